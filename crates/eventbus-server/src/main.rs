//! `eventbusd`: parse flags, load configuration, start logging, serve until a signal.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use eventbus_server::config::{LogFormat, Overrides, Settings};
use eventbus_server::{Server, shutdown, telemetry};
use tokio_util::sync::CancellationToken;

/// jemalloc rather than glibc's malloc: buffers here are often freed by another thread
/// than the one that allocated them (Redis replies, gRPC frames, events), where glibc's
/// malloc spent 40% of the daemon's time in a redis-mode consume; measured against it
/// and against mimalloc in docs/PERFORMANCE.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// What `--help` adds after the flags: where the defaults are and how to change them.
const AFTER_HELP: &str = "\
Defaults: gRPC on 0.0.0.0:50051, HTTP (REST, /v1, the console, /metrics) on 0.0.0.0:8080,
durable consumers stored in ./data/ (relative to the working directory).

Settings, lowest layer first: the built-in defaults (config/default.yaml), the file
given with --config (else ./config/default.yaml when present), EVENTBUS__SECTION__KEY
environment variables (EVENTBUS__SERVER__GRPC_ADDR=127.0.0.1:50051 sets
server.grpc_addr), then these flags. RUST_LOG, when set, wins over log.level.

Docs: docs/configuration.md (every setting), docs/getting-started.md, docs/operations.md.";

/// Socle EventBus daemon: push fan-out of events over gRPC.
#[derive(Debug, Parser)]
#[command(name = "eventbusd", version, about, after_help = AFTER_HELP)]
struct Args {
    /// YAML configuration file (default: ./config/default.yaml when present).
    #[arg(long, short = 'c', env = "EVENTBUS_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC listen address (server.grpc_addr; default 0.0.0.0:50051).
    #[arg(long, value_name = "ADDR")]
    grpc_addr: Option<String>,
    /// HTTP listen address (server.http_addr; default 0.0.0.0:8080).
    #[arg(long, value_name = "ADDR")]
    http_addr: Option<String>,
    /// Directory of the embedded durable store (durable.data_dir; default ./data/; ""
    /// keeps it in memory). Two eventbusd on one host need one each.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
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
        data_dir: args.data_dir,
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
    let json_logs = settings.log.format == LogFormat::Json;
    match runtime.block_on(serve(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = report(&err);
            // Text logs share the terminal with stderr: the error is said once, there.
            // JSON logs go to a collector, which gets it as a line of its own too.
            if json_logs {
                tracing::error!("{message}");
            }
            eprintln!("eventbusd: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause once: a message that already
/// carries its cause's text does not repeat it.
fn report(err: &anyhow::Error) -> String {
    let mut message = err.to_string();
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
    }
    message
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
