//! `eventbus`: command-line client for Socle EventBus.
//!
//! - `cli`: the command line (clap).
//! - `connect`: turning gRPC errors into one readable line (connections themselves are
//!   `eventbus_bench::client`'s, shared with the bench: address, TLS, bearer token).
//! - `publish`, `subscribe`, `admin`: the commands; `bench` runs `eventbus_bench`.
//! - `auth`: `auth new-token`, a token and its principals-file entry.
//! - `output`: how events and tables are printed, for people and for scripts (`--json`).

mod admin;
mod auth;
mod cli;
mod connect;
mod durable;
mod durable_bench;
mod idle;
mod output;
mod publish;
mod subscribe;

use std::process::ExitCode;

use clap::Parser;
use eventbus_bench::client::Connector;

use crate::cli::{Cli, Command};

/// `eventbus bench`: one run, reported as text or one JSON object.
async fn bench(server: &Connector, json: bool, workload: &cli::BenchWorkload) -> anyhow::Result<()> {
    let workload = match workload {
        cli::BenchWorkload::Idle(args) => return idle::run(server, json, args).await,
        cli::BenchWorkload::Durable(args) => return durable_bench::run(server, json, args).await,
        cli::BenchWorkload::Traffic(workload) => workload,
    };
    let target = eventbus_bench::eventbus::EventBusTarget::new(server.clone());
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
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json = cli.json;
    if let Command::Auth { command } = &cli.command {
        return auth::run(json, command);
    }
    let server = Connector::new(&cli.connect)?;
    match cli.command {
        Command::Publish(args) => publish::run(&server, json, args).await,
        Command::Subscribe(args) => subscribe::run(&server, json, args).await,
        Command::Stats => admin::stats(&server, json).await,
        Command::Channels => admin::channels(&server, json).await,
        Command::Subscriptions => admin::subscriptions(&server, json).await,
        Command::Unsubscribe { id } => admin::unsubscribe(&server, json, &id).await,
        Command::Consumer { command } => durable::consumer(&server, json, command).await,
        Command::Consume(args) => durable::consume(&server, json, args).await,
        Command::Log(args) => durable::log(&server, json, args).await,
        Command::Bench { workload } => bench(&server, json, &workload).await,
        Command::Auth { .. } => unreachable!("answered above, without a connection"),
    }
}
