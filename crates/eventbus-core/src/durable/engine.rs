//! The durable consumer engine.
//!
//! Working state lives in memory, per consumer, behind that consumer's own mutex; every
//! change is also sent to the [`Store`]. Locked sections only mutate and collect
//! [`Effects`] (store ops, deliveries, timers, dead letters), which run after the lock
//! is released, so no lock is held across I/O or `.await`.
//!
//! - Capture waits for its commit (an OK means durable); one writer thread drains
//!   every queued change into a single transaction (group commit: concurrent publishes
//!   share one fsync). Delivery bookkeeping and acks do not wait for theirs.
//! - One scheduler task holds every timer (ack deadlines, redeliveries) in a sorted map
//!   and sleeps until the earliest; stale timers are recognised and skipped.
//! - Ordering keys: per key, only the oldest unfinished event is eligible; the next
//!   becomes eligible when it is acked or dead-lettered.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::durable::backend::{
    Attachment, BoxFuture, CaptureRequest, Captured, ConsumerClient, DurableBackend, LogSlice,
};
use crate::durable::config::ConsumerConfig;
use crate::durable::store::{
    DedupRecord, EntryRecord, Failure, LogEntry, LogPage, LogStatus, Store, StoreError, StoreOp, epoch_ms,
};
use crate::event::Event;
use crate::name::Pattern;
use crate::tasks::{Supervisor, TaskHandle};
use crate::trie::Trie;

/// Reason recorded when an ack deadline passes.
pub const REASON_DEADLINE: &str = "ack deadline exceeded";
/// Reason recorded when a client leaves with events in flight.
pub const REASON_DISCONNECT: &str = "consumer disconnected";
/// Reason recorded by a `term` without one.
pub const REASON_TERM: &str = "terminated by the consumer";
/// Most changes one group commit takes.
const MAX_GROUP: usize = 4096;
/// Changes queued for the writer before submitters wait.
const WRITER_QUEUE: usize = 65_536;
/// Default events per delivery message.
pub const DEFAULT_MAX_BATCH: u32 = 256;

/// Why a durable call was refused.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("no consumer named {0:?}")]
    UnknownConsumer(String),
    #[error("consumer {0:?} already exists with a different configuration")]
    AlreadyExists(String),
    #[error("invalid consumer configuration: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the durable store is not available: {0}")]
    Unavailable(String),
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: &'static str, message: String },
}

impl DurableError {
    /// A `page_token` this broker did not issue.
    pub fn bad_page_token(token: &str) -> Self {
        Self::InvalidArgument {
            field: "page_token",
            message: format!("{token:?} is not a page token this broker issued"),
        }
    }
}

/// A dead-lettered event, to be published on its dead-letter channel.
#[derive(Debug, Clone)]
pub struct PublishedDeadLetter {
    pub channel: String,
    pub event: Arc<Event>,
    pub consumer: String,
    pub attempts: u32,
    pub failures: Vec<Failure>,
}

/// Encodes a dead letter for publishing: (payload, content type). The wire layer
/// provides it (the `eventbus.v1.DeadLetter` protobuf).
pub type DeadLetterEncoder = Arc<dyn Fn(&PublishedDeadLetter) -> (Bytes, String) + Send + Sync>;
/// Publishes an encoded dead letter (channel, payload, content type) through the bus;
/// the future ends when the publish has been answered. A dead letter is not held to
/// `max_payload_bytes`: it wraps an event that was.
pub type DeadLetterSink =
    Arc<dyn Fn(String, Bytes, String) -> BoxFuture<'static, Result<(), crate::Error>> + Send + Sync>;
/// Observes ack latency (delivery to ack) per consumer, for metrics.
pub type AckObserver = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// Engine settings.
#[derive(Clone)]
pub struct DurableOptions {
    pub dedup_window: Duration,
    pub dead_letter_encoder: DeadLetterEncoder,
    pub on_ack: Option<AckObserver>,
    /// Starts the engine's background tasks and reports one that stops.
    pub supervisor: Supervisor,
}

impl std::fmt::Debug for DurableOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableOptions").field("dedup_window", &self.dedup_window).finish_non_exhaustive()
    }
}

/// One event handed to a client.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: Arc<Event>,
    /// 1-based.
    pub attempt: u32,
    /// Ack before this, or the event counts as failed and is redelivered.
    pub deadline: SystemTime,
}

/// What a client asks for when it attaches.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientOptions {
    /// 0 = the consumer's `max_in_flight` (also the ceiling).
    pub max_in_flight: u32,
    /// 0 = [`DEFAULT_MAX_BATCH`].
    pub max_batch: u32,
}

impl ClientOptions {
    /// (max_in_flight, max_batch) in force for a consumer whose ceiling is `ceiling`.
    pub fn resolve(self, ceiling: u32) -> (u32, u32) {
        let max_in_flight = match self.max_in_flight {
            0 => ceiling,
            n => n.min(ceiling),
        };
        let max_batch = match self.max_batch {
            0 => DEFAULT_MAX_BATCH,
            n => n,
        };
        (max_in_flight, max_batch)
    }
}

/// Round-robin over `len` clients from `*next`: the first with room, and its room
/// (`room_of` answers 0 for a full or departed client); `None` when none has any.
/// Both engines hand out events with it.
pub fn next_with_room(len: usize, next: &mut usize, room_of: impl Fn(usize) -> usize) -> Option<(usize, usize)> {
    for _ in 0..len {
        let i = *next % len;
        *next = next.wrapping_add(1);
        let room = room_of(i);
        if room > 0 {
            return Some((i, room));
        }
    }
    None
}

