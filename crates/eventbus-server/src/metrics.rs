//! Prometheus metrics (README "Operations").
//!
//! Counters are not kept twice: the bus already counts per channel (with a capped label
//! table) on its hot path, and a collector reads those atomics at scrape time. Only the
//! two histograms are observed directly, by the gRPC edge. With metrics disabled none
//! of this exists and the hot path skips the label counters.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventbus_core::{Bus, Event};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Bucket bounds from 10 µs to 10 s: in-process fan-out sits in the microseconds, a
/// publish waiting on a full queue in the hundreds of milliseconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The registry and the metrics observed outside the bus.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    publish_duration: Histogram,
    delivery_latency: Histogram,
    /// Per durable consumer (a handful, named by operators: a bounded label).
    ack_latency: HistogramVec,
}

impl Metrics {
    /// Registers every metric under `prefix` (e.g. `socle_eventbus`).
    pub fn new(prefix: &str, bus: Bus) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let publish_duration = Histogram::with_opts(
            HistogramOpts::new(
                format!("{prefix}_publish_duration_seconds"),
                "Time to accept a publish and offer it to every matching subscription.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let delivery_latency = Histogram::with_opts(
            HistogramOpts::new(
                format!("{prefix}_delivery_latency_seconds"),
                "Time from publish to the event being written on a subscriber's stream.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let ack_latency = HistogramVec::new(
            HistogramOpts::new(
                format!("{prefix}_consumer_ack_latency_seconds"),
                "Time from delivery to ack, per durable consumer.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["consumer"],
        )?;
        registry.register(Box::new(ack_latency.clone()))?;
        registry.register(Box::new(publish_duration.clone()))?;
        registry.register(Box::new(delivery_latency.clone()))?;
        registry.register(Box::new(BusCollector::new(prefix, bus)?))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(Self { registry, publish_duration, delivery_latency, ack_latency })
    }

    /// Serves the edge counters too.
    pub(crate) fn register_edge(&self, edge: &EdgeCounters) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(edge.accept_errors.clone()))?;
        self.registry.register(Box::new(edge.handshake_failures.clone()))?;
        self.registry.register(Box::new(edge.auth_failures.clone()))?;
        self.registry.register(Box::new(edge.permission_denied.clone()))?;
        self.registry.register(Box::new(edge.connections_open.clone()))?;
        self.registry.register(Box::new(edge.connections_refused.clone()))?;
        Ok(())
    }

    pub(crate) fn observe_publish(&self, took: Duration) {
        self.publish_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn observe_ack(&self, consumer: &str, latency: Duration) {
        self.ack_latency.with_label_values(&[consumer]).observe(latency.as_secs_f64());
    }

    /// Records publish-to-stream latency for a batch about to be written.
    pub(crate) fn observe_delivery(&self, events: &[Arc<Event>]) {
        let now = SystemTime::now();
        for event in events {
            let latency = now.duration_since(event.timestamp).unwrap_or_default();
            self.delivery_latency.observe(latency.as_secs_f64());
        }
    }

    /// The text exposition.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// Counters of the network edge: listeners, TLS and access control (README "Security").
/// They exist whether or not metrics are served, so the code that counts never checks.
#[derive(Debug, Clone)]
pub(crate) struct EdgeCounters {
    /// Failed `accept` calls, per listener (`grpc`, `http`).
    pub(crate) accept_errors: IntCounterVec,
    /// TLS handshakes that failed or timed out, per listener.
    pub(crate) handshake_failures: IntCounterVec,
    /// Requests refused for their credentials, per reason.
    pub(crate) auth_failures: IntCounterVec,
    /// Requests refused for want of a right, per operation.
    pub(crate) permission_denied: IntCounterVec,
    /// Connections open, per listener.
    pub(crate) connections_open: IntGaugeVec,
    /// Connections closed at once because the listener was at `server.max_connections`.
    pub(crate) connections_refused: IntCounterVec,
}

impl EdgeCounters {
    pub(crate) fn new(prefix: &str) -> Result<Self, prometheus::Error> {
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(format!("{prefix}_{name}"), help), &[label])
        };
        Ok(Self {
            accept_errors: counter(
                "accept_errors_total",
                "Failed accepts of new connections, per listener.",
                "listener",
            )?,
            handshake_failures: counter(
                "tls_handshake_failures_total",
                "TLS handshakes that failed or timed out, per listener.",
                "listener",
            )?,
            auth_failures: counter(
                "auth_failures_total",
                "Requests refused as unauthenticated, per reason.",
                "reason",
            )?,
            permission_denied: counter(
                "permission_denied_total",
                "Requests refused for want of a permission, per operation.",
                "operation",
            )?,
            connections_open: IntGaugeVec::new(
                Opts::new(format!("{prefix}_connections_open"), "Connections open, per listener."),
                &["listener"],
            )?,
            connections_refused: counter(
                "connections_refused_total",
                "Connections closed at once because the listener was at server.max_connections.",
                "listener",
            )?,
        })
    }
}

