//! `eventbus`: command-line client for Socle EventBus.
//!
//! Every call goes through `eventbus_client` (connection, TLS, token, typed errors that
//! read as one line), like the bench's: one client code path.
//!
//! - `cli`: the command line (clap), including the connection options.
//! - `publish`, `subscribe`, `admin`, `durable`, `consumer_ops`: the commands.
//! - `bench` runs `eventbus_bench`; `durable_bench` the `durable` and `worker`
//!   workloads, `push_bench` the `push` one, `idle` the idle one.
//! - `relay`: the PostgreSQL outbox relay with its /metrics listener.
//! - `auth`: `auth new-token`, a token and its principals-file entry.
//! - `output`: how events and tables are printed, for people and for scripts (`--json`).

mod admin;
mod auth;
mod cli;
mod consumer_ops;
mod durable;
mod durable_bench;
mod idle;
mod output;
mod publish;
mod push_bench;
mod relay;
mod subscribe;

use std::process::ExitCode;

use clap::Parser;
use eventbus_client::Client;

/// jemalloc with the `jemalloc` feature (the bench scripts build with it), as in
/// `eventbusd`: decoding pushed events allocates their strings, and glibc's malloc was
/// a quarter of a subscriber's instructions (callgrind, `bench fanout`). `peers` uses it
/// too, so the bench compares the systems, not allocators. Off by default: building
/// jemalloc was a third of the command's install time, and publishing, subscribing or
/// relaying by hand does not need it.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use crate::cli::{Cli, Command};

/// `eventbus bench`: one run, reported as text or one JSON object.
async fn bench(client: &Client, json: bool, workload: &cli::BenchWorkload) -> anyhow::Result<()> {
    let workload = match workload {
        cli::BenchWorkload::Idle(args) => return idle::run(client, json, args).await,
        cli::BenchWorkload::Durable(args) => return durable_bench::run(client, json, args).await,
        cli::BenchWorkload::Worker(args) => return durable_bench::run_worker(client, json, args).await,
        cli::BenchWorkload::Push(args) => return push_bench::run(client, json, args).await,
        cli::BenchWorkload::Traffic(workload) => workload,
    };
    let target = eventbus_bench::eventbus::EventBusTarget::new(client.clone());
    let report = eventbus_bench::run(&target, workload, true).await?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Multi-threaded: `bench` drives many connections at once.
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let server = cli.connect.server.clone();
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = format!("{err:#}");
            eprintln!("error: {message}");
            if let Some(hint) = hint(&message, &server) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What to do about the connection errors whose cause the transport names in its own
/// words: a plain-text client at a TLS port, a certificate from an unknown CA.
fn hint(message: &str, server: &str) -> Option<&'static str> {
    // A TLS port answers a plain-text HTTP/2 preface with a TLS alert, which the
    // transport reports as one of these (which one depends on timing: a connection
    // closed before the call's answer is a bare "transport error").
    let plain_at_tls = [
        "h2 protocol error",
        "frame with invalid size",
        "operation was canceled",
        "connection reset",
        "transport error",
    ];
    if server.starts_with("http://") && plain_at_tls.iter().any(|m| message.contains(m)) {
        return Some("if the broker serves TLS on this port, use an https:// address in --server");
    }
    if message.contains("UnknownIssuer") || message.contains("unknown issuer") {
        return Some(
            "the broker's certificate is signed by a CA this machine does not trust: name that CA's PEM file with --tls-ca FILE",
        );
    }
    None
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json = cli.json;
    if let Command::Auth { command } = &cli.command {
        return auth::run(json, command);
    }
    if let Command::Relay(args) = cli.command {
        return relay::run(cli.connect.options(), args).await;
    }
    let client = Client::connect(cli.connect.options()).await?;
    match cli.command {
        Command::Publish(args) => publish::run(&client, json, args).await,
        Command::Subscribe(args) => subscribe::run(&client, json, args).await,
        Command::Stats => admin::stats(&client, json).await,
        Command::Channels => admin::channels(&client, json).await,
        Command::History(args) => admin::history(&client, json, args).await,
        Command::Subscriptions => admin::subscriptions(&client, json).await,
        Command::Unsubscribe { id } => admin::unsubscribe(&client, json, &id).await,
        Command::Consumer { command } => durable::consumer(&client, json, command).await,
        Command::Consume(args) => durable::consume(&client, json, args).await,
        Command::Log(args) => durable::log(&client, json, args).await,
        Command::Bench { workload } => bench(&client, json, &workload).await,
        Command::Auth { .. } | Command::Relay(_) => unreachable!("answered above"),
    }
}

#[cfg(test)]
mod hint_tests {
    use super::hint;

    /// Each way the transport reports a plain-text client at a TLS port gets the hint,
    /// whichever one the timing of the connection's close produced.
    #[test]
    fn plain_text_at_a_tls_port_is_hinted_in_every_wording() {
        for message in [
            "status: Unknown, message: \"h2 protocol error: http2 error\"",
            "transport error (Unknown)",
            "status: Unavailable, message: \"error trying to connect: connection reset by peer\"",
            "operation was canceled",
        ] {
            let got = hint(message, "http://127.0.0.1:50051");
            assert!(got.is_some_and(|h| h.contains("https://")), "{message}");
            assert!(hint(message, "https://127.0.0.1:50051").is_none(), "{message}");
        }
    }
}