/// A consumer's state for `GetConsumer`/`ListConsumers`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerInfo {
    pub config: ConsumerConfig,
    /// Unfinished events not in flight (ready, waiting for redelivery, or behind their key).
    pub pending: u64,
    pub in_flight: u64,
    pub clients: u32,
    pub acked: u64,
    pub dead_lettered: u64,
    pub redelivered: u64,
}

// ---------------------------------------------------------------------------------

#[derive(Debug)]
enum EState {
    /// Behind an older event with the same ordering key.
    Parked,
    Ready,
    Waiting(Instant),
    InFlight {
        client: u64,
        deadline: Instant,
        since: Instant,
    },
}

#[derive(Debug)]
struct Entry {
    event: Arc<Event>,
    key: Option<Arc<str>>,
    record: EntryRecord,
    state: EState,
}

#[derive(Debug)]
struct Client {
    id: u64,
    max_in_flight: u32,
    max_batch: u32,
    in_flight: u32,
    tx: mpsc::Sender<Vec<Delivery>>,
}

impl Client {
    /// Events this client can take now (0 when it has left).
    fn room(&self) -> usize {
        if self.tx.is_closed() {
            return 0;
        }
        self.max_in_flight.saturating_sub(self.in_flight).min(self.max_batch) as usize
    }
}

#[derive(Debug, Default)]
struct CState {
    entries: HashMap<u64, Entry>,
    by_id: HashMap<Arc<str>, u64>,
    ready: BTreeSet<u64>,
    key_queues: HashMap<Arc<str>, VecDeque<u64>>,
    clients: Vec<Client>,
    next_client: usize,
    deleted: bool,
}

#[derive(Debug)]
struct Consumer {
    name: Arc<str>,
    config: ConsumerConfig,
    filters: Vec<Pattern>,
    state: Mutex<CState>,
    acked: AtomicU64,
    dead_lettered: AtomicU64,
    redelivered: AtomicU64,
}

#[derive(Debug, Default)]
struct Registry {
    by_name: HashMap<Arc<str>, Arc<Consumer>>,
    trie: Trie<Arc<str>>,
}

/// Work collected under a lock, run after it.
#[derive(Default)]
struct Effects {
    ops: Vec<StoreOp>,
    sends: Vec<(mpsc::Sender<Vec<Delivery>>, Vec<Delivery>)>,
    timers: Vec<(Instant, Arc<Consumer>, u64)>,
    dead_letters: Vec<PublishedDeadLetter>,
    acks: Vec<Duration>,
}

#[derive(Debug)]
struct WriteRequest {
    ops: Vec<StoreOp>,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// Idempotency keys in the window. Expiry is kept both as wall time (what the store
/// persists) and as a monotonic instant (what the window is measured with).
#[derive(Debug, Default)]
struct Dedup {
    keys: HashMap<String, (String, Instant)>,
    by_expiry: BTreeMap<(Instant, String), ()>,
}

impl Dedup {
    fn prune(&mut self, now: Instant) {
        while let Some((expires, key)) = self.by_expiry.first_key_value().map(|(k, _)| k.clone()) {
            if expires > now {
                break;
            }
            self.by_expiry.remove(&(expires, key.clone()));
            if self.keys.get(&key).is_some_and(|(_, e)| *e == expires) {
                self.keys.remove(&key);
            }
        }
    }

    fn insert(&mut self, key: String, event_id: String, expires: Instant) {
        self.by_expiry.insert((expires, key.clone()), ());
        self.keys.insert(key, (event_id, expires));
    }
}

/// A capture waiting for its store commit.
struct CapturePlan {
    seq: u64,
    event: Arc<Event>,
    key: Option<Arc<str>>,
    consumers: Vec<Arc<Consumer>>,
    dedup: Option<DedupRecord>,
    /// Taken for the commit.
    op: Option<StoreOp>,
}

/// The durable consumer engine. A cheap handle.
#[derive(Clone)]
pub struct Durable {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("consumers", &self.inner.registry.read().by_name.len()).finish()
    }
}

/// Every pending timer: (due, tie-breaker) → (consumer, event seq).
type Timers = BTreeMap<(Instant, u64), (Weak<Consumer>, u64)>;

struct Inner {
    /// First, so they are retired before the channels they read close.
    tasks: OnceLock<[TaskHandle; 2]>,
    store: Arc<dyn Store>,
    options: DurableOptions,
    registry: RwLock<Registry>,
    next_seq: AtomicU64,
    /// Consumers registered: with none and no idempotency key, a publish skips the
    /// engine entirely (no lock, no trie walk on the plain pub/sub path).
    consumer_count: AtomicU64,
    next_client: AtomicU64,
    dedup: Mutex<Dedup>,
    writer: mpsc::Sender<WriteRequest>,
    timers: Mutex<Timers>,
    timer_seq: AtomicU64,
    /// Shared with the scheduler task, which must not keep the engine alive.
    timers_changed: Arc<Notify>,
    sink: OnceLock<DeadLetterSink>,
}

