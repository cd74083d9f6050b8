//! What a commit of the fjall store needs to know without reading the database.

use std::collections::VecDeque;

/// Every commit hashes a few sequence numbers and names per event: foldhash's seeded
/// hasher costs a fraction of the default SipHash.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
type HashSet<T> = std::collections::HashSet<T, foldhash::quality::RandomState>;

/// Rebuilt from the database when the store opens; changed by every commit, under the
/// store's lock, before the commit is appended.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Event seq → how many entries and kept dead letters still hold it.
    refs: HashMap<u64, u32>,
    /// Consumer → the seqs of its unfinished entries.
    live: HashMap<String, HashSet<u64>>,
    /// Consumer → its log lines (id, finished ms), oldest first.
    logs: HashMap<String, VecDeque<(u64, u64)>>,
    /// Consumer → its events kept for redrive (seq, dead-lettered at ms), oldest first.
    dead: HashMap<String, VecDeque<(u64, u64)>>,
    /// Idempotency key → when its record expires; and the keys in expiry order.
    keys: HashMap<String, u64>,
    key_order: VecDeque<(u64, String)>,
    /// The next log line's id.
    pub(super) next_log: u64,
    /// A log line was appended since the counter was last saved.
    pub(super) log_moved: bool,
    /// The highest capture seq written, and the `next_seq` saved.
    pub(super) max_seq: u64,
    pub(super) saved_seq: u64,
}

/// What a deleted consumer held.
pub(super) struct Forgotten {
    pub(super) entries: Vec<u64>,
    pub(super) dead: Vec<u64>,
    pub(super) log: Vec<u64>,
}

impl Index {
    /// `consumer` holds event `seq` (a new entry).
    pub(super) fn hold(&mut self, consumer: &str, seq: u64) {
        let live = match self.live.get_mut(consumer) {
            Some(live) => live,
            None => self.live.entry(consumer.to_owned()).or_default(),
        };
        if live.insert(seq) {
            *self.refs.entry(seq).or_default() += 1;
        }
    }

    pub(super) fn holds(&self, consumer: &str, seq: u64) -> bool {
        self.live.get(consumer).is_some_and(|live| live.contains(&seq))
    }

    /// Ends the entry; false when there was none. The event's reference moves to the
    /// caller, who either keeps it (dead letter) or [`Index::release`]s it.
    pub(super) fn unhold(&mut self, consumer: &str, seq: u64) -> bool {
        self.live.get_mut(consumer).is_some_and(|live| live.remove(&seq))
    }

    /// Drops one reference to `seq`; true when that was the last.
    pub(super) fn release(&mut self, seq: u64) -> bool {
        match self.refs.get_mut(&seq) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.refs.remove(&seq);
                true
            }
            None => false,
        }
    }

    pub(super) fn forget_consumer(&mut self, consumer: &str) -> Forgotten {
        Forgotten {
            entries: self.live.remove(consumer).map(|s| s.into_iter().collect()).unwrap_or_default(),
            dead: self.dead.remove(consumer).map(|d| d.into_iter().map(|(seq, _)| seq).collect()).unwrap_or_default(),
            log: self.logs.remove(consumer).map(|l| l.into_iter().map(|(id, _)| id).collect()).unwrap_or_default(),
        }
    }

    pub(super) fn append_log(&mut self, consumer: &str, id: u64, finished_ms: u64) {
        match self.logs.get_mut(consumer) {
            Some(log) => log.push_back((id, finished_ms)),
            None => self.logs.entry(consumer.to_owned()).or_default().push_back((id, finished_ms)),
        }
    }

    pub(super) fn max_log_id(&self) -> u64 {
        self.logs.values().filter_map(|l| l.back().map(|&(id, _)| id)).max().unwrap_or(0)
    }

    /// Drops the oldest log lines past `max_entries` or finished before `cutoff_ms`.
    pub(super) fn trim_log(&mut self, consumer: &str, max_entries: u64, cutoff_ms: u64) -> Vec<u64> {
        self.logs.get_mut(consumer).map(|log| trim(log, max_entries, cutoff_ms)).unwrap_or_default()
    }

    /// Keeps `seq` for redrive; the entry's reference to the event moves to it.
    pub(super) fn keep_dead(&mut self, consumer: &str, seq: u64, at_ms: u64) {
        match self.dead.get_mut(consumer) {
            Some(dead) => dead.push_back((seq, at_ms)),
            None => self.dead.entry(consumer.to_owned()).or_default().push_back((seq, at_ms)),
        }
    }

    /// A kept event read at open: it holds a reference of its own.
    pub(super) fn keep_dead_at_open(&mut self, consumer: &str, seq: u64, at_ms: u64) {
        self.keep_dead(consumer, seq, at_ms);
        *self.refs.entry(seq).or_default() += 1;
    }

    /// Drops the oldest kept events past the bounds; the caller releases their events.
    pub(super) fn trim_dead(&mut self, consumer: &str, max_entries: u64, cutoff_ms: u64) -> Vec<u64> {
        self.dead.get_mut(consumer).map(|dead| trim(dead, max_entries, cutoff_ms)).unwrap_or_default()
    }

    /// `seq` left the kept events (redriven); the caller releases its event.
    pub(super) fn unkeep_dead(&mut self, consumer: &str, seq: u64) {
        if let Some(dead) = self.dead.get_mut(consumer) {
            dead.retain(|&(s, _)| s != seq);
        }
    }

    pub(super) fn dead_count(&self, consumer: &str) -> u64 {
        self.dead.get(consumer).map_or(0, |d| d.len() as u64)
    }

    pub(super) fn remember_key(&mut self, key: &str, expires_ms: u64) {
        self.keys.insert(key.to_owned(), expires_ms);
        self.key_order.push_back((expires_ms, key.to_owned()));
    }

    /// Puts the keys read at open in expiry order.
    pub(super) fn sort_keys(&mut self) {
        self.key_order.make_contiguous().sort_unstable();
    }

    /// Forgets the keys expired at `now_ms`, returning those whose record is to go.
    pub(super) fn expired_keys(&mut self, now_ms: u64) -> Vec<String> {
        let mut expired = Vec::new();
        while let Some((expires_ms, _)) = self.key_order.front()
            && *expires_ms <= now_ms
        {
            let Some((expires_ms, key)) = self.key_order.pop_front() else { break };
            // A key seen again since has a later expiry: its record stays.
            if self.keys.get(&key) == Some(&expires_ms) {
                self.keys.remove(&key);
                expired.push(key);
            }
        }
        expired
    }
}

/// Pops the oldest `(id, ms)` pairs past `max_entries` or older than `cutoff_ms`.
fn trim(rows: &mut VecDeque<(u64, u64)>, max_entries: u64, cutoff_ms: u64) -> Vec<u64> {
    let mut dropped = Vec::new();
    while let Some(&(id, ms)) = rows.front() {
        if rows.len() as u64 <= max_entries && ms >= cutoff_ms {
            break;
        }
        rows.pop_front();
        dropped.push(id);
    }
    dropped
}
