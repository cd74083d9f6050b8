//! The embedded durable store before the move to fjall: one redb file under
//! `durable.data_dir` (crash-safe, copy-on-write B-trees), or redb's in-memory backend
//! when `data_dir` is empty. Kept (feature `migrate-redb`) to migrate such a directory
//! to fjall, and as a second implementation the store contract runs on.
//!
//! Tables: `consumers` (name → JSON config), `events` (seq → binary event with the
//! number of consumers still holding it), `entries` ((consumer, seq) → JSON state),
//! `log` ((consumer, log seq) → JSON entry), `dedup` (idempotency key → JSON record),
//! `dead_letters` (outbox id → binary dead letter, until published), `dead`
//! ((consumer, seq) → JSON record: a dead-lettered event kept for redrive, holding its
//! event; bounded like the log), `paused` (consumer → since, ms), `meta` (schema
//! marker and counters). A file without the schema marker is refused.

mod migrate;
mod tables;

pub use migrate::Copied;

use tables::{LogTrack, Tables, put_dedup, release_event};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use eventbus_core::durable::{LogEntry, LogStatus, Retention, epoch_ms};

use crate::codec::{decode_dead_letter, decode_event, encode_dead_letter, encode_event, set_refs};
use crate::store::{
    BATCH_FLUSH_MS, DeadRecord, DedupRecord, FRESH_ENTRY, Fsync, Loaded, LogPage, RedriveSelection, RedrivenEvent,
    Store, StoreError, StoreOp, StoredEvent,
};

const CONSUMERS: TableDefinition<&str, &str> = TableDefinition::new("consumers");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const ENTRIES: TableDefinition<(&str, u64), &str> = TableDefinition::new("entries");
const LOG: TableDefinition<(&str, u64), &str> = TableDefinition::new("log");
const DEDUP: TableDefinition<&str, &str> = TableDefinition::new("dedup");
const DEAD_LETTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("dead_letters");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const DEAD: TableDefinition<(&str, u64), &str> = TableDefinition::new("dead");
const PAUSED: TableDefinition<&str, u64> = TableDefinition::new("paused");

/// Marks a file as ours (value = schema version).
const SCHEMA_KEY: &str = "socle-eventbus-schema";
const SCHEMA_VERSION: u64 = 1;
pub use crate::fjall_store::REDB_FILE_NAME as FILE_NAME;
/// `location` of an in-memory store.
const MEMORY: &str = "(memory)";

/// The redb-backed [`Store`].
#[derive(Debug)]
pub struct RedbStore {
    db: Database,
    location: String,
    /// The store's directory; `None` in memory.
    dir: Option<PathBuf>,
    fsync: Fsync,
    retention: Retention,
    next_log: AtomicU64,
    /// Per consumer: its log lines, to enforce `max_entries` without counting, and the
    /// age of the oldest, to enforce `max_age_ms` without reading it per append.
    logs: Mutex<HashMap<String, LogTrack>>,
    /// Events kept for redrive per consumer, likewise.
    dead_counts: Mutex<HashMap<String, u64>>,
    last_durable_ms: AtomicU64,
}

fn io(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Io(e.into().into())
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt { what: "a JSON record".into(), source: Some(e.into()) }
}

impl RedbStore {
    /// Opens (or creates) the store in `data_dir`; an empty `data_dir` keeps it in memory.
    pub fn open(data_dir: &Path, fsync: Fsync, retention: Retention) -> Result<Self, StoreError> {
        let dir = (!data_dir.as_os_str().is_empty()).then(|| data_dir.to_path_buf());
        let (db, location) = if data_dir.as_os_str().is_empty() {
            let db = Database::builder()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .map_err(|e| StoreError::Open { path: MEMORY.into(), source: e.into() })?;
            (db, MEMORY.to_owned())
        } else {
            std::fs::create_dir_all(data_dir)
                .map_err(|e| StoreError::Open { path: data_dir.display().to_string(), source: e.into() })?;
            let path: PathBuf = data_dir.join(FILE_NAME);
            let db = Database::create(&path)
                .map_err(|e| StoreError::Open { path: path.display().to_string(), source: e.into() })?;
            (db, path.display().to_string())
        };
        let store = Self {
            db,
            location,
            dir,
            fsync,
            retention,
            next_log: AtomicU64::new(1),
            logs: Mutex::default(),
            dead_counts: Mutex::default(),
            last_durable_ms: AtomicU64::new(0),
        };
        store.init()?;
        Ok(store)
    }