impl Durable {
    /// Loads the store and starts the writer thread and the scheduler task.
    pub fn start(store: Arc<dyn Store>, options: DurableOptions) -> Result<Self, DurableError> {
        let loaded = store.load()?;
        let (writer, rx) = mpsc::channel(WRITER_QUEUE);
        let supervisor = options.supervisor.clone();
        let inner = Arc::new(Inner {
            tasks: OnceLock::new(),
            store,
            options,
            registry: RwLock::default(),
            next_seq: AtomicU64::new(loaded.next_seq.max(1)),
            consumer_count: AtomicU64::new(0),
            next_client: AtomicU64::new(1),
            dedup: Mutex::default(),
            writer,
            timers: Mutex::default(),
            timer_seq: AtomicU64::new(0),
            timers_changed: Arc::new(Notify::new()),
            sink: OnceLock::new(),
        });
        // The scheduler holds the engine weakly (it must not keep it alive), and the
        // weak reference is taken from the finished engine: it can fail to upgrade only
        // once the engine is gone, never before construction ends (issue 13).
        let writer = supervisor
            .thread("durable store writer", writer_loop(Arc::clone(&inner.store), rx))
            .map_err(|e| DurableError::Unavailable(format!("cannot start the durable store writer: {e}")))?;
        let scheduler = supervisor
            .spawn("durable timer scheduler", run_scheduler(Arc::downgrade(&inner), Arc::clone(&inner.timers_changed)));
        let _ = inner.tasks.set([writer, scheduler]);
        let durable = Self { inner };
        durable.restore(loaded)?;
        Ok(durable)
    }

