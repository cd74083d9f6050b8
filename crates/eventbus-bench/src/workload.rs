//! The workloads, their arguments and their reports.
//!
//! Every run uses a fresh subject, creates its subscribers (live) and publishers
//! (connected) before the clock starts, and waits for deliveries until every expected
//! copy arrived or nothing arrived for [`IDLE`]; what never arrived is reported as loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::target::{Ack, PublishMode, Publisher, Publishing, Subscriber, Target};

/// A run ends when no delivery has arrived for this long.
const IDLE: Duration = Duration::from_secs(2);
/// Progress lines are printed for runs longer than this.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// P publishers, S subscribers (optionally one group): throughput and loss.
    Fanout(FanoutArgs),
    /// One publisher at a fixed rate: delivery latency percentiles, measured from each
    /// event's intended send time (so a stalled broker cannot hide).
    Latency(LatencyArgs),
    /// Publish throughput with no subscriber.
    Pubonly(PubonlyArgs),
}

/// The publishing side of a throughput run.
#[derive(Debug, Clone, clap::Args)]
pub struct Load {
    /// Concurrent publishers (each its own connection).
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    pub payload: usize,
    /// Events to publish, across all publishers.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Publish mode.
    #[arg(long, value_enum, default_value_t = PublishMode::Stream)]
    pub mode: PublishMode,
    /// Events per call with `--mode batch`.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// What a `--mode stream` publisher waits for (eventbus; NATS and Redis answer no
    /// publish and publish as always).
    #[arg(long, value_enum, default_value_t = Ack::Each)]
    pub ack: Ack,
}

impl Load {
    fn params(&self) -> Value {
        let mut params = json!({
            "publishers": self.publishers, "payload": self.payload, "count": self.count, "mode": self.mode.name(),
        });
        if self.mode == PublishMode::Batch {
            params["batch"] = json!(self.batch);
        }
        if self.ack != Ack::Each {
            params["ack"] = json!(self.ack.name());
        }
        params
    }

    fn publishing(&self) -> anyhow::Result<Publishing> {
        check_ack(self.mode, self.ack)?;
        anyhow::ensure!(self.mode != PublishMode::Client, "--mode client applies to bench durable only");
        Ok(Publishing { mode: self.mode, batch: self.batch as usize, ack: self.ack })
    }
}

/// `--ack` chooses what a stream publisher waits for: other modes have no choice.
fn check_ack(mode: PublishMode, ack: Ack) -> anyhow::Result<()> {
    anyhow::ensure!(ack == Ack::Each || mode == PublishMode::Stream, "--ack applies to --mode stream only");
    Ok(())
}

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub load: Load,
    /// Subscribers (each its own connection).
    #[arg(long, default_value_t = 16)]
    pub subscribers: usize,
    /// Put all subscribers in one group: each event goes to one of them.
    #[arg(long)]
    pub group: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    /// Events per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Seconds to publish for.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Subscribers.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    /// Payload size in bytes (at least 8: the intended send time).
    #[arg(long, default_value_t = 128)]
    pub payload: usize,
    /// Publish mode.
    #[arg(long, value_enum, default_value_t = PublishMode::Stream)]
    pub mode: PublishMode,
    /// What a `--mode stream` publisher waits for.
    #[arg(long, value_enum, default_value_t = Ack::Each)]
    pub ack: Ack,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PubonlyArgs {
    #[command(flatten)]
    pub load: Load,
}

/// Delivery latency percentiles, in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// The outcome of one run.
#[derive(Debug, Clone)]
pub struct Report {
    pub system: &'static str,
    pub workload: &'static str,
    /// The run's parameters, for the record.
    pub params: Value,
    pub published: u64,
    pub expected: u64,
    pub received: u64,
    /// From the first publish to the last publish accepted (flushed).
    pub publish_secs: f64,
    /// From the first publish to the last delivery.
    pub deliver_secs: f64,
    pub latency: Option<Percentiles>,
}

impl Report {
    pub fn published_per_sec(&self) -> f64 {
        rate(self.published, self.publish_secs)
    }

