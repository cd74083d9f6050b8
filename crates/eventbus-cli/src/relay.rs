//! `eventbus relay`: the outbox relay of `eventbus_client::outbox` as a process, with
//! its own /metrics listener, stopping gracefully on SIGINT or SIGTERM.

use std::time::Duration;

use anyhow::Context as _;
use eventbus_client::outbox::{Relay, RelayMetrics, RelayOptions};
use eventbus_client::{Backoff, Client, ClientOptions};
use tokio_util::sync::CancellationToken;

use crate::cli::RelayArgs;

pub(crate) async fn run(client_options: ClientOptions, args: RelayArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();

    let mut options = RelayOptions::new(args.database_url);
    options.table = args.table;
    options.batch = usize::try_from(args.batch).unwrap_or(usize::MAX);
    options.retention = Duration::from_secs(args.retention_secs);
    options.source = args.source;
    // A wrong address or a missing table stops the relay now, naming it; a database
    // lost later is retried.
    options.preflight().await?;
    let registry = prometheus::Registry::new();
    let metrics = RelayMetrics::register(&registry).context("metrics")?;
    let listener = metrics_listener(args.metrics_addr).await?;
    let metrics_addr = listener.local_addr().context("/metrics listener")?;

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move { prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap_or_default() }
        }),
    );
    let metrics_server = axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let relay = async {
        let Some(client) = connect(client_options, &shutdown).await? else { return Ok(()) };
        let relay = Relay::new(client, options)?.metrics(&metrics);
        tracing::info!(metrics = %metrics_addr, "outbox relay running");
        let outcome = relay.run(shutdown.clone()).await;
        shutdown.cancel(); // the relay returns on shutdown or on an error it cannot fix: stop /metrics too
        outcome.map_err(anyhow::Error::from)
    };
    let (relayed, served) = tokio::join!(relay, metrics_server);
    shutdown.cancel();
    relayed?;
    served.context("/metrics listener")?;
    tracing::info!("outbox relay stopped");
    Ok(())
}

/// The default /metrics address when none is given.
const DEFAULT_METRICS_ADDR: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9473);

/// The /metrics listener: the address given, or the default one, or, when the default
/// is taken (another relay on this host), a free port: a second relay must not die of
/// the first one's port. An address given and taken is an error.
async fn metrics_listener(given: Option<std::net::SocketAddr>) -> anyhow::Result<tokio::net::TcpListener> {
    let addr = given.unwrap_or(DEFAULT_METRICS_ADDR);
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(err) if given.is_none() && err.kind() == std::io::ErrorKind::AddrInUse => {
            let fallback = std::net::SocketAddr::new(addr.ip(), 0);
            let listener = tokio::net::TcpListener::bind(fallback)
                .await
                .with_context(|| format!("cannot listen on {fallback} for /metrics"))?;
            tracing::warn!(
                taken = %addr,
                metrics = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                "the default /metrics address is taken (another relay?): serving /metrics on a free port; set --metrics-addr to choose"
            );
            Ok(listener)
        }
        Err(err) => Err(err).with_context(|| format!("cannot listen on {addr} for /metrics")),
    }
}

/// Connects to the broker, retrying while it is away; `None` on shutdown.
async fn connect(options: ClientOptions, shutdown: &CancellationToken) -> anyhow::Result<Option<Client>> {
    let backoff = Backoff::default();
    let mut failures = 0;
    loop {
        match Client::connect(options.clone()).await {
            Ok(client) => return Ok(Some(client)),
            Err(err) if err.is_transient() => {
                tracing::warn!(error = %err, "outbox relay: broker unavailable, retrying");
            }
            Err(err) => return Err(err.into()),
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(backoff.delay(failures)) => failures = failures.saturating_add(1),
        }
    }
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("stopping");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second relay on a host finds the default /metrics port taken and serves on a
    /// free one; an address given explicitly and taken is an error naming it.
    #[tokio::test]
    async fn a_taken_default_metrics_port_falls_back_to_a_free_one() {
        // Held here, or already by someone else: taken either way.
        let _holder = tokio::net::TcpListener::bind(DEFAULT_METRICS_ADDR).await;
        let listener = metrics_listener(None).await.expect("a free port");
        let addr = listener.local_addr().unwrap();
        assert_ne!(addr, DEFAULT_METRICS_ADDR);
        let err = metrics_listener(Some(addr)).await.unwrap_err();
        assert!(format!("{err:#}").contains(&addr.to_string()), "{err:#}");
    }
}
