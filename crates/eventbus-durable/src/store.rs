//! What the embedded engine keeps, and the trait a store implements.
//!
//! The engine holds the working state in memory and sends every change to the store as
//! [`StoreOp`]s, many at a time: [`Store::apply`] commits a batch atomically, so
//! concurrent publishes share one commit (and one fsync). [`Store::load`] rebuilds the
//! engine after a restart.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::durable::{BoxError, ConsumerConfig, DurableError, Failure, LogEntry, LogStatus};
use serde::{Deserialize, Serialize};

/// How hard commits push to disk (`durable.fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Every commit is on disk before it is answered.
    Always,
    /// Commits are answered once the operating system has them (a crash of the
    /// process loses nothing) and synced within [`BATCH_FLUSH_MS`]: a crash of the
    /// machine can lose the last ones.
    Batch,
}

/// With [`Fsync::Batch`], the longest a commit waits to be made durable.
pub const BATCH_FLUSH_MS: u64 = 100;

/// Why the store failed. Publishes and acks that hit it are refused, never faked; the
/// wire layers answer it as an internal error and log its cause.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the durable store at {path}")]
    Open {
        path: String,
        #[source]
        source: BoxError,
    },
    /// Another process (another eventbusd) has the store open.
    #[error("the durable store at {path} is in use by another process")]
    Locked { path: String },
    #[error("the durable store at {path} is refused: {reason}")]
    Refused { path: String, reason: String },
    #[error("durable store I/O failed")]
    Io(#[source] BoxError),
    #[error("corrupt record in the durable store: {what}")]
    Corrupt {
        what: String,
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    /// A record that does not read back.
    pub fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt { what: what.into(), source: None }
    }
}

impl From<StoreError> for DurableError {
    fn from(err: StoreError) -> Self {
        match err {
            // Out until the process restarts and recovers from its journal (its
            // liveness fails meanwhile): the same call succeeds then, or elsewhere.
            StoreError::Refused { .. } => DurableError::unavailable_because(
                "the durable store refuses writes after one failed, until eventbusd restarts",
                err,
            ),
            err => DurableError::internal("durable store", err),
        }
    }
}

/// The state of a new entry (`EntryRecord::default()` as JSON), written by every
/// capture: spelled out rather than serialised per event.
pub(crate) const FRESH_ENTRY: &str = r#"{"attempts":0,"first_delivered_ms":null,"failures":[],"due_ms":null}"#;

/// Free space on the disk holding `dir`, in bytes; `None` (logged) when unreadable.
pub(crate) fn free_space(dir: &std::path::Path) -> Option<u64> {
    match rustix::fs::statvfs(dir) {
        Ok(fs) => Some(fs.f_bavail.saturating_mul(fs.f_frsize)),
        Err(err) => {
            tracing::warn!(dir = %dir.display(), %err, "cannot read the free space of the durable store's disk");
            None
        }
    }
}

/// An unfinished event of one consumer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRecord {
    /// Deliveries so far.
    pub attempts: u32,
    pub first_delivered_ms: Option<u64>,
    pub failures: Vec<Failure>,
    /// When a failed event is due again (ms since the epoch); `None` = ready now.
    pub due_ms: Option<u64>,
}

/// A dead-lettered event kept for redrive (its event stays stored), as both stores
/// keep it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DeadRecord {
    pub(crate) event_id: String,
    pub(crate) channel: String,
    pub(crate) attempts: u32,
    pub(crate) at_ms: u64,
}

impl DeadRecord {
    /// The record of the event its `DeadLettered` log line names.
    pub(crate) fn of(log: &LogEntry, at_ms: u64) -> Self {
        Self { event_id: log.event_id.clone(), channel: log.channel.clone(), attempts: log.attempts, at_ms }
    }

    /// The `Redriven` log line of putting it back.
    pub(crate) fn redriven(self, now_ms: u64) -> LogEntry {
        LogEntry {
            event_id: self.event_id,
            channel: self.channel,
            status: LogStatus::Redriven,
            attempts: self.attempts,
            first_delivered_ms: None,
            finished_ms: now_ms,
            failures: Vec::new(),
        }
    }
}

/// An idempotency key seen, and the event it named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    pub key: String,
    pub event_id: String,
    pub expires_ms: u64,
}

