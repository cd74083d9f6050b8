//! `peers`: the `eventbus bench` workloads against NATS core and Redis Pub/Sub, so the
//! three systems are measured by the same code with the same parameters. Not shipped;
//! `bench/compare.sh` drives it.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use eventbus_bench::BenchCommand;

/// The allocator of the `eventbus` load generator, so both sides decode alike.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod jetstream;
mod nats;
mod redis_target;

#[derive(Debug, Parser)]
#[command(about = "Bench workloads against NATS core or Redis Pub/Sub")]
struct Args {
    /// System to drive.
    #[arg(long, value_enum)]
    system: System,
    /// Its URL: nats://127.0.0.1:4222 or redis://127.0.0.1:6379.
    #[arg(long)]
    url: String,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Debug, clap::Subcommand)]
enum Workload {
    #[command(flatten)]
    Traffic(BenchCommand),
    /// NATS only: JetStream (file storage) durable publish, then consume with acks.
    Durable(eventbus_bench::durable::DurableArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum System {
    Nats,
    Redis,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Workload::Durable(durable) = &args.workload {
        let done = match args.system {
            System::Nats => runtime.block_on(jetstream::run(&args.url, args.json, durable)),
            System::Redis => Err(anyhow::anyhow!("the durable workload compares with NATS JetStream only")),
        };
        return match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        };
    }
    let Workload::Traffic(workload) = &args.workload else { return ExitCode::FAILURE };
    let result = runtime.block_on(async {
        match args.system {
            System::Nats => eventbus_bench::run(&nats::NatsTarget::new(&args.url), workload, true).await,
            System::Redis => eventbus_bench::run(&redis_target::RedisTarget::new(&args.url)?, workload, true).await,
        }
    });
    match result {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.human());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
