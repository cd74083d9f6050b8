//! Prometheus metrics (docs/operations.md).
//!
//! Counters are not kept twice: the bus already counts per channel (with a capped label
//! table) on its hot path, and a collector reads those atomics at scrape time. Only the
//! two histograms are observed directly, by the gRPC edge. With metrics disabled none
//! of this exists and the hot path skips the label counters.
//!
//! Every label has a bounded set of values (docs/operations.md "Cardinality"): channels are
//! capped by the bus (`max_channel_labels`), subscriptions by `max_subscription_labels`
//! (the fullest queues, the rest summed), durable consumers by `max_consumer_labels`,
//! and the other labels (listener, reason, operation) are fixed sets.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventbus_core::{Bus, Event, OTHER_LABEL, QueueLevel, TransportStatus};
use parking_lot::Mutex;
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
    /// Publishes refused one by one (the event was read and not published), per gRPC
    /// status code: what a publisher that waits for no answer does not look at.
    publish_refused: IntCounterVec,
    /// Subscriptions that asked to recover, by outcome, and the events recovered.
    recoveries: IntCounterVec,
    recovered_events: IntCounter,
    delivery_latency: Histogram,
    /// Per durable consumer, for the first `max_consumer_labels` consumers that ack;
    /// the others share `_other`.
    ack_latency: HistogramVec,
    ack_labels: Mutex<HashSet<String>>,
    max_consumer_labels: usize,
    /// For the consumers that still exist when a scrape renders.
    bus: Bus,
}

/// How many values the per-subscription and per-consumer labels may take.
#[derive(Debug, Clone, Copy)]
pub struct LabelLimits {
    /// `metrics.max_subscription_labels`.
    pub subscriptions: usize,
    /// `metrics.max_consumer_labels`.
    pub consumers: usize,
}