    /// Checks (or writes) the schema marker and creates the tables.
    fn init(&self) -> Result<(), StoreError> {
        let refuse = |reason: String| StoreError::Refused { path: self.location.clone(), reason };
        let txn = self.db.begin_write().map_err(io)?;
        {
            let mut meta = txn.open_table(META).map_err(io)?;
            let schema = meta.get(SCHEMA_KEY).map_err(io)?.map(|v| v.value());
            match schema {
                Some(SCHEMA_VERSION) => {}
                Some(other) => {
                    return Err(refuse(format!("schema version {other}, this eventbusd reads {SCHEMA_VERSION}")));
                }
                None => {
                    let foreign = txn.list_tables().map_err(io)?.any(|t| t.name() != "meta");
                    if foreign {
                        return Err(refuse("a redb file that is not an eventbus store".into()));
                    }
                    meta.insert(SCHEMA_KEY, SCHEMA_VERSION).map_err(io)?;
                }
            }
            let next_log = meta.get("next_log").map_err(io)?.map_or(1, |v| v.value());
            self.next_log.store(next_log, Ordering::Relaxed);
            txn.open_table(CONSUMERS).map_err(io)?;
            txn.open_table(EVENTS).map_err(io)?;
            txn.open_table(ENTRIES).map_err(io)?;
            txn.open_table(DEDUP).map_err(io)?;
            txn.open_table(DEAD_LETTERS).map_err(io)?;
            txn.open_table(PAUSED).map_err(io)?;
            let log = txn.open_table(LOG).map_err(io)?;
            let mut logs = self.logs.lock();
            for row in log.iter().map_err(io)? {
                let (key, _) = row.map_err(io)?;
                logs.entry(key.value().0.to_owned()).or_default().count += 1;
            }
            let dead = txn.open_table(DEAD).map_err(io)?;
            let mut counts = self.dead_counts.lock();
            for row in dead.iter().map_err(io)? {
                let (key, _) = row.map_err(io)?;
                *counts.entry(key.value().0.to_owned()).or_default() += 1;
            }
        }
        txn.commit().map_err(io)
    }

