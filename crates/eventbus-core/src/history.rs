//! Per-channel history, so a subscriber that reconnects can recover what it missed.
//!
//! A channel matching one of the `eventbus.history` rules keeps its latest events,
//! bounded by count, bytes and age. Every event it keeps has a [`Position`]: the
//! channel's current epoch and an offset (1, 2, 3… per channel within the epoch). The
//! epoch changes whenever the history is lost (an `in_memory` broker restarting, a
//! Redis flushed), so a position from before the loss is recognised as such rather
//! than mistaken for a later event.
//!
//! Here is the `in_memory` store ([`MemoryHistory`]); redis mode keeps the history in
//! Redis, behind the same reading contract ([`Recovery`], [`HistoryInfo`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::event::{Event, MEMORY_OVERHEAD};
use crate::name::Pattern;

/// Where an event stands in its channel's history.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position {
    /// Changes whenever the channel's history is lost.
    pub epoch: Arc<str>,
    /// 1 for the first event of the epoch, then one more per event.
    pub offset: u64,
}

/// How much history one channel keeps: the oldest events go first once any bound is
/// passed (the newest event is always kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Most events.
    pub size: usize,
    /// Most bytes (each event counted like in a subscription's queue).
    pub max_bytes: usize,
    /// Oldest age; `None` keeps events until a count or byte bound drops them.
    pub ttl: Option<Duration>,
}

/// Channels matching `channels` keep history within `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRule {
    /// Exact channel or pattern.
    pub channels: Pattern,
    /// What each matching channel keeps.
    pub limits: HistoryLimits,
}

/// The `eventbus.history` rules, in order: a channel follows the first that matches it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryRules(Arc<[HistoryRule]>);

impl HistoryRules {
    /// Rules in the order given.
    pub fn new(rules: Vec<HistoryRule>) -> Self {
        Self(rules.into())
    }

    /// True when no channel keeps history (the default).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What `channel` keeps, if it keeps anything.
    pub fn limits(&self, channel: &str) -> Option<&HistoryLimits> {
        self.0.iter().find(|r| r.channels.matches(channel)).map(|r| &r.limits)
    }

    /// True when every channel `filter` matches keeps a history (one rule covers
    /// them all).
    pub fn cover(&self, filter: &Pattern) -> bool {
        self.0.iter().any(|r| r.channels.covers(filter))
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[HistoryRule] {
        &self.0
    }
}

/// Where a read of a channel's history starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The events after this one (the last one a subscriber received).
    After(Position),
    /// The events published at or after this time.
    At(SystemTime),
    /// Everything kept.
    Oldest,
}

/// Which events of a read come back when there are more than fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The oldest `n` (a page: [`Recovery::more`] says others follow).
    First(usize),
    /// The newest `n` (a recovery bounded by a queue: [`Recovery::more`] says older ones
    /// were left out).
    Last(usize),
}

impl Take {
    /// How many at most.
    pub fn count(self) -> usize {
        match self {
            Self::First(n) | Self::Last(n) => n,
        }
    }

    /// Cuts `events` (oldest first) to what this takes; true when some were cut.
    pub fn apply<T>(self, events: &mut Vec<T>) -> bool {
        let over = events.len().saturating_sub(self.count());
        match self {
            Self::First(n) => events.truncate(n),
            Self::Last(_) => {
                events.drain(..over);
            }
        }
        over > 0
    }
}

/// What a read of one channel's history found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// The events asked for that are still kept, oldest first, each with its position.
    pub events: Vec<Arc<Event>>,
    /// False when events asked for are gone: trimmed by the bounds, or lost with the
    /// epoch the position came from (then `events` starts at the oldest kept).
    pub complete: bool,
    /// The channel's latest position (none before its first event).
    pub last: Option<Position>,
    /// More events were asked for than the read's [`Take`] let through: newer ones
    /// follow (`First`), or older ones were left out (`Last`).
    pub more: bool,
}

