//! The embedded durable store on disk: a fjall database (log-structured: every commit
//! is appended to a journal, then to in-memory tables flushed and compacted in the
//! background) under `durable.data_dir/store`.
//!
//! Keyspaces: `consumers` (name → JSON config), `events` (seq → binary event),
//! `entries` ((consumer, seq) → JSON state), `log` ((consumer, log seq) → JSON entry),
//! `dedup` (idempotency key → JSON record), `dead_letters` (outbox id → binary dead
//! letter, until published), `dead` ((consumer, seq) → JSON record of a dead-lettered
//! event kept for redrive), `paused` (consumer → since, ms), `meta` (schema marker and
//! counters). Composite keys are the consumer's name, a zero byte, then the number big
//! endian, so one consumer's rows are one ordered range.
//!
//! Commits never read: which entries exist, how many consumers still hold an event, the
//! age of each log line, are kept in an [`Index`] rebuilt when the store opens. A
//! commit is then a batch of blind writes appended to the journal, and
//! [`Store::write`] returns before the journal is on disk: [`Store::sync`] makes it
//! durable, so the writer prepares and appends the next group while the previous one
//! is being synced.

mod index;
mod migrate;

pub use migrate::REDB_FILE_NAME;

use index::Index;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch, PersistMode};
use parking_lot::Mutex;

use eventbus_core::durable::{LogEntry, LogStatus, Retention, epoch_ms};

use crate::codec::{decode_dead_letter, decode_event, encode_dead_letter, encode_event};
use crate::store::{
    BATCH_FLUSH_MS, DeadRecord, DedupRecord, EntryRecord, FRESH_ENTRY, Fsync, Loaded, LogPage, RedriveSelection,
    RedrivenEvent, Store, StoreError, StoreOp, StoredEvent,
};

/// The store's directory under `durable.data_dir`.
pub const STORE_DIR: &str = "store";

const SCHEMA_KEY: &str = "socle-eventbus-schema";
const SCHEMA_VERSION: u64 = 2;
const NEXT_SEQ: &str = "next_seq";
const NEXT_LOG: &str = "next_log";

fn io(e: fjall::Error) -> StoreError {
    StoreError::Io(e.into())
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt { what: "a JSON record".into(), source: Some(e.into()) }
}

/// `name`, a zero byte, then `n` big endian: one consumer's rows sort together, by `n`.
/// Names never hold a zero byte (consumer names are letters, digits, `-`, `_`, `.`).
pub(crate) fn pair_key(name: &str, n: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 9);
    key.extend_from_slice(name.as_bytes());
    key.push(0);
    key.extend_from_slice(&n.to_be_bytes());
    key
}

/// Splits a [`pair_key`].
fn split_pair_key(key: &[u8]) -> Result<(&str, u64), StoreError> {
    let bad = || StoreError::corrupt("a malformed key");
    let split = key.len().checked_sub(9).ok_or_else(bad)?;
    let (name, rest) = key.split_at(split);
    let (zero, n) = rest.split_first().ok_or_else(bad)?;
    let n: [u8; 8] = n.try_into().map_err(|_| bad())?;
    if *zero != 0 {
        return Err(bad());
    }
    Ok((std::str::from_utf8(name).map_err(|_| bad())?, u64::from_be_bytes(n)))
}

fn number(value: &[u8]) -> Result<u64, StoreError> {
    let n: [u8; 8] = value.try_into().map_err(|_| StoreError::corrupt("a malformed number"))?;
    Ok(u64::from_be_bytes(n))
}

/// The keyspaces, opened once.
#[derive(Clone)]
pub(crate) struct Keyspaces {
    pub(crate) consumers: Keyspace,
    pub(crate) events: Keyspace,
    pub(crate) entries: Keyspace,
    pub(crate) log: Keyspace,
    pub(crate) dedup: Keyspace,
    pub(crate) dead_letters: Keyspace,
    pub(crate) dead: Keyspace,
    pub(crate) paused: Keyspace,
    pub(crate) meta: Keyspace,
}