impl Metrics {
    /// Registers every metric under `prefix` (e.g. `socle_eventbus`).
    pub fn new(prefix: &str, limits: LabelLimits, bus: Bus) -> Result<Self, prometheus::Error> {
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
        let publish_refused = IntCounterVec::new(
            Opts::new(
                format!("{prefix}_publish_refused_total"),
                "Publishes refused (read and not published), per gRPC status code.",
            ),
            &["code"],
        )?;
        registry.register(Box::new(publish_refused.clone()))?;
        let recoveries = IntCounterVec::new(
            Opts::new(
                format!("{prefix}_history_recoveries_total"),
                "Subscriptions that asked to recover from history, per outcome: complete, or incomplete (history \
                 no longer held part of what was asked).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(recoveries.clone()))?;
        let recovered_events =
            IntCounter::new(format!("{prefix}_history_recovered_total"), "Events recovered from history.")?;
        registry.register(Box::new(recovered_events.clone()))?;
        registry.register(Box::new(delivery_latency.clone()))?;
        registry.register(Box::new(BusCollector::new(prefix, limits, bus.clone())?))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(crate::process_metrics::ProcessCollector::new()?))?;
        Ok(Self {
            registry,
            publish_duration,
            publish_refused,
            recoveries,
            recovered_events,
            delivery_latency,
            ack_latency,
            ack_labels: Mutex::default(),
            max_consumer_labels: limits.consumers,
            bus,
        })
    }

    /// Serves the edge counters too.
    pub(crate) fn register_edge(&self, edge: &EdgeCounters) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(edge.accept_errors.clone()))?;
        self.registry.register(Box::new(edge.handshake_failures.clone()))?;
        self.registry.register(Box::new(edge.handshakes_evicted.clone()))?;
        self.registry.register(Box::new(edge.auth_failures.clone()))?;
        self.registry.register(Box::new(edge.permission_denied.clone()))?;
        self.registry.register(Box::new(edge.connections_open.clone()))?;
        self.registry.register(Box::new(edge.connections_refused.clone()))?;
        self.registry.register(Box::new(edge.connections_idle_closed.clone()))?;
        Ok(())
    }

    /// Serves the push consumers' metrics too.
    pub(crate) fn register_push(&self, push: &PushMetrics) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(push.requests.clone()))?;
        self.registry.register(Box::new(push.duration.clone()))?;
        self.registry.register(Box::new(push.in_flight.clone()))?;
        self.registry.register(Box::new(push.owner_revoked.clone()))?;
        Ok(())
    }

    pub(crate) fn observe_publish(&self, took: Duration) {
        self.publish_duration.observe(took.as_secs_f64());
    }

    /// Counts a subscription's recovery from history.
    pub(crate) fn count_recovery(&self, complete: bool, events: usize) {
        self.recoveries.with_label_values(&[if complete { "complete" } else { "incomplete" }]).inc();
        self.recovered_events.inc_by(events as u64);
    }

    /// Counts a refused publish.
    pub(crate) fn count_refused(&self, code: tonic::Code) {
        self.publish_refused.with_label_values(&[code_label(code)]).inc();
    }

    pub(crate) fn observe_ack(&self, consumer: &str, latency: Duration) {
        let label = {
            let mut labels = self.ack_labels.lock();
            if labels.contains(consumer)
                || (labels.len() < self.max_consumer_labels && labels.insert(consumer.to_owned()))
            {
                consumer
            } else {
                OTHER_LABEL
            }
        };
        self.ack_latency.with_label_values(&[label]).observe(latency.as_secs_f64());
    }

    /// Records publish-to-stream latency for a batch about to be written.
    pub(crate) fn observe_delivery(&self, events: &[Arc<Event>]) {
        let now = SystemTime::now();
        for event in events {
            let latency = now.duration_since(event.timestamp).unwrap_or_default();
            self.delivery_latency.observe(latency.as_secs_f64());
        }
    }

    /// Removes the ack latency series of consumers deleted since (on any instance):
    /// a scrape shows only consumers that exist, and their labels go to new ones.
    fn forget_deleted_consumers(&self) {
        let Some(durable) = self.bus.durable() else { return };
        let existing: HashSet<String> = durable.consumers_snapshot().into_iter().map(|c| c.config.name).collect();
        self.ack_labels.lock().retain(|label| {
            let exists = existing.contains(label);
            if !exists {
                // Absent when no ack was observed under it yet.
                let _ = self.ack_latency.remove_label_values(&[label]);
            }
            exists
        });
    }

    /// The text exposition.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        self.forget_deleted_consumers();
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// The answer classes a push request counts under.
pub(crate) const PUSH_CLASSES: [&str; 6] = ["2xx", "3xx", "4xx", "5xx", "timeout", "error"];

/// Push consumers' requests (docs/push.md), per consumer: the first
/// `max_consumer_labels` push consumers of this instance get their own label, the
/// others share `_other`. They exist whether or not metrics are served.
#[derive(Debug, Clone)]
pub(crate) struct PushMetrics {
    /// Requests by answer class: `2xx`, `3xx`, `4xx`, `5xx`, `timeout`, `error`.
    pub(crate) requests: IntCounterVec,
    pub(crate) duration: HistogramVec,
    pub(crate) in_flight: IntGaugeVec,
    /// 1 while a consumer is stopped because its owner lost its rights.
    pub(crate) owner_revoked: IntGaugeVec,
    labels: Arc<Mutex<HashSet<String>>>,
    max_labels: usize,
}

