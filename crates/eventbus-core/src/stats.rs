//! Counters per bus, per channel and their snapshots; the bounded channel table.
//!
//! Counters are relaxed atomics bumped on the hot path. The channel table is sharded so
//! publishers on different channels do not meet on one lock, and bounded: past
//! `max_channels` entries, channels that no subscription matches are forgotten,
//! least recently published first.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::router::Targets;
use crate::subscription::{DropReason, Overflow};

const SHARDS: usize = 16;

/// Totals for the whole bus, and the queued-bytes budget every subscription shares.
#[derive(Debug)]
pub(crate) struct BusCounters {
    pub(crate) published: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dropped: AtomicU64,
    /// Drops per [`DropReason`], indexed by `reason as usize`.
    pub(crate) dropped_by_reason: [AtomicU64; DropReason::ALL.len()],
    /// Bytes of the events queued now, each event counted once however many queues
    /// hold it (see `event::Residency`). On its own cache line: consumers release bytes
    /// while publishers bump the counters above.
    pub(crate) queued_bytes: CacheLine<AtomicUsize>,
    /// The budget `queued_bytes` must stay within (`eventbus.max_queued_bytes`).
    pub(crate) max_queued_bytes: usize,
    /// Events a full DEAD_LETTER subscription refused, published to their overflow
    /// dead-letter channel; those whose publication failed; and those not published
    /// because they were on a dead-letter channel already.
    pub(crate) overflow_dead_lettered: AtomicU64,
    pub(crate) overflow_dead_letters_failed: AtomicU64,
    pub(crate) overflow_dead_letters_skipped: AtomicU64,
}

impl BusCounters {
    pub(crate) fn new(max_queued_bytes: usize) -> Self {
        Self {
            published: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dropped_by_reason: Default::default(),
            queued_bytes: CacheLine(AtomicUsize::new(0)),
            max_queued_bytes,
            overflow_dead_lettered: AtomicU64::new(0),
            overflow_dead_letters_failed: AtomicU64::new(0),
            overflow_dead_letters_skipped: AtomicU64::new(0),
        }
    }
}

/// A value alone on its cache line (128 bytes: adjacent-line prefetching pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl Default for BusCounters {
    /// No budget: for tests of one subscription.
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

