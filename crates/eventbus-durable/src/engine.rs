//! The engine handle: start-up and restore, consumer definitions, attach, and the one
//! place where effects collected under a consumer's lock are carried out.
//!
//! Working state lives in memory, per consumer, behind that consumer's own mutex; every
//! change is also sent to the [`Store`]. Locked sections only mutate and collect
//! `Effects` (store ops, deliveries, timers, dead letters), which run after the lock
//! is released, so no lock is held across I/O or `.await` (docs/ARCHITECTURE.md
//! "A durable delivery").

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use eventbus_core::durable::{
    ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink, DurableError, DurableOptions, LogStatus, MAX_REDRIVE,
    PendingEntry, REASON_DISCONNECT, Redriven, epoch_ms,
};
use eventbus_core::tasks::TaskHandle;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::client::{Attached, ClientHandle};
use crate::dedup::Dedup;
use crate::outbox::{self, Committed};
use crate::scheduler::{Timers, run_scheduler};
use crate::state::{Client, Consumer, Effects, EntryState, Registry, add_entry, dispatch, fail, info, pending_entry};
use crate::store::{EntryRecord, Loaded, LogPage, RedriveSelection, Store, StoreOp};
use crate::writer::{
    Completion, SYNC_QUEUE, WRITER_QUEUE, WriteQueue, WriteRequest, sync_loop, writer_loop, writer_stopped,
};
use eventbus_core::Event;

/// The durable consumer engine. A cheap handle.
#[derive(Clone)]
pub struct Durable {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("consumers", &self.inner.registry.read().by_name.len()).finish()
    }
}

pub(crate) struct Inner {
    /// First, so they are retired before the channels they read close.
    tasks: OnceLock<[TaskHandle; 3]>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: DurableOptions,
    pub(crate) registry: RwLock<Registry>,
    pub(crate) next_seq: AtomicU64,
    /// Consumers registered: with none and no idempotency key, a publish skips the
    /// engine entirely (no lock, no trie walk on the plain pub/sub path).
    pub(crate) consumer_count: AtomicU64,
    next_client: AtomicU64,
    pub(crate) dedup: Mutex<Dedup>,
    /// Held while a keyed capture (ordering or idempotency key) is planned and queued,
    /// so keyed captures reach the writer, hence their consumers, in the order they were
    /// planned: a publisher told `duplicate`, or publishing the next event of a key,
    /// never overtakes the capture it follows. Unkeyed captures do not take it.
    pub(crate) sequencer: Mutex<()>,
    writer: Arc<WriteQueue>,
    pub(crate) timers: Mutex<Timers>,
    timer_seq: AtomicU64,
    /// Shared with the scheduler task, which must not keep the engine alive.
    timers_changed: Arc<Notify>,
    pub(crate) sink: OnceLock<DeadLetterSink>,
    /// Dead letters committed but not yet published (docs/durable.md "Dead letters").
    pub(crate) outbox: outbox::Outbox,
    /// The disk watermark, read at most once a second.
    disk: DiskCheck,
    /// Bumped by every create, redefinition and delete.
    pub(crate) definitions: watch::Sender<u64>,
}

/// The last reading of the store's free disk space.
#[derive(Debug)]
struct DiskCheck {
    /// When it was read (ms since the epoch); 0 = never.
    at_ms: AtomicU64,
    /// Free bytes then; `u64::MAX` = unknown (no disk, or unreadable).
    free: AtomicU64,
}

impl Default for DiskCheck {
    fn default() -> Self {
        Self { at_ms: AtomicU64::new(0), free: AtomicU64::new(u64::MAX) }
    }
}

/// How long a free-space reading stands.
const DISK_CHECK_EVERY_MS: u64 = 1_000;

