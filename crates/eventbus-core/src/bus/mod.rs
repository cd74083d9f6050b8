//! The fan-out engine: publish, subscribe, unsubscribe, stats and shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures::future::join_all;
use parking_lot::RwLock;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::durable::{CaptureRequest, Captured, DurableBackend, DurableError};
use crate::error::Error;
use crate::event::{ChannelCheck, Event, PublishInput, Stamp, new_id};
use crate::history::{ChannelHistory, HistoryRules, MemoryHistory, Position};
use crate::name::Pattern;
use crate::router::{GroupTargets, Router, Targets};
use crate::stats::{
    BusCounters, BusStats, ChannelEntry, ChannelStats, ChannelTable, LabelStats, QueueLevel, SubscriptionInfo,
};
use crate::subscription::{CloseReason, DropReason, Offer, OwnerBudget, Subscription, SubscriptionSpec};
use crate::transport::{Fanout, LocalFanout, Transport, TransportError, TransportStatus};

mod config;
mod history;
mod publish;
mod subscribe;

pub use config::{
    BusConfig, MAX_BATCH_BYTES, MAX_BATCH_LIMIT, MAX_KEY_BYTES, MAX_LABEL_BYTES, MAX_SOURCE_BYTES,
    MAX_SUBSCRIBE_CHANNELS, SubscribeOptions,
};
pub use history::{MAX_SINCE_CHANNELS, Since};
pub use subscribe::SubscriptionHandle;

use publish::scoped_key;
use subscribe::info;

/// The channel the publishes of one call went to last, with its entry (counters and
/// cached targets), for the next publish of the call on the same channel.
/// Also the last publish time it converted: the events of one call share theirs.
#[derive(Debug, Default)]
pub(crate) struct RecentChannel {
    entry: Option<Arc<ChannelEntry>>,
    stamp: Option<(SystemTime, i64)>,
}

impl RecentChannel {
    /// `at` in microseconds since the Unix epoch, converted once per distinct time.
    fn unix_micros(&mut self, at: SystemTime) -> i64 {
        match self.stamp {
            Some((seen, us)) if seen == at => us,
            _ => {
                let us = crate::stats::unix_micros(at);
                self.stamp = Some((at, us));
                us
            }
        }
    }
}

/// Outcome of an accepted publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Id given to the event (shared with the event, not copied).
    pub event_id: Arc<str>,
    /// Subscriptions (or, remotely, instances) that took it.
    pub delivered: u32,
    /// Matching subscriptions that could not take it.
    pub failed: u32,
    /// Time spent, including waits for full queues.
    pub duration: Duration,
    /// The idempotency key was seen within the dedup window: nothing was delivered and
    /// `event_id` is the original event's.
    pub duplicate: bool,
    /// Durable consumers that stored it (0 when none matches, and for a duplicate).
    pub captured: u32,
    /// When the durable engine held it (capture and commit), if it did.
    pub capture: Option<CaptureTiming>,
}

/// The part of a publish spent in the durable engine: capture, commit and, for a
/// batch, the other events captured in the same round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureTiming {
    /// From the start of the publish to the start of the capture.
    pub after: Duration,
    /// Length of the capture.
    pub took: Duration,
}