    fn apply_op(&self, t: &mut Tables<'_>, op: &StoreOp, now_ms: u64) -> Result<(), StoreError> {
        match op {
            StoreOp::PutConsumer(config) => {
                let json = serde_json::to_string(config).map_err(corrupt)?;
                t.consumers()?.insert(config.name.as_str(), json.as_str()).map_err(io)?;
            }
            StoreOp::DeleteConsumer(name) => {
                t.consumers()?.remove(name.as_str()).map_err(io)?;
                let seqs: Vec<u64> = {
                    let rows = t.entries()?.range((name.as_str(), 0)..=(name.as_str(), u64::MAX)).map_err(io)?;
                    rows.map(|r| r.map(|(k, _)| k.value().1)).collect::<Result<_, _>>().map_err(io)?
                };
                for seq in seqs {
                    t.entries()?.remove((name.as_str(), seq)).map_err(io)?;
                    release_event(t, seq)?;
                }
                t.log()?.retain_in((name.as_str(), 0)..=(name.as_str(), u64::MAX), |_, _| false).map_err(io)?;
                self.logs.lock().remove(name);
                let dead: Vec<u64> = {
                    let rows = t.dead()?.range((name.as_str(), 0)..=(name.as_str(), u64::MAX)).map_err(io)?;
                    rows.map(|r| r.map(|(k, _)| k.value().1)).collect::<Result<_, _>>().map_err(io)?
                };
                for seq in dead {
                    t.dead()?.remove((name.as_str(), seq)).map_err(io)?;
                    release_event(t, seq)?;
                }
                self.dead_counts.lock().remove(name);
                t.paused()?.remove(name.as_str()).map_err(io)?;
            }
            StoreOp::Capture { seq, event, ordering_key, consumers, dedup } => {
                if !consumers.is_empty() {
                    let bytes = encode_event(event, ordering_key.as_deref(), consumers.len() as u32);
                    t.events()?.insert(*seq, bytes.as_slice()).map_err(io)?;
                    let entries = t.entries()?;
                    for consumer in consumers {
                        entries.insert((&**consumer, *seq), FRESH_ENTRY).map_err(io)?;
                    }
                }
                if let Some(d) = dedup {
                    put_dedup(t, d, now_ms)?;
                }
            }
            StoreOp::Dedup(d) => put_dedup(t, d, now_ms)?,
            StoreOp::Update { consumer, seq, entry } => {
                let json = serde_json::to_string(entry).map_err(corrupt)?;
                let entries = t.entries()?;
                // An update racing a finish must not resurrect the entry: one B-tree
                // walk in the common case (it is there), a second to undo the rare one.
                let absent = entries.insert((&**consumer, *seq), json.as_str()).map_err(io)?.is_none();
                if absent {
                    entries.remove((&**consumer, *seq)).map_err(io)?;
                }
            }
            StoreOp::Finish { consumer, seq, log } => {
                let removed = t.entries()?.remove((&**consumer, *seq)).map_err(io)?.is_some();
                if removed && log.status == LogStatus::DeadLettered {
                    // Kept, with its event, for a redrive.
                    self.keep_dead(t, consumer, *seq, log, now_ms)?;
                } else if removed {
                    release_event(t, *seq)?;
                }
                self.append_log(t, consumer, log, now_ms)?;
            }
            StoreOp::SetPaused { consumer, paused } => {
                let table = t.paused()?;
                if *paused {
                    table.insert(&**consumer, now_ms).map_err(io)?;
                } else {
                    table.remove(&**consumer).map_err(io)?;
                }
            }
            StoreOp::PutDeadLetter { id, record } => {
                let bytes = encode_dead_letter(record);
                t.dead_letters()?.insert(*id, bytes.as_slice()).map_err(io)?;
            }
            StoreOp::DeleteDeadLetter { id } => {
                t.dead_letters()?.remove(*id).map_err(io)?;
            }
        }
        Ok(())
    }

    /// Appends a terminal-log line and drops the oldest ones past the count or age
    /// bound. The log counter (`meta.next_log`) is saved once per transaction, by
    /// [`Tables::finish`].
    fn append_log(&self, t: &mut Tables<'_>, consumer: &str, entry: &LogEntry, now_ms: u64) -> Result<(), StoreError> {
        let id = self.next_log.fetch_add(1, Ordering::Relaxed);
        t.next_log = Some(id + 1);
        let json = serde_json::to_string(entry).map_err(corrupt)?;
        let log = t.log()?;
        log.insert((consumer, id), json.as_str()).map_err(io)?;
        let mut logs = self.logs.lock();
        let track = logs.entry(consumer.to_owned()).or_default();
        track.count += 1;
        let cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        while track.count > 0 {
            let too_many = track.count > self.retention.max_entries;
            // The oldest line's age is read once and remembered until it is dropped:
            // otherwise every append would walk to it and parse it.
            if !too_many && track.oldest_ms.is_some_and(|ms| ms >= cutoff) {
                break;
            }
            let Some((key, value)) =
                log.range((consumer, 0)..=(consumer, u64::MAX)).map_err(io)?.next().transpose().map_err(io)?
            else {
                break;
            };
            let oldest = key.value().1;
            let finished_ms = serde_json::from_str::<LogEntry>(value.value()).ok().map(|e| e.finished_ms);
            drop((key, value));
            let too_old = finished_ms.is_none_or(|ms| ms < cutoff);
            if !(too_many || too_old) {
                track.oldest_ms = finished_ms;
                break;
            }
            log.remove((consumer, oldest)).map_err(io)?;
            track.count -= 1;
            track.oldest_ms = None;
        }
        Ok(())
    }
}

