//! A consumer's working state and its transitions. Everything here runs under that
//! consumer's lock and only collects `Effects`; the engine carries them out after.
//!
//! Ordering keys: per key, only the oldest unfinished event is eligible; the next
//! becomes eligible when it is acked or dead-lettered.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use eventbus_core::durable::{
    ConsumerConfig, ConsumerInfo, Delivery, Failure, LogEntry, LogStatus, PendingEntry, PendingState,
    PublishedDeadLetter, epoch_ms, next_with_room,
};
use eventbus_core::trie::Trie;
use eventbus_core::{Event, Pattern};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::{EntryRecord, StoreOp};

/// Where one unfinished event of a consumer is in its delivery.
#[derive(Debug)]
pub(crate) enum EntryState {
    /// Behind an older event with the same ordering key.
    Parked,
    /// Eligible: in `ready`, handed to the next client with room.
    Ready,
    /// Delayed (a failed attempt's backoff, or a nack's delay) until this instant.
    Waiting(Instant),
    /// Delivered to `client`, to be acked by `deadline`.
    InFlight { client: u64, deadline: Instant, since: Instant },
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) event: Arc<Event>,
    pub(crate) key: Option<Arc<str>>,
    pub(crate) record: EntryRecord,
    pub(crate) state: EntryState,
}

#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) id: u64,
    pub(crate) max_in_flight: u32,
    pub(crate) max_batch: u32,
    pub(crate) in_flight: u32,
    pub(crate) tx: mpsc::Sender<Vec<Delivery>>,
    /// Stopping: takes no more deliveries.
    pub(crate) draining: bool,
}

impl Client {
    /// Events this client can take now (0 when it has left or is stopping).
    fn room(&self) -> usize {
        if self.draining || self.tx.is_closed() {
            return 0;
        }
        self.max_in_flight.saturating_sub(self.in_flight).min(self.max_batch) as usize
    }
}

/// A consumer's working state: its unfinished events and attached clients, behind
/// [`Consumer::state`].
#[derive(Debug, Default)]
pub(crate) struct ConsumerState {
    pub(crate) entries: HashMap<u64, Entry>,
    pub(crate) by_id: HashMap<Arc<str>, u64>,
    pub(crate) ready: BTreeSet<u64>,
    pub(crate) key_queues: HashMap<Arc<str>, VecDeque<u64>>,
    pub(crate) clients: Vec<Client>,
    pub(crate) next_client: usize,
    pub(crate) deleted: bool,
    /// Paused by an operator: nothing is handed out.
    pub(crate) paused: bool,
}

#[derive(Debug)]
pub(crate) struct Consumer {
    pub(crate) name: Arc<str>,
    pub(crate) config: ConsumerConfig,
    pub(crate) filters: Vec<Pattern>,
    pub(crate) state: Mutex<ConsumerState>,
    pub(crate) acked: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) redelivered: AtomicU64,
    pub(crate) redriven: AtomicU64,
    /// Unfinished events, readable without the lock (the `max_pending` check).
    pub(crate) held: AtomicU64,
    /// Captures dropped at `max_pending`.
    pub(crate) dropped: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) by_name: HashMap<Arc<str>, Arc<Consumer>>,
    pub(crate) trie: Trie<Arc<str>>,
}

/// Work collected under a lock, run after it.
#[derive(Default)]
pub(crate) struct Effects {
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) sends: Vec<(mpsc::Sender<Vec<Delivery>>, Vec<Delivery>)>,
    pub(crate) timers: Vec<(Instant, Arc<Consumer>, u64)>,
    pub(crate) dead_letters: Vec<PublishedDeadLetter>,
    pub(crate) acks: Vec<Duration>,
}

// --- state transitions (all under the consumer's lock) ---------------------------

#[allow(clippy::too_many_arguments)]
pub(crate) fn add_entry(
    consumer: &Arc<Consumer>,
    st: &mut ConsumerState,
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
        (false, _) => EntryState::Parked,
        (true, Some(at)) => {
            fx.timers.push((at, Arc::clone(consumer), seq));
            EntryState::Waiting(at)
        }
        (true, None) => {
            st.ready.insert(seq);
            EntryState::Ready
        }
    };
    st.by_id.insert(Arc::clone(&event.id), seq);
    if st.entries.insert(seq, Entry { event, key, record, state }).is_none() {
        consumer.held.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) fn release_client(st: &mut ConsumerState, client: u64) {
    if let Some(c) = st.clients.iter_mut().find(|c| c.id == client) {
        c.in_flight = c.in_flight.saturating_sub(1);
    }
}

