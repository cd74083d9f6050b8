//! One write transaction's open tables and the record helpers shared by the store's writes.

use super::*;

/// What the store remembers of one consumer's terminal log, so that appending a line
/// needs no count and, mostly, no read.
#[derive(Debug, Default)]
pub(super) struct LogTrack {
    /// Lines in the log.
    pub(super) count: u64,
    /// `finished_ms` of the oldest line, once read; `None` = not known (read it).
    pub(super) oldest_ms: Option<u64>,
}

pub(super) type Tbl<'txn, K, V> = redb::Table<'txn, K, V>;

/// The tables of one write transaction, each opened at its first use and kept open
/// until the commit. redb opens and closes a table through the transaction's table
/// tree, which costs as much as a small insert: per change that was a large part of a
/// commit's CPU.
pub(super) struct Tables<'txn> {
    pub(super) txn: &'txn redb::WriteTransaction,
    pub(super) consumers: Option<Tbl<'txn, &'static str, &'static str>>,
    pub(super) events: Option<Tbl<'txn, u64, &'static [u8]>>,
    pub(super) entries: Option<Tbl<'txn, (&'static str, u64), &'static str>>,
    pub(super) log: Option<Tbl<'txn, (&'static str, u64), &'static str>>,
    pub(super) dedup: Option<Tbl<'txn, &'static str, &'static str>>,
    pub(super) dead_letters: Option<Tbl<'txn, u64, &'static [u8]>>,
    pub(super) dead: Option<Tbl<'txn, (&'static str, u64), &'static str>>,
    pub(super) paused: Option<Tbl<'txn, &'static str, u64>>,
    /// The highest capture sequence number written, to save `meta.next_seq` once.
    pub(super) max_seq: u64,
    /// The log counter to save as `meta.next_log`, when a line was appended.
    pub(super) next_log: Option<u64>,
}

/// Opens `definition` into `slot` unless it is open already.
pub(super) fn open<'s, 'txn, K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &'txn redb::WriteTransaction,
    slot: &'s mut Option<Tbl<'txn, K, V>>,
    definition: TableDefinition<K, V>,
) -> Result<&'s mut Tbl<'txn, K, V>, StoreError> {
    let table = match slot.take() {
        Some(table) => table,
        None => txn.open_table(definition).map_err(io)?,
    };
    Ok(slot.insert(table))
}

impl<'txn> Tables<'txn> {
    pub(super) fn new(txn: &'txn redb::WriteTransaction) -> Self {
        Self {
            txn,
            consumers: None,
            events: None,
            entries: None,
            log: None,
            dedup: None,
            dead_letters: None,
            dead: None,
            paused: None,
            max_seq: 0,
            next_log: None,
        }
    }

    pub(super) fn consumers(&mut self) -> Result<&mut Tbl<'txn, &'static str, &'static str>, StoreError> {
        open(self.txn, &mut self.consumers, CONSUMERS)
    }

    pub(super) fn events(&mut self) -> Result<&mut Tbl<'txn, u64, &'static [u8]>, StoreError> {
        open(self.txn, &mut self.events, EVENTS)
    }

    pub(super) fn entries(&mut self) -> Result<&mut Tbl<'txn, (&'static str, u64), &'static str>, StoreError> {
        open(self.txn, &mut self.entries, ENTRIES)
    }

    pub(super) fn log(&mut self) -> Result<&mut Tbl<'txn, (&'static str, u64), &'static str>, StoreError> {
        open(self.txn, &mut self.log, LOG)
    }

    pub(super) fn dedup(&mut self) -> Result<&mut Tbl<'txn, &'static str, &'static str>, StoreError> {
        open(self.txn, &mut self.dedup, DEDUP)
    }

    pub(super) fn dead_letters(&mut self) -> Result<&mut Tbl<'txn, u64, &'static [u8]>, StoreError> {
        open(self.txn, &mut self.dead_letters, DEAD_LETTERS)
    }

    pub(super) fn dead(&mut self) -> Result<&mut Tbl<'txn, (&'static str, u64), &'static str>, StoreError> {
        open(self.txn, &mut self.dead, DEAD)
    }

    pub(super) fn paused(&mut self) -> Result<&mut Tbl<'txn, &'static str, u64>, StoreError> {
        open(self.txn, &mut self.paused, PAUSED)
    }

    /// Saves the counters this transaction moved (`meta`) and closes every table, so
    /// the transaction can commit.
    pub(super) fn finish(self) -> Result<(), StoreError> {
        let Self { txn, max_seq, next_log, .. } = self;
        if max_seq == 0 && next_log.is_none() {
            return Ok(());
        }
        let mut meta = txn.open_table(META).map_err(io)?;
        if max_seq > 0 {
            let saved = meta.get("next_seq").map_err(io)?.map_or(0, |v| v.value());
            if max_seq + 1 > saved {
                meta.insert("next_seq", max_seq + 1).map_err(io)?;
            }
        }
        if let Some(next_log) = next_log {
            let saved = meta.get("next_log").map_err(io)?.map_or(0, |v| v.value());
            meta.insert("next_log", saved.max(next_log)).map_err(io)?;
        }
        Ok(())
    }
}

/// One consumer is done with event `seq`: drop it when none holds it any more.
pub(super) fn release_event(t: &mut Tables<'_>, seq: u64) -> Result<(), StoreError> {
    let events = t.events()?;
    // Removed at once (the common case: its last holder); put back, one reference
    // fewer, when others still hold it.
    let bytes = match events.remove(seq).map_err(io)? {
        Some(v) => v.value().to_vec(),
        None => return Ok(()),
    };
    let Some(&[a, b, c, d]) = bytes.get(..4).and_then(|h| <&[u8; 4]>::try_from(h).ok()) else {
        return Err(StoreError::corrupt(format!("event {seq}: record too short")));
    };
    let refs = u32::from_le_bytes([a, b, c, d]);
    if refs > 1 {
        let mut bytes = bytes;
        set_refs(&mut bytes, refs - 1);
        events.insert(seq, bytes.as_slice()).map_err(io)?;
    }
    Ok(())
}

pub(super) fn put_dedup(t: &mut Tables<'_>, d: &DedupRecord, now_ms: u64) -> Result<(), StoreError> {
    let dedup = t.dedup()?;
    let json = serde_json::to_string(d).map_err(corrupt)?;
    dedup.insert(d.key.as_str(), json.as_str()).map_err(io)?;
    // Expired keys are pruned as new ones arrive, a few at a time.
    let expired: Vec<String> = dedup
        .iter()
        .map_err(io)?
        .take(16)
        .filter_map(|r| r.ok())
        .filter(|(_, v)| serde_json::from_str::<DedupRecord>(v.value()).map_or(true, |r| r.expires_ms <= now_ms))
        .map(|(k, _)| k.value().to_owned())
        .collect();
    for key in expired {
        dedup.remove(key.as_str()).map_err(io)?;
    }
    Ok(())
}