/// The event bus: a cheap handle, clone it freely.
#[derive(Debug, Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    config: BusConfig,
    instance_id: String,
    started_at: SystemTime,
    /// Written on subscribe/unsubscribe only; publishers read it only when their
    /// channel's cached targets are stale.
    router: RwLock<Router>,
    /// Bumped under the router write lock on every change.
    generation: AtomicU64,
    channels: ChannelTable,
    counters: Arc<BusCounters>,
    shutting_down: AtomicBool,
    /// `None` in `in_memory` mode: publishes are routed locally, no boxing.
    transport: Option<Arc<dyn Transport>>,
    /// The transport's connection state, followed once rather than per publish.
    transport_status: Option<tokio::sync::watch::Receiver<TransportStatus>>,
    /// Signalled whenever a subscription leaves (shutdown waits on it).
    removed: Notify,
    /// Signalled when shutdown begins (publish streams waiting for requests end).
    stopping: Notify,
    /// `in_memory` mode with history rules: the kept events.
    history: Option<MemoryHistory>,
    /// Durable consumers, when enabled: captured before a publish is answered.
    durable: std::sync::OnceLock<Arc<dyn DurableBackend>>,
    /// Each principal's queued-bytes share, held by its subscriptions (touched at
    /// subscribe only; enqueueing uses the subscription's own handle).
    owner_budgets: parking_lot::Mutex<HashMap<String, std::sync::Weak<OwnerBudget>>>,
    /// This bus, for the work it hands to tasks of its own (an overflowed event's dead
    /// letter): weak, so such a task never keeps a dropped bus alive.
    me: std::sync::Weak<Inner>,
}

impl Bus {
    /// An in-memory bus.
    pub fn new(config: BusConfig) -> Self {
        Self { inner: Arc::new_cyclic(|me| Inner::new(config, None, me.clone())) }
    }

    /// A bus whose publishes go through a shared transport. `make` receives the
    /// handle the transport uses to deliver events it receives to local subscribers.
    pub fn with_transport(config: BusConfig, make: impl FnOnce(LocalFanout) -> Arc<dyn Transport>) -> Self {
        let inner = Arc::new_cyclic(|weak| {
            let transport = make(LocalFanout { bus: weak.clone() });
            Inner::new(config, Some(transport), weak.clone())
        });
        Self { inner }
    }

    /// Enables durable consumers: every later publish is captured for the consumers it
    /// matches before it is answered, and dead letters are published on this bus.
    pub fn enable_durable(&self, durable: impl DurableBackend) {
        let durable: Arc<dyn DurableBackend> = Arc::new(durable);
        let bus = Arc::downgrade(&self.inner);
        durable.set_dead_letter_sink(Arc::new(move |channel, payload, content_type| {
            let bus = bus.upgrade().map(|inner| Bus { inner });
            Box::pin(async move {
                let bus = bus.ok_or(Error::ShuttingDown)?;
                let input =
                    PublishInput { channel, payload, content_type, source: "eventbusd".into(), ..Default::default() };
                // A dead letter wraps an event that was within the limit; refusing it
                // for the wrapping would lose it.
                bus.publish_within(input, usize::MAX, &mut RecentChannel::default()).await.map(drop)
            })
        }));
        let _ = self.inner.durable.set(durable);
    }

    /// The durable consumer engine, when enabled.
    pub fn durable(&self) -> Option<&Arc<dyn DurableBackend>> {
        self.inner.durable.get()
    }

    /// Settings in force.
    pub fn config(&self) -> &BusConfig {
        &self.inner.config
    }

    /// Unique id of this instance.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// Opens a subscription. It is live (matched by every later publish, on any
    /// instance sharing the transport) on return.
    pub async fn subscribe(&self, opts: SubscribeOptions) -> Result<SubscriptionHandle, Error> {
        let spec = self.inner.spec(opts)?;
        let sub = Arc::new(Subscription::new(new_id(), spec, Arc::clone(&self.inner.counters)));
        {
            let mut router = self.inner.router.write();
            // Checked under the lock so a subscription cannot slip past shutdown's drain.
            if self.is_shutting_down() {
                return Err(Error::ShuttingDown);
            }
            let watch = router.add(Arc::clone(&sub));
            self.inner.generation.fetch_add(1, Ordering::Release);
            if let Some(transport) = &self.inner.transport {
                watch.iter().for_each(|f| transport.watch(f));
                if let Some(group) = &sub.spec.group_key {
                    transport.group_members(group, router.group_members(group));
                }
            }
        }
        // Built before waiting: if the caller gives up, dropping it unsubscribes.
        let handle = SubscriptionHandle { sub, bus: self.clone(), recovered: Default::default(), seam: HashMap::new() };
        if let Some(transport) = &self.inner.transport {
            transport.watched().await;
        }
        Ok(handle)
    }