impl PushMetrics {
    pub(crate) fn new(prefix: &str, max_labels: usize) -> Result<Self, prometheus::Error> {
        Ok(Self {
            requests: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_push_requests_total"),
                    "Requests to push endpoints, per consumer and answer class (2xx, 3xx, 4xx, 5xx, timeout, \
                     error: no answer).",
                ),
                &["consumer", "class"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    format!("{prefix}_push_request_duration_seconds"),
                    "Time from sending a push request to its answer (or its failure), per consumer.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["consumer"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new(format!("{prefix}_push_in_flight"), "Push requests waiting for their answer, per consumer."),
                &["consumer"],
            )?,
            owner_revoked: IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_push_owner_revoked"),
                    "1 while a push consumer sends nothing because its owner is no longer a principal or lost the \
                     right to subscribe to its channels, per consumer.",
                ),
                &["consumer"],
            )?,
            labels: Arc::default(),
            max_labels,
        })
    }

    /// Removes a consumer's series (deleted, or no longer pushed) and frees its label;
    /// the shared `_other` series stay.
    pub(crate) fn forget(&self, consumer: &str) {
        if !self.labels.lock().remove(consumer) {
            return;
        }
        // Absent when never touched under that label.
        for class in PUSH_CLASSES {
            let _ = self.requests.remove_label_values(&[consumer, class]);
        }
        let _ = self.duration.remove_label_values(&[consumer]);
        let _ = self.in_flight.remove_label_values(&[consumer]);
        let _ = self.owner_revoked.remove_label_values(&[consumer]);
    }

    /// The label of `consumer`'s series: its name while there is room, else `_other`.
    pub(crate) fn label(&self, consumer: &str) -> String {
        let mut labels = self.labels.lock();
        if labels.contains(consumer) || (labels.len() < self.max_labels && labels.insert(consumer.to_owned())) {
            consumer.to_owned()
        } else {
            OTHER_LABEL.to_owned()
        }
    }
}

