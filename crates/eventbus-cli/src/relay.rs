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
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    let mut options = RelayOptions::new(args.database_url);
    options.table = args.table;
    options.batch = usize::try_from(args.batch).unwrap_or(usize::MAX);
    options.retention = Duration::from_secs(args.retention_secs);
    options.check()?;
    let registry = prometheus::Registry::new();
    let metrics = RelayMetrics::register(&registry).context("metrics")?;
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {} for /metrics", args.metrics_addr))?;

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
        tracing::info!(metrics = %args.metrics_addr, "outbox relay running");
        relay.run(shutdown.clone()).await;
        shutdown.cancel(); // the relay only returns on shutdown; stop /metrics too
        anyhow::Ok(())
    };
    let (relayed, served) = tokio::join!(relay, metrics_server);
    shutdown.cancel();
    relayed?;
    served.context("/metrics listener")?;
    tracing::info!("outbox relay stopped");
    Ok(())
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
