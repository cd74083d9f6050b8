//! The push worker's Prometheus metrics, labelled by consumer.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// `socle_push_worker_*` metrics on the host application's registry. Register once
/// per registry and give clones to every worker: each worker uses its consumer's label.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    processed: IntCounterVec,
    failed: IntCounterVec,
    in_flight: IntGaugeVec,
    handle_seconds: HistogramVec,
}

impl WorkerMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let labels = &["consumer"];
        let metrics = Self {
            processed: IntCounterVec::new(
                Opts::new("socle_push_worker_processed_total", "Events whose handler succeeded (acked)."),
                labels,
            )?,
            failed: IntCounterVec::new(
                Opts::new("socle_push_worker_failed_total", "Handler attempts that failed (retried or terminal)."),
                labels,
            )?,
            in_flight: IntGaugeVec::new(Opts::new("socle_push_worker_in_flight", "Handlers running now."), labels)?,
            handle_seconds: HistogramVec::new(
                HistogramOpts::new("socle_push_worker_handle_seconds", "Time spent in the handler, per event."),
                labels,
            )?,
        };
        registry.register(Box::new(metrics.processed.clone()))?;
        registry.register(Box::new(metrics.failed.clone()))?;
        registry.register(Box::new(metrics.in_flight.clone()))?;
        registry.register(Box::new(metrics.handle_seconds.clone()))?;
        Ok(metrics)
    }

    pub(super) fn for_consumer(&self, consumer: &str) -> ConsumerMetrics {
        ConsumerMetrics {
            processed: self.processed.with_label_values(&[consumer]),
            failed: self.failed.with_label_values(&[consumer]),
            in_flight: self.in_flight.with_label_values(&[consumer]),
            handle_seconds: self.handle_seconds.with_label_values(&[consumer]),
        }
    }
}

/// One consumer's series, resolved once.
#[derive(Debug, Clone)]
pub(super) struct ConsumerMetrics {
    pub(super) processed: IntCounter,
    pub(super) failed: IntCounter,
    pub(super) in_flight: IntGauge,
    pub(super) handle_seconds: prometheus::Histogram,
}