    /// Where dead letters are published (the bus, set once it exists).
    pub fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        let _ = self.inner.sink.set(sink);
    }

    fn restore(&self, loaded: crate::durable::store::Loaded) -> Result<(), DurableError> {
        let now = Instant::now();
        let now_ms = epoch_ms(SystemTime::now());
        let events: HashMap<u64, (Arc<Event>, Option<Arc<str>>)> =
            loaded.events.into_iter().map(|e| (e.seq, (Arc::new(e.event), e.ordering_key.map(Arc::from)))).collect();
        for config in loaded.consumers {
            let consumer = self.register(config)?;
            if let Some((acked, dead)) = loaded.finished.get(&*consumer.name) {
                consumer.acked.store(*acked, Ordering::Relaxed);
                consumer.dead_lettered.store(*dead, Ordering::Relaxed);
            }
        }
        let mut fx = Effects::default();
        for (name, seq, record) in loaded.entries {
            let Some(consumer) = self.consumer(&name) else { continue };
            let Some((event, key)) = events.get(&seq) else { continue };
            let mut st = consumer.state.lock();
            let due = record.due_ms.filter(|d| *d > now_ms).map(|d| now + Duration::from_millis(d - now_ms));
            add_entry(&consumer, &mut st, seq, Arc::clone(event), key.clone(), record, due, &mut fx);
        }
        {
            let mut dedup = self.inner.dedup.lock();
            for d in loaded.dedup {
                let left = Duration::from_millis(d.expires_ms.saturating_sub(now_ms));
                dedup.insert(d.key, d.event_id, now + left);
            }
        }
        self.run(fx);
        Ok(())
    }

    fn consumer(&self, name: &str) -> Option<Arc<Consumer>> {
        self.inner.registry.read().by_name.get(name).cloned()
    }

    fn register(&self, config: ConsumerConfig) -> Result<Arc<Consumer>, DurableError> {
        let filters = config.validate().map_err(DurableError::InvalidConfig)?;
        let name: Arc<str> = config.name.as_str().into();
        let consumer = Arc::new(Consumer {
            name: Arc::clone(&name),
            config,
            filters,
            state: Mutex::default(),
            acked: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            redelivered: AtomicU64::new(0),
        });
        let mut registry = self.inner.registry.write();
        for f in &consumer.filters {
            registry.trie.insert(f, Arc::clone(&name));
        }
        if registry.by_name.insert(name, Arc::clone(&consumer)).is_none() {
            self.inner.consumer_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(consumer)
    }

    /// Waits for `ops` to be committed.
    async fn commit(&self, ops: Vec<StoreOp>) -> Result<(), DurableError> {
        if self.inner.store.inline() {
            return self.inner.store.apply(&ops).map_err(|e| DurableError::Unavailable(e.to_string()));
        }
        let (done, wait) = oneshot::channel();
        self.inner
            .writer
            .send(WriteRequest { ops, done: Some(done) })
            .await
            .map_err(|_| DurableError::Unavailable("the store writer has stopped".into()))?;
        match wait.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(DurableError::Unavailable(e)),
            Err(_) => Err(DurableError::Unavailable("the store writer has stopped".into())),
        }
    }

    /// Shutdown: detaches every client (their streams end; what they held counts one
    /// failed attempt and is released), so nothing waits on them.
    pub fn detach_all(&self) {
        let consumers: Vec<Arc<Consumer>> = self.inner.registry.read().by_name.values().cloned().collect();
        for consumer in consumers {
            let mut fx = Effects::default();
            {
                let mut st = consumer.state.lock();
                let clients: Vec<u64> = st.clients.iter().map(|c| c.id).collect();
                st.clients.clear();
                let held: Vec<u64> = st
                    .entries
                    .iter()
                    .filter(|(_, e)| matches!(e.state, EState::InFlight { client, .. } if clients.contains(&client)))
                    .map(|(seq, _)| *seq)
                    .collect();
                for seq in held {
                    fail(&consumer, &mut st, seq, REASON_DISCONNECT.into(), None, &mut fx);
                }
            }
            self.run(fx);
        }
    }

    /// Waits until every change queued so far is committed.
    pub async fn flush(&self) -> Result<(), DurableError> {
        self.commit(Vec::new()).await
    }

    /// Creates a consumer. Idempotent for an identical configuration.
    pub async fn create_consumer(&self, config: ConsumerConfig) -> Result<ConsumerInfo, DurableError> {
        config.validate().map_err(DurableError::InvalidConfig)?;
        if let Some(existing) = self.consumer(&config.name) {
            if existing.config == config {
                return Ok(info(&existing));
            }
            return Err(DurableError::AlreadyExists(config.name));
        }
        self.commit(vec![StoreOp::PutConsumer(config.clone())]).await?;
        let consumer = self.register(config)?;
        Ok(info(&consumer))
    }

    /// Creates or replaces a consumer declared in the configuration file.
    pub async fn declare_consumer(&self, config: ConsumerConfig) -> Result<(), DurableError> {
        match self.consumer(&config.name) {
            Some(existing) if existing.config == config => Ok(()),
            Some(existing) => {
                // Keep what it holds; only the definition changes.
                self.commit(vec![StoreOp::PutConsumer(config.clone())]).await?;
                let filters = config.validate().map_err(DurableError::InvalidConfig)?;
                let replacement = Arc::new(Consumer {
                    name: Arc::clone(&existing.name),
                    config,
                    filters,
                    state: Mutex::new(std::mem::take(&mut *existing.state.lock())),
                    acked: AtomicU64::new(existing.acked.load(Ordering::Relaxed)),
                    dead_lettered: AtomicU64::new(existing.dead_lettered.load(Ordering::Relaxed)),
                    redelivered: AtomicU64::new(existing.redelivered.load(Ordering::Relaxed)),
                });
                let mut registry = self.inner.registry.write();
                for f in &existing.filters {
                    registry.trie.remove(f, |n| **n == *existing.name);
                }
                for f in &replacement.filters {
                    registry.trie.insert(f, Arc::clone(&replacement.name));
                }
                registry.by_name.insert(Arc::clone(&replacement.name), replacement);
                Ok(())
            }
            None => self.create_consumer(config).await.map(|_| ()),
        }
    }

    pub fn get_consumer(&self, name: &str) -> Result<ConsumerInfo, DurableError> {
        self.consumer(name).map(|c| info(&c)).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))
    }

    pub fn list_consumers(&self) -> Vec<ConsumerInfo> {
        let mut out: Vec<ConsumerInfo> = self.inner.registry.read().by_name.values().map(|c| info(c)).collect();
        out.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        out
    }

    /// Deletes a consumer, what it holds, and its log; attached clients are detached.
    pub async fn delete_consumer(&self, name: &str) -> Result<(), DurableError> {
        let consumer = self.consumer(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?;
        self.commit(vec![StoreOp::DeleteConsumer(name.to_owned())]).await?;
        let mut registry = self.inner.registry.write();
        for f in &consumer.filters {
            registry.trie.remove(f, |n| **n == *consumer.name);
        }
        if registry.by_name.remove(name).is_some() {
            self.inner.consumer_count.fetch_sub(1, Ordering::Relaxed);
        }
        drop(registry);
        let mut st = consumer.state.lock();
        st.deleted = true;
        st.clients.clear();
        Ok(())
    }

    /// The terminal log of a consumer, including every change made before the call.
    pub async fn log(
        &self,
        name: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, DurableError> {
        if self.consumer(name).is_none() {
            return Err(DurableError::UnknownConsumer(name.to_owned()));
        }
        self.flush().await?;
        Ok(self.inner.store.log(name, status, limit.clamp(1, 1000), after)?)
    }

    /// Captures several events of one publisher with one store commit (one sync
    /// under `fsync: always`), in order. On a failed commit none is captured and the
    /// one answer is the error.
    pub async fn capture_many(&self, batch: &[CaptureRequest<'_>]) -> Vec<Result<Captured, DurableError>> {
        if self.inner.consumer_count.load(Ordering::Relaxed) == 0 && batch.iter().all(|r| r.idempotency_key.is_none()) {
            // The common case without consumers: nothing to store, nothing to plan.
            return batch.iter().map(|_| Ok(Captured::Stored(0))).collect();
        }
        let mut planned: Vec<Result<CapturePlan, Captured>> =
            batch.iter().map(|r| self.plan_capture(r.event, r.ordering_key, r.idempotency_key)).collect();
        let ops: Vec<StoreOp> = planned.iter_mut().filter_map(|p| p.as_mut().ok()?.op.take()).collect();
        if !ops.is_empty()
            && let Err(err) = self.commit(ops).await
        {
            let plans: Vec<CapturePlan> = planned.into_iter().filter_map(Result::ok).collect();
            self.forget_dedup(&plans);
            return vec![Err(err)];
        }
        planned
            .into_iter()
            .map(|p| match p {
                Ok(plan) => Ok(self.apply_capture(plan)),
                Err(done) => Ok(done),
            })
            .collect()
    }

    /// What capturing `event` takes: `Err` when nothing needs storing (the answer is
    /// final), else the store op and what to apply once it is committed. Claims the
    /// idempotency key at once, so a repeat later in the same batch is a duplicate.
    fn plan_capture(
        &self,
        event: &Arc<Event>,
        ordering_key: Option<&str>,
        idempotency_key: Option<&str>,
    ) -> Result<CapturePlan, Captured> {
        if idempotency_key.is_none() && self.inner.consumer_count.load(Ordering::Relaxed) == 0 {
            return Err(Captured::Stored(0));
        }
        let window = self.inner.options.dedup_window;
        let dedup = match idempotency_key {
            Some(key) => {
                let mut d = self.inner.dedup.lock();
                let now = Instant::now();
                d.prune(now);
                if let Some((original, _)) = d.keys.get(key) {
                    return Err(Captured::Duplicate(original.clone()));
                }
                let expires_ms = epoch_ms(event.timestamp) + window.as_millis() as u64;
                d.insert(key.to_owned(), event.id.clone(), now + window);
                Some(DedupRecord { key: key.to_owned(), event_id: event.id.clone(), expires_ms })
            }
            None => None,
        };
        let consumers: Vec<Arc<Consumer>> = {
            let registry = self.inner.registry.read();
            let mut names = Vec::new();
            registry.trie.collect(&event.channel, &mut names);
            names.sort();
            names.dedup();
            names.iter().filter_map(|n| registry.by_name.get(n).cloned()).collect()
        };
        if consumers.is_empty() && dedup.is_none() {
            return Err(Captured::Stored(0));
        }
        let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
        let key: Option<Arc<str>> = ordering_key.filter(|k| !k.is_empty()).map(Arc::from);
        let op = match (consumers.is_empty(), dedup.clone()) {
            (true, Some(record)) => StoreOp::Dedup(record),
            _ => StoreOp::Capture {
                seq,
                event: Arc::clone(event),
                ordering_key: key.clone(),
                consumers: consumers.iter().map(|c| Arc::clone(&c.name)).collect(),
                dedup: dedup.clone(),
            },
        };
        Ok(CapturePlan { seq, event: Arc::clone(event), key, consumers, dedup, op: Some(op) })
    }

    /// A commit failed: the keys these plans claimed are free again.
    fn forget_dedup(&self, plans: &[CapturePlan]) {
        let mut d = self.inner.dedup.lock();
        for record in plans.iter().filter_map(|p| p.dedup.as_ref()) {
            d.keys.remove(&record.key);
        }
    }

    /// Hands a committed capture to its consumers.
    fn apply_capture(&self, plan: CapturePlan) -> Captured {
        let mut fx = Effects::default();
        for consumer in &plan.consumers {
            let mut st = consumer.state.lock();
            if st.deleted {
                continue;
            }
            let (event, key) = (Arc::clone(&plan.event), plan.key.clone());
            add_entry(consumer, &mut st, plan.seq, event, key, EntryRecord::default(), None, &mut fx);
            dispatch(consumer, &mut st, &mut fx);
        }
        self.run(fx);
        Captured::Stored(plan.consumers.len())
    }

    /// Attaches a client to a consumer (creating it from `create_if_missing` when absent).
    pub async fn attach(
        &self,
        name: &str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> Result<Attached, DurableError> {
        let consumer = match (self.consumer(name), create_if_missing) {
            (Some(c), _) => c,
            (None, Some(config)) => {
                self.create_consumer(config.named_for_attach(name).map_err(DurableError::InvalidConfig)?).await?;
                self.consumer(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?
            }
            (None, None) => return Err(DurableError::UnknownConsumer(name.to_owned())),
        };
        let (max_in_flight, max_batch) = options.resolve(consumer.config.max_in_flight);
        let id = self.inner.next_client.fetch_add(1, Ordering::Relaxed);
        // One message per delivery batch; a batch holds at least one in-flight event.
        let (tx, rx) = mpsc::channel(max_in_flight as usize);
        let mut fx = Effects::default();
        {
            let mut st = consumer.state.lock();
            st.clients.push(Client { id, max_in_flight, max_batch, in_flight: 0, tx });
            dispatch(&consumer, &mut st, &mut fx);
        }
        let info = info(&consumer);
        self.run(fx);
        Ok(Attached { info, deliveries: rx, client: ClientHandle { durable: self.clone(), consumer, id } })
    }

    /// Runs the effects collected under a lock.
    fn run(&self, fx: Effects) {
        let Effects { ops, sends, timers, dead_letters, acks: _ } = fx;
        if !ops.is_empty() {
            self.submit(ops);
        }
        for (tx, batch) in sends {
            // Capacity covers max_in_flight batches; a failure means the client left,
            // and its detach releases the events.
            let _ = tx.try_send(batch);
        }
        if !timers.is_empty() {
            let mut t = self.inner.timers.lock();
            let mut earliest = t.first_key_value().map(|(k, _)| k.0);
            for (at, consumer, seq) in timers {
                let id = self.inner.timer_seq.fetch_add(1, Ordering::Relaxed);
                t.insert((at, id), (Arc::downgrade(&consumer), seq));
                if earliest.is_none_or(|e| at < e) {
                    earliest = Some(at);
                    self.inner.timers_changed.notify_one();
                }
            }
        }
        for dl in dead_letters {
            let (payload, content_type) = (self.inner.options.dead_letter_encoder)(&dl);
            match self.inner.sink.get() {
                Some(sink) => {
                    let published = sink(dl.channel.clone(), payload, content_type);
                    tokio::spawn(async move {
                        if let Err(err) = published.await {
                            tracing::error!(channel = %dl.channel, consumer = %dl.consumer, event = %dl.event.id, %err, "cannot publish a dead letter");
                        }
                    });
                }
                None => {
                    tracing::warn!(consumer = %dl.consumer, event = %dl.event.id, "dead letter not published: no sink")
                }
            }
        }
    }

    /// Queues store changes without waiting for their commit.
    fn submit(&self, ops: Vec<StoreOp>) {
        if self.inner.store.inline() {
            if let Err(err) = self.inner.store.apply(&ops) {
                tracing::error!(%err, "durable store commit failed");
            }
            return;
        }
        let req = WriteRequest { ops, done: None };
        if let Err(mpsc::error::TrySendError::Full(req)) = self.inner.writer.try_send(req) {
            let writer = self.inner.writer.clone();
            tokio::spawn(async move {
                let _ = writer.send(req).await;
            });
        }
    }

    /// A timer fired: an ack deadline passed or a redelivery is due.
    fn fire(&self, consumer: &Arc<Consumer>, seq: u64) {
        let now = Instant::now();
        let mut fx = Effects::default();
        {
            let mut st = consumer.state.lock();
            let Some(entry) = st.entries.get(&seq) else { return };
            match entry.state {
                EState::InFlight { client, deadline, .. } if deadline <= now => {
                    release_client(&mut st, client);
                    fail(consumer, &mut st, seq, REASON_DEADLINE.into(), None, &mut fx);
                }
                EState::Waiting(due) if due <= now => {
                    if let Some(e) = st.entries.get_mut(&seq) {
                        e.state = EState::Ready;
                    }
                    st.ready.insert(seq);
                    consumer.redelivered.fetch_add(1, Ordering::Relaxed);
                }
                _ => return,
            }
            dispatch(consumer, &mut st, &mut fx);
        }
        self.run(fx);
    }
}

/// A client attached to a consumer: its deliveries and its handle.
#[derive(Debug)]
pub struct Attached {
    pub info: ConsumerInfo,
    pub deliveries: mpsc::Receiver<Vec<Delivery>>,
    pub client: ClientHandle,
}

/// Acks and friends for one attached client. Dropping it detaches the client: events
/// it holds count a failed attempt ("consumer disconnected") and are released at once.
#[derive(Debug)]
pub struct ClientHandle {
    durable: Durable,
    consumer: Arc<Consumer>,
    id: u64,
}

impl ClientHandle {
    fn with_state(&self, f: impl FnOnce(&Arc<Consumer>, &mut CState, &mut Effects)) {
        let mut fx = Effects::default();
        {
            let mut st = self.consumer.state.lock();
            f(&self.consumer, &mut st, &mut fx);
            dispatch(&self.consumer, &mut st, &mut fx);
        }
        let latencies = std::mem::take(&mut fx.acks);
        if let Some(on_ack) = &self.durable.inner.options.on_ack {
            for l in latencies {
                on_ack(&self.consumer.name, l);
            }
        }
        self.durable.run(fx);
    }

    /// Completes events (also late acks; unknown ids are ignored: already done).
    pub fn ack(&self, event_ids: &[String]) {
        self.with_state(|c, st, fx| {
            for id in event_ids {
                if let Some(seq) = st.by_id.get(id.as_str()).copied() {
                    if let Some(EState::InFlight { client, since, .. }) = st.entries.get(&seq).map(|e| &e.state) {
                        fx.acks.push(since.elapsed());
                        let client = *client;
                        release_client(st, client);
                    }
                    finish(c, st, seq, LogStatus::Completed, fx);
                }
            }
        });
    }

    /// Fails one in-flight event now; redelivered after `delay` or the backoff.
    pub fn nack(&self, event_id: &str, reason: &str, delay: Option<Duration>) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let Some(seq) = st.by_id.get(event_id).copied() else { return };
            if matches!(st.entries.get(&seq).map(|e| &e.state), Some(EState::InFlight { client, .. }) if *client == id)
            {
                release_client(st, id);
                let reason = if reason.is_empty() { "nacked" } else { reason };
                fail(c, st, seq, reason.to_owned(), delay, fx);
            }
        });
    }

    /// Moves the deadlines of in-flight events to `by` from now (0 = the ack deadline).
    pub fn extend(&self, event_ids: &[String], by: Duration) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let by = if by.is_zero() { c.config.ack_deadline() } else { by };
            let deadline = Instant::now() + by;
            for event_id in event_ids {
                let Some(seq) = st.by_id.get(event_id.as_str()).copied() else { continue };
                if let Some(entry) = st.entries.get_mut(&seq)
                    && let EState::InFlight { client, deadline: d, .. } = &mut entry.state
                    && *client == id
                {
                    *d = deadline;
                    fx.timers.push((deadline, Arc::clone(c), seq));
                }
            }
        });
    }

    /// Dead-letters an in-flight event now.
    pub fn term(&self, event_id: &str, reason: &str) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let Some(seq) = st.by_id.get(event_id).copied() else { return };
            if matches!(st.entries.get(&seq).map(|e| &e.state), Some(EState::InFlight { client, .. }) if *client == id)
            {
                release_client(st, id);
                let reason = if reason.is_empty() { REASON_TERM } else { reason };
                if let Some(e) = st.entries.get_mut(&seq) {
                    e.record.failures.push(Failure { at_ms: epoch_ms(SystemTime::now()), reason: reason.to_owned() });
                }
                dead_letter(c, st, seq, fx);
            }
        });
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            st.clients.retain(|cl| cl.id != id);
            let held: Vec<u64> = st
                .entries
                .iter()
                .filter(|(_, e)| matches!(e.state, EState::InFlight { client, .. } if client == id))
                .map(|(seq, _)| *seq)
                .collect();
            for seq in held {
                fail(c, st, seq, REASON_DISCONNECT.into(), None, fx);
            }
        });
    }
}

