//! `eventbusd`: parse flags, load configuration, start logging, serve until a signal.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use eventbus_server::config::{Overrides, Settings};
use eventbus_server::{Server, shutdown, telemetry};
use tokio_util::sync::CancellationToken;

/// jemalloc rather than glibc's malloc: buffers here are often freed by another thread
/// than the one that allocated them (Redis replies, gRPC frames, events), where glibc's
/// malloc spent 40% of the daemon's time in a redis-mode consume; measured against it
/// and against mimalloc in docs/PERFORMANCE.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Socle EventBus daemon: push fan-out of events over gRPC.
#[derive(Debug, Parser)]
#[command(name = "eventbusd", version, about)]
struct Args {
    /// YAML configuration file (default: ./config/default.yaml when present).
    #[arg(long, short = 'c', env = "EVENTBUS_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC listen address (server.grpc_addr).
    #[arg(long)]
    grpc_addr: Option<String>,
    /// HTTP listen address (server.http_addr).
    #[arg(long)]
    http_addr: Option<String>,
    /// Fan-out mode (eventbus.mode): in_memory or redis.
    #[arg(long)]
    mode: Option<String>,
    /// Log level or filter directives (log.level).
    #[arg(long)]
    log_level: Option<String>,
    /// Log format (log.format): text or json.
    #[arg(long)]
    log_format: Option<String>,
    /// Check the configuration (every setting, the TLS files, the principals file and
    /// JWT keys) and exit: 0 when eventbusd would start with it, 2 with the problem.
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let overrides = Overrides {
        config_file: args.config,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        mode: args.mode,
        log_level: args.log_level,
        log_format: args.log_format,
    };
    let env: HashMap<String, String> = std::env::vars().collect();
    let settings = match Settings::load(&overrides, &env) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("eventbusd: configuration error: {err}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        return check_config(&settings);
    }
    if let Err(err) = telemetry::init(&settings.log) {
        eprintln!("eventbusd: {err}");
        return ExitCode::from(2);
    }
    for ignored in settings.without_effect() {
        tracing::warn!(
            key = ignored.key,
            variable = ignored.variable,
            value = ignored.value,
            "setting has no effect: {}",
            ignored.reason
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("eventbusd: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("eventbusd: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config`: the settings loaded already; the files they name next.
fn check_config(settings: &Settings) -> ExitCode {
    if let Err(err) = Server::check_files(settings) {
        eprintln!("eventbusd: configuration error: {:#}", anyhow::Error::from(err));
        return ExitCode::from(2);
    }
    for ignored in settings.without_effect() {
        println!("note: {} ({}) has no effect: {}", ignored.key, ignored.variable, ignored.reason);
    }
    println!(
        "configuration OK: mode {}, gRPC {}, HTTP {}, authentication {}",
        settings.eventbus.mode,
        settings.server.grpc_addr,
        settings.server.http_addr,
        if settings.auth.enabled { "on" } else { "off" }
    );
    ExitCode::SUCCESS
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let server = Server::bind(settings).await?;
    let token = CancellationToken::new();
    let reloader = server.reloader();
    let stop_reloading = token.clone();
    tokio::spawn(async move {
        if let Err(err) = shutdown::reload_on_signal(reloader, stop_reloading).await {
            tracing::error!("cannot listen for SIGHUP ({err}); reload needs a restart");
        }
    });
    let signals = token.clone();
    tokio::spawn(async move {
        if let Err(err) = shutdown::on_signal(signals.clone()).await {
            tracing::error!("cannot listen for signals ({err}); stopping");
            signals.cancel();
        }
    });
    server.run(token).await?;
    Ok(())
}