/// Reads the bus's counters and queues at scrape time.
#[derive(Debug)]
struct BusCollector {
    bus: Bus,
    published: IntCounterVec,
    delivered: IntCounterVec,
    failed: IntCounterVec,
    dropped: IntCounterVec,
    active: IntGauge,
    queue_size: IntGaugeVec,
    queue_capacity: IntGaugeVec,
    /// Redis mode only.
    redis: Option<(IntGauge, IntCounter)>,
    /// Durable consumers: pending, in flight, acked, redelivered, dead-lettered.
    consumers: [IntCounterVec; 3],
    consumer_gauges: [IntGaugeVec; 2],
}

impl BusCollector {
    fn new(prefix: &str, bus: Bus) -> Result<Self, prometheus::Error> {
        let counter =
            |name: &str, help: &str| IntCounterVec::new(Opts::new(format!("{prefix}_{name}"), help), &["channel"]);
        let gauge =
            |name: &str, help: &str| IntGaugeVec::new(Opts::new(format!("{prefix}_{name}"), help), &["subscription"]);
        Ok(Self {
            published: counter("published_total", "Events published, per channel.")?,
            delivered: counter("delivered_total", "Event copies queued to subscriptions, per channel.")?,
            failed: counter(
                "failed_total",
                "Event copies matching subscriptions could not take at publish, per channel.",
            )?,
            dropped: counter(
                "dropped_total",
                "Events lost (full queue, drop_oldest eviction, closed subscription), per channel.",
            )?,
            active: IntGauge::new(format!("{prefix}_subscriptions_active"), "Open subscriptions.")?,
            queue_size: gauge("queue_size", "Events queued in a subscription, not yet written to its stream.")?,
            queue_capacity: gauge("queue_capacity", "Queue capacity of a subscription.")?,
            redis: match bus.transport_status() {
                None => None,
                Some(_) => Some((
                    IntGauge::new(format!("{prefix}_redis_connected"), "1 while connected to Redis, else 0.")?,
                    IntCounter::new(
                        format!("{prefix}_redis_reconnects_total"),
                        "Reconnections to Redis after a lost connection.",
                    )?,
                )),
            },
            consumers: [
                IntCounterVec::new(
                    Opts::new(format!("{prefix}_consumer_acked_total"), "Events acked, per durable consumer."),
                    &["consumer"],
                )?,
                IntCounterVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_redelivered_total"),
                        "Redeliveries after a failed attempt, per durable consumer.",
                    ),
                    &["consumer"],
                )?,
                IntCounterVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_dead_lettered_total"),
                        "Events dead-lettered, per durable consumer.",
                    ),
                    &["consumer"],
                )?,
            ],
            consumer_gauges: [
                IntGaugeVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_pending"),
                        "Unfinished events not in flight, per durable consumer.",
                    ),
                    &["consumer"],
                )?,
                IntGaugeVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_in_flight"),
                        "Delivered, unacknowledged events, per durable consumer.",
                    ),
                    &["consumer"],
                )?,
            ],
            bus,
        })
    }

    /// Fresh copies of the metric vectors (same descriptors), filled from the bus.
    fn fill(&self) -> Result<Vec<MetricFamily>, prometheus::Error> {
        let fresh = |v: &IntCounterVec| IntCounterVec::new(opts_of(v.desc()[0]), &["channel"]);
        let (published, delivered, failed, dropped) =
            (fresh(&self.published)?, fresh(&self.delivered)?, fresh(&self.failed)?, fresh(&self.dropped)?);
        for label in self.bus.label_stats() {
            let values = [label.label.as_str()];
            published.with_label_values(&values).inc_by(label.published);
            delivered.with_label_values(&values).inc_by(label.delivered);
            failed.with_label_values(&values).inc_by(label.failed);
            dropped.with_label_values(&values).inc_by(label.dropped);
        }
        let gauge = |v: &IntGaugeVec| IntGaugeVec::new(opts_of(v.desc()[0]), &["subscription"]);
        let (size, capacity) = (gauge(&self.queue_size)?, gauge(&self.queue_capacity)?);
        let subscriptions = self.bus.subscriptions();
        for s in &subscriptions {
            size.with_label_values(&[s.id.as_str()]).set(s.pending as i64);
            capacity.with_label_values(&[s.id.as_str()]).set(s.capacity as i64);
        }
        let active = IntGauge::with_opts(opts_of(self.active.desc()[0]))?;
        active.set(subscriptions.len() as i64);

        let mut families = Vec::new();
        for c in [&published, &delivered, &failed, &dropped] {
            families.extend(c.collect());
        }
        families.extend(active.collect());
        families.extend(size.collect());
        families.extend(capacity.collect());
        if let Some(durable) = self.bus.durable() {
            let counters = self.consumers.each_ref().map(|c| IntCounterVec::new(opts_of(c.desc()[0]), &["consumer"]));
            let gauges = self.consumer_gauges.each_ref().map(|g| IntGaugeVec::new(opts_of(g.desc()[0]), &["consumer"]));
            let [acked, redelivered, dead] = counters;
            let [pending, in_flight] = gauges;
            let (acked, redelivered, dead, pending, in_flight) = (acked?, redelivered?, dead?, pending?, in_flight?);
            for info in durable.consumers_snapshot() {
                let name = [info.config.name.as_str()];
                acked.with_label_values(&name).inc_by(info.acked);
                redelivered.with_label_values(&name).inc_by(info.redelivered);
                dead.with_label_values(&name).inc_by(info.dead_lettered);
                pending.with_label_values(&name).set(info.pending as i64);
                in_flight.with_label_values(&name).set(info.in_flight as i64);
            }
            families.extend(acked.collect());
            families.extend(redelivered.collect());
            families.extend(dead.collect());
            families.extend(pending.collect());
            families.extend(in_flight.collect());
        }
        if let (Some((connected, reconnects)), Some(status)) = (&self.redis, self.bus.transport_status()) {
            let status = *status.borrow();
            let connected = IntGauge::with_opts(opts_of(connected.desc()[0]))?;
            connected.set(i64::from(status.connected));
            let reconnects = IntCounter::with_opts(opts_of(reconnects.desc()[0]))?;
            reconnects.inc_by(status.reconnects);
            families.extend(connected.collect());
            families.extend(reconnects.collect());
        }
        Ok(families)
    }
}

fn opts_of(desc: &Desc) -> Opts {
    Opts::new(desc.fq_name.clone(), desc.help.clone())
}

impl Collector for BusCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = Vec::new();
        for c in [&self.published, &self.delivered, &self.failed, &self.dropped] {
            descs.extend(c.desc());
        }
        descs.extend(self.active.desc());
        descs.extend(self.queue_size.desc());
        descs.extend(self.queue_capacity.desc());
        for c in &self.consumers {
            descs.extend(c.desc());
        }
        for g in &self.consumer_gauges {
            descs.extend(g.desc());
        }
        if let Some((connected, reconnects)) = &self.redis {
            descs.extend(connected.desc());
            descs.extend(reconnects.desc());
        }
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.fill().unwrap_or_else(|err| {
            tracing::error!(%err, "cannot collect bus metrics");
            Vec::new()
        })
    }
}
