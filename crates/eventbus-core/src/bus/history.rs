//! Reading channel histories, and recovering a subscriber from where it was.

use super::*;
use crate::history::{HistoryInfo, Recovery, Start, Take, TrimReason};

/// Most channels a subscriber may name in [`Since::positions`].
pub const MAX_SINCE_CHANNELS: usize = 1024;

/// Where a subscriber that reconnects was (`SubscribeRequest.since`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Since {
    /// The last position received, per channel.
    pub positions: HashMap<String, Position>,
    /// For the subscription's other channels with history: the events published at or
    /// after this time.
    pub timestamp: Option<SystemTime>,
}

impl Since {
    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty() && self.timestamp.is_none()
    }
}

impl Bus {
    /// The history rules in force.
    pub fn history_rules(&self) -> &HistoryRules {
        &self.inner.config.history
    }

    /// Reads `channel`'s history from `start`, the events `take` says; `None` when the
    /// channel keeps none.
    pub async fn read_history(&self, channel: &str, start: &Start, take: Take) -> Result<Option<Recovery>, Error> {
        if let Some(history) = &self.inner.history {
            return Ok(history.read(channel, start, take));
        }
        match &self.inner.transport {
            Some(transport) => Ok(transport.read_history(channel, start, take).await?),
            None => Ok(None),
        }
    }

    /// Channels matching `filter` that keep a history now, sorted.
    pub async fn history_channels(&self, filter: &Pattern) -> Result<Vec<String>, Error> {
        if let Some(history) = &self.inner.history {
            return Ok(history.channels_matching(filter));
        }
        match &self.inner.transport {
            Some(transport) => Ok(transport.history_channels(filter).await?),
            None => Ok(Vec::new()),
        }
    }

    /// What `channel`'s history holds; `None` when it keeps none.
    pub async fn history_info(&self, channel: &str) -> Result<Option<HistoryInfo>, Error> {
        if let Some(history) = &self.inner.history {
            return Ok(history.info(channel));
        }
        match &self.inner.transport {
            Some(transport) => Ok(transport.history_info(channel).await?),
            None => Ok(None),
        }
    }

    /// Bytes of history kept in this process (`in_memory` mode with rules).
    pub fn history_bytes(&self) -> Option<u64> {
        self.inner.history.as_ref().map(MemoryHistory::bytes)
    }

    /// Events this process's history trimmed since start, by reason.
    pub fn history_trimmed(&self) -> Option<[(TrimReason, u64); 3]> {
        self.inner.history.as_ref().map(MemoryHistory::trimmed)
    }

    /// The latest position of each exact channel of `filters` that keeps a history (so
    /// a subscriber that has received nothing yet knows where it started).
    pub async fn latest_positions(&self, filters: &[String]) -> Result<HashMap<String, Position>, Error> {
        let mut out = HashMap::new();
        for channel in filters.iter().filter(|f| self.history_rules().limits(f).is_some()) {
            let exact = Pattern::parse(channel).is_ok_and(|p| p.is_exact());
            if !exact {
                continue;
            }
            if let Some(last) = self.read_history(channel, &Start::Oldest, Take::First(0)).await?.and_then(|r| r.last) {
                out.insert(channel.clone(), last);
            }
        }
        Ok(out)
    }

