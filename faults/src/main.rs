//! The fault harness: `eventbus-faults net up|down` builds and removes its network;
//! `eventbus-faults run` (inside the client namespace, as `faults/run.sh` does) starts
//! each fleet, runs the clients, applies the seeded schedule of faults, heals, waits
//! for the fleet to converge, checks every promise and writes a JSON report and a
//! table. It exits with 1 when a promise was broken.

mod check;
mod fleet;
mod nemesis;
mod net;
mod report;
mod scenario;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fleet::{Durability, Kind};

#[derive(Debug, Parser)]
#[command(name = "eventbus-faults", about = "Faults against eventbusd fleets, and a checker for every promise")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Creates (`up`) or removes (`down`) the namespaces, links and filesystem.
    Net {
        #[arg(value_parser = ["up", "down"])]
        action: String,
    },
    /// Runs the fleets through the schedule (inside the client namespace).
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Seed of the schedule and of every target choice (printed; the same seed gives
    /// the same schedule).
    #[arg(long)]
    seed: Option<u64>,
    /// A long random schedule (single faults and pairs) instead of the short one that
    /// applies each fault once.
    #[arg(long)]
    long: bool,
    /// Minutes of faults per fleet in a long run.
    #[arg(long, default_value_t = 20)]
    minutes: u64,
    /// The fleets to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "embedded,single,cluster")]
    fleets: Vec<Kind>,
    /// `eventbus.redis.min_replicas_acked` of the cluster fleet.
    #[arg(long, default_value_t = 1)]
    min_replicas_acked: u32,
    /// Redis `appendfsync`: `always` or `everysec`.
    #[arg(long, default_value = "always", value_parser = ["always", "everysec"])]
    appendfsync: String,
    /// The eventbusd binary.
    #[arg(long)]
    eventbusd: PathBuf,
    /// Directory of the logs and of `report.json`.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
}

/// How long the fleet has to converge after the last heal.
const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Net { action } if action == "up" => net::up().await.map(|()| true),
        Command::Net { .. } => {
            net::down().await;
            Ok(true)
        }
        Command::Run(args) => run(args).await,
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(err) => {
            eprintln!("faults: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Runs every fleet; true when no promise was broken.
async fn run(args: RunArgs) -> Result<bool> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs())
    });
    println!("faults: seed {seed} (again: --seed {seed}){}", if args.long { ", long" } else { "" });
    let appendfsync = if args.appendfsync == "everysec" { "everysec" } else { "always" };
    let durability = Durability { min_replicas_acked: args.min_replicas_acked, appendfsync };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fleets = Vec::new();
    for kind in &args.fleets {
        let dir = args.out.join(format!("{kind:?}").to_lowercase());
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
        }
        let schedule = scenario::schedule(*kind, args.long, args.minutes, &mut rng);
        println!("faults: {kind:?} fleet, {} steps", schedule.len());
        fleets.push(scenario::run_fleet(*kind, durability, &schedule, &args.eventbusd, &dir, &mut rng).await?);
    }
    let report = report::Report { seed, long: args.long, fleets };
    let path = args.out.join("report.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("{}", report.table());
    println!("faults: report in {}", path.display());
    Ok(report.passed())
}

/// Seconds since `start`.
fn since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}
