//! The durable workload's arguments and report, shared by `eventbus bench durable` and
//! the JetStream run in `bench/peers`, so both are driven and reported alike. (The runs
//! themselves differ: each system has its own consumer API.)

pub use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::PublishMode;

#[derive(Debug, Clone, clap::Args)]
pub struct DurableArgs {
    /// Concurrent publishers (each its own connection, each publish awaited).
    #[arg(long, default_value_t = 16)]
    pub publishers: usize,
    /// Events to publish, then consume.
    #[arg(long, default_value_t = 20_000)]
    pub count: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    pub payload: usize,
    /// Deliveries fetched (and acked) per batch when consuming.
    #[arg(long, default_value_t = 256)]
    pub max_batch: u32,
    /// `unary`: each publish awaited before the next; `stream`: each publisher keeps
    /// up to [`STREAM_WINDOW`] publishes unanswered (eventbus: one `PublishStream`;
    /// JetStream: asynchronous publishes, acks awaited in order); `batch`: eventbus
    /// sends [`STREAM_WINDOW`] events per `PublishBatch`, each call awaited (JetStream:
    /// as `stream`); `client`: the publishers are tasks sharing one client, each awaiting
    /// `publish()` (eventbus: the client's shared `PublishStream`; JetStream: one
    /// connection, `publish().await` and its ack).
    #[arg(long, value_enum, default_value_t = PublishMode::Unary)]
    pub mode: PublishMode,
}

/// Publishes a `stream` publisher may have sent and not yet seen acknowledged.
pub const STREAM_WINDOW: usize = 32;

impl DurableArgs {
    fn mode_name(&self) -> &'static str {
        self.mode.name()
    }
}

/// A new histogram of nanoseconds (1 ns to 60 s, 3 significant digits).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// What a durable run measured.
#[derive(Debug)]
pub struct DurableReport<'a> {
    pub system: &'static str,
    pub args: &'a DurableArgs,
    pub publish_secs: f64,
    /// Publish latencies in nanoseconds.
    pub latency: Histogram<u64>,
    pub consumed: u64,
    pub consume_secs: f64,
}

impl DurableReport<'_> {
    fn us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn to_json(&self) -> Value {
        let a = self.args;
        json!({
            "system": self.system, "workload": "durable",
            "params": {"publishers": a.publishers, "count": a.count, "payload": a.payload, "max_batch": a.max_batch, "mode": a.mode_name()},
            "published_per_sec": (a.count as f64 / self.publish_secs).round(),
            "publish_latency_us": {"p50": self.us(0.5), "p90": self.us(0.9), "p99": self.us(0.99), "max": self.latency.max() as f64 / 1000.0},
            "consumed_per_sec": (self.consumed as f64 / self.consume_secs).round(),
        })
    }

    pub fn human(&self) -> String {
        let a = self.args;
        format!(
            "{} durable (publishers={} count={} payload={} max_batch={} mode={})\n  durable publish  {:>10.0}/s   latency µs p50 {:.0}  p90 {:.0}  p99 {:.0}  max {:.0}\n  consume + ack    {:>10.0}/s\n",
            self.system,
            a.publishers,
            a.count,
            a.payload,
            a.max_batch,
            a.mode_name(),
            a.count as f64 / self.publish_secs,
            self.us(0.5),
            self.us(0.9),
            self.us(0.99),
            self.latency.max() as f64 / 1000.0,
            self.consumed as f64 / self.consume_secs,
        )
    }
}