// --- state transitions (all under the consumer's lock) ---------------------------

#[allow(clippy::too_many_arguments)]
fn add_entry(
    consumer: &Arc<Consumer>,
    st: &mut CState,
    seq: u64,
    event: Arc<Event>,
    key: Option<Arc<str>>,
    record: EntryRecord,
    due: Option<Instant>,
    fx: &mut Effects,
) {
    let first_of_key = match &key {
        Some(k) => {
            let q = st.key_queues.entry(Arc::clone(k)).or_default();
            q.push_back(seq);
            q.len() == 1
        }
        None => true,
    };
    let state = match (first_of_key, due) {
        (false, _) => EState::Parked,
        (true, Some(at)) => {
            fx.timers.push((at, Arc::clone(consumer), seq));
            EState::Waiting(at)
        }
        (true, None) => {
            st.ready.insert(seq);
            EState::Ready
        }
    };
    st.by_id.insert(event.id.as_str().into(), seq);
    st.entries.insert(seq, Entry { event, key, record, state });
}

fn release_client(st: &mut CState, client: u64) {
    if let Some(c) = st.clients.iter_mut().find(|c| c.id == client) {
        c.in_flight = c.in_flight.saturating_sub(1);
    }
}

/// Hands ready events to clients with room, round-robin, in batches.
fn dispatch(consumer: &Arc<Consumer>, st: &mut CState, fx: &mut Effects) {
    if st.deleted {
        return;
    }
    let now = Instant::now();
    let wall = SystemTime::now();
    let deadline_in = consumer.config.ack_deadline();
    while !st.ready.is_empty() {
        let clients = &st.clients;
        let Some((i, room)) = next_with_room(clients.len(), &mut st.next_client, |i| clients[i].room()) else {
            break;
        };
        let (client_id, tx) = (st.clients[i].id, st.clients[i].tx.clone());
        let mut batch = Vec::with_capacity(room.min(st.ready.len()));
        while batch.len() < room {
            let Some(seq) = st.ready.pop_first() else { break };
            let Some(entry) = st.entries.get_mut(&seq) else { continue };
            entry.record.attempts += 1;
            entry.record.first_delivered_ms.get_or_insert(epoch_ms(wall));
            entry.record.due_ms = None;
            let deadline = now + deadline_in;
            entry.state = EState::InFlight { client: client_id, deadline, since: now };
            fx.timers.push((deadline, Arc::clone(consumer), seq));
            fx.ops.push(StoreOp::Update { consumer: Arc::clone(&consumer.name), seq, entry: entry.record.clone() });
            batch.push(Delivery {
                event: Arc::clone(&entry.event),
                attempt: entry.record.attempts,
                deadline: wall + deadline_in,
            });
        }
        st.clients[i].in_flight += batch.len() as u32;
        if !batch.is_empty() {
            fx.sends.push((tx, batch));
        }
    }
}