impl Keyspaces {
    const NAMES: [&'static str; 9] =
        ["consumers", "events", "entries", "log", "dedup", "dead_letters", "dead", "paused", "meta"];

    fn open(db: &Database) -> Result<Self, fjall::Error> {
        let ks = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default);
        Ok(Self {
            consumers: ks("consumers")?,
            events: ks("events")?,
            entries: ks("entries")?,
            log: ks("log")?,
            dedup: ks("dedup")?,
            dead_letters: ks("dead_letters")?,
            dead: ks("dead")?,
            paused: ks("paused")?,
            meta: ks("meta")?,
        })
    }
}

/// The fjall-backed [`Store`].
pub struct FjallStore {
    db: Database,
    ks: Keyspaces,
    location: String,
    dir: PathBuf,
    fsync: Fsync,
    retention: Retention,
    /// What commits need to know without reading; also serialises writers (the
    /// writer thread's commits and a redrive).
    index: Mutex<Index>,
    /// What the opening scan found, for a [`Store::load`] before any write.
    opened: Mutex<Option<Loaded>>,
    /// Set when a commit failed half-way: the index may no longer match the disk, so
    /// every later write is refused.
    broken: AtomicBool,
    /// Written since the last sync.
    dirty: AtomicBool,
    last_sync_ms: AtomicU64,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore").field("location", &self.location).field("fsync", &self.fsync).finish()
    }
}

impl FjallStore {
    /// Opens (or creates) the store in `data_dir/store`, reading it whole to rebuild
    /// the index (and the state [`Store::load`] returns).
    ///
    /// A data directory written by an eventbusd from before the move to fjall (a redb
    /// file, `eventbus.redb`) is migrated first: copied into `store.migrating`, synced,
    /// renamed to `store`; the old file is then renamed `eventbus.redb.migrated` (kept
    /// for a downgrade; delete it at will). A migration cut short starts over.
    pub fn open(data_dir: &Path, fsync: Fsync, retention: Retention) -> Result<Self, StoreError> {
        let dir = data_dir.join(STORE_DIR);
        migrate::migrate_if_needed(data_dir, &dir, retention)?;
        let store = Self::open_dir(&dir, fsync, retention)?;
        let loaded = store.scan()?;
        *store.opened.lock() = Some(loaded);
        Ok(store)
    }

