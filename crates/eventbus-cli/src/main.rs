//! `eventbus`: command-line client for Socle EventBus.
//!
//! - `cli`: the command line (clap).
//! - `connect`: reaching the broker, and turning gRPC errors into one readable line.
//! - `publish`, `subscribe`, `admin`: the commands; `bench` runs `eventbus_bench`.
//! - `output`: how events and tables are printed, for people and for scripts (`--json`).

mod admin;
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

use crate::cli::{Cli, Command};

/// `eventbus bench`: one run, reported as text or one JSON object.
async fn bench(server: &str, json: bool, workload: &cli::BenchWorkload) -> anyhow::Result<()> {
    let workload = match workload {
        cli::BenchWorkload::Idle(args) => return idle::run(server, json, args).await,
        cli::BenchWorkload::Durable(args) => return durable_bench::run(server, json, args).await,
        cli::BenchWorkload::Traffic(workload) => workload,
    };
    let target = eventbus_bench::eventbus::EventBusTarget::new(server);
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
    let server = cli.server;
    let json = cli.json;
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
    }
}