/// One failed attempt: redeliver after the delay, or dead-letter past max_attempts.
fn fail(
    consumer: &Arc<Consumer>,
    st: &mut CState,
    seq: u64,
    reason: String,
    delay: Option<Duration>,
    fx: &mut Effects,
) {
    let max = consumer.config.max_attempts;
    let Some(entry) = st.entries.get_mut(&seq) else { return };
    entry.record.failures.push(Failure { at_ms: epoch_ms(SystemTime::now()), reason });
    if max != 0 && entry.record.attempts >= max {
        dead_letter(consumer, st, seq, fx);
        return;
    }
    let delay = delay.unwrap_or_else(|| consumer.config.backoff.delay(entry.record.attempts));
    let due = Instant::now() + delay;
    entry.state = EState::Waiting(due);
    entry.record.due_ms = Some(epoch_ms(SystemTime::now() + delay));
    fx.ops.push(StoreOp::Update { consumer: Arc::clone(&consumer.name), seq, entry: entry.record.clone() });
    fx.timers.push((due, Arc::clone(consumer), seq));
}

fn dead_letter(consumer: &Arc<Consumer>, st: &mut CState, seq: u64, fx: &mut Effects) {
    let Some(entry) = st.entries.get(&seq) else { return };
    fx.dead_letters.push(PublishedDeadLetter {
        channel: consumer.config.dead_letter_channel_for(&entry.event.channel),
        event: Arc::clone(&entry.event),
        consumer: consumer.name.to_string(),
        attempts: entry.record.attempts,
        failures: entry.record.failures.clone(),
    });
    finish(consumer, st, seq, LogStatus::DeadLettered, fx);
}