/// One channel's history, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryInfo {
    /// The channel.
    pub channel: String,
    /// Its current epoch.
    pub epoch: Arc<str>,
    /// Offset of the oldest event kept (`last_offset + 1` when none is).
    pub first_offset: u64,
    /// Offset of the latest event (0 before the first).
    pub last_offset: u64,
    /// Events kept.
    pub events: u64,
    /// Their bytes, counted as in the bounds.
    pub bytes: u64,
}

/// Why events left a history, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimReason {
    /// The `size` bound.
    Size,
    /// The `max_bytes` bound, or the broker-wide budget.
    Bytes,
    /// Older than `ttl`.
    Age,
}

impl TrimReason {
    /// Every reason, in index order.
    pub const ALL: [TrimReason; 3] = [TrimReason::Size, TrimReason::Bytes, TrimReason::Age];

    /// Metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Size => "size",
            Self::Bytes => "bytes",
            Self::Age => "age",
        }
    }
}

/// An age as people write it for a recovery or a history read: `500ms`, `90s`, `5m`,
/// `2h`, `1d`; `None` for anything else.
pub fn parse_age(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).map(Duration::from_millis)
}

/// A fresh epoch name: unique across restarts (time and randomness).
pub fn new_epoch() -> Arc<str> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    Arc::from(format!("{ms:x}{:04x}", rand::random::<u16>()))
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What an event costs in a history (as in a subscription's queue).
pub fn event_bytes(event: &Event) -> usize {
    event.approx_size() + MEMORY_OVERHEAD
}

/// The `in_memory` history of every channel with a rule. Each channel's epoch is made
/// when its history is: this process's epoch and a number, so a restart, or a history
/// evicted to keep within the bounds and made again, starts a new one.
#[derive(Debug)]
pub(crate) struct MemoryHistory {
    rules: HistoryRules,
    epoch: Arc<str>,
    started_at: SystemTime,
    /// Looked up once per channel entry (cached there), not per publish.
    channels: Mutex<HashMap<Box<str>, Arc<ChannelHistory>>>,
    /// Histories made so far (each one's epoch number), and evicted.
    made: AtomicU64,
    evictions: AtomicU64,
    /// When a history was last evicted (ms since the Unix epoch; 0: never).
    evicted_at: AtomicU64,
    max_channels: usize,
    /// Bytes kept across channels, and the bound on them.
    total: Arc<AtomicU64>,
    max_total: u64,
    trimmed: Arc<[AtomicU64; 3]>,
}

impl MemoryHistory {
    pub(crate) fn new(rules: HistoryRules, max_total: usize, max_channels: usize) -> Self {
        Self {
            rules,
            epoch: new_epoch(),
            started_at: SystemTime::now(),
            channels: Mutex::default(),
            made: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evicted_at: AtomicU64::new(0),
            max_channels: max_channels.max(1),
            total: Arc::default(),
            max_total: max_total as u64,
            trimmed: Arc::new(Default::default()),
        }
    }

    /// Since when every channel's history is whole: the start of this process, or the
    /// latest eviction of a channel's history (what was evicted is gone).
    pub(crate) fn kept_since(&self) -> SystemTime {
        let evicted = self.evicted_at.load(Ordering::Relaxed);
        self.started_at.max(UNIX_EPOCH + Duration::from_millis(evicted))
    }

    /// Whether a rule covers `channel`.
    pub(crate) fn covers(&self, channel: &str) -> bool {
        self.rules.limits(channel).is_some()
    }

    /// The history of `channel`, made on first use (evicting the least recently
    /// published tenth when `max_channels` are kept); `None` when no rule covers it.
    pub(crate) fn channel(&self, channel: &str) -> Option<Arc<ChannelHistory>> {
        let limits = self.rules.limits(channel)?;
        let mut channels = self.channels.lock();
        if let Some(h) = channels.get(channel) {
            return Some(Arc::clone(h));
        }
        if channels.len() >= self.max_channels {
            let mut by_age: Vec<(u64, Box<str>)> =
                channels.iter().map(|(name, h)| (h.last_append.load(Ordering::Relaxed), name.clone())).collect();
            let evict = (self.max_channels / 10).clamp(1, by_age.len());
            by_age.select_nth_unstable_by_key(evict - 1, |(at, _)| *at);
            self.evictions.fetch_add(evict as u64, Ordering::Relaxed);
            self.evicted_at.store(millis(SystemTime::now()), Ordering::Relaxed);
            for (_, name) in by_age.into_iter().take(evict) {
                if let Some(h) = channels.remove(&name) {
                    h.evicted.store(true, Ordering::Release);
                }
            }
        }
        let made = self.made.fetch_add(1, Ordering::Relaxed);
        let h = Arc::new(ChannelHistory {
            limits: limits.clone(),
            epoch: Arc::from(format!("{}.{made}", self.epoch)),
            total: Arc::clone(&self.total),
            max_total: self.max_total,
            trimmed: Arc::clone(&self.trimmed),
            last_append: AtomicU64::new(millis(SystemTime::now())),
            // Once a history was evicted, one made now may follow one that was lost.
            complete_since: match self.evictions.load(Ordering::Relaxed) {
                0 => self.started_at,
                _ => SystemTime::now(),
            },
            evicted: AtomicBool::new(false),
            state: Mutex::default(),
        });
        channels.insert(channel.into(), Arc::clone(&h));
        Some(h)
    }

    /// The history of `channel` if it has one already.
    fn existing(&self, channel: &str) -> Option<Arc<ChannelHistory>> {
        self.channels.lock().get(channel).cloned()
    }

    pub(crate) fn read(&self, channel: &str, start: &Start, take: Take) -> Option<Recovery> {
        self.rules.limits(channel)?;
        Some(match self.existing(channel) {
            Some(h) => h.read(start, take),
            // Nothing published since start: complete unless asked about an older epoch
            // or a time before this process kept anything.
            // Nothing published since start (or its history was evicted): complete
            // only from nothing, or from a time since which nothing could be lost.
            None => Recovery {
                complete: match start {
                    Start::After(p) => p.offset == 0,
                    Start::At(t) => *t >= self.started_at && self.evictions.load(Ordering::Relaxed) == 0,
                    Start::Oldest => true,
                },
                ..Recovery::default()
            },
        })
    }

    /// Channels with history matching `filter`, sorted.
    pub(crate) fn channels_matching(&self, filter: &Pattern) -> Vec<String> {
        let mut out: Vec<String> =
            self.channels.lock().keys().filter(|c| filter.matches(c)).map(|c| c.to_string()).collect();
        out.sort_unstable();
        out
    }

    pub(crate) fn info(&self, channel: &str) -> Option<HistoryInfo> {
        self.rules.limits(channel)?;
        let (epoch, events, bytes, first, last) = match self.existing(channel) {
            Some(h) => {
                let mut s = h.state.lock();
                h.expire(&mut s, SystemTime::now());
                (Arc::clone(&h.epoch), s.events.len() as u64, s.bytes as u64, s.first_offset(), s.last_offset)
            }
            None => (Arc::from(""), 0, 0, 1, 0),
        };
        Some(HistoryInfo { channel: channel.to_owned(), epoch, first_offset: first, last_offset: last, events, bytes })
    }

    /// Bytes kept across channels.
    pub(crate) fn bytes(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Events trimmed since start, by reason.
    pub(crate) fn trimmed(&self) -> [(TrimReason, u64); 3] {
        TrimReason::ALL.map(|r| (r, self.trimmed[r as usize].load(Ordering::Relaxed)))
    }
}

/// One channel's kept events.
#[derive(Debug)]
pub(crate) struct ChannelHistory {
    limits: HistoryLimits,
    epoch: Arc<str>,
    total: Arc<AtomicU64>,
    max_total: u64,
    trimmed: Arc<[AtomicU64; 3]>,
    /// When this history was last published to (ms since the Unix epoch), to tell which
    /// was published least recently.
    last_append: AtomicU64,
    /// Dropped by the store to keep within `max_channels`: publishers look it up anew.
    evicted: AtomicBool,
    /// A read from a time before this one may miss events (the process started, or an
    /// earlier history of the channel may have been evicted).
    complete_since: SystemTime,
    state: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// Oldest first, each with its bytes.
    events: VecDeque<(Arc<Event>, usize)>,
    bytes: usize,
    last_offset: u64,
    /// The newest event trimmed (offset and time): a read from before it is incomplete.
    trimmed_offset: u64,
    trimmed_at: Option<SystemTime>,
}

impl Kept {
    fn first_offset(&self) -> u64 {
        self.events.front().and_then(|(e, _)| e.position.as_ref()).map_or(self.last_offset + 1, |p| p.offset)
    }
}

impl ChannelHistory {
    /// Gives `event` the channel's next position and keeps it; `publish` then runs with
    /// the position taken and before the next event of the channel gets one, so the
    /// subscribers see the channel's events in position order.
    pub(crate) fn append<R>(&self, event: &mut Arc<Event>, publish: impl FnOnce(&Arc<Event>) -> R) -> R {
        self.last_append.store(millis(event.timestamp), Ordering::Relaxed);
        let mut s = self.state.lock();
        s.last_offset += 1;
        let position = Position { epoch: Arc::clone(&self.epoch), offset: s.last_offset };
        Arc::make_mut(event).position = Some(position);
        let bytes = event_bytes(event);
        s.events.push_back((Arc::clone(event), bytes));
        s.bytes += bytes;
        self.total.fetch_add(bytes as u64, Ordering::Relaxed);
        let now = event.timestamp;
        self.expire(&mut s, now);
        while s.events.len() > 1 {
            let reason = if s.events.len() > self.limits.size {
                TrimReason::Size
            } else if s.bytes > self.limits.max_bytes || self.total.load(Ordering::Relaxed) > self.max_total {
                TrimReason::Bytes
            } else {
                break;
            };
            self.trim_oldest(&mut s, reason);
        }
        publish(event)
    }

    /// True once the store dropped this history.
    pub(crate) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Drops events older than the ttl.
    fn expire(&self, s: &mut Kept, now: SystemTime) {
        let Some(ttl) = self.limits.ttl else { return };
        let Some(oldest) = now.checked_sub(ttl) else { return };
        while s.events.front().is_some_and(|(e, _)| e.timestamp < oldest) {
            self.trim_oldest(s, TrimReason::Age);
        }
    }

    fn trim_oldest(&self, s: &mut Kept, reason: TrimReason) {
        let Some((event, bytes)) = s.events.pop_front() else { return };
        s.bytes -= bytes;
        self.total.fetch_sub(bytes as u64, Ordering::Relaxed);
        self.trimmed[reason as usize].fetch_add(1, Ordering::Relaxed);
        s.trimmed_offset = event.position.as_ref().map_or(s.trimmed_offset, |p| p.offset);
        s.trimmed_at = Some(event.timestamp);
    }

    fn read(&self, start: &Start, take: Take) -> Recovery {
        let mut s = self.state.lock();
        self.expire(&mut s, SystemTime::now());
        let (skip, complete) = match start {
            Start::After(p) if (*p.epoch == *self.epoch && p.offset <= s.last_offset) || p.offset == 0 => {
                let first = s.first_offset();
                (p.offset.saturating_sub(first - 1).min(s.events.len() as u64) as usize, s.trimmed_offset <= p.offset)
            }
            Start::After(_) => (0, false),
            Start::At(t) => {
                let skip = s.events.partition_point(|(e, _)| e.timestamp < *t);
                (skip, *t >= self.complete_since && s.trimmed_at.is_none_or(|at| at < *t))
            }
            Start::Oldest => (0, s.trimmed_offset == 0),
        };
        let selected = s.events.len().saturating_sub(skip);
        let from = match take {
            Take::First(_) => skip,
            Take::Last(n) => skip + selected.saturating_sub(n),
        };
        let events: Vec<Arc<Event>> =
            s.events.iter().skip(from).take(take.count()).map(|(e, _)| Arc::clone(e)).collect();
        Recovery {
            more: selected > events.len(),
            events,
            complete,
            last: (s.last_offset > 0).then(|| Position { epoch: Arc::clone(&self.epoch), offset: s.last_offset }),
        }
    }
}

impl Drop for ChannelHistory {
    fn drop(&mut self) {
        self.total.fetch_sub(self.state.get_mut().bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(size: usize, max_bytes: usize) -> HistoryLimits {
        HistoryLimits { size, max_bytes, ttl: None }
    }

    fn store(size: usize, max_bytes: usize) -> MemoryHistory {
        let rule = HistoryRule { channels: Pattern::parse("orders.>").unwrap(), limits: limits(size, max_bytes) };
        MemoryHistory::new(HistoryRules::new(vec![rule]), usize::MAX, 1000)
    }

    fn event(channel: &str, payload: &'static [u8]) -> Arc<Event> {
        Arc::new(Event::from_parts(
            "id".into(),
            channel.into(),
            SystemTime::now(),
            String::new(),
            bytes::Bytes::from_static(payload),
            HashMap::new(),
            String::new(),
        ))
    }

    fn append(h: &MemoryHistory, channel: &str, payload: &'static [u8]) -> Position {
        let mut e = event(channel, payload);
        h.channel(channel).unwrap().append(&mut e, |_| ());
        e.position.clone().unwrap()
    }

    fn offsets(r: &Recovery) -> Vec<u64> {
        r.events.iter().map(|e| e.position.as_ref().unwrap().offset).collect()
    }

    #[test]
    fn positions_count_up_per_channel_and_reads_resume_after_one() {
        let h = store(100, usize::MAX);
        assert!(h.channel("other").is_none());
        let p1 = append(&h, "orders.a", b"1");
        append(&h, "orders.b", b"x");
        let p2 = append(&h, "orders.a", b"2");
        append(&h, "orders.a", b"3");
        assert_eq!((p1.offset, p2.offset), (1, 2));
        let r = h.read("orders.a", &Start::After(p1.clone()), Take::First(100)).unwrap();
        assert_eq!(offsets(&r), [2, 3]);
        assert!(r.complete);
        assert_eq!(r.last.unwrap().offset, 3);
        let r = h.read("orders.a", &Start::After(p1.clone()), Take::First(1)).unwrap();
        assert_eq!((offsets(&r), r.more), (vec![2], true));
        let r = h.read("orders.a", &Start::After(p1), Take::Last(1)).unwrap();
        assert_eq!((offsets(&r), r.more), (vec![3], true), "the newest, older ones left out");
        let r = h.read("orders.a", &Start::Oldest, Take::Last(10)).unwrap();
        assert_eq!((offsets(&r), r.more), (vec![1, 2, 3], false));
        assert_eq!(h.channels_matching(&Pattern::parse("orders.*").unwrap()), ["orders.a", "orders.b"]);
    }

    #[test]
    fn a_trimmed_or_foreign_position_reads_as_incomplete() {
        let h = store(2, usize::MAX);
        let p1 = append(&h, "orders.a", b"1");
        let p2 = append(&h, "orders.a", b"2");
        append(&h, "orders.a", b"3");
        append(&h, "orders.a", b"4");
        let r = h.read("orders.a", &Start::After(p1), Take::First(100)).unwrap();
        assert_eq!((offsets(&r), r.complete), (vec![3, 4], false));
        let r = h.read("orders.a", &Start::After(p2.clone()), Take::First(100)).unwrap();
        assert_eq!((offsets(&r), r.complete), (vec![3, 4], true));
        let old = Position { epoch: "gone".into(), offset: 2 };
        let r = h.read("orders.a", &Start::After(old), Take::First(100)).unwrap();
        assert_eq!((offsets(&r), r.complete), (vec![3, 4], false));
        // Past the last offset: offsets were given again (the store lost its latest
        // writes), so what the subscriber has is unknown.
        let ahead = Position { epoch: p2.epoch.clone(), offset: 9 };
        let r = h.read("orders.a", &Start::After(ahead), Take::First(100)).unwrap();
        assert_eq!((offsets(&r), r.complete), (vec![3, 4], false));
        let info = h.info("orders.a").unwrap();
        assert_eq!((info.first_offset, info.last_offset, info.events), (3, 4, 2));
    }

    #[test]
    fn bytes_are_bounded_per_channel_and_in_total() {
        let one = event_bytes(&event("orders.a", b"0123456789"));
        let h = store(1000, one * 3);
        for _ in 0..50 {
            append(&h, "orders.a", b"0123456789");
        }
        let info = h.info("orders.a").unwrap();
        assert_eq!((info.events, info.bytes), (3, 3 * one as u64));
        assert_eq!(h.bytes(), 3 * one as u64);
        let rule = HistoryRule { channels: Pattern::parse(">").unwrap(), limits: limits(1000, usize::MAX) };
        let h = MemoryHistory::new(HistoryRules::new(vec![rule]), one * 4, 1000);
        for _ in 0..10 {
            append(&h, "a", b"0123456789");
            append(&h, "b", b"0123456789");
        }
        assert!(h.bytes() <= 5 * one as u64, "{} > {}", h.bytes(), 5 * one);
        assert!(h.trimmed()[1].1 > 0);
    }

    /// Appends an event published `second` seconds after the Unix epoch.
    fn append_at(h: &MemoryHistory, channel: &str, second: u64) -> Position {
        let mut e = event(channel, b"x");
        Arc::make_mut(&mut e).timestamp = UNIX_EPOCH + Duration::from_secs(second);
        h.channel(channel).unwrap().append(&mut e, |_| ());
        e.position.clone().unwrap()
    }

    #[test]
    fn past_max_channels_the_least_recently_published_histories_go_and_come_back_in_a_new_epoch() {
        let rule = HistoryRule { channels: Pattern::parse(">").unwrap(), limits: limits(10, usize::MAX) };
        let h = MemoryHistory::new(HistoryRules::new(vec![rule]), usize::MAX, 10);
        append_at(&h, "c0", 1);
        let first = append_at(&h, "c1", 2);
        for i in 2..10 {
            append_at(&h, &format!("c{i}"), 10 + i);
        }
        append_at(&h, "c0", 30); // c0 is now the most recent; c1 the least
        let c1 = h.channel("c1").unwrap();
        append_at(&h, "c10", 31);
        assert!(c1.is_evicted(), "the least recently published went");
        assert!(!h.channel("c0").unwrap().is_evicted());
        assert_eq!(h.channels_matching(&Pattern::parse(">").unwrap()).len(), 10);
        let again = append_at(&h, "c1", 32);
        assert_ne!(again.epoch, first.epoch);
        assert_eq!(again.offset, 1, "a new history starts over, in its own epoch");
        let r = h.read("c0", &Start::At(UNIX_EPOCH), Take::First(10)).unwrap();
        assert!(!r.complete, "a time before the store started");
    }

    #[test]
    fn reads_by_time_are_complete_only_when_nothing_after_it_was_trimmed() {
        let h = store(2, usize::MAX);
        let before = SystemTime::now();
        append(&h, "orders.a", b"1");
        let r = h.read("orders.a", &Start::At(before), Take::First(10)).unwrap();
        assert!(r.complete);
        append(&h, "orders.a", b"2");
        append(&h, "orders.a", b"3");
        let r = h.read("orders.a", &Start::At(before), Take::First(10)).unwrap();
        assert_eq!((offsets(&r), r.complete), (vec![2, 3], false));
        let r = h.read("orders.a", &Start::At(before - Duration::from_secs(3600)), Take::First(10)).unwrap();
        assert!(!r.complete, "a time before the store started cannot be complete");
    }
}
