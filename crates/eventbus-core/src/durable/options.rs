//! Settings both durable engines take.

use std::sync::Arc;
use std::time::Duration;

use crate::durable::dead_letter::DeadLetterEncoder;
use crate::tasks::Supervisor;

/// Observes ack latency (delivery to ack) per consumer, for metrics.
pub type AckObserver = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// Engine settings.
#[derive(Clone)]
pub struct DurableOptions {
    pub dedup_window: Duration,
    pub dead_letter_encoder: DeadLetterEncoder,
    pub on_ack: Option<AckObserver>,
    /// The embedded store refuses captures, and the instance is not ready, while its
    /// disk has less free space than this (`durable.min_free_disk_bytes`; 0 = no
    /// check). The Redis engine has no disk of its own and ignores it.
    pub min_free_disk_bytes: u64,
    /// A publish matching more consumers than this is refused
    /// (`durable.max_captures_per_publish`; 0 = no bound).
    pub max_captures_per_publish: usize,
    /// Starts the engine's background tasks and reports one that stops.
    pub supervisor: Supervisor,
}

impl std::fmt::Debug for DurableOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableOptions").field("dedup_window", &self.dedup_window).finish_non_exhaustive()
    }
}
