//! The store when `durable.data_dir` is empty: maps in memory, nothing survives a
//! restart. It keeps the same contract as the store on disk (the tests in
//! `store_tests.rs` run on both): a batch of ops applies atomically, the terminal log
//! and the dead-lettered events kept for redrive are bounded by the retention, an event
//! is kept while a consumer holds it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use eventbus_core::Event;
use eventbus_core::durable::{ConsumerConfig, LogEntry, LogStatus, Retention, epoch_ms};
use parking_lot::Mutex;

use crate::store::{
    DeadLetterRecord, DeadRecord, DedupRecord, EntryRecord, Loaded, LogPage, RedriveSelection, RedrivenEvent, Store,
    StoreError, StoreOp, StoredEvent,
};

/// Expired idempotency keys looked at per new key (as the store on disk prunes them).
const DEDUP_PRUNE: usize = 16;

/// The in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    retention: Retention,
    state: Mutex<State>,
}

/// A captured event and how many consumers still hold it.
#[derive(Debug)]
struct Kept {
    event: Arc<Event>,
    ordering_key: Option<Arc<str>>,
    holders: usize,
}

#[derive(Debug, Default)]
struct State {
    consumers: BTreeMap<String, ConsumerConfig>,
    events: BTreeMap<u64, Kept>,
    /// Per consumer: its unfinished events by sequence number.
    entries: HashMap<String, BTreeMap<u64, EntryRecord>>,
    /// Per consumer: its terminal log by line number (one counter for all).
    log: HashMap<String, BTreeMap<u64, LogEntry>>,
    /// Per consumer: its dead-lettered events kept for redrive.
    dead: HashMap<String, BTreeMap<u64, DeadRecord>>,
    dedup: BTreeMap<String, DedupRecord>,
    dead_letters: BTreeMap<u64, DeadLetterRecord>,
    /// Paused consumers.
    paused: BTreeMap<String, u64>,
    next_log: u64,
    /// One past the highest capture sequence number.
    next_seq: u64,
}

impl MemoryStore {
    pub fn new(retention: Retention) -> Self {
        Self { retention, state: Mutex::new(State { next_log: 1, next_seq: 1, ..State::default() }) }
    }
}

impl State {
    fn apply(&mut self, op: &StoreOp, retention: Retention, now_ms: u64) {
        match op {
            StoreOp::PutConsumer(config) => {
                self.consumers.insert(config.name.clone(), config.clone());
            }
            StoreOp::DeleteConsumer(name) => {
                self.consumers.remove(name);
                let held = self.entries.remove(name).into_iter().flat_map(BTreeMap::into_keys);
                let kept = self.dead.remove(name).into_iter().flat_map(BTreeMap::into_keys);
                for seq in held.chain(kept).collect::<Vec<_>>() {
                    self.release(seq);
                }
                self.log.remove(name);
                self.paused.remove(name);
            }
            StoreOp::Capture { seq, event, ordering_key, consumers, dedup } => {
                if !consumers.is_empty() {
                    let kept =
                        Kept { event: Arc::clone(event), ordering_key: ordering_key.clone(), holders: consumers.len() };
                    self.events.insert(*seq, kept);
                    for consumer in consumers {
                        self.entries.entry(consumer.to_string()).or_default().insert(*seq, EntryRecord::default());
                    }
                }
                self.next_seq = self.next_seq.max(seq + 1);
                if let Some(d) = dedup {
                    self.put_dedup(d, now_ms);
                }
            }
            StoreOp::Dedup(d) => self.put_dedup(d, now_ms),
            StoreOp::Update { consumer, seq, entry } => {
                // An update racing a finish does not bring the entry back.
                if let Some(kept) = self.entries.get_mut(&**consumer).and_then(|e| e.get_mut(seq)) {
                    *kept = entry.clone();
                }
            }
            StoreOp::Finish { consumer, seq, log } => {
                let removed = self.entries.get_mut(&**consumer).and_then(|e| e.remove(seq)).is_some();
                if removed && log.status == LogStatus::DeadLettered {
                    // Kept, with its event, for a redrive.
                    self.keep_dead(consumer, *seq, DeadRecord::of(log, now_ms), retention, now_ms);
                } else if removed {
                    self.release(*seq);
                }
                self.append_log(consumer, log.clone(), retention, now_ms);
            }
            StoreOp::SetPaused { consumer, paused } => match paused {
                true => {
                    self.paused.insert(consumer.to_string(), now_ms);
                }
                false => {
                    self.paused.remove(&**consumer);
                }
            },
            StoreOp::PutDeadLetter { id, record } => {
                self.dead_letters.insert(*id, record.clone());
            }
            StoreOp::DeleteDeadLetter { id } => {
                self.dead_letters.remove(id);
            }
        }
    }

    /// One holder is done with event `seq`: dropped when none holds it any more.
    fn release(&mut self, seq: u64) {
        if let Some(kept) = self.events.get_mut(&seq) {
            kept.holders -= 1;
            if kept.holders == 0 {
                self.events.remove(&seq);
            }
        }
    }

    /// Keeps an idempotency key, pruning a few expired ones.
    fn put_dedup(&mut self, d: &DedupRecord, now_ms: u64) {
        self.dedup.insert(d.key.clone(), d.clone());
        let expired: Vec<String> =
            self.dedup.values().take(DEDUP_PRUNE).filter(|r| r.expires_ms <= now_ms).map(|r| r.key.clone()).collect();
        for key in expired {
            self.dedup.remove(&key);
        }
    }

