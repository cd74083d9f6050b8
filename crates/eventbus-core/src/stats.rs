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
use crate::subscription::Overflow;

const SHARDS: usize = 16;

/// Totals for the whole bus.
#[derive(Debug, Default)]
pub(crate) struct BusCounters {
    pub(crate) published: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dropped: AtomicU64,
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
    pub(crate) fn mark_published(&self, at: SystemTime) {
        self.published.fetch_add(1, Ordering::Relaxed);
        let us = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        self.last_published_us.fetch_max(us, Ordering::Relaxed);
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
}

type Shard = RwLock<HashMap<Box<str>, Arc<ChannelEntry>>>;

/// Channels seen by this instance, bounded.
#[derive(Debug)]
pub(crate) struct ChannelTable {
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    len: AtomicUsize,
    max_channels: usize,
    /// Metrics labels; `None` when metrics are off, so the hot path skips them.
    labels: Option<LabelTable>,
    /// Held while evicting, so concurrent inserts past the cap evict once.
    evicting: Mutex<()>,
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
        }
    }

    fn shard(&self, name: &str) -> &Shard {
        &self.shards[self.hasher.hash_one(name) as usize % SHARDS]
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The entry for `name`, created on first use. Returns it and whether the table has
    /// grown past its bound (the caller then evicts idle channels).
    pub(crate) fn get_or_insert(&self, name: &str) -> (Arc<ChannelEntry>, bool) {
        let shard = self.shard(name);
        if let Some(entry) = shard.read().get(name) {
            return (Arc::clone(entry), false);
        }
        let mut map = shard.write();
        let entry = map.entry(name.into()).or_insert_with(|| {
            self.len.fetch_add(1, Ordering::Relaxed);
            let label = self.labels.as_ref().map(|l| l.assign(name));
            let counters = Arc::new(ChannelCounters { label, ..ChannelCounters::default() });
            Arc::new(ChannelEntry { name: name.into(), counters, targets: RwLock::new(None) })
        });
        (Arc::clone(entry), self.len() > self.max_channels)
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

    /// Forgets idle channels (per `is_idle`), least recently published first, until
    /// the table is back under 90% of its bound. Skipped if another thread is at it.
    pub(crate) fn evict_idle(&self, is_idle: impl Fn(&ChannelEntry) -> bool) -> usize {
        let Some(_guard) = self.evicting.try_lock() else { return 0 };
        let target = self.max_channels - self.max_channels / 10;
        if self.len() <= target {
            return 0;
        }
        let mut idle: Vec<(i64, Arc<ChannelEntry>)> = self
            .all()
            .into_iter()
            .filter(|e| is_idle(e))
            .map(|e| (e.counters.last_published_us.load(Ordering::Relaxed), e))
            .collect();
        idle.sort_unstable_by_key(|(at, _)| *at);
        let excess = self.len() - target;
        let mut removed = 0;
        for (_, entry) in idle.into_iter().take(excess) {
            if self.shard(&entry.name).write().remove(&entry.name).is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
                removed += 1;
            }
        }
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
    pub delivered: u64,
    pub dropped: u64,
    pub overflow: Overflow,
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    pub created_at: SystemTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_evicts_idle_oldest_first_and_keeps_busy() {
        let table = ChannelTable::new(10, None);
        for i in 0..11 {
            let (entry, over) = table.get_or_insert(&format!("c{i}"));
            entry.counters.mark_published(UNIX_EPOCH + Duration::from_secs(100 + i));
            assert_eq!(over, i == 10);
        }
        // c0 is "busy" (has subscribers): never evicted.
        let removed = table.evict_idle(|e| &*e.name != "c0");
        assert_eq!(removed, 2);
        let names: Vec<String> = table.all().iter().map(|e| e.name.to_string()).collect();
        assert!(names.contains(&"c0".to_owned()));
        assert!(!names.contains(&"c1".to_owned()) && !names.contains(&"c2".to_owned()));
        assert_eq!(table.len(), 9);
    }

    #[test]
    fn labels_are_capped_and_survive_eviction() {
        let table = ChannelTable::new(2, Some(3));
        for i in 0..10 {
            let (entry, _) = table.get_or_insert(&format!("c{i}"));
            entry.counters.mark_published(UNIX_EPOCH + Duration::from_secs(1 + i));
            entry.counters.add_delivered(2);
            table.evict_idle(|_| true);
        }
        let (entry, _) = table.get_or_insert("c0");
        entry.counters.mark_published(UNIX_EPOCH + Duration::from_secs(100));
        let labels = table.label_stats();
        assert_eq!(labels.len(), 4, "3 channels and _other");
        let c0 = labels.iter().find(|l| l.label == "c0").unwrap();
        assert_eq!((c0.published, c0.delivered), (2, 2), "kept across eviction and re-creation");
        let other = labels.last().unwrap();
        assert_eq!((other.label.as_str(), other.published, other.delivered), (OTHER_LABEL, 7, 14));
    }
}
