//! `eventbus bench idle`: hold many idle subscriptions open and report what the daemon
//! spends on them — CPU over the period (should be ~0: no timers, no polling) and
//! resident memory (grows with queued events, not with queue capacity).

use std::time::Duration;

use anyhow::Context;
use eventbus_client::{Client, SubscribeOptions};
use serde_json::json;

/// Streams per connection (HTTP/2 servers commonly cap concurrent streams at 200).
const STREAMS_PER_CONNECTION: usize = 100;
/// Linux reports CPU time in clock ticks of 1/100 s on every mainstream platform.
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct IdleArgs {
    /// Idle subscriptions to hold open.
    #[arg(long, default_value_t = 1000)]
    subscriptions: usize,
    /// Queue capacity each subscription asks for.
    #[arg(long, default_value_t = 10_000)]
    queue_capacity: u32,
    /// Seconds to stay idle.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// PID of the local eventbusd, to read its CPU time and RSS from /proc.
    #[arg(long)]
    pid: u32,
}

struct Sample {
    cpu_secs: f64,
    rss_bytes: u64,
}

fn sample(pid: u32) -> anyhow::Result<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("no process {pid}"))?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).context("unexpected /proc stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the name.
    let cpu_secs = (ticks(11) + ticks(12)) / CLOCK_TICKS_PER_SEC;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .context("no VmRSS in /proc status")?;
    Ok(Sample { cpu_secs, rss_bytes: rss_kb * 1024 })
}

pub(crate) async fn run(client: &Client, json: bool, a: &IdleArgs) -> anyhow::Result<()> {
    let baseline = sample(a.pid)?;
    let mut streams = Vec::with_capacity(a.subscriptions);
    let mut connection = client.clone();
    for i in 0..a.subscriptions {
        if i % STREAMS_PER_CONNECTION == 0 {
            connection = client.new_connection().await?;
        }
        let options = SubscribeOptions::new([format!("idle.{i}")])
            .queue_capacity(a.queue_capacity)
            .name("idle-bench")
            .reconnect(false);
        streams.push(connection.subscribe(options).await?);
    }
    let before = sample(a.pid)?;
    tokio::time::sleep(Duration::from_secs_f64(a.duration)).await;
    let after = sample(a.pid)?;
    let cpu = after.cpu_secs - before.cpu_secs;
    let per_sub = after.rss_bytes.saturating_sub(baseline.rss_bytes) / a.subscriptions.max(1) as u64;
    if json {
        let v = json!({
            "workload": "idle", "subscriptions": a.subscriptions, "queue_capacity": a.queue_capacity,
            "duration": a.duration, "cpu_secs": cpu, "cpu_percent": 100.0 * cpu / a.duration,
            "rss_before_bytes": baseline.rss_bytes, "rss_bytes": after.rss_bytes, "rss_per_subscription_bytes": per_sub,
        });
        println!("{v}");
    } else {
        println!(
            "eventbus idle ({} subscriptions, queue capacity {}, {} s)",
            a.subscriptions, a.queue_capacity, a.duration
        );
        println!("  daemon CPU      {cpu:.2} s ({:.2}% of one core)", 100.0 * cpu / a.duration);
        println!(
            "  daemon RSS      {:.1} MiB (was {:.1} MiB before subscribing: {per_sub} bytes per subscription)",
            after.rss_bytes as f64 / 1048576.0,
            baseline.rss_bytes as f64 / 1048576.0
        );
    }
    drop(streams);
    Ok(())
}