    /// Opens the database at `dir` without reading it.
    pub(crate) fn open_dir(dir: &Path, fsync: Fsync, retention: Retention) -> Result<Self, StoreError> {
        let location = dir.display().to_string();
        let open_err = |e: fjall::Error| StoreError::Open { path: location.clone(), source: e.into() };
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open { path: location.clone(), source: e.into() })?;
        let db = Database::builder(dir).open().map_err(|e| match e {
            fjall::Error::Locked => StoreError::Locked { path: location.clone() },
            e => open_err(e),
        })?;
        let foreign = db.list_keyspace_names().iter().any(|name| !Keyspaces::NAMES.contains(&&**name));
        let ks = Keyspaces::open(&db).map_err(open_err)?;
        let refuse = |reason: String| StoreError::Refused { path: location.clone(), reason };
        match ks.meta.get(SCHEMA_KEY).map_err(io)? {
            Some(v) if number(&v)? == SCHEMA_VERSION => {}
            Some(v) => {
                let found = number(&v)?;
                return Err(refuse(format!("schema version {found}, this eventbusd reads {SCHEMA_VERSION}")));
            }
            None if foreign || !ks.consumers.is_empty().map_err(io)? => {
                return Err(refuse("a database that is not an eventbus store".into()));
            }
            None => {
                ks.meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_be_bytes()).map_err(io)?;
                db.persist(PersistMode::SyncAll).map_err(io)?;
            }
        }
        Ok(Self {
            db,
            ks,
            location,
            dir: dir.to_path_buf(),
            fsync,
            retention,
            index: Mutex::new(Index::default()),
            opened: Mutex::new(None),
            broken: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            last_sync_ms: AtomicU64::new(0),
        })
    }

    /// For the migration from redb, which writes the keyspaces directly.
    #[cfg(feature = "migrate-redb")]
    pub(crate) fn keyspaces(&self) -> &Keyspaces {
        &self.ks
    }

    #[cfg(feature = "migrate-redb")]
    pub(crate) fn database(&self) -> &Database {
        &self.db
    }

    /// Reads everything: the state to load, and the index rebuilt from it.
    fn scan(&self) -> Result<Loaded, StoreError> {
        let mut index = self.index.lock();
        *index = Index::default();
        let mut loaded = Loaded::default();
        for row in self.ks.consumers.iter() {
            let (_, v) = row.into_inner().map_err(io)?;
            loaded.consumers.push(serde_json::from_slice(&v).map_err(corrupt)?);
        }
        for row in self.ks.events.iter() {
            let (k, v) = row.into_inner().map_err(io)?;
            let seq = number(&k)?;
            let (event, ordering_key, _) = decode_event(&v)?;
            loaded.next_seq = loaded.next_seq.max(seq + 1);
            loaded.events.push(StoredEvent { seq, event, ordering_key });
        }
        for row in self.ks.entries.iter() {
            let (k, v) = row.into_inner().map_err(io)?;
            let (consumer, seq) = split_pair_key(&k)?;
            let entry: EntryRecord = serde_json::from_slice(&v).map_err(corrupt)?;
            index.hold(consumer, seq);
            loaded.entries.push((consumer.to_owned(), seq, entry));
        }
        for row in self.ks.dead.iter() {
            let (k, v) = row.into_inner().map_err(io)?;
            let (consumer, seq) = split_pair_key(&k)?;
            let record: DeadRecord = serde_json::from_slice(&v).map_err(corrupt)?;
            index.keep_dead_at_open(consumer, seq, record.at_ms);
        }
        let now = epoch_ms(std::time::SystemTime::now());
        for row in self.ks.dedup.iter() {
            let (_, v) = row.into_inner().map_err(io)?;
            let record: DedupRecord = serde_json::from_slice(&v).map_err(corrupt)?;
            index.remember_key(&record.key, record.expires_ms);
            if record.expires_ms > now {
                loaded.dedup.push(record);
            }
        }
        index.sort_keys();
        for row in self.ks.log.iter() {
            let (k, v) = row.into_inner().map_err(io)?;
            let (consumer, id) = split_pair_key(&k)?;
            let entry: LogEntry = serde_json::from_slice(&v).map_err(corrupt)?;
            index.append_log(consumer, id, entry.finished_ms);
            let counts = loaded.finished.entry(consumer.to_owned()).or_default();
            match entry.status {
                LogStatus::Completed => counts.acked += 1,
                LogStatus::DeadLettered => counts.dead_lettered += 1,
                LogStatus::Redriven => counts.redriven += 1,
            }
        }
        for row in self.ks.paused.iter() {
            let k = row.key().map_err(io)?;
            loaded.paused.push(String::from_utf8_lossy(&k).into_owned());
        }
        for row in self.ks.dead_letters.iter() {
            let (k, v) = row.into_inner().map_err(io)?;
            loaded.dead_letters.push((number(&k)?, decode_dead_letter(&v)?));
        }
        let saved =
            |key: &str| -> Result<u64, StoreError> { self.ks.meta.get(key).map_err(io)?.map_or(Ok(0), |v| number(&v)) };
        let saved_seq = saved(NEXT_SEQ)?;
        index.saved_seq = saved_seq;
        index.next_log = saved(NEXT_LOG)?.max(index.max_log_id() + 1).max(1);
        loaded.next_seq = loaded.next_seq.max(saved_seq).max(1);
        Ok(loaded)
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.broken.load(Ordering::Relaxed) {
            return Err(StoreError::Refused {
                path: self.location.clone(),
                reason: "an earlier commit failed; restart eventbusd to recover from the journal".into(),
            });
        }
        Ok(())
    }

    /// Commits `batch`, appended to the journal and handed to the operating system
    /// (a crash of this process loses nothing; the machine's, what is not synced).
    fn commit(&self, batch: OwnedWriteBatch) -> Result<(), StoreError> {
        self.dirty.store(true, Ordering::Release);
        batch.durability(Some(PersistMode::Buffer)).commit().map_err(|e| {
            self.broken.store(true, Ordering::Relaxed);
            io(e)
        })
    }

    fn persist(&self) -> Result<(), StoreError> {
        // Cleared first: a commit racing this sync marks the store dirty again.
        self.dirty.store(false, Ordering::Release);
        self.db.persist(PersistMode::SyncData).map_err(|e| {
            self.broken.store(true, Ordering::Relaxed);
            io(e)
        })?;
        self.last_sync_ms.store(epoch_ms(std::time::SystemTime::now()), Ordering::Relaxed);
        Ok(())
    }

    fn apply_op(
        &self,
        index: &mut Index,
        batch: &mut OwnedWriteBatch,
        op: &StoreOp,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let ks = &self.ks;
        match op {
            StoreOp::PutConsumer(config) => {
                let json = serde_json::to_vec(config).map_err(corrupt)?;
                batch.insert(&ks.consumers, config.name.as_str(), json);
            }
            StoreOp::DeleteConsumer(name) => {
                batch.remove(&ks.consumers, name.as_str());
                batch.remove(&ks.paused, name.as_str());
                let gone = index.forget_consumer(name);
                for seq in gone.entries {
                    batch.remove(&ks.entries, pair_key(name, seq));
                    self.release(index, batch, seq);
                }
                for seq in gone.dead {
                    batch.remove(&ks.dead, pair_key(name, seq));
                    self.release(index, batch, seq);
                }
                for id in gone.log {
                    batch.remove(&ks.log, pair_key(name, id));
                }
            }
            StoreOp::Capture { seq, event, ordering_key, consumers, dedup } => {
                if !consumers.is_empty() {
                    let bytes = encode_event(event, ordering_key.as_deref(), consumers.len() as u32);
                    batch.insert(&ks.events, seq.to_be_bytes(), bytes);
                    for consumer in consumers {
                        batch.insert(&ks.entries, pair_key(consumer, *seq), FRESH_ENTRY);
                        index.hold(consumer, *seq);
                    }
                }
                index.max_seq = index.max_seq.max(*seq);
                if let Some(d) = dedup {
                    self.put_dedup(index, batch, d, now_ms)?;
                }
            }
            StoreOp::Dedup(d) => self.put_dedup(index, batch, d, now_ms)?,
            StoreOp::Update { consumer, seq, entry } => {
                // An update racing a finish must not resurrect the entry.
                if index.holds(consumer, *seq) {
                    let json = serde_json::to_vec(entry).map_err(corrupt)?;
                    batch.insert(&ks.entries, pair_key(consumer, *seq), json);
                }
            }
            StoreOp::Finish { consumer, seq, log } => {
                if index.unhold(consumer, *seq) {
                    batch.remove(&ks.entries, pair_key(consumer, *seq));
                    if log.status == LogStatus::DeadLettered {
                        // Kept, with its event, for a redrive.
                        self.keep_dead(index, batch, consumer, *seq, log, now_ms)?;
                    } else {
                        self.release(index, batch, *seq);
                    }
                }
                self.append_log(index, batch, consumer, log, now_ms)?;
            }
            StoreOp::SetPaused { consumer, paused } => {
                if *paused {
                    batch.insert(&ks.paused, &**consumer, now_ms.to_be_bytes());
                } else {
                    batch.remove(&ks.paused, &**consumer);
                }
            }
            StoreOp::PutDeadLetter { id, record } => {
                batch.insert(&ks.dead_letters, id.to_be_bytes(), encode_dead_letter(record));
            }
            StoreOp::DeleteDeadLetter { id } => batch.remove(&ks.dead_letters, id.to_be_bytes()),
        }
        Ok(())
    }

    /// One holder is done with event `seq`: dropped when it was the last.
    fn release(&self, index: &mut Index, batch: &mut OwnedWriteBatch, seq: u64) {
        if index.release(seq) {
            batch.remove(&self.ks.events, seq.to_be_bytes());
        }
    }

    fn put_dedup(
        &self,
        index: &mut Index,
        batch: &mut OwnedWriteBatch,
        d: &DedupRecord,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_vec(d).map_err(corrupt)?;
        batch.insert(&self.ks.dedup, d.key.as_str(), json);
        index.remember_key(&d.key, d.expires_ms);
        for key in index.expired_keys(now_ms) {
            batch.remove(&self.ks.dedup, key);
        }
        Ok(())
    }

    /// Appends a terminal-log line and drops the oldest ones past the count or age bound.
    fn append_log(
        &self,
        index: &mut Index,
        batch: &mut OwnedWriteBatch,
        consumer: &str,
        entry: &LogEntry,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let id = index.next_log;
        index.next_log += 1;
        index.log_moved = true;
        let json = serde_json::to_vec(entry).map_err(corrupt)?;
        batch.insert(&self.ks.log, pair_key(consumer, id), json);
        index.append_log(consumer, id, entry.finished_ms);
        let cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        for old in index.trim_log(consumer, self.retention.max_entries, cutoff) {
            batch.remove(&self.ks.log, pair_key(consumer, old));
        }
        Ok(())
    }

    /// Keeps a dead-lettered event for redrive, dropping the oldest kept ones past the
    /// retention bounds (their events released).
    fn keep_dead(
        &self,
        index: &mut Index,
        batch: &mut OwnedWriteBatch,
        consumer: &str,
        seq: u64,
        log: &LogEntry,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let record = DeadRecord::of(log, now_ms);
        let json = serde_json::to_vec(&record).map_err(corrupt)?;
        batch.insert(&self.ks.dead, pair_key(consumer, seq), json);
        index.keep_dead(consumer, seq, now_ms);
        let cutoff = now_ms.saturating_sub(self.retention.max_age_ms);
        for old in index.trim_dead(consumer, self.retention.max_entries, cutoff) {
            batch.remove(&self.ks.dead, pair_key(consumer, old));
            self.release(index, batch, old);
        }
        Ok(())
    }

    /// Saves the counters the batch moved.
    fn save_counters(&self, index: &mut Index, batch: &mut OwnedWriteBatch) {
        if index.max_seq + 1 > index.saved_seq {
            index.saved_seq = index.max_seq + 1;
            batch.insert(&self.ks.meta, NEXT_SEQ, index.saved_seq.to_be_bytes());
        }
        if std::mem::take(&mut index.log_moved) {
            batch.insert(&self.ks.meta, NEXT_LOG, index.next_log.to_be_bytes());
        }
    }
}