/// Counters of the network edge: listeners, TLS and access control (docs/security.md).
/// They exist whether or not metrics are served, so the code that counts never checks.
#[derive(Debug, Clone)]
pub(crate) struct EdgeCounters {
    /// Failed `accept` calls, per listener (`grpc`, `http`).
    pub(crate) accept_errors: IntCounterVec,
    /// TLS handshakes that failed or timed out, per listener.
    pub(crate) handshake_failures: IntCounterVec,
    /// Connections closed before their TLS handshake began: silent past the first-byte
    /// deadline, or evicted to make room for newer ones, per listener.
    pub(crate) handshakes_evicted: IntCounterVec,
    /// Requests refused for their credentials, per reason.
    pub(crate) auth_failures: IntCounterVec,
    /// Requests refused for want of a right, per operation.
    pub(crate) permission_denied: IntCounterVec,
    /// Connections open, per listener.
    pub(crate) connections_open: IntGaugeVec,
    /// Connections closed at once because the listener was at `server.max_connections`.
    pub(crate) connections_refused: IntCounterVec,
    /// Connections closed after `server.idle_timeout_ms` with no request in progress.
    pub(crate) connections_idle_closed: IntCounterVec,
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
            handshakes_evicted: counter(
                "tls_handshakes_evicted_total",
                "Connections closed before their TLS handshake began (silent past the first-byte deadline, \
                 or evicted by newer ones), per listener.",
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
            connections_idle_closed: counter(
                "connections_idle_closed_total",
                "Connections closed after server.idle_timeout_ms without a request in progress, per listener.",
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
    queue_bytes: IntGaugeVec,
    queued_bytes: IntGauge,
    max_queued_bytes: IntGauge,
    dropped_by_reason: IntCounterVec,
    channels_tracked: IntGauge,
    channels_evicted: IntCounter,
    overflow_dead_letters: IntCounterVec,
    /// `in_memory` history: bytes kept, events trimmed by reason.
    history_bytes: IntGauge,
    history_trimmed: IntCounterVec,
    limits: LabelLimits,
    /// Redis mode only.
    /// redis mode: connected, reconnects, subscription gaps, slots without a master.
    redis: Option<RedisMetrics>,
    /// Durable consumers: acked, redelivered, dead-lettered, redriven, dropped; pending, in
    /// flight, paused.
    consumers: [IntCounterVec; 5],
    consumer_gauges: [IntGaugeVec; 3],
}

impl BusCollector {
    fn new(prefix: &str, limits: LabelLimits, bus: Bus) -> Result<Self, prometheus::Error> {
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
            queue_bytes: gauge(
                "queue_bytes",
                "Bytes queued in a subscription (each event's approximate size), not yet written to its stream.",
            )?,
            queued_bytes: IntGauge::new(
                format!("{prefix}_queued_bytes"),
                "Bytes queued across subscriptions, each event counted once however many queues hold it.",
            )?,
            max_queued_bytes: IntGauge::new(
                format!("{prefix}_max_queued_bytes"),
                "The budget of queued bytes (eventbus.max_queued_bytes).",
            )?,
            dropped_by_reason: IntCounterVec::new(
                Opts::new(format!("{prefix}_dropped_by_reason_total"), "Events lost, per reason."),
                &["reason"],
            )?,
            channels_tracked: IntGauge::new(
                format!("{prefix}_channels_tracked"),
                "Channels in the channel table (at most eventbus.max_tracked_channels).",
            )?,
            channels_evicted: IntCounter::new(
                format!("{prefix}_channels_evicted_total"),
                "Channels forgotten to keep the channel table within eventbus.max_tracked_channels.",
            )?,
            overflow_dead_letters: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_overflow_dead_letters_total"),
                    "Events full DEAD_LETTER subscriptions refused, per outcome: published to dlq.overflow.<channel>, \
                     failed (lost), skipped (already on a dead-letter channel: dropped only).",
                ),
                &["outcome"],
            )?,
            history_bytes: IntGauge::new(
                format!("{prefix}_history_bytes"),
                "Bytes of channel history kept in memory (at most eventbus.history_max_bytes).",
            )?,
            history_trimmed: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_history_trimmed_total"),
                    "Events that left a channel's in-memory history, per bound: size, bytes, age.",
                ),
                &["reason"],
            )?,
            limits,
            redis: match bus.transport_status() {
                None => None,
                Some(_) => Some(RedisMetrics::new(prefix)?),
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
                IntCounterVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_redriven_total"),
                        "Dead-lettered events put back by RedriveDeadLetters, per durable consumer.",
                    ),
                    &["consumer"],
                )?,
                IntCounterVec::new(
                    Opts::new(
                        format!("{prefix}_consumer_dropped_total"),
                        "Publishes not captured because the consumer held max_pending events, per durable consumer.",
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
                IntGaugeVec::new(
                    Opts::new(format!("{prefix}_consumer_paused"), "1 while a durable consumer is paused, else 0."),
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
        let (size, capacity, bytes) =
            (gauge(&self.queue_size)?, gauge(&self.queue_capacity)?, gauge(&self.queue_bytes)?);
        let levels = self.bus.queue_levels();
        let active = IntGauge::with_opts(opts_of(self.active.desc()[0]))?;
        active.set(levels.len() as i64);
        for (label, level) in labelled_levels(levels, self.limits.subscriptions) {
            let values = [&*label];
            size.with_label_values(&values).set(level.pending as i64);
            capacity.with_label_values(&values).set(level.capacity as i64);
            bytes.with_label_values(&values).set(level.queued_bytes as i64);
        }
        let queued_bytes = IntGauge::with_opts(opts_of(self.queued_bytes.desc()[0]))?;
        queued_bytes.set(self.bus.queued_bytes() as i64);
        let max_queued_bytes = IntGauge::with_opts(opts_of(self.max_queued_bytes.desc()[0]))?;
        max_queued_bytes.set(self.bus.config().max_queued_bytes as i64);
        let by_reason = IntCounterVec::new(opts_of(self.dropped_by_reason.desc()[0]), &["reason"])?;
        for (reason, n) in self.bus.dropped_by_reason() {
            by_reason.with_label_values(&[reason.as_str()]).inc_by(n);
        }
        let channels_tracked = IntGauge::with_opts(opts_of(self.channels_tracked.desc()[0]))?;
        channels_tracked.set(self.bus.stats().active_channels as i64);
        let channels_evicted = IntCounter::with_opts(opts_of(self.channels_evicted.desc()[0]))?;
        channels_evicted.inc_by(self.bus.channels_evicted());

        let mut families = Vec::new();
        for c in [&published, &delivered, &failed, &dropped, &by_reason] {
            families.extend(c.collect());
        }
        families.extend(active.collect());
        families.extend(size.collect());
        families.extend(capacity.collect());
        families.extend(bytes.collect());
        for g in [&queued_bytes, &max_queued_bytes, &channels_tracked] {
            families.extend(g.collect());
        }
        families.extend(channels_evicted.collect());
        let overflow = IntCounterVec::new(opts_of(self.overflow_dead_letters.desc()[0]), &["outcome"])?;
        for (outcome, n) in self.bus.overflow_dead_letters() {
            overflow.with_label_values(&[outcome]).inc_by(n);
        }
        families.extend(overflow.collect());
        if let (Some(kept), Some(trimmed)) = (self.bus.history_bytes(), self.bus.history_trimmed()) {
            let bytes = IntGauge::with_opts(opts_of(self.history_bytes.desc()[0]))?;
            bytes.set(kept as i64);
            families.extend(bytes.collect());
            let by_reason = IntCounterVec::new(opts_of(self.history_trimmed.desc()[0]), &["reason"])?;
            for (reason, n) in trimmed {
                by_reason.with_label_values(&[reason.as_str()]).inc_by(n);
            }
            families.extend(by_reason.collect());
        }
        if let Some(durable) = self.bus.durable() {
            let counters = self.consumers.each_ref().map(|c| IntCounterVec::new(opts_of(c.desc()[0]), &["consumer"]));
            let gauges = self.consumer_gauges.each_ref().map(|g| IntGaugeVec::new(opts_of(g.desc()[0]), &["consumer"]));
            let [acked, redelivered, dead, redriven, dropped] = counters;
            let [pending, in_flight, paused] = gauges;
            let (acked, redelivered, dead, redriven, dropped) = (acked?, redelivered?, dead?, redriven?, dropped?);
            let (pending, in_flight, paused) = (pending?, in_flight?, paused?);
            let mut consumers = durable.consumers_snapshot();
            // The first consumers by name keep their own label; the rest are summed
            // (`paused` then counts the paused ones).
            consumers.sort_by(|a, b| a.config.name.cmp(&b.config.name));
            for (i, info) in consumers.iter().enumerate() {
                let name = [if i < self.limits.consumers { info.config.name.as_str() } else { OTHER_LABEL }];
                acked.with_label_values(&name).inc_by(info.acked);
                redelivered.with_label_values(&name).inc_by(info.redelivered);
                dead.with_label_values(&name).inc_by(info.dead_lettered);
                redriven.with_label_values(&name).inc_by(info.redriven);
                dropped.with_label_values(&name).inc_by(info.dropped);
                pending.with_label_values(&name).add(info.pending as i64);
                in_flight.with_label_values(&name).add(info.in_flight as i64);
                paused.with_label_values(&name).add(i64::from(info.paused));
            }
            families.extend(acked.collect());
            families.extend(redelivered.collect());
            families.extend(dead.collect());
            families.extend(redriven.collect());
            families.extend(dropped.collect());
            families.extend(pending.collect());
            families.extend(in_flight.collect());
            families.extend(paused.collect());
        }
        if let (Some(redis), Some(status)) = (&self.redis, self.bus.transport_status()) {
            let status = *status.borrow();
            families.extend(redis.fill(&status)?);
        }
        Ok(families)
    }
}

/// The `max` fullest queues (by events, then bytes) under their own id, and the sum of
/// the rest under [`OTHER_LABEL`] (present only when there is a rest).
fn labelled_levels(mut levels: Vec<QueueLevel>, max: usize) -> Vec<(Arc<str>, QueueLevel)> {
    if levels.len() > max {
        levels.select_nth_unstable_by(max, |a, b| (b.pending, b.queued_bytes).cmp(&(a.pending, a.queued_bytes)));
    }
    let rest = levels.split_off(max.min(levels.len()));
    let mut out: Vec<(Arc<str>, QueueLevel)> = levels.into_iter().map(|l| (Arc::clone(&l.id), l)).collect();
    if !rest.is_empty() {
        let other: Arc<str> = OTHER_LABEL.into();
        let sum = rest.iter().fold(
            QueueLevel { id: Arc::clone(&other), pending: 0, capacity: 0, queued_bytes: 0, max_queue_bytes: 0 },
            |mut sum, l| {
                sum.pending += l.pending;
                sum.capacity += l.capacity;
                sum.queued_bytes += l.queued_bytes;
                sum.max_queue_bytes += l.max_queue_bytes;
                sum
            },
        );
        out.push((other, sum));
    }
    out
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
        descs.extend(self.queue_bytes.desc());
        descs.extend(self.dropped_by_reason.desc());
        for g in [&self.queued_bytes, &self.max_queued_bytes, &self.channels_tracked] {
            descs.extend(g.desc());
        }
        descs.extend(self.channels_evicted.desc());
        descs.extend(self.overflow_dead_letters.desc());
        descs.extend(self.history_bytes.desc());
        descs.extend(self.history_trimmed.desc());
        for c in &self.consumers {
            descs.extend(c.desc());
        }
        for g in &self.consumer_gauges {
            descs.extend(g.desc());
        }
        if let Some(redis) = &self.redis {
            descs.extend(redis.descs());
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

/// The transport's connection state (redis mode), filled from its status at each scrape.
#[derive(Debug)]
struct RedisMetrics {
    connected: IntGauge,
    degraded_slots: IntGauge,
    reconnects: IntCounter,
    gaps: IntCounter,
    unroutable: IntCounter,
}

impl RedisMetrics {
    fn new(prefix: &str) -> prometheus::Result<Self> {
        Ok(Self {
            connected: IntGauge::new(format!("{prefix}_redis_connected"), "1 while connected to Redis, else 0.")?,
            degraded_slots: IntGauge::new(
                format!("{prefix}_redis_cluster_degraded_slots"),
                "Redis Cluster: hash slots without a serving master now (their channels' publishes fail).",
            )?,
            reconnects: IntCounter::new(
                format!("{prefix}_redis_reconnects_total"),
                "Reconnections to Redis after a lost connection.",
            )?,
            gaps: IntCounter::new(
                format!("{prefix}_redis_subscription_gaps_total"),
                "Redis Cluster: sharded subscriptions interrupted by a failover, a slot migration or a lost node \
                 connection, then restored (events published meanwhile were missed).",
            )?,
            unroutable: IntCounter::new(
                format!("{prefix}_redis_unroutable_total"),
                "Redis Cluster: messages on a shard channel without an eventbus envelope naming their channel, \
                 dropped.",
            )?,
        })
    }

    fn descs(&self) -> Vec<&Desc> {
        [&self.connected, &self.degraded_slots]
            .into_iter()
            .flat_map(|g| g.desc())
            .chain([&self.reconnects, &self.gaps, &self.unroutable].into_iter().flat_map(|c| c.desc()))
            .collect()
    }

    fn fill(&self, status: &TransportStatus) -> prometheus::Result<Vec<MetricFamily>> {
        let mut families = Vec::new();
        for (gauge, value) in
            [(&self.connected, i64::from(status.connected)), (&self.degraded_slots, i64::from(status.degraded_slots))]
        {
            let fresh = IntGauge::with_opts(opts_of(gauge.desc()[0]))?;
            fresh.set(value);
            families.extend(fresh.collect());
        }
        for (counter, value) in
            [(&self.reconnects, status.reconnects), (&self.gaps, status.gaps), (&self.unroutable, status.unroutable)]
        {
            let fresh = IntCounter::with_opts(opts_of(counter.desc()[0]))?;
            fresh.inc_by(value);
            families.extend(fresh.collect());
        }
        Ok(families)
    }
}

/// A gRPC status code as a label value (the `google.rpc.Code` name, lower case).
fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}