/// `at` in microseconds since the Unix epoch (0 before it).
pub(crate) fn unix_micros(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// Counters of one channel on this instance.
#[derive(Debug, Default)]
pub(crate) struct ChannelCounters {
    pub(crate) published: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dropped: AtomicU64,
    /// Microseconds since the Unix epoch; 0 = never.
    pub(crate) last_published_us: AtomicI64,
    /// The channel's metrics label, if labels are kept: outlives the channel's
    /// eviction, so label counters only ever grow.
    label: Option<Arc<LabelCounters>>,
}

impl ChannelCounters {
    /// Counts a publish made at `at_us` ([`unix_micros`]).
    pub(crate) fn mark_published(&self, at_us: i64) {
        self.published.fetch_add(1, Ordering::Relaxed);
        self.last_published_us.fetch_max(at_us, Ordering::Relaxed);
        if let Some(label) = &self.label {
            label.published.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
        if let Some(label) = &self.label {
            label.delivered.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_failed(&self, n: u64) {
        self.failed.fetch_add(n, Ordering::Relaxed);
        if let Some(label) = &self.label {
            label.failed.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn add_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if let Some(label) = &self.label {
            label.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn last_published(&self) -> Option<SystemTime> {
        match self.last_published_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(UNIX_EPOCH + Duration::from_micros(us as u64)),
        }
    }
}

/// Monotonic counters of one metrics label (a channel, or [`OTHER_LABEL`]).
#[derive(Debug, Default)]
pub(crate) struct LabelCounters {
    published: AtomicU64,
    delivered: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

/// Label that channels past the label cap share.
pub const OTHER_LABEL: &str = "_other";

/// Channel labels for metrics: the first `max` distinct channels get their own, the
/// rest share [`OTHER_LABEL`]. Never shrinks, so exported counters never go down, and
/// never grows past `max + 1` entries, so a flood of names cannot blow up memory.
#[derive(Debug)]
pub(crate) struct LabelTable {
    max: usize,
    labels: RwLock<HashMap<Box<str>, Arc<LabelCounters>>>,
    other: Arc<LabelCounters>,
}

impl LabelTable {
    fn new(max: usize) -> Self {
        Self { max, labels: RwLock::default(), other: Arc::default() }
    }

    fn assign(&self, channel: &str) -> Arc<LabelCounters> {
        if let Some(c) = self.labels.read().get(channel) {
            return Arc::clone(c);
        }
        let mut labels = self.labels.write();
        if labels.len() >= self.max && !labels.contains_key(channel) {
            return Arc::clone(&self.other);
        }
        Arc::clone(labels.entry(channel.into()).or_default())
    }

    fn snapshot(&self) -> Vec<LabelStats> {
        let labels = self.labels.read();
        let mut out: Vec<LabelStats> = labels.iter().map(|(name, c)| LabelStats::of(name, c)).collect();
        out.push(LabelStats::of(OTHER_LABEL, &self.other));
        out
    }
}

/// Counters of one channel label, for metrics export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelStats {
    pub label: String,
    pub published: u64,
    pub delivered: u64,
    pub failed: u64,
    pub dropped: u64,
}

impl LabelStats {
    fn of(label: &str, c: &LabelCounters) -> Self {
        Self {
            label: label.to_owned(),
            published: c.published.load(Ordering::Relaxed),
            delivered: c.delivered.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
        }
    }
}

/// A tracked channel: its counters and its cached routing result.
#[derive(Debug)]
pub(crate) struct ChannelEntry {
    pub(crate) name: Box<str>,
    pub(crate) counters: Arc<ChannelCounters>,
    /// Subscriptions matching this channel, valid while the router generation is
    /// unchanged. Recomputed by the first publish after a subscribe or unsubscribe.
    pub(crate) targets: RwLock<Option<Arc<Targets>>>,
    /// Whether a history rule covers the channel (`in_memory` mode), decided on its
    /// first publish.
    pub(crate) keeps_history: std::sync::OnceLock<bool>,
    /// The channel's `in_memory` history, looked up again when the store evicted it.
    pub(crate) history: RwLock<Option<Arc<crate::history::ChannelHistory>>>,
}

/// Every publish hashes its channel twice (shard, then map): foldhash's seeded
/// quality hasher costs a fraction of SipHash on short names.
type ChannelHasher = foldhash::quality::RandomState;

type Shard = RwLock<HashMap<Box<str>, Arc<ChannelEntry>, ChannelHasher>>;

/// Channels seen by this instance, bounded.
#[derive(Debug)]
pub(crate) struct ChannelTable {
    shards: Box<[Shard]>,
    hasher: ChannelHasher,
    len: AtomicUsize,
    max_channels: usize,
    /// Metrics labels; `None` when metrics are off, so the hot path skips them.
    labels: Option<LabelTable>,
    /// Held while evicting, so concurrent inserts past the cap evict once.
    evicting: Mutex<()>,
    /// Channels forgotten to stay within `max_channels`.
    evicted: AtomicU64,
}

impl ChannelTable {
    pub(crate) fn new(max_channels: usize, max_labels: Option<usize>) -> Self {
        Self {
            labels: max_labels.map(LabelTable::new),
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: Default::default(),
            len: AtomicUsize::new(0),
            max_channels: max_channels.max(1),
            evicting: Mutex::new(()),
            evicted: AtomicU64::new(0),
        }
    }

    fn shard(&self, name: &str) -> &Shard {
        &self.shards[self.hasher.hash_one(name) as usize % SHARDS]
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The entry for `name`, created on first use; `None` when it is new and the table
    /// is full (the caller evicts, then asks again). The bound holds however many
    /// threads insert at once: a slot is reserved before an entry is added.
    pub(crate) fn get_or_insert(&self, name: &str) -> Option<Arc<ChannelEntry>> {
        let shard = self.shard(name);
        if let Some(entry) = shard.read().get(name) {
            return Some(Arc::clone(entry));
        }
        let mut map = shard.write();
        if let Some(entry) = map.get(name) {
            return Some(Arc::clone(entry));
        }
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_channels).then_some(n + 1))
            .ok()?;
        let label = self.labels.as_ref().map(|l| l.assign(name));
        let counters = Arc::new(ChannelCounters { label, ..ChannelCounters::default() });
        let entry = Arc::new(ChannelEntry {
            name: name.into(),
            counters,
            targets: RwLock::new(None),
            keeps_history: std::sync::OnceLock::new(),
            history: RwLock::new(None),
        });
        map.insert(name.into(), Arc::clone(&entry));
        Some(entry)
    }

    /// Channels forgotten to keep the table within its bound, since start.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Counters per metrics label, `_other` last; empty when labels are off.
    pub(crate) fn label_stats(&self) -> Vec<LabelStats> {
        self.labels.as_ref().map(LabelTable::snapshot).unwrap_or_default()
    }

    /// Every entry, for listings and cache invalidation.
    pub(crate) fn all(&self) -> Vec<Arc<ChannelEntry>> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            out.extend(shard.read().values().cloned());
        }
        out
    }

    /// Makes room once the table is full: forgets channels until it is back at 90% of
    /// its bound, idle ones (per `is_idle`: no subscription matches them) first, then
    /// the least recently published of the rest, so a pattern that matches every
    /// channel (`>`) cannot grow the table without bound. A forgotten channel loses its
    /// `ListChannels` counters (its metrics label keeps counting) and is tracked afresh
    /// on its next publish. Returns how many were forgotten.
    pub(crate) fn evict(&self, is_idle: impl Fn(&ChannelEntry) -> bool) -> usize {
        // Waited for, not skipped: a publisher of a new channel needs the room.
        let _guard = self.evicting.lock();
        if self.len() < self.max_channels {
            return 0; // Another thread made room meanwhile.
        }
        let target = (self.max_channels - self.max_channels / 10).min(self.max_channels - 1);
        let mut candidates: Vec<(bool, i64, Arc<ChannelEntry>)> = self
            .all()
            .into_iter()
            .map(|e| (!is_idle(&e), e.counters.last_published_us.load(Ordering::Relaxed), e))
            .collect();
        candidates.sort_unstable_by_key(|(busy, at, _)| (*busy, *at));
        let excess = self.len().saturating_sub(target);
        let mut removed = 0;
        for (_, _, entry) in candidates.into_iter().take(excess) {
            if self.shard(&entry.name).write().remove(&entry.name).is_some() {
                self.len.fetch_sub(1, Ordering::AcqRel);
                removed += 1;
            }
        }
        self.evicted.fetch_add(removed as u64, Ordering::Relaxed);
        removed
    }
}

/// Totals of a bus (`Admin.GetStats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusStats {
    pub total_published: u64,
    pub total_delivered: u64,
    pub total_failed: u64,
    pub total_dropped: u64,
    pub active_subscriptions: u64,
    pub active_channels: u64,
    pub started_at: SystemTime,
    pub mode: &'static str,
    pub instance_id: String,
}

/// One channel's counters (`Admin.ListChannels`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelStats {
    pub channel: String,
    pub published_count: u64,
    pub delivered_count: u64,
    pub failed_count: u64,
    pub dropped_count: u64,
    /// Subscriptions matching the channel now, exact or pattern.
    pub subscriber_count: u64,
    pub last_published_at: Option<SystemTime>,
}

impl ChannelStats {
    pub(crate) fn of(entry: &ChannelEntry, subscriber_count: u64) -> Self {
        let c = &entry.counters;
        Self {
            channel: entry.name.to_string(),
            published_count: c.published.load(Ordering::Relaxed),
            delivered_count: c.delivered.load(Ordering::Relaxed),
            failed_count: c.failed.load(Ordering::Relaxed),
            dropped_count: c.dropped.load(Ordering::Relaxed),
            subscriber_count,
            last_published_at: c.last_published(),
        }
    }
}

/// One subscription (`Admin.ListSubscriptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionInfo {
    pub id: String,
    pub channels: Vec<String>,
    pub group: Option<String>,
    pub name: String,
    pub pending: u64,
    pub capacity: u64,
    /// Bytes queued now (each event's [`crate::Event::approx_size`]).
    pub queued_bytes: u64,
    /// The queue's byte bound.
    pub max_queue_bytes: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub overflow: Overflow,
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    pub created_at: SystemTime,
}