    pub fn delivered_per_sec(&self) -> f64 {
        rate(self.received, self.deliver_secs)
    }

    pub fn loss(&self) -> u64 {
        self.expected.saturating_sub(self.received)
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "system": self.system,
            "workload": self.workload,
            "params": self.params,
            "published": self.published,
            "expected": self.expected,
            "received": self.received,
            "loss": self.loss(),
            "publish_secs": self.publish_secs,
            "deliver_secs": self.deliver_secs,
            "published_per_sec": self.published_per_sec().round(),
            "delivered_per_sec": self.delivered_per_sec().round(),
        });
        if let Some(l) = &self.latency {
            v["latency_us"] = json!({"p50": l.p50, "p90": l.p90, "p99": l.p99, "p99_9": l.p999, "max": l.max});
        }
        v
    }

    /// A few lines for people.
    pub fn human(&self) -> String {
        let params: Vec<String> = self
            .params
            .as_object()
            .map(|o| o.iter().map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"'))).collect())
            .unwrap_or_default();
        let mut out = format!("{} {} ({})\n", self.system, self.workload, params.join(" "));
        out.push_str(&format!(
            "  published  {:>12} in {:>8.3}s  {:>14}/s\n",
            self.published,
            self.publish_secs,
            thousands(self.published_per_sec())
        ));
        if self.expected > 0 {
            out.push_str(&format!(
                "  delivered  {:>12} in {:>8.3}s  {:>14}/s   loss {}\n",
                self.received,
                self.deliver_secs,
                thousands(self.delivered_per_sec()),
                self.loss()
            ));
            out.push_str(&format!(
                "  time split publish {:.3}s, drain after last publish {:.3}s\n",
                self.publish_secs,
                (self.deliver_secs - self.publish_secs).max(0.0)
            ));
        }
        if let Some(l) = &self.latency {
            out.push_str(&format!(
                "  latency µs p50 {:.0}  p90 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}\n",
                l.p50, l.p90, l.p99, l.p999, l.max
            ));
        }
        out
    }
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A subject no earlier run used, so runs never see each other's events.
fn subject(workload: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("bench.{workload}.{}x{nanos}", std::process::id())
}

/// Runs one workload against `target`. `progress` prints to stderr during long runs.
pub async fn run<T: Target>(target: &T, cmd: &BenchCommand, progress: bool) -> anyhow::Result<Report> {
    match cmd {
        BenchCommand::Fanout(a) => fanout(target, a, progress).await,
        BenchCommand::Latency(a) => latency(target, a, progress).await,
        BenchCommand::Pubonly(a) => pubonly(target, a).await,
    }
}

/// Deliveries counted by all subscriber tasks.
#[derive(Debug)]
struct Tally {
    received: AtomicU64,
    expected: u64,
    /// Nanoseconds from the start to the latest delivery.
    last_ns: AtomicU64,
    all_in: Notify,
}

impl Tally {
    fn new(expected: u64) -> Arc<Self> {
        Arc::new(Self { received: AtomicU64::new(0), expected, last_ns: AtomicU64::new(0), all_in: Notify::new() })
    }

    fn add(&self, n: u64, start: Instant) {
        self.last_ns.fetch_max(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if self.received.fetch_add(n, Ordering::Relaxed) + n >= self.expected {
            self.all_in.notify_one();
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits for every expected delivery, or until nothing arrives for [`IDLE`].
    async fn wait(&self, start: Instant, progress: bool) {
        let mut seen = self.received();
        let mut last_change = Instant::now();
        while self.received() < self.expected {
            tokio::select! {
                () = self.all_in.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            let now = self.received();
            if now != seen {
                seen = now;
                last_change = Instant::now();
            } else if last_change.elapsed() >= IDLE {
                return;
            }
            if progress && now < self.expected && start.elapsed() > PROGRESS_AFTER {
                eprintln!("  … {:.1}s: {now} of {} delivered", start.elapsed().as_secs_f64(), self.expected);
            }
        }
    }

    fn deliver_secs(&self) -> f64 {
        self.last_ns.load(Ordering::Relaxed) as f64 / 1e9
    }
}

async fn publishers<T: Target>(target: &T, n: usize, how: Publishing) -> anyhow::Result<Vec<T::Pub>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        out.push(target.publisher(how).await?);
    }
    Ok(out)
}

/// Publishes `count` events split over the publishers; returns when all are flushed.
async fn publish_all<P: Publisher>(pubs: Vec<P>, subject: &str, payload: Bytes, count: u64) -> anyhow::Result<()> {
    let n = pubs.len() as u64;
    let mut tasks = JoinSet::new();
    for (i, mut p) in pubs.into_iter().enumerate() {
        let share = count / n + u64::from((i as u64) < count % n);
        let subject = subject.to_owned();
        let payload = payload.clone();
        tasks.spawn(async move {
            for _ in 0..share {
                p.publish(&subject, payload.clone()).await?;
            }
            p.flush().await
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

async fn fanout<T: Target>(target: &T, a: &FanoutArgs, progress: bool) -> anyhow::Result<Report> {
    let subject = subject("fanout");
    let group = a.group.then_some("bench");
    let mut subs = Vec::with_capacity(a.subscribers);
    for _ in 0..a.subscribers {
        subs.push(target.subscriber(&subject, group).await?);
    }
    let load = &a.load;
    let pubs = publishers(target, load.publishers, load.publishing()?).await?;
    let expected = if a.subscribers == 0 {
        0
    } else if a.group {
        load.count
    } else {
        load.count * a.subscribers as u64
    };
    let tally = Tally::new(expected);
    let start = Instant::now();
    let mut readers = JoinSet::new();
    for mut sub in subs {
        let tally = Arc::clone(&tally);
        readers.spawn(async move {
            let mut buf = Vec::new();
            while sub.next(&mut buf).await? {
                tally.add(buf.len() as u64, start);
                buf.clear();
            }
            anyhow::Ok(())
        });
    }
    publish_all(pubs, &subject, Bytes::from(vec![0xAB; load.payload]), load.count).await?;
    let publish_secs = start.elapsed().as_secs_f64();
    tally.wait(start, progress).await;
    readers.abort_all();
    let mut params = load.params();
    params["subscribers"] = json!(a.subscribers);
    params["group"] = json!(a.group);
    Ok(Report {
        system: target.name(),
        workload: "fanout",
        params,
        published: load.count,
        expected,
        received: tally.received(),
        publish_secs,
        deliver_secs: tally.deliver_secs(),
        latency: None,
    })
}

async fn pubonly<T: Target>(target: &T, a: &PubonlyArgs) -> anyhow::Result<Report> {
    let subject = subject("pubonly");
    let load = &a.load;
    let pubs = publishers(target, load.publishers, load.publishing()?).await?;
    let start = Instant::now();
    publish_all(pubs, &subject, Bytes::from(vec![0xAB; load.payload]), load.count).await?;
    let publish_secs = start.elapsed().as_secs_f64();
    Ok(Report {
        system: target.name(),
        workload: "pubonly",
        params: load.params(),
        published: load.count,
        expected: 0,
        received: 0,
        publish_secs,
        deliver_secs: 0.0,
        latency: None,
    })
}

async fn latency<T: Target>(target: &T, a: &LatencyArgs, progress: bool) -> anyhow::Result<Report> {
    anyhow::ensure!(a.rate > 0 && a.duration > 0.0, "--rate and --duration must be positive");
    anyhow::ensure!(
        a.mode != PublishMode::Batch,
        "latency times each event from its send: --mode batch would hold events back to fill a batch"
    );
    let subject = subject("latency");
    let mut subs = Vec::with_capacity(a.subscribers);
    for _ in 0..a.subscribers {
        subs.push(target.subscriber(&subject, None).await?);
    }
    check_ack(a.mode, a.ack)?;
    let mut publisher = target.publisher(Publishing { mode: a.mode, batch: 1, ack: a.ack }).await?;
    let count = (a.rate as f64 * a.duration).round() as u64;
    let tally = Tally::new(count * a.subscribers as u64);
    let epoch = Instant::now();

    // Each subscriber records now − intended send time of every event.
    let mut readers = JoinSet::new();
    let histograms: Vec<Arc<parking::Hist>> = (0..a.subscribers).map(|_| Arc::new(parking::Hist::new())).collect();
    for (mut sub, hist) in subs.into_iter().zip(histograms.iter().cloned()) {
        let tally = Arc::clone(&tally);
        readers.spawn(async move {
            let mut buf = Vec::new();
            while sub.next(&mut buf).await? {
                let now = epoch.elapsed().as_nanos() as u64;
                hist.record_batch(buf.iter().map(|p| now.saturating_sub(intended_of(p))));
                tally.add(buf.len() as u64, epoch);
                buf.clear();
            }
            anyhow::Ok(())
        });
    }

    // Pacing on a dedicated thread: tokio timers tick in milliseconds, far coarser than
    // the 100 µs between events at 10,000/s. The thread hands each event's intended send
    // time to the async publisher; a late send still counts from the intended time.
    let interval_ns = 1e9 / a.rate as f64;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(65_536);
    let pacer = std::thread::spawn(move || {
        for i in 0..count {
            let intended = (i as f64 * interval_ns) as u64;
            let due = epoch + Duration::from_nanos(intended);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if tx.blocking_send(intended).is_err() {
                return;
            }
        }
    });
    let size = a.payload.max(8);
    let mut buf = BytesMut::with_capacity(size * 64);
    while let Some(intended) = rx.recv().await {
        buf.reserve(size);
        buf.put_u64(intended);
        buf.put_bytes(0xAB, size - 8);
        publisher.publish(&subject, buf.split().freeze()).await?;
    }
    publisher.flush().await?;
    let publish_secs = epoch.elapsed().as_secs_f64();
    let _ = pacer.join();
    tally.wait(epoch, progress).await;
    readers.abort_all();

    let mut merged = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for h in &histograms {
        h.merge_into(&mut merged)?;
    }
    let us = |q: f64| merged.value_at_quantile(q) as f64 / 1000.0;
    let latency =
        Percentiles { p50: us(0.5), p90: us(0.9), p99: us(0.99), p999: us(0.999), max: merged.max() as f64 / 1000.0 };
    let mut params = json!({
        "rate": a.rate, "duration": a.duration, "subscribers": a.subscribers,
        "payload": size, "mode": a.mode.name(),
    });
    if a.ack != Ack::Each {
        params["ack"] = json!(a.ack.name());
    }
    Ok(Report {
        system: target.name(),
        workload: "latency",
        params,
        published: count,
        expected: tally.expected,
        received: tally.received(),
        publish_secs,
        deliver_secs: tally.deliver_secs(),
        latency: Some(latency),
    })
}

fn intended_of(payload: &[u8]) -> u64 {
    payload.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes)
}

/// A histogram shared between a subscriber task and the report.
mod parking {
    use std::sync::Mutex;

    use hdrhistogram::Histogram;

    #[derive(Debug)]
    pub(super) struct Hist(Mutex<Histogram<u64>>);

    impl Hist {
        pub(super) fn new() -> Self {
            // 1 ns to 60 s at 3 significant digits: constant, valid bounds.
            Self(Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")))
        }

        pub(super) fn record_batch(&self, values: impl Iterator<Item = u64>) {
            if let Ok(mut h) = self.0.lock() {
                for v in values {
                    h.saturating_record(v.max(1));
                }
            }
        }

        pub(super) fn merge_into(&self, out: &mut Histogram<u64>) -> anyhow::Result<()> {
            if let Ok(h) = self.0.lock() {
                out.add(&*h)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_rates() {
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(rate(10, 2.0), 5.0);
        assert_eq!(rate(10, 0.0), 0.0);
        assert_eq!(intended_of(&42u64.to_be_bytes()), 42);
        assert_eq!(intended_of(b"short"), 0);
    }
}