impl RedbStore {
    /// After a transaction that did not commit: the log ages remembered may name lines
    /// it dropped and that are back, so each is read again at the next append.
    fn forget_log_ages(&self) {
        for track in self.logs.lock().values_mut() {
            track.oldest_ms = None;
        }
    }

    /// Keeps a dead-lettered event for redrive, dropping the oldest kept ones past the
    /// retention bounds (their events released).
    fn keep_dead(
        &self,
        t: &mut Tables<'_>,
        consumer: &str,
        seq: u64,
        log: &LogEntry,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let record = DeadRecord::of(log, now_ms);
        let json = serde_json::to_string(&record).map_err(corrupt)?;
        let dead = t.dead()?;
        dead.insert((consumer, seq), json.as_str()).map_err(io)?;
        let mut counts = self.dead_counts.lock();
        let count = counts.entry(consumer.to_owned()).or_default();
        *count += 1;
        let cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        let mut dropped = Vec::new();
        while *count > 0 {
            let Some((key, value)) =
                dead.range((consumer, 0)..=(consumer, u64::MAX)).map_err(io)?.next().transpose().map_err(io)?
            else {
                break;
            };
            let oldest = key.value().1;
            let too_many = *count > self.retention.max_entries;
            let too_old = serde_json::from_str::<DeadRecord>(value.value()).map_or(true, |r| r.at_ms < cutoff);
            drop((key, value));
            if !(too_many || too_old) {
                break;
            }
            dead.remove((consumer, oldest)).map_err(io)?;
            *count -= 1;
            dropped.push(oldest);
        }
        drop(counts);
        for seq in dropped {
            release_event(t, seq)?;
        }
        Ok(())
    }
}