/// Hands ready events to clients with room, round-robin, in batches. An exclusive
/// consumer hands them only to its oldest attached client.
pub(crate) fn dispatch(consumer: &Arc<Consumer>, st: &mut ConsumerState, fx: &mut Effects) {
    if st.deleted || st.paused {
        return;
    }
    let now = Instant::now();
    let wall = SystemTime::now();
    let deadline_in = consumer.config.ack_deadline();
    let receivers = if consumer.config.exclusive { st.clients.len().min(1) } else { st.clients.len() };
    while !st.ready.is_empty() {
        let clients = &st.clients;
        let Some((i, room)) = next_with_room(receivers, &mut st.next_client, |i| clients[i].room()) else {
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
            entry.state = EntryState::InFlight { client: client_id, deadline, since: now };
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
pub(crate) fn fail(
    consumer: &Arc<Consumer>,
    st: &mut ConsumerState,
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
    entry.state = EntryState::Waiting(due);
    entry.record.due_ms = Some(epoch_ms(SystemTime::now() + delay));
    fx.ops.push(StoreOp::Update { consumer: Arc::clone(&consumer.name), seq, entry: entry.record.clone() });
    fx.timers.push((due, Arc::clone(consumer), seq));
}

pub(crate) fn dead_letter(consumer: &Arc<Consumer>, st: &mut ConsumerState, seq: u64, fx: &mut Effects) {
    let Some(entry) = st.entries.get(&seq) else { return };
    fx.dead_letters.push(PublishedDeadLetter {
        channel: consumer.config.dead_letter_channel_for(&entry.event.channel),
        event: Arc::clone(&entry.event),
        consumer: consumer.name.to_string(),
        owner: consumer.config.owner.clone(),
        attempts: entry.record.attempts,
        failures: entry.record.failures.clone(),
    });
    finish(consumer, st, seq, LogStatus::DeadLettered, fx);
}

/// Removes a finished event, logs it, and lets the next event of its key go.
pub(crate) fn finish(consumer: &Arc<Consumer>, st: &mut ConsumerState, seq: u64, status: LogStatus, fx: &mut Effects) {
    let Some(entry) = st.entries.remove(&seq) else { return };
    consumer.held.fetch_sub(1, Ordering::Relaxed);
    st.by_id.remove(&*entry.event.id);
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
                    && matches!(e.state, EntryState::Parked)
                {
                    e.state = EntryState::Ready;
                    st.ready.insert(next);
                }
            }
        }
    }
    match status {
        LogStatus::Completed => consumer.acked.fetch_add(1, Ordering::Relaxed),
        LogStatus::DeadLettered => consumer.dead_lettered.fetch_add(1, Ordering::Relaxed),
        LogStatus::Redriven => consumer.redriven.fetch_add(1, Ordering::Relaxed),
    };
    let log = LogEntry {
        event_id: entry.event.id.to_string(),
        channel: entry.event.channel.clone(),
        status,
        attempts: entry.record.attempts,
        first_delivered_ms: entry.record.first_delivered_ms,
        finished_ms: epoch_ms(SystemTime::now()),
        failures: entry.record.failures,
    };
    fx.ops.push(StoreOp::Finish { consumer: Arc::clone(&consumer.name), seq, log });
}

/// The consumer's state; `redrivable` comes from the store.
pub(crate) fn info(consumer: &Consumer, redrivable: u64) -> ConsumerInfo {
    let st = consumer.state.lock();
    let in_flight = st.entries.values().filter(|e| matches!(e.state, EntryState::InFlight { .. })).count() as u64;
    ConsumerInfo {
        config: consumer.config.clone(),
        pending: st.entries.len() as u64 - in_flight,
        in_flight,
        clients: st.clients.len() as u32,
        acked: consumer.acked.load(Ordering::Relaxed),
        dead_lettered: consumer.dead_lettered.load(Ordering::Relaxed),
        redelivered: consumer.redelivered.load(Ordering::Relaxed),
        redriven: consumer.redriven.load(Ordering::Relaxed),
        dropped: consumer.dropped.load(Ordering::Relaxed),
        paused: st.paused,
        redrivable,
    }
}

/// Where an entry stands, for `ListPending`.
pub(crate) fn pending_entry(entry: &Entry, now: Instant, wall: SystemTime) -> PendingEntry {
    let at = |instant: Instant| epoch_ms(wall + instant.saturating_duration_since(now));
    let (state, next_delivery_ms) = match entry.state {
        EntryState::Parked => (PendingState::BlockedByOrderingKey, None),
        EntryState::Ready => (PendingState::Ready, None),
        EntryState::Waiting(due) => (PendingState::Delayed, Some(at(due))),
        EntryState::InFlight { deadline, .. } => (PendingState::InFlight, Some(at(deadline))),
    };
    PendingEntry {
        event: Arc::clone(&entry.event),
        attempt: entry.record.attempts,
        next_delivery_ms,
        failures: entry.record.failures.clone(),
        state,
    }
}