impl Durable {
    /// Loads the store and starts the writer thread and the scheduler task.
    pub fn start(store: Arc<dyn Store>, options: DurableOptions) -> Result<Self, DurableError> {
        let mut loaded = store.load()?;
        let (writer, rx) = mpsc::channel(WRITER_QUEUE);
        let outbox = outbox::Outbox::new(std::mem::take(&mut loaded.dead_letters));
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
            sequencer: Mutex::default(),
            writer: WriteQueue::new(writer),
            timers: Mutex::default(),
            timer_seq: AtomicU64::new(0),
            timers_changed: Arc::new(Notify::new()),
            sink: OnceLock::new(),
            outbox,
            disk: DiskCheck::default(),
            definitions: watch::Sender::new(0),
        });
        // The scheduler holds the engine weakly (it must not keep it alive), and the
        // weak reference is taken from the finished engine: it can fail to upgrade only
        // once the engine is gone, never before construction ends.
        let (synced, to_sync) = std::sync::mpsc::sync_channel(SYNC_QUEUE);
        let syncer = supervisor
            .thread(
                "durable store sync",
                sync_loop(Arc::clone(&inner.store), to_sync, tokio::runtime::Handle::try_current().ok()),
            )
            .map_err(|e| DurableError::unavailable_because("cannot start the durable store sync thread", e))?;
        let writer = supervisor
            .thread("durable store writer", writer_loop(Arc::clone(&inner.store), rx, synced))
            .map_err(|e| DurableError::unavailable_because("cannot start the durable store writer", e))?;
        let scheduler = supervisor
            .spawn("durable timer scheduler", run_scheduler(Arc::downgrade(&inner), Arc::clone(&inner.timers_changed)));
        let _ = inner.tasks.set([writer, syncer, scheduler]);
        let durable = Self { inner };
        durable.restore(loaded)?;
        Ok(durable)
    }

    /// Where dead letters are published (the bus, set once it exists).
    /// Dead letters left unpublished by the last run go out now.
    pub fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        let _ = self.inner.sink.set(sink);
        self.release_waiting();
    }

    fn restore(&self, loaded: Loaded) -> Result<(), DurableError> {
        let now = Instant::now();
        let now_ms = epoch_ms(SystemTime::now());
        let events: HashMap<u64, (Arc<Event>, Option<Arc<str>>)> =
            loaded.events.into_iter().map(|e| (e.seq, (Arc::new(e.event), e.ordering_key.map(Arc::from)))).collect();
        for config in loaded.consumers {
            let consumer = self.register(config)?;
            if let Some(counts) = loaded.finished.get(&*consumer.name) {
                consumer.acked.store(counts.acked, Ordering::Relaxed);
                consumer.dead_lettered.store(counts.dead_lettered, Ordering::Relaxed);
                consumer.redriven.store(counts.redriven, Ordering::Relaxed);
            }
            consumer.state.lock().paused = loaded.paused.iter().any(|p| **p == *consumer.name);
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

    pub(crate) fn consumer(&self, name: &str) -> Option<Arc<Consumer>> {
        self.inner.registry.read().by_name.get(name).cloned()
    }

    pub(crate) fn register(&self, config: ConsumerConfig) -> Result<Arc<Consumer>, DurableError> {
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
            redriven: AtomicU64::new(0),
            held: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let mut registry = self.inner.registry.write();
        for f in &consumer.filters {
            registry.trie.insert(f, Arc::clone(&name));
        }
        if registry.by_name.insert(name, Arc::clone(&consumer)).is_none() {
            self.inner.consumer_count.fetch_add(1, Ordering::Relaxed);
        }
        drop(registry);
        self.definitions_changed();
        Ok(consumer)
    }

    /// Waits for `ops` to be committed.
    pub(crate) async fn commit(&self, ops: Vec<StoreOp>) -> Result<(), DurableError> {
        match self.submit_waiting(ops) {
            None => Err(writer_stopped()),
            Some(committed) => match committed.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(err)) => Err(DurableError::internal("commit", err)),
                Err(_) => Err(writer_stopped()),
            },
        }
    }

    /// Commits `ops`, then runs `then` with the outcome on the writer's side, and
    /// answers what it returns. `then` runs exactly once whether or not the caller still
    /// waits: a caller dropped mid-await (a client that went away) cannot leave a
    /// committed change out of the working state.
    pub(crate) async fn commit_then<T: Send + 'static>(
        &self,
        ops: Vec<StoreOp>,
        then: impl FnOnce(Result<(), DurableError>) -> T + Send + 'static,
    ) -> Result<T, DurableError> {
        // Only a writer that died mid-commit drops the work unrun (and is reported).
        self.queue_then(ops, then).await.map_err(|_| writer_stopped())
    }

    /// The queueing half of [`Durable::commit_then`]: `ops` join the writer's queue now
    /// (an inline store applies them, and runs `then`, at once).
    pub(crate) fn queue_then<T: Send + 'static>(
        &self,
        ops: Vec<StoreOp>,
        then: impl FnOnce(Result<(), DurableError>) -> T + Send + 'static,
    ) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        let after = move |result| {
            let _ = tx.send(then(result));
        };
        if self.inner.store.inline() {
            after(self.inner.store.apply(&ops).map_err(|err| DurableError::internal("commit", err)));
        } else {
            self.queue(WriteRequest { ops, done: Completion::Then(Box::new(after)) });
        }
        rx
    }

    /// Commits `ops`, then runs `then` on success (see [`Durable::commit_then`]).
    async fn commit_and<T: Send + 'static>(
        &self,
        ops: Vec<StoreOp>,
        then: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, DurableError> {
        self.commit_then(ops, |result| result.map(|()| then())).await?
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
                    .filter(
                        |(_, e)| matches!(e.state, EntryState::InFlight { client, .. } if clients.contains(&client)),
                    )
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
                return Ok(self.info(&existing));
            }
            return Err(DurableError::already_exists(&existing.config, config));
        }
        let this = self.clone();
        let consumer =
            self.commit_and(vec![StoreOp::PutConsumer(config.clone())], move || this.register(config)).await??;
        Ok(self.info(&consumer))
    }

    /// Creates or replaces a consumer declared in the configuration file.
    pub async fn declare_consumer(&self, config: ConsumerConfig) -> Result<(), DurableError> {
        match self.consumer(&config.name) {
            Some(existing) if existing.config == config => Ok(()),
            Some(existing) => {
                // Keep what it holds; only the definition changes.
                let filters = config.validate().map_err(DurableError::InvalidConfig)?;
                let this = self.clone();
                self.commit_and(vec![StoreOp::PutConsumer(config.clone())], move || {
                    this.replace_definition(&existing, config, filters)
                })
                .await
            }
            None => self.create_consumer(config).await.map(|_| ()),
        }
    }

    /// Swaps a consumer's definition, keeping what it holds.
    fn replace_definition(&self, existing: &Consumer, config: ConsumerConfig, filters: Vec<eventbus_core::Pattern>) {
        let replacement = Arc::new(Consumer {
            name: Arc::clone(&existing.name),
            config,
            filters,
            state: Mutex::new(std::mem::take(&mut *existing.state.lock())),
            acked: AtomicU64::new(existing.acked.load(Ordering::Relaxed)),
            dead_lettered: AtomicU64::new(existing.dead_lettered.load(Ordering::Relaxed)),
            redelivered: AtomicU64::new(existing.redelivered.load(Ordering::Relaxed)),
            redriven: AtomicU64::new(existing.redriven.load(Ordering::Relaxed)),
            held: AtomicU64::new(existing.held.load(Ordering::Relaxed)),
            dropped: AtomicU64::new(existing.dropped.load(Ordering::Relaxed)),
        });
        let mut registry = self.inner.registry.write();
        for f in &existing.filters {
            registry.trie.remove(f, |n| **n == *existing.name);
        }
        for f in &replacement.filters {
            registry.trie.insert(f, Arc::clone(&replacement.name));
        }
        registry.by_name.insert(Arc::clone(&replacement.name), replacement);
        drop(registry);
        self.definitions_changed();
    }

    fn definitions_changed(&self) {
        self.inner.definitions.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn get_consumer(&self, name: &str) -> Result<ConsumerInfo, DurableError> {
        self.consumer(name).map(|c| self.info(&c)).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))
    }

    fn info(&self, consumer: &Consumer) -> ConsumerInfo {
        info(consumer, self.inner.store.redrivable(&consumer.name))
    }

    pub fn list_consumers(&self) -> Vec<ConsumerInfo> {
        let consumers: Vec<Arc<Consumer>> = self.inner.registry.read().by_name.values().cloned().collect();
        let mut out: Vec<ConsumerInfo> = consumers.iter().map(|c| self.info(c)).collect();
        out.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        out
    }

    /// Deletes a consumer, what it holds, and its log; attached clients are detached.
    pub async fn delete_consumer(&self, name: &str) -> Result<(), DurableError> {
        let consumer = self.consumer(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?;
        let this = self.clone();
        self.commit_and(vec![StoreOp::DeleteConsumer(name.to_owned())], move || this.unregister(&consumer)).await
    }

    /// Takes a deleted consumer out of the working state; its clients are detached.
    fn unregister(&self, consumer: &Consumer) {
        let mut registry = self.inner.registry.write();
        for f in &consumer.filters {
            registry.trie.remove(f, |n| **n == *consumer.name);
        }
        if registry.by_name.remove(&consumer.name).is_some() {
            self.inner.consumer_count.fetch_sub(1, Ordering::Relaxed);
        }
        drop(registry);
        self.definitions_changed();
        let mut st = consumer.state.lock();
        st.deleted = true;
        st.clients.clear();
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
        // One message per delivery batch (a batch holds at least one in-flight event),
        // and the drain's empty batch.
        let (tx, rx) = mpsc::channel(max_in_flight as usize + 1);
        let mut fx = Effects::default();
        {
            let mut st = consumer.state.lock();
            st.clients.push(Client { id, max_in_flight, max_batch, in_flight: 0, tx, draining: false });
            dispatch(&consumer, &mut st, &mut fx);
        }
        let info = self.info(&consumer);
        self.run(fx);
        Ok(Attached { info, deliveries: rx, client: ClientHandle { durable: self.clone(), consumer, id } })
    }

    /// `DiskFull` while the store's disk has less free space than
    /// `durable.min_free_disk_bytes` (docs/limits.md); reads it at most once a second.
    pub(crate) fn disk_full(&self) -> Option<DurableError> {
        let min = self.inner.options.min_free_disk_bytes;
        if min == 0 {
            return None;
        }
        let disk = &self.inner.disk;
        let now = epoch_ms(SystemTime::now());
        let at = disk.at_ms.load(Ordering::Relaxed);
        if now.saturating_sub(at) >= DISK_CHECK_EVERY_MS
            && disk.at_ms.compare_exchange(at, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let free = self.inner.store.free_space().unwrap_or(u64::MAX);
            let was_low = disk.free.swap(free, Ordering::Relaxed) < min;
            match (was_low, free < min) {
                (false, true) => {
                    tracing::error!(free, min, "the durable store's disk is nearly full: refusing durable captures")
                }
                (true, false) => {
                    tracing::info!(free, min, "the durable store's disk has room again: accepting durable captures")
                }
                _ => {}
            }
        }
        let free = disk.free.load(Ordering::Relaxed);
        (free < min).then_some(DurableError::DiskFull { free, min })
    }

    fn known(&self, name: &str) -> Result<Arc<Consumer>, DurableError> {
        self.consumer(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))
    }

    /// A page of the consumer's unfinished events, oldest first, after seq `after`.
    pub fn list_pending(
        &self,
        name: &str,
        limit: usize,
        after: Option<u64>,
    ) -> Result<(Vec<PendingEntry>, Option<u64>), DurableError> {
        let consumer = self.known(name)?;
        let limit = limit.clamp(1, 1000);
        let st = consumer.state.lock();
        let mut seqs: Vec<u64> = st.entries.keys().copied().filter(|s| after.is_none_or(|a| *s > a)).collect();
        let more = seqs.len() > limit;
        if more {
            seqs.select_nth_unstable(limit);
            seqs.truncate(limit);
        }
        seqs.sort_unstable();
        let (now, wall) = (Instant::now(), SystemTime::now());
        let entries = seqs.iter().filter_map(|s| st.entries.get(s)).map(|e| pending_entry(e, now, wall)).collect();
        Ok((entries, if more { seqs.last().copied() } else { None }))
    }

    /// Pauses or resumes a consumer; the state is stored before the answer.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<ConsumerInfo, DurableError> {
        let consumer = self.known(name)?;
        let (this, target) = (self.clone(), Arc::clone(&consumer));
        self.commit_and(vec![StoreOp::SetPaused { consumer: Arc::clone(&consumer.name), paused }], move || {
            let mut fx = Effects::default();
            {
                let mut st = target.state.lock();
                st.paused = paused;
                dispatch(&target, &mut st, &mut fx);
            }
            this.run(fx);
        })
        .await?;
        tracing::info!(consumer = %consumer.name, paused, "durable consumer {}", if paused { "paused" } else { "resumed" });
        Ok(self.info(&consumer))
    }

    /// Puts dead-lettered events back to the consumer (one store transaction), then
    /// hands them out like new captures.
    pub async fn redrive(&self, name: &str, event_ids: &[String], limit: usize) -> Result<Redriven, DurableError> {
        let consumer = self.known(name)?;
        // Dead-letterings queued before the call must be visible to it.
        self.flush().await?;
        let limit = if limit == 0 { MAX_REDRIVE } else { limit.min(MAX_REDRIVE) };
        let ids: Vec<String> = event_ids.iter().take(MAX_REDRIVE).cloned().collect();
        // The store's move and the working state's update run together off the caller,
        // so a caller that goes away mid-call cannot leave moved events unhanded.
        let (this, target) = (self.clone(), Arc::clone(&consumer));
        let moved = tokio::task::spawn_blocking(move || {
            let selection = if ids.is_empty() { RedriveSelection::Oldest(limit) } else { RedriveSelection::Ids(&ids) };
            let moved = this.inner.store.redrive(&target.name, selection, &this.inner.next_seq)?;
            let mut fx = Effects::default();
            {
                let mut st = target.state.lock();
                if !st.deleted {
                    for r in &moved {
                        let event = Arc::new(r.event.clone());
                        let key = r.ordering_key.as_deref().filter(|k| !k.is_empty()).map(Arc::from);
                        add_entry(&target, &mut st, r.seq, event, key, EntryRecord::default(), None, &mut fx);
                    }
                    dispatch(&target, &mut st, &mut fx);
                }
            }
            this.run(fx);
            target.redriven.fetch_add(moved.len() as u64, Ordering::Relaxed);
            Ok::<_, crate::store::StoreError>(moved)
        })
        .await
        .map_err(|e| DurableError::internal("redrive", e))??;
        let remaining = self.inner.store.redrivable(&consumer.name);
        tracing::info!(consumer = %consumer.name, redriven = moved.len(), remaining, "dead letters redriven");
        Ok(Redriven { redriven: moved.len() as u64, remaining })
    }

    /// Runs the effects collected under a lock.
    pub(crate) fn run(&self, fx: Effects) {
        let Effects { mut ops, sends, timers, dead_letters, acks: _ } = fx;
        if !dead_letters.is_empty() {
            let records = self.to_outbox(dead_letters, &mut ops);
            match self.submit_waiting(ops) {
                Some(committed) => self.publish_when_committed(records, committed),
                None => tracing::error!(count = records.len(), "dead letters not stored: the store writer has stopped"),
            }
        } else if !ops.is_empty() {
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
    }

    /// Queues store changes without waiting for their commit.
    pub(crate) fn submit(&self, ops: Vec<StoreOp>) {
        if self.inner.store.inline() {
            if let Err(err) = self.inner.store.apply(&ops) {
                tracing::error!(error = %eventbus_core::error_chain(&err), "durable store commit failed");
            }
            return;
        }
        self.queue(WriteRequest { ops, done: Completion::None });
    }

    /// Queues store changes; the answer says when they are committed (`None`: the
    /// writer has stopped).
    fn submit_waiting(&self, ops: Vec<StoreOp>) -> Option<Committed> {
        let (done, committed) = oneshot::channel();
        if self.inner.store.inline() {
            let _ = done.send(self.inner.store.apply(&ops).map_err(Arc::new));
            return Some(committed);
        }
        self.queue(WriteRequest { ops, done: Completion::Notify(done) }).then_some(committed)
    }

    /// Hands a request to the writer, in order (see [`WriteQueue`]). False when the
    /// writer has stopped.
    fn queue(&self, req: WriteRequest) -> bool {
        self.inner.writer.queue(req)
    }
}