impl Store for RedbStore {
    fn inline(&self) -> bool {
        self.location == MEMORY
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(io)?;
        let mut loaded = Loaded::default();
        for row in txn.open_table(CONSUMERS).map_err(io)?.iter().map_err(io)? {
            let (_, v) = row.map_err(io)?;
            loaded.consumers.push(serde_json::from_str(v.value()).map_err(corrupt)?);
        }
        for row in txn.open_table(EVENTS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let (event, ordering_key, _) = decode_event(v.value())?;
            loaded.next_seq = loaded.next_seq.max(k.value() + 1);
            loaded.events.push(StoredEvent { seq: k.value(), event, ordering_key });
        }
        for row in txn.open_table(ENTRIES).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let (consumer, seq) = k.value();
            loaded.entries.push((consumer.to_owned(), seq, serde_json::from_str(v.value()).map_err(corrupt)?));
        }
        let now = epoch_ms(std::time::SystemTime::now());
        for row in txn.open_table(DEDUP).map_err(io)?.iter().map_err(io)? {
            let (_, v) = row.map_err(io)?;
            let record: DedupRecord = serde_json::from_str(v.value()).map_err(corrupt)?;
            if record.expires_ms > now {
                loaded.dedup.push(record);
            }
        }
        for row in txn.open_table(LOG).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let entry: LogEntry = serde_json::from_str(v.value()).map_err(corrupt)?;
            let counts = loaded.finished.entry(k.value().0.to_owned()).or_default();
            match entry.status {
                LogStatus::Completed => counts.acked += 1,
                LogStatus::DeadLettered => counts.dead_lettered += 1,
                LogStatus::Redriven => counts.redriven += 1,
            }
        }
        for row in txn.open_table(PAUSED).map_err(io)?.iter().map_err(io)? {
            let (k, _) = row.map_err(io)?;
            loaded.paused.push(k.value().to_owned());
        }
        for row in txn.open_table(DEAD_LETTERS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            loaded.dead_letters.push((k.value(), decode_dead_letter(v.value())?));
        }
        let meta = txn.open_table(META).map_err(io)?;
        let saved_seq = meta.get("next_seq").map_err(io)?.map_or(0, |v| v.value());
        loaded.next_seq = loaded.next_seq.max(saved_seq).max(1);
        Ok(loaded)
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        let now_ms = epoch_ms(std::time::SystemTime::now());
        let mut txn = self.db.begin_write().map_err(io)?;
        let durable = match self.fsync {
            Fsync::Always => true,
            Fsync::Batch => now_ms >= self.last_durable_ms.load(Ordering::Relaxed) + BATCH_FLUSH_MS,
        };
        let durability = if durable { Durability::Immediate } else { Durability::None };
        txn.set_durability(durability).map_err(io)?;
        let applied = (|| {
            let mut tables = Tables::new(&txn);
            for op in ops {
                if let StoreOp::Capture { seq, .. } = op {
                    tables.max_seq = tables.max_seq.max(*seq);
                }
                self.apply_op(&mut tables, op, now_ms)?;
            }
            tables.finish()
        })();
        if let Err(err) = applied.and_then(|()| txn.commit().map_err(io)) {
            self.forget_log_ages();
            return Err(err);
        }
        if durable {
            self.last_durable_ms.store(now_ms, Ordering::Relaxed);
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
        let txn = self.db.begin_write().map_err(io)?;
        let moved = (|| {
            let mut t = Tables::new(&txn);
            let mut chosen: Vec<(u64, DeadRecord)> = Vec::new();
            for row in t.dead()?.range((consumer, 0)..=(consumer, u64::MAX)).map_err(io)? {
                let (k, v) = row.map_err(io)?;
                let record: DeadRecord = serde_json::from_str(v.value()).map_err(corrupt)?;
                match selection {
                    RedriveSelection::Oldest(limit) if chosen.len() >= limit => break,
                    RedriveSelection::Ids(ids) if !ids.contains(&record.event_id) => continue,
                    _ => chosen.push((k.value().1, record)),
                }
            }
            let mut out = Vec::with_capacity(chosen.len());
            for (old, record) in chosen {
                let bytes = match t.events()?.get(old).map_err(io)? {
                    Some(v) => v.value().to_vec(),
                    None => return Err(StoreError::corrupt(format!("dead-lettered event {old} without its event"))),
                };
                let (event, ordering_key, _) = decode_event(&bytes)?;
                let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                let fresh = encode_event(&event, ordering_key.as_deref(), 1);
                t.events()?.insert(seq, fresh.as_slice()).map_err(io)?;
                release_event(&mut t, old)?;
                t.dead()?.remove((consumer, old)).map_err(io)?;
                t.entries()?.insert((consumer, seq), FRESH_ENTRY).map_err(io)?;
                let line = record.redriven(now_ms);
                self.append_log(&mut t, consumer, &line, now_ms)?;
                t.max_seq = t.max_seq.max(seq);
                out.push(RedrivenEvent { seq, event, ordering_key });
            }
            t.finish()?;
            Ok(out)
        })();
        let out = match moved.and_then(|out| txn.commit().map_err(io).map(|()| out)) {
            Ok(out) => out,
            Err(err) => {
                self.forget_log_ages();
                return Err(err);
            }
        };
        if !out.is_empty()
            && let Some(count) = self.dead_counts.lock().get_mut(consumer)
        {
            *count = count.saturating_sub(out.len() as u64);
        }
        Ok(out)
    }

    fn redrivable(&self, consumer: &str) -> u64 {
        self.dead_counts.lock().get(consumer).copied().unwrap_or(0)
    }

    fn free_space(&self) -> Option<u64> {
        crate::store::free_space(self.dir.as_ref()?)
    }

    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, StoreError> {
        let txn = self.db.begin_read().map_err(io)?;
        let log = txn.open_table(LOG).map_err(io)?;
        let start = after.map_or(0, |a| a.saturating_add(1));
        let mut page = LogPage::default();
        let mut last = None;
        for row in log.range((consumer, start)..=(consumer, u64::MAX)).map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let entry: LogEntry = serde_json::from_str(v.value()).map_err(corrupt)?;
            if page.entries.len() == limit {
                page.next = last;
                break;
            }
            last = Some(k.value().1);
            if status.is_none_or(|s| s == entry.status) {
                page.entries.push(entry);
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests;