impl Store for FjallStore {
    fn load(&self) -> Result<Loaded, StoreError> {
        match self.opened.lock().take() {
            Some(loaded) => Ok(loaded),
            None => self.scan(),
        }
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        self.write(ops)?;
        self.sync()
    }

    fn write(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        self.check()?;
        let now_ms = epoch_ms(std::time::SystemTime::now());
        let mut index = self.index.lock();
        self.opened.lock().take();
        let mut batch = self.db.batch();
        for op in ops {
            if let Err(err) = self.apply_op(&mut index, &mut batch, op, now_ms) {
                // The index has moved for part of the group: it no longer matches the disk.
                self.broken.store(true, Ordering::Relaxed);
                return Err(err);
            }
        }
        self.save_counters(&mut index, &mut batch);
        self.commit(batch)
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.check()?;
        match self.fsync {
            Fsync::Always => self.persist(),
            Fsync::Batch => {
                let now_ms = epoch_ms(std::time::SystemTime::now());
                if now_ms >= self.last_sync_ms.load(Ordering::Relaxed) + BATCH_FLUSH_MS {
                    self.persist()?;
                }
                Ok(())
            }
        }
    }

    fn unsynced(&self) -> bool {
        self.dirty.load(Ordering::Acquire) && !self.broken.load(Ordering::Relaxed)
    }