    /// Closes a subscription by id; its stream ends normally.
    pub fn unsubscribe(&self, id: &str) -> Result<(), Error> {
        if self.inner.remove(id, CloseReason::Unsubscribed) {
            Ok(())
        } else {
            Err(Error::UnknownSubscription(id.to_owned()))
        }
    }

    /// Totals since start.
    pub fn stats(&self) -> BusStats {
        let c = &self.inner.counters;
        BusStats {
            total_published: c.published.load(Ordering::Relaxed),
            total_delivered: c.delivered.load(Ordering::Relaxed),
            total_failed: c.failed.load(Ordering::Relaxed),
            total_dropped: c.dropped.load(Ordering::Relaxed),
            active_subscriptions: self.inner.router.read().len() as u64,
            active_channels: self.inner.channels.len() as u64,
            started_at: self.inner.started_at,
            mode: self.mode(),
            instance_id: self.inner.instance_id.clone(),
        }
    }

    /// The transport's connection state; `None` in `in_memory` mode (always ready).
    pub fn transport_status(&self) -> Option<tokio::sync::watch::Receiver<TransportStatus>> {
        self.inner.transport.as_ref().map(|t| t.status())
    }

    /// `in_memory`, or the transport's mode.
    pub fn mode(&self) -> &'static str {
        self.inner.transport.as_ref().map_or("in_memory", |t| t.mode())
    }

    /// Bytes of the events queued now across subscriptions, each event counted once
    /// (see [`BusConfig::max_queued_bytes`]).
    pub fn queued_bytes(&self) -> u64 {
        self.inner.counters.queued_bytes.load(Ordering::Relaxed) as u64
    }

    /// Events lost since start, per reason.
    pub fn dropped_by_reason(&self) -> [(DropReason, u64); DropReason::ALL.len()] {
        let counts = &self.inner.counters.dropped_by_reason;
        DropReason::ALL.map(|r| (r, counts[r as usize].load(Ordering::Relaxed)))
    }

    /// Queue figures of every open subscription, for metrics: lighter than
    /// [`Bus::subscriptions`] (no strings but the id).
    pub fn queue_levels(&self) -> Vec<QueueLevel> {
        let router = self.inner.router.read();
        router
            .all()
            .map(|s| QueueLevel {
                id: Arc::clone(&s.id),
                pending: s.pending() as u64,
                capacity: s.spec.capacity as u64,
                queued_bytes: s.queued_bytes() as u64,
                max_queue_bytes: s.spec.max_bytes as u64,
            })
            .collect()
    }

    /// Tracked channels with their counters, sorted by name.
    pub fn channels(&self) -> Vec<ChannelStats> {
        let mut out: Vec<ChannelStats> = self
            .inner
            .channels
            .all()
            .iter()
            .map(|entry| ChannelStats::of(entry, self.inner.targets(entry).subscriber_count() as u64))
            .collect();
        out.sort_by(|a, b| a.channel.cmp(&b.channel));
        out
    }

    /// Channels forgotten since start to keep the channel table within
    /// [`BusConfig::max_channels`] (their metrics labels keep counting).
    pub fn channels_evicted(&self) -> u64 {
        self.inner.channels.evicted()
    }

    /// Events full DEAD_LETTER subscriptions refused, by outcome: published to their
    /// overflow dead-letter channel, lost because that publish failed, and dropped
    /// without one because they were on a dead-letter channel already.
    pub fn overflow_dead_letters(&self) -> [(&'static str, u64); 3] {
        let c = &self.inner.counters;
        [
            ("published", c.overflow_dead_lettered.load(Ordering::Relaxed)),
            ("failed", c.overflow_dead_letters_failed.load(Ordering::Relaxed)),
            ("skipped", c.overflow_dead_letters_skipped.load(Ordering::Relaxed)),
        ]
    }

    /// Counters per channel metrics label (capped; see [`BusConfig::max_channel_labels`]).
    pub fn label_stats(&self) -> Vec<LabelStats> {
        self.inner.channels.label_stats()
    }

    /// Open subscriptions, oldest first.
    pub fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        let router = self.inner.router.read();
        let mut out: Vec<SubscriptionInfo> = router.all().map(|s| info(s)).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The principal that opened subscription `id` ("" with authentication off), if it
    /// is open.
    pub fn subscription_owner(&self, id: &str) -> Option<String> {
        let router = self.inner.router.read();
        router.all().find(|s| &*s.id == id).map(|s| s.spec.owner.clone())
    }

    /// True once shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    /// Starts shutdown: new publishes and subscribes are refused, and every
    /// subscription delivers what it has queued, then ends with `ShuttingDown`.
    pub fn begin_shutdown(&self) {
        let router = self.inner.router.write();
        self.inner.shutting_down.store(true, Ordering::Release);
        router.all().for_each(|s| s.drain());
        self.inner.stopping.notify_waiters();
    }

    /// Resolves once shutdown has begun: for the streams that wait on their publisher
    /// and would otherwise hold the drain until the connections are closed.
    pub async fn shutdown_begun(&self) {
        let notified = self.inner.stopping.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_shutting_down() {
            return;
        }
        notified.await;
    }

    /// Resolves once no subscription is left (all drained and gone).
    pub async fn drained(&self) {
        loop {
            let notified = self.inner.removed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.router.read().len() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Ends every remaining subscription now (drain timed out).
    pub fn close_all(&self) {
        self.inner.close_all(CloseReason::ShuttingDown);
    }
}

impl Inner {
    /// The transport may have lost events for local subscriptions: ends each (unless
    /// shutting down, which ends them anyway) so that its client recovers.
    pub(crate) fn interrupt(&self) {
        if self.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let ended = self.close_all(CloseReason::Interrupted);
        if ended > 0 {
            tracing::warn!(
                subscriptions = ended,
                "the connection to Redis was lost or restored, or one of its subscriptions interrupted: \
                 local subscriptions ended, for their clients to recover what they missed from history"
            );
        }
    }

    /// Ends every subscription with `reason`; returns how many there were.
    pub(crate) fn close_all(&self, reason: CloseReason) -> usize {
        let ids: Vec<Arc<str>> = self.router.read().all().map(|s| Arc::clone(&s.id)).collect();
        for id in &ids {
            self.remove(id, reason);
        }
        ids.len()
    }

    fn new(config: BusConfig, transport: Option<Arc<dyn Transport>>, me: std::sync::Weak<Inner>) -> Self {
        let max_queued_bytes = config.max_queued_bytes;
        let history = (transport.is_none() && !config.history.is_empty())
            .then(|| MemoryHistory::new(config.history.clone(), config.history_max_bytes, config.history_max_channels));
        Self {
            channels: ChannelTable::new(config.max_channels, config.max_channel_labels),
            config,
            instance_id: new_id().to_string(),
            started_at: SystemTime::now(),
            router: RwLock::default(),
            generation: AtomicU64::new(0),
            counters: Arc::new(BusCounters::new(max_queued_bytes)),
            shutting_down: AtomicBool::new(false),
            history,
            transport_status: transport.as_ref().map(|t| t.status()),
            transport,
            removed: Notify::new(),
            stopping: Notify::new(),
            durable: std::sync::OnceLock::new(),
            owner_budgets: parking_lot::Mutex::default(),
            me,
        }
    }

    fn channel(&self, name: &str) -> Arc<ChannelEntry> {
        loop {
            if let Some(entry) = self.channels.get_or_insert(name) {
                return entry;
            }
            self.channels.evict(|e| self.targets(e).subscriber_count() == 0);
        }
    }

    /// The channel's cached targets, recomputed if the router changed since.
    fn targets(&self, entry: &ChannelEntry) -> Arc<Targets> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(t) = entry.targets.read().as_ref()
            && t.generation == generation
        {
            return Arc::clone(t);
        }
        let router = self.router.read();
        let generation = self.generation.load(Ordering::Acquire);
        let fresh = Arc::new(router.targets(&entry.name, generation));
        drop(router);
        *entry.targets.write() = Some(Arc::clone(&fresh));
        fresh
    }

    /// Routes an event received from the transport to local subscriptions.
    pub(crate) async fn dispatch(&self, event: Event) -> Fanout {
        self.dispatch_local(Arc::new(event), false, &mut RecentChannel::default()).await
    }

    /// The entry of channel `name`: `recent`'s when it is that channel's (a run of
    /// publishes on one channel looks it up once), else looked up and kept in `recent`.
    fn entry<'a>(&self, name: &str, recent: &'a mut RecentChannel) -> &'a Arc<ChannelEntry> {
        let entry = match recent.entry.take() {
            Some(entry) if *entry.name == *name => entry,
            _ => self.channel(name),
        };
        recent.entry.insert(entry)
    }

    /// Offers the event to every matching subscription (one member per group). Queues
    /// with room are served first; only then does the publish wait, for all full
    /// DROP_NEWEST queues at once, up to `offer_timeout`. A channel with history gives
    /// the event its position first, and offers it before the channel's next event
    /// gets one: subscribers see a channel's positions in order.
    async fn dispatch_local(&self, mut event: Arc<Event>, count_publish: bool, recent: &mut RecentChannel) -> Fanout {
        let at_us = if count_publish { recent.unix_micros(event.timestamp) } else { 0 };
        let entry = self.entry(&event.channel, recent);
        if count_publish {
            entry.counters.mark_published(at_us);
            self.counters.published.fetch_add(1, Ordering::Relaxed);
        }
        let counters = Some(Arc::clone(&entry.counters));
        let size = event.approx_size() + crate::event::MEMORY_OVERHEAD;
        // Still held elsewhere (a durable engine keeping it), the queues get their own
        // copy, which no queue holds yet (`Event`'s `Clone`).
        let routed = Arc::make_mut(&mut event);
        routed.counters = counters;
        routed.residency.size = size;
        let history = match count_publish {
            true => self.history_of(entry),
            false => None,
        };
        let (mut fanout, full) = match history {
            Some(history) => history.append(&mut event, |event| self.offer_now(event, &self.targets(entry))),
            None => self.offer_now(&event, &self.targets(entry)),
        };
        if !full.is_empty() {
            let deadline = Instant::now() + self.config.offer_timeout;
            for outcome in join_all(full.iter().map(|s| s.offer_wait(&event, deadline))).await {
                match outcome {
                    Offer::Accepted => fanout.delivered += 1,
                    Offer::Rejected | Offer::Disconnected | Offer::DeadLettered => fanout.failed += 1,
                    Offer::MustWait | Offer::Closed => {}
                }
            }
        }
        let (delivered, failed) = (u64::from(fanout.delivered), u64::from(fanout.failed));
        entry.counters.add_delivered(delivered);
        self.counters.delivered.fetch_add(delivered, Ordering::Relaxed);
        if failed > 0 {
            entry.counters.add_failed(failed);
            self.counters.failed.fetch_add(failed, Ordering::Relaxed);
        }
        fanout
    }

    /// The channel's `in_memory` history, if it keeps one: the entry's, unless the store
    /// evicted it since (then the store's new one).
    fn history_of(&self, entry: &ChannelEntry) -> Option<Arc<ChannelHistory>> {
        let history = self.history.as_ref()?;
        if !*entry.keeps_history.get_or_init(|| history.covers(&entry.name)) {
            return None;
        }
        if let Some(h) = entry.history.read().as_ref().filter(|h| !h.is_evicted()) {
            return Some(Arc::clone(h));
        }
        let fresh = history.channel(&entry.name)?;
        *entry.history.write() = Some(Arc::clone(&fresh));
        Some(fresh)
    }

    /// Offers the event to every target that can take it now; returns the counts and
    /// the full DROP_NEWEST queues that are worth a wait.
    fn offer_now(&self, event: &Arc<Event>, targets: &Targets) -> (Fanout, Vec<Arc<Subscription>>) {
        let mut fanout = Fanout::default();
        let mut full = Vec::new();
        // With a transport, a group spans the instances: one of them delivers each event.
        let chosen = targets
            .groups
            .iter()
            .filter(|g| match (&self.transport, g.members.first().and_then(|m| m.spec.group_key.as_deref())) {
                (Some(transport), Some(group)) => transport.delivers_to_group(group, event),
                _ => true,
            })
            .map(pick_member);
        for sub in targets.solo.iter().chain(chosen) {
            match sub.try_offer(event) {
                Offer::Accepted => fanout.delivered += 1,
                Offer::Rejected => fanout.failed += 1,
                Offer::DeadLettered => {
                    fanout.failed += 1;
                    self.dead_letter_overflow(event, sub);
                }
                Offer::Disconnected => {
                    fanout.failed += 1;
                    self.remove(&sub.id, CloseReason::SlowConsumer);
                }
                Offer::MustWait => full.push(Arc::clone(sub)),
                Offer::Closed => {}
            }
        }
        (fanout, full)
    }

    /// Publishes an event a full DEAD_LETTER subscription refused to
    /// `dlq.overflow.<channel>` (shortened like any dead-letter channel when too long),
    /// with the subscription's id and name in its metadata, off the publishing path. An
    /// event of a dead-letter channel is only dropped (already counted): an overflow
    /// never feeds itself.
    fn dead_letter_overflow(&self, event: &Arc<Event>, sub: &Subscription) {
        if event.channel.starts_with(crate::durable::DLQ_PREFIX) {
            self.counters.overflow_dead_letters_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(bus) = self.me.upgrade().map(|inner| Bus { inner }) else { return };
        let mut metadata = event.metadata.clone();
        metadata.insert("eventbus-subscription-id".to_owned(), sub.id.to_string());
        metadata.insert("eventbus-subscription-name".to_owned(), sub.spec.name.clone());
        metadata.insert("eventbus-channel".to_owned(), event.channel.to_string());
        metadata.insert("eventbus-event-id".to_owned(), event.id.to_string());
        let input = PublishInput {
            channel: crate::durable::default_dead_letter_channel(&format!("overflow.{}", event.channel)),
            payload: event.payload.clone(),
            metadata,
            content_type: event.content_type.to_string(),
            source: "eventbusd".into(),
            ..Default::default()
        };
        let counters = Arc::clone(&self.counters);
        tokio::spawn(async move {
            let channel = input.channel.clone();
            match bus.publish_within(input, usize::MAX, &mut RecentChannel::default()).await {
                Ok(_) => {
                    counters.overflow_dead_lettered.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => {
                    counters.overflow_dead_letters_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%channel, error = %crate::error_chain(&err), "an overflowed event could not be dead-lettered; it is lost (counted)");
                }
            }
        });
    }

    /// Takes a subscription out of the router and closes it. False if unknown.
    fn remove(&self, id: &str, reason: CloseReason) -> bool {
        let removed = {
            let mut router = self.router.write();
            let removed = router.remove(id);
            if let Some((sub, unwatch)) = &removed {
                self.generation.fetch_add(1, Ordering::Release);
                if let Some(transport) = &self.transport {
                    unwatch.iter().for_each(|f| transport.unwatch(f));
                    if let Some(group) = &sub.spec.group_key {
                        transport.group_members(group, router.group_members(group));
                    }
                }
            }
            removed
        };
        let Some((sub, _)) = removed else { return false };
        sub.close(reason);
        self.removed.notify_waiters();
        true
    }
}

/// One member of a group: round-robin, skipping members whose queue is full; if all
/// are full, the round-robin choice (whose overflow policy then applies).
fn pick_member(group: &GroupTargets) -> &Arc<Subscription> {
    let n = group.members.len();
    let start = group.cursor.fetch_add(1, Ordering::Relaxed) % n;
    (0..n).map(|i| &group.members[(start + i) % n]).find(|m| m.has_room()).unwrap_or(&group.members[start])
}

#[cfg(test)]
mod tests;