/// Removes a finished event, logs it, and lets the next event of its key go.
fn finish(consumer: &Arc<Consumer>, st: &mut CState, seq: u64, status: LogStatus, fx: &mut Effects) {
    let Some(entry) = st.entries.remove(&seq) else { return };
    st.by_id.remove(entry.event.id.as_str());
    st.ready.remove(&seq);
    if let Some(key) = &entry.key
        && let Some(q) = st.key_queues.get_mut(key)
    {
        q.retain(|s| *s != seq);
        match q.front().copied() {
            None => {
                st.key_queues.remove(key);
            }
            Some(next) => {
                if let Some(e) = st.entries.get_mut(&next)
                    && matches!(e.state, EState::Parked)
                {
                    e.state = EState::Ready;
                    st.ready.insert(next);
                }
            }
        }
    }
    match status {
        LogStatus::Completed => consumer.acked.fetch_add(1, Ordering::Relaxed),
        LogStatus::DeadLettered => consumer.dead_lettered.fetch_add(1, Ordering::Relaxed),
    };
    let log = LogEntry {
        event_id: entry.event.id.clone(),
        channel: entry.event.channel.clone(),
        status,
        attempts: entry.record.attempts,
        first_delivered_ms: entry.record.first_delivered_ms,
        finished_ms: epoch_ms(SystemTime::now()),
        failures: entry.record.failures,
    };
    fx.ops.push(StoreOp::Finish { consumer: Arc::clone(&consumer.name), seq, log });
}