    fn redrive(
        &self,
        consumer: &str,
        selection: RedriveSelection<'_>,
        next_seq: &AtomicU64,
    ) -> Result<Vec<RedrivenEvent>, StoreError> {
        self.check()?;
        let now_ms = epoch_ms(std::time::SystemTime::now());
        // Holding the index: no commit runs meanwhile, and every earlier one is readable.
        let mut index = self.index.lock();
        self.opened.lock().take();
        let mut chosen: Vec<(u64, DeadRecord)> = Vec::new();
        for row in self.ks.dead.range(pair_key(consumer, 0)..=pair_key(consumer, u64::MAX)) {
            let (k, v) = row.into_inner().map_err(io)?;
            let record: DeadRecord = serde_json::from_slice(&v).map_err(corrupt)?;
            match selection {
                RedriveSelection::Oldest(limit) if chosen.len() >= limit => break,
                RedriveSelection::Ids(ids) if !ids.contains(&record.event_id) => continue,
                _ => chosen.push((split_pair_key(&k)?.1, record)),
            }
        }
        let mut batch = self.db.batch();
        let mut out = Vec::with_capacity(chosen.len());
        for (old, record) in chosen {
            let Some(bytes) = self.ks.events.get(old.to_be_bytes()).map_err(io)? else {
                return Err(StoreError::corrupt(format!("dead-lettered event {old} without its event")));
            };
            let (event, ordering_key, _) = decode_event(&bytes)?;
            let seq = next_seq.fetch_add(1, Ordering::Relaxed);
            batch.insert(&self.ks.events, seq.to_be_bytes(), encode_event(&event, ordering_key.as_deref(), 1));
            batch.insert(&self.ks.entries, pair_key(consumer, seq), FRESH_ENTRY);
            batch.remove(&self.ks.dead, pair_key(consumer, old));
            index.hold(consumer, seq);
            index.unkeep_dead(consumer, old);
            self.release(&mut index, &mut batch, old);
            let line = record.redriven(now_ms);
            self.append_log(&mut index, &mut batch, consumer, &line, now_ms)?;
            index.max_seq = index.max_seq.max(seq);
            out.push(RedrivenEvent { seq, event, ordering_key });
        }
        self.save_counters(&mut index, &mut batch);
        self.commit(batch)?;
        drop(index);
        self.persist()?;
        Ok(out)
    }

    fn redrivable(&self, consumer: &str) -> u64 {
        self.index.lock().dead_count(consumer)
    }

    fn free_space(&self) -> Option<u64> {
        crate::store::free_space(&self.dir)
    }

    fn failed(&self) -> Option<String> {
        self.check().err().map(|e| e.to_string())
    }

    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, StoreError> {
        let start = after.map_or(0, |a| a.saturating_add(1));
        let mut page = LogPage::default();
        let mut last = None;
        for row in self.ks.log.range(pair_key(consumer, start)..=pair_key(consumer, u64::MAX)) {
            let (k, v) = row.into_inner().map_err(io)?;
            if page.entries.len() == limit {
                page.next = last;
                break;
            }
            let entry: LogEntry = serde_json::from_slice(&v).map_err(corrupt)?;
            last = Some(split_pair_key(&k)?.1);
            if status.is_none_or(|s| s == entry.status) {
                page.entries.push(entry);
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests;