    /// Appends a terminal-log line, dropping the oldest past the count or age bound.
    fn append_log(&mut self, consumer: &str, entry: LogEntry, retention: Retention, now_ms: u64) {
        let id = self.next_log;
        self.next_log += 1;
        let log = self.log.entry(consumer.to_owned()).or_default();
        log.insert(id, entry);
        let cutoff = now_ms.saturating_sub(retention.max_age_ms);
        loop {
            let too_many = log.len() as u64 > retention.max_entries;
            let Some(oldest) = log.first_entry() else { break };
            if !too_many && oldest.get().finished_ms >= cutoff {
                break;
            }
            oldest.remove();
        }
    }

    /// Keeps a dead-lettered event for redrive, dropping the oldest kept ones past the
    /// retention bounds (their events released).
    fn keep_dead(&mut self, consumer: &str, seq: u64, record: DeadRecord, retention: Retention, now_ms: u64) {
        let dead = self.dead.entry(consumer.to_owned()).or_default();
        dead.insert(seq, record);
        let cutoff = now_ms.saturating_sub(retention.max_age_ms);
        let mut dropped = Vec::new();
        loop {
            let too_many = dead.len() as u64 > retention.max_entries;
            let Some(oldest) = dead.first_entry() else { break };
            if !too_many && oldest.get().at_ms >= cutoff {
                break;
            }
            dropped.push(*oldest.key());
            oldest.remove();
        }
        for seq in dropped {
            self.release(seq);
        }
    }
}

impl Store for MemoryStore {
    fn inline(&self) -> bool {
        true
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let state = self.state.lock();
        let now = epoch_ms(std::time::SystemTime::now());
        let mut loaded = Loaded {
            consumers: state.consumers.values().cloned().collect(),
            dedup: state.dedup.values().filter(|r| r.expires_ms > now).cloned().collect(),
            next_seq: state.next_seq,
            dead_letters: state.dead_letters.iter().map(|(id, r)| (*id, r.clone())).collect(),
            paused: state.paused.keys().cloned().collect(),
            ..Loaded::default()
        };
        loaded.events = state
            .events
            .iter()
            .map(|(seq, kept)| StoredEvent {
                seq: *seq,
                event: Event::clone(&kept.event),
                ordering_key: kept.ordering_key.as_deref().map(str::to_owned),
            })
            .collect();
        for (consumer, entries) in &state.entries {
            loaded.entries.extend(entries.iter().map(|(seq, e)| (consumer.clone(), *seq, e.clone())));
        }
        for (consumer, log) in &state.log {
            let counts = loaded.finished.entry(consumer.clone()).or_default();
            for entry in log.values() {
                match entry.status {
                    LogStatus::Completed => counts.acked += 1,
                    LogStatus::DeadLettered => counts.dead_lettered += 1,
                    LogStatus::Redriven => counts.redriven += 1,
                }
            }
        }
        Ok(loaded)
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        let now_ms = epoch_ms(std::time::SystemTime::now());
        let mut state = self.state.lock();
        for op in ops {
            state.apply(op, self.retention, now_ms);
        }
        Ok(())
    }

    fn redrive(
        &self,
        consumer: &str,
        selection: RedriveSelection<'_>,
        next_seq: &AtomicU64,
    ) -> Result<Vec<RedrivenEvent>, StoreError> {
        let now_ms = epoch_ms(std::time::SystemTime::now());
        let mut state = self.state.lock();
        let chosen: Vec<u64> = match state.dead.get(consumer) {
            None => Vec::new(),
            Some(dead) => match selection {
                RedriveSelection::Oldest(limit) => dead.keys().take(limit).copied().collect(),
                RedriveSelection::Ids(ids) => {
                    dead.iter().filter(|(_, r)| ids.contains(&r.event_id)).map(|(seq, _)| *seq).collect()
                }
            },
        };
        // Checked before anything moves: the batch moves whole or not at all.
        if let Some(old) = chosen.iter().find(|old| !state.events.contains_key(old)) {
            return Err(StoreError::corrupt(format!("dead-lettered event {old} without its event")));
        }
        let mut out = Vec::with_capacity(chosen.len());
        for old in chosen {
            let Some(record) = state.dead.get_mut(consumer).and_then(|d| d.remove(&old)) else { continue };
            let Some(kept) = state.events.get(&old) else { continue };
            let (event, ordering_key) = (Arc::clone(&kept.event), kept.ordering_key.clone());
            let seq = next_seq.fetch_add(1, Ordering::Relaxed);
            state.release(old);
            state
                .events
                .insert(seq, Kept { event: Arc::clone(&event), ordering_key: ordering_key.clone(), holders: 1 });
            state.entries.entry(consumer.to_owned()).or_default().insert(seq, EntryRecord::default());
            state.next_seq = state.next_seq.max(seq + 1);
            state.append_log(consumer, record.redriven(now_ms), self.retention, now_ms);
            out.push(RedrivenEvent {
                seq,
                event: Event::clone(&event),
                ordering_key: ordering_key.as_deref().map(str::to_owned),
            });
        }
        Ok(out)
    }

    fn redrivable(&self, consumer: &str) -> u64 {
        self.state.lock().dead.get(consumer).map_or(0, |d| d.len() as u64)
    }

    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, StoreError> {
        let state = self.state.lock();
        let mut page = LogPage::default();
        let Some(log) = state.log.get(consumer) else { return Ok(page) };
        let start = after.map_or(0, |a| a.saturating_add(1));
        let mut last = None;
        for (id, entry) in log.range(start..) {
            if page.entries.len() == limit {
                page.next = last;
                break;
            }
            last = Some(*id);
            if status.is_none_or(|s| s == entry.status) {
                page.entries.push(entry.clone());
            }
        }
        Ok(page)
    }
}