fn info(consumer: &Consumer) -> ConsumerInfo {
    let st = consumer.state.lock();
    let in_flight = st.entries.values().filter(|e| matches!(e.state, EState::InFlight { .. })).count() as u64;
    ConsumerInfo {
        config: consumer.config.clone(),
        pending: st.entries.len() as u64 - in_flight,
        in_flight,
        clients: st.clients.len() as u32,
        acked: consumer.acked.load(Ordering::Relaxed),
        dead_lettered: consumer.dead_lettered.load(Ordering::Relaxed),
        redelivered: consumer.redelivered.load(Ordering::Relaxed),
    }
}

// --- background work ---------------------------------------------------------------

/// The group-commit writer: takes every queued change and commits them together. Ends
/// when the engine is gone (its queue closes).
fn writer_loop(store: Arc<dyn Store>, mut rx: mpsc::Receiver<WriteRequest>) -> impl FnOnce() + Send + 'static {
    move || {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            let mut ops_count = batch[0].ops.len();
            while ops_count < MAX_GROUP {
                match rx.try_recv() {
                    Ok(req) => {
                        ops_count += req.ops.len();
                        batch.push(req);
                    }
                    Err(_) => break,
                }
            }
            let ops: Vec<StoreOp> = batch.iter_mut().flat_map(|r| std::mem::take(&mut r.ops)).collect();
            let result = store.apply(&ops).map_err(|e| e.to_string());
            if let Err(err) = &result {
                tracing::error!(%err, changes = ops.len(), "durable store commit failed");
            }
            for req in batch {
                if let Some(done) = req.done {
                    let _ = done.send(result.clone());
                }
            }
        }
    }
}

/// Sleeps until the earliest timer, fires every due one, repeats. No timer, no wake-up.
async fn run_scheduler(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        // `notify_one` leaves a permit when nobody waits: a timer added after this
        // look still wakes the sleep below.
        let notified = wake.notified();
        let next = {
            let Some(strong) = inner.upgrade() else {
                // The engine is being dropped, and its drop aborts this task: wait for
                // that rather than end first (an end before it is reported as a failure).
                return std::future::pending().await;
            };
            let now = Instant::now();
            let next = strong.timers.lock().first_key_value().map(|(k, _)| k.0);
            if next.is_some_and(|n| n <= now) {
                fire_due(&Durable { inner: strong }, now);
                continue;
            }
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = notified => {}
                }
            }
            None => notified.await,
        }
    }
}

fn fire_due(durable: &Durable, now: Instant) {
    let due: Vec<(Weak<Consumer>, u64)> = {
        let mut timers = durable.inner.timers.lock();
        let later = timers.split_off(&(now + Duration::from_nanos(1), 0));
        std::mem::replace(&mut *timers, later).into_values().collect()
    };
    for (consumer, seq) in due {
        if let Some(consumer) = consumer.upgrade() {
            durable.fire(&consumer, seq);
        }
    }
}

impl DurableBackend for Durable {
    fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        Durable::set_dead_letter_sink(self, sink);
    }

    fn capture_many<'a>(
        &'a self,
        batch: &'a [CaptureRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Captured, DurableError>>> {
        Box::pin(Durable::capture_many(self, batch))
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<ConsumerInfo, DurableError>> {
        Box::pin(Durable::create_consumer(self, config))
    }

    fn declare_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(Durable::declare_consumer(self, config))
    }

    fn get_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(std::future::ready(Durable::get_consumer(self, name)))
    }

    fn list_consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, DurableError>> {
        Box::pin(std::future::ready(Ok(Durable::list_consumers(self))))
    }

    fn consumers_snapshot(&self) -> Vec<ConsumerInfo> {
        Durable::list_consumers(self)
    }

    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>> {
        Box::pin(Durable::delete_consumer(self, name))
    }

    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>> {
        Box::pin(async move {
            let after = match page_token {
                "" => None,
                token => Some(token.parse::<u64>().map_err(|_| DurableError::bad_page_token(token))?),
            };
            let page = Durable::log(self, name, status, limit, after).await?;
            Ok(LogSlice {
                entries: page.entries,
                next_page_token: page.next.map(|n| n.to_string()).unwrap_or_default(),
            })
        })
    }

    fn attach<'a>(
        &'a self,
        name: &'a str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> BoxFuture<'a, Result<Attachment, DurableError>> {
        Box::pin(async move {
            let attached = Durable::attach(self, name, options, create_if_missing).await?;
            Ok(Attachment { info: attached.info, deliveries: attached.deliveries, client: Box::new(attached.client) })
        })
    }

    fn detach_all(&self) {
        Durable::detach_all(self);
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(Durable::flush(self))
    }
}

impl ConsumerClient for ClientHandle {
    fn ack(&self, event_ids: Vec<String>) -> BoxFuture<'_, ()> {
        ClientHandle::ack(self, &event_ids);
        Box::pin(std::future::ready(()))
    }

    fn nack(&self, event_id: String, reason: String, delay: Option<Duration>) -> BoxFuture<'_, ()> {
        ClientHandle::nack(self, &event_id, &reason, delay);
        Box::pin(std::future::ready(()))
    }

    fn extend(&self, event_ids: Vec<String>, by: Duration) -> BoxFuture<'_, ()> {
        ClientHandle::extend(self, &event_ids, by);
        Box::pin(std::future::ready(()))
    }

    fn term(&self, event_id: String, reason: String) -> BoxFuture<'_, ()> {
        ClientHandle::term(self, &event_id, &reason);
        Box::pin(std::future::ready(()))
    }
}