/// A change to durable state.
#[derive(Debug, Clone)]
pub enum StoreOp {
    PutConsumer(ConsumerConfig),
    /// Removes the consumer and everything it still holds.
    DeleteConsumer(String),
    /// A published event, kept for each consumer whose filter matched it.
    Capture {
        seq: u64,
        event: Arc<Event>,
        ordering_key: Option<Arc<str>>,
        consumers: Vec<Arc<str>>,
        dedup: Option<DedupRecord>,
    },
    /// An idempotency key of a publish no consumer captured.
    Dedup(DedupRecord),
    /// New attempt count, failures or due time of an unfinished event.
    Update {
        consumer: Arc<str>,
        seq: u64,
        entry: EntryRecord,
    },
    /// The event is done for this consumer: into the terminal log.
    Finish {
        consumer: Arc<str>,
        seq: u64,
        log: LogEntry,
    },
    /// A dead letter to publish, kept until its publication is answered (committed with
    /// the `Finish` that dead-lettered it: a crash in between cannot lose it).
    PutDeadLetter {
        id: u64,
        record: DeadLetterRecord,
    },
    /// A dead letter was published.
    DeleteDeadLetter {
        id: u64,
    },
    /// A consumer paused (`true`) or resumed.
    SetPaused {
        consumer: Arc<str>,
        paused: bool,
    },
}

/// An event put back to its consumer by [`Store::redrive`], under its new sequence
/// number (behind everything pending).
#[derive(Debug, Clone)]
pub struct RedrivenEvent {
    pub seq: u64,
    pub event: Event,
    pub ordering_key: Option<String>,
}

/// Which dead-lettered events [`Store::redrive`] puts back.
#[derive(Debug, Clone, Copy)]
pub enum RedriveSelection<'a> {
    /// These event ids (others are skipped).
    Ids(&'a [String]),
    /// The oldest ones, at most this many.
    Oldest(usize),
}

/// An encoded dead letter waiting in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    pub channel: String,
    pub payload: Bytes,
    pub content_type: String,
    /// For logs.
    pub consumer: String,
    pub event_id: String,
}

/// A captured event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: u64,
    pub event: Event,
    pub ordering_key: Option<String>,
}

/// Everything needed to rebuild the engine.
#[derive(Debug, Default)]
pub struct Loaded {
    pub consumers: Vec<ConsumerConfig>,
    pub events: Vec<StoredEvent>,
    /// (consumer, seq, state), in seq order per consumer.
    pub entries: Vec<(String, u64, EntryRecord)>,
    pub dedup: Vec<DedupRecord>,
    pub next_seq: u64,
    /// Consumer → its counters as counted in the log, for stats after restart.
    pub finished: HashMap<String, LogCounts>,
    /// Dead letters committed but not yet published, by outbox id.
    pub dead_letters: Vec<(u64, DeadLetterRecord)>,
    /// Consumers paused.
    pub paused: Vec<String>,
}

/// Lines of one consumer's terminal log, by status.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LogCounts {
    pub acked: u64,
    pub dead_lettered: u64,
    pub redriven: u64,
}

/// A page of the terminal log.
#[derive(Debug, Clone, Default)]
pub struct LogPage {
    pub entries: Vec<LogEntry>,
    /// Pass back to continue after the last entry; `None` at the end.
    pub next: Option<u64>,
}

/// Where the embedded engine keeps its state: [`crate::FjallStore`] on disk, or
/// [`crate::RedbStore`] in memory.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Reads the whole durable state (at start-up).
    fn load(&self) -> Result<Loaded, StoreError>;

    /// Commits `ops` atomically; on return they survive a crash (per the fsync policy).
    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError>;

    /// Commits `ops` atomically, visible to every later read and commit, without
    /// waiting for the disk: [`Store::sync`] makes them durable. The group-commit
    /// writer appends one group while the previous one syncs. By default the same as
    /// [`Store::apply`].
    fn write(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        self.apply(ops)
    }

    /// Makes every [`Store::write`] so far durable, per the fsync policy.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// True while some [`Store::write`] is not yet synced (with `fsync: batch`, the
    /// sync thread then calls [`Store::sync`] again within [`crate::BATCH_FLUSH_MS`]).
    fn unsynced(&self) -> bool {
        false
    }

    /// True when commits are cheap, in-process memory writes: the engine then applies
    /// them inline instead of through the writer thread (deterministic under paused
    /// time in tests).
    fn inline(&self) -> bool {
        false
    }

    /// Moves dead-lettered events of `consumer` back to it, in one transaction: each
    /// gets a new sequence number from `next_seq` (so it queues behind what is
    /// pending), a fresh state (attempts reset) and a `Redriven` log line. An event is
    /// moved once: a second call does not find it. Returns them in their original order.
    fn redrive(
        &self,
        consumer: &str,
        selection: RedriveSelection<'_>,
        next_seq: &std::sync::atomic::AtomicU64,
    ) -> Result<Vec<RedrivenEvent>, StoreError>;

    /// Dead-lettered events of `consumer` kept for redrive.
    fn redrivable(&self, consumer: &str) -> u64;

    /// Free space on the store's disk, in bytes, for the disk watermark; `None` for a
    /// store with no disk (in memory) or when it cannot be read.
    fn free_space(&self) -> Option<u64> {
        None
    }

    /// Why the store refuses every write until the process restarts, if it does (an
    /// earlier commit or sync failed).
    fn failed(&self) -> Option<String> {
        None
    }

    /// The terminal log of `consumer`, oldest first, after position `after`.
    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, StoreError>;
}