/// One subscription's queue figures (metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLevel {
    pub id: Arc<str>,
    pub pending: u64,
    pub capacity: u64,
    pub queued_bytes: u64,
    pub max_queue_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_evicts_idle_oldest_first_then_busy_oldest() {
        let table = ChannelTable::new(10, None);
        for i in 0..10 {
            let entry = table.get_or_insert(&format!("c{i}")).unwrap();
            entry.counters.mark_published(unix_micros(UNIX_EPOCH + Duration::from_secs(100 + i)));
        }
        assert!(table.get_or_insert("c10").is_none(), "full: the caller must evict first");
        assert!(table.get_or_insert("c3").is_some(), "known channels are still found");
        // c0 is "busy" (has subscribers): kept while idle ones remain.
        assert_eq!(table.evict(|e| &*e.name != "c0"), 1, "down to 90%");
        let names: Vec<String> = table.all().iter().map(|e| e.name.to_string()).collect();
        assert!(names.contains(&"c0".to_owned()));
        assert!(!names.contains(&"c1".to_owned()) && names.contains(&"c2".to_owned()));
        assert_eq!(table.len(), 9);
        // Every channel busy (a `>` subscriber): the oldest go all the same.
        let entry = table.get_or_insert("n").unwrap();
        entry.counters.mark_published(unix_micros(UNIX_EPOCH + Duration::from_secs(1000)));
        assert_eq!(table.evict(|_| false), 1);
        assert!(!table.all().iter().any(|e| &*e.name == "c0"), "the least recently published");
        assert_eq!((table.len(), table.evicted()), (9, 2));
    }

    #[test]
    fn labels_are_capped_and_survive_eviction() {
        let table = ChannelTable::new(2, Some(3));
        for i in 0..10 {
            let name = format!("c{i}");
            let entry = table.get_or_insert(&name).or_else(|| {
                table.evict(|_| true);
                table.get_or_insert(&name)
            });
            let entry = entry.unwrap();
            entry.counters.mark_published(unix_micros(UNIX_EPOCH + Duration::from_secs(1 + i)));
            entry.counters.add_delivered(2);
        }
        table.evict(|_| true);
        let entry = table.get_or_insert("c0").unwrap();
        entry.counters.mark_published(unix_micros(UNIX_EPOCH + Duration::from_secs(100)));
        let labels = table.label_stats();
        assert_eq!(labels.len(), 4, "3 channels and _other");
        let c0 = labels.iter().find(|l| l.label == "c0").unwrap();
        assert_eq!((c0.published, c0.delivered), (2, 2), "kept across eviction and re-creation");
        let other = labels.last().unwrap();
        assert_eq!((other.label.as_str(), other.published, other.delivered), (OTHER_LABEL, 7, 14));
    }
}
