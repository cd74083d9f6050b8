//! Copies a data directory's redb file, as every eventbusd before the move to fjall
//! wrote it, into a fjall store: every table row for row, in the same record formats.

use fjall::{OwnedWriteBatch, PersistMode};

use super::*;
use crate::fjall_store::{FjallStore, pair_key};

/// Rows per fjall batch while copying.
const CHUNK: usize = 10_000;

/// What a migration copied, for its log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub consumers: u64,
    pub events: u64,
    pub entries: u64,
    pub log_lines: u64,
    pub dead: u64,
}

/// Appends rows to `target`, committing every [`CHUNK`].
struct Copier<'a> {
    target: &'a FjallStore,
    batch: Option<OwnedWriteBatch>,
}

impl Copier<'_> {
    fn put(&mut self, keyspace: &fjall::Keyspace, key: Vec<u8>, value: &[u8]) -> Result<(), StoreError> {
        let batch = self.batch.get_or_insert_with(|| self.target.database().batch());
        batch.insert(keyspace, key, value);
        if batch.len() >= CHUNK {
            self.commit()?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        match self.batch.take() {
            Some(batch) => batch.commit().map_err(|e| StoreError::Io(e.into())),
            None => Ok(()),
        }
    }
}

impl RedbStore {
    /// Copies everything this store holds into `target` (a new, empty store) and
    /// syncs it.
    pub(crate) fn copy_into(&self, target: &FjallStore) -> Result<Copied, StoreError> {
        let txn = self.db.begin_read().map_err(io)?;
        let ks = target.keyspaces();
        let mut out = Copier { target, batch: None };
        let mut copied = Copied::default();
        for row in txn.open_table(CONSUMERS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.put(&ks.consumers, k.value().as_bytes().to_vec(), v.value().as_bytes())?;
            copied.consumers += 1;
        }
        for row in txn.open_table(EVENTS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.put(&ks.events, k.value().to_be_bytes().to_vec(), v.value())?;
            copied.events += 1;
        }
        let pairs = [
            (ENTRIES, &ks.entries, &mut copied.entries),
            (LOG, &ks.log, &mut copied.log_lines),
            (DEAD, &ks.dead, &mut copied.dead),
        ];
        for (table, keyspace, count) in pairs {
            for row in txn.open_table(table).map_err(io)?.iter().map_err(io)? {
                let (k, v) = row.map_err(io)?;
                let (name, n) = k.value();
                out.put(keyspace, pair_key(name, n), v.value().as_bytes())?;
                *count += 1;
            }
        }
        for row in txn.open_table(DEDUP).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.put(&ks.dedup, k.value().as_bytes().to_vec(), v.value().as_bytes())?;
        }
        for row in txn.open_table(DEAD_LETTERS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.put(&ks.dead_letters, k.value().to_be_bytes().to_vec(), v.value())?;
        }
        for row in txn.open_table(PAUSED).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.put(&ks.paused, k.value().as_bytes().to_vec(), &v.value().to_be_bytes())?;
        }
        let meta = txn.open_table(META).map_err(io)?;
        for key in ["next_seq", "next_log"] {
            if let Some(v) = meta.get(key).map_err(io)? {
                out.put(&ks.meta, key.as_bytes().to_vec(), &v.value().to_be_bytes())?;
            }
        }
        out.commit()?;
        target.database().persist(PersistMode::SyncAll).map_err(|e| StoreError::Io(e.into()))?;
        Ok(copied)
    }
}