    /// Fills a new subscription with what its subscriber missed: for each channel of
    /// `since.positions`, the events after that position; with `since.timestamp`, for
    /// each other channel of the subscription with a history, the events from that time.
    /// They are delivered before any live event, and a live event the subscriber
    /// already has (recovered, or received before) is skipped: no gap and no copy at
    /// the seam. Returns false when history no longer holds everything asked for (then
    /// the subscription starts from what it has), or when some of the subscription's
    /// channels keep no history.
    pub async fn recover(&self, handle: &mut SubscriptionHandle, since: &Since) -> Result<bool, Error> {
        let spec = &handle.sub.spec;
        if spec.group.is_some() {
            return Err(Error::InvalidOption {
                field: "since",
                message:
                    "a group's members share its events, so a member cannot recover them; subscribe without a group"
                        .into(),
            });
        }
        if since.positions.len() > MAX_SINCE_CHANNELS {
            return Err(Error::InvalidOption {
                field: "since",
                message: format!("{} channels is over the limit of {MAX_SINCE_CHANNELS}", since.positions.len()),
            });
        }
        let mut reads: Vec<(String, Start)> = Vec::new();
        for (channel, position) in &since.positions {
            if !spec.filters.iter().any(|f| f.matches(channel)) {
                return Err(Error::InvalidOption {
                    field: "since",
                    message: format!("{} is not a channel this subscription covers", crate::quoted(channel)),
                });
            }
            reads.push((channel.clone(), Start::After(position.clone())));
        }
        reads.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(at) = since.timestamp {
            let mut others = Vec::new();
            for filter in &spec.filters {
                if filter.is_exact() {
                    if self.history_rules().limits(filter.as_str()).is_some() {
                        others.push(filter.as_str().to_owned());
                    }
                } else {
                    others.extend(self.history_channels(filter).await?);
                }
            }
            others.sort_unstable();
            others.dedup();
            others.retain(|c| !since.positions.contains_key(c));
            reads.extend(others.into_iter().map(|c| (c, Start::At(at))));
        }
        // A channel without history has nothing to recover from: what it lost is lost.
        let mut complete = spec.filters.iter().all(|f| self.history_rules().cover(f));
        // From a time before this process kept anything (a restart lost it), a channel
        // without history now may have had events then.
        if let (Some(at), Some(history)) = (since.timestamp, &self.inner.history) {
            complete &= at >= history.kept_since();
        }
        // At most a queue's worth is recovered, the newest: each channel's newest that
        // many, merged into what is kept so far, so a recovery holds at most two queues'
        // worth at a time however many channels it reads.
        let capacity = spec.capacity;
        let mut events: Vec<Arc<Event>> = Vec::new();
        let mut seam = HashMap::new();
        for (channel, start) in reads {
            let Some(read) = self.read_history(&channel, &start, Take::Last(capacity)).await? else {
                // Asked for by position, yet the channel keeps no history (any more).
                complete = false;
                continue;
            };
            complete &= read.complete && !read.more;
            let had = match start {
                Start::After(p) => Some(p),
                Start::At(_) | Start::Oldest => None,
            };
            let last = read.events.last().and_then(|e| e.position.clone());
            let current = |p: &Position| read.last.as_ref().is_some_and(|l| l.epoch == p.epoch && p.offset <= l.offset);
            if let Some(position) = last.or(had.filter(current)) {
                seam.insert(channel, position);
            }
            events = merge_by_time(vec![events, read.events]);
            if Take::Last(capacity).apply(&mut events) {
                complete = false;
            }
        }
        handle.recovered = events.into();
        handle.seam = seam;
        Ok(complete)
    }
}

/// Several channels' events in time order, each channel's kept in position order even
/// where two publishing instances' clocks disagree.
fn merge_by_time(runs: Vec<Vec<Arc<Event>>>) -> Vec<Arc<Event>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let total = runs.iter().map(Vec::len).sum();
    let mut runs: Vec<std::vec::IntoIter<Arc<Event>>> = runs.into_iter().map(Vec::into_iter).collect();
    let mut heads: Vec<Option<Arc<Event>>> = runs.iter_mut().map(Iterator::next).collect();
    let mut next: BinaryHeap<Reverse<(SystemTime, usize)>> =
        heads.iter().enumerate().filter_map(|(i, h)| h.as_ref().map(|e| Reverse((e.timestamp, i)))).collect();
    let mut out = Vec::with_capacity(total);
    while let Some(Reverse((_, i))) = next.pop() {
        out.extend(heads[i].take());
        heads[i] = runs[i].next();
        if let Some(e) = &heads[i] {
            next.push(Reverse((e.timestamp, i)));
        }
    }
    out
}
