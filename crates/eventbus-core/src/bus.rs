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
use crate::event::{ChannelCheck, Event, PublishInput, new_id};
use crate::name::Pattern;
use crate::router::{GroupTargets, Router, Targets};
use crate::stats::{
    BusCounters, BusStats, ChannelEntry, ChannelStats, ChannelTable, LabelStats, QueueLevel, SubscriptionInfo,
};
use crate::subscription::{CloseReason, DropReason, Offer, Overflow, OwnerBudget, Subscription, SubscriptionSpec};
use crate::transport::{Fanout, LocalFanout, Transport, TransportError, TransportStatus};

/// Most channels and patterns in one subscription.
pub const MAX_SUBSCRIBE_CHANNELS: usize = 64;
/// Longest `ordering_key` or `idempotency_key`, in bytes: each is kept per event (and,
/// for idempotency, for the whole dedup window), so a long one costs memory and disk.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest publisher-given `source`, in bytes: it travels with every copy of the event.
pub const MAX_SOURCE_BYTES: usize = 1024;
/// Largest `max_batch` a subscriber may ask for.
pub const MAX_BATCH_LIMIT: usize = 10_000;
/// Longest group or subscription name, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;
/// Approximate byte budget of one batch: keeps stream messages far below the 4 MiB
/// that gRPC clients accept by default (a single larger event still goes alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Engine settings (the `eventbus` section of the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct BusConfig {
    /// Queue capacity of a subscription that asks for 0.
    pub default_queue_capacity: usize,
    /// Largest queue capacity a subscription may ask for.
    pub max_queue_capacity: usize,
    /// Byte bound of a subscription's queue when it asks for 0.
    pub default_queue_bytes: usize,
    /// Budget of bytes queued across all subscriptions, each event counted once; also
    /// the largest `max_queue_bytes` a subscription may ask for.
    pub max_queued_bytes: usize,
    /// How long a DROP_NEWEST publish waits for room in a full queue.
    pub offer_timeout: Duration,
    /// Policy of a subscription that does not choose one.
    pub overflow: Overflow,
    /// Events per stream message for a subscription that asks for 0.
    pub max_batch: usize,
    /// Largest payload accepted.
    pub max_payload_bytes: usize,
    /// Channels tracked for stats before idle ones are forgotten.
    pub max_channels: usize,
    /// Channels counted under their own metrics label (the rest share `_other`);
    /// `None` keeps no label counters (metrics off).
    pub max_channel_labels: Option<usize>,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            default_queue_capacity: 10_000,
            max_queue_capacity: 1_000_000,
            default_queue_bytes: 64 << 20,
            max_queued_bytes: 512 << 20,
            offer_timeout: Duration::from_millis(100),
            overflow: Overflow::DropNewest,
            max_batch: 256,
            max_payload_bytes: 1 << 20,
            max_channels: 10_000,
            max_channel_labels: Some(1000),
        }
    }
}

/// What a subscriber asks for (`SubscribeRequest`, wire-free).
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Exact channels and/or patterns.
    pub channels: Vec<String>,
    /// Group to join; empty means none.
    pub group: String,
    /// 0 means the default capacity.
    pub queue_capacity: usize,
    /// Byte bound of the queue; 0 means the default.
    pub max_queue_bytes: usize,
    /// `None` means the configured default.
    pub overflow: Option<Overflow>,
    /// 0 means the configured default.
    pub max_batch: usize,
    /// Free label.
    pub name: String,
    /// Client address.
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    /// Most bytes queued across all of `owner`'s subscriptions (0 = no bound but the
    /// broker's `max_queued_bytes`).
    pub owner_max_queued_bytes: usize,
}

/// Outcome of an accepted publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Id given to the event.
    pub event_id: String,
    /// Subscriptions (or, remotely, instances) that took it.
    pub delivered: u32,
    /// Matching subscriptions that could not take it.
    pub failed: u32,
    /// Time spent, including waits for full queues.
    pub duration: Duration,
    /// The idempotency key was seen within the dedup window: nothing was delivered and
    /// `event_id` is the original event's.
    pub duplicate: bool,
}

/// A publish's keys ("" = none).
struct PublishKeys {
    ordering: String,
    idempotency: String,
}

impl PublishKeys {
    fn request<'a>(&'a self, event: &'a Arc<Event>) -> CaptureRequest<'a> {
        CaptureRequest {
            event,
            ordering_key: (!self.ordering.is_empty()).then_some(self.ordering.as_str()),
            idempotency_key: (!self.idempotency.is_empty()).then_some(self.idempotency.as_str()),
        }
    }
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
                bus.publish_within(input, usize::MAX).await.map(drop)
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

    /// Validates and publishes one event.
    pub async fn publish(&self, input: PublishInput) -> Result<Published, Error> {
        self.publish_within(input, self.inner.config.max_payload_bytes).await
    }

    /// [`Bus::publish`] with its own payload limit.
    async fn publish_within(&self, input: PublishInput, max_payload_bytes: usize) -> Result<Published, Error> {
        let start = Instant::now();
        let (event, keys) = self.prepare(input, max_payload_bytes, ChannelCheck::Needed)?;
        let event = Arc::new(event);
        let Some(durable) = self.inner.durable.get() else {
            return self.deliver(event, start).await;
        };
        let r = keys.request(&event);
        let captured = durable.capture(r.event, r.ordering_key, r.idempotency_key).await?;
        self.complete(event, captured, start).await
    }

    /// Publishes several events of one publisher (the requests of a `PublishStream`
    /// that arrived together), in order: the durable capture of all of them shares one
    /// round trip where the engine allows it. The answers come in the same order and
    /// stop at the first error, which is then the last answer; the events after it
    /// go unanswered (see [`DurableBackend::capture_many`]).
    pub async fn publish_many(&self, inputs: Vec<PublishInput>) -> Vec<Result<Published, Error>> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(inputs.len());
        let Some(durable) = self.inner.durable.get().filter(|_| inputs.len() > 1) else {
            for input in inputs {
                let published = self.publish(input).await;
                let failed = published.is_err();
                out.push(published);
                if failed {
                    break;
                }
            }
            return out;
        };
        let mut prepared = Vec::with_capacity(inputs.len());
        let mut refused = None;
        for input in inputs {
            let check = channel_check(prepared.last().map(|(e, _)| e), &input);
            match self.prepare(input, self.inner.config.max_payload_bytes, check) {
                Ok((event, keys)) => prepared.push((Arc::new(event), keys)),
                Err(err) => {
                    refused = Some(err);
                    break;
                }
            }
        }
        let captured = {
            let requests: Vec<CaptureRequest<'_>> = prepared.iter().map(|(e, keys)| keys.request(e)).collect();
            durable.capture_many(&requests).await
        };
        let expected = prepared.len();
        for ((event, _), captured) in prepared.into_iter().zip(captured) {
            let published = match captured {
                Ok(c) => self.complete(event, c, start).await,
                Err(err) => Err(err.into()),
            };
            let failed = published.is_err();
            out.push(published);
            if failed {
                return out;
            }
        }
        if out.len() < expected {
            // An engine that answered fewer events than it was given: say so rather
            // than leave a publisher without an answer.
            let answered = out.len();
            let reason = format!("the durable engine answered {answered} of {expected} publishes");
            out.push(Err(Error::Durable(DurableError::unavailable(reason))));
            return out;
        }
        out.extend(refused.map(Err));
        out
    }

    /// Publishes the events of one batch (`PublishBatch`) in order, and answers every
    /// one of them, in the same order: unlike [`Bus::publish_many`], a refused event
    /// does not stop the ones after it. The durable captures of the accepted events
    /// share one round trip where the engine allows it; should the engine fail part-way,
    /// the events it left unanswered are refused as not captured (like any publish
    /// whose answer was lost, a shared store may have captured some of them).
    pub async fn publish_each(&self, inputs: Vec<PublishInput>) -> Vec<Result<Published, Error>> {
        let mut out = Vec::with_capacity(inputs.len());
        let Some(durable) = self.inner.durable.get() else {
            for input in inputs {
                out.push(self.publish(input).await);
            }
            return out;
        };
        let start = Instant::now();
        let max_payload_bytes = self.inner.config.max_payload_bytes;
        let mut prepared: Vec<Result<(Arc<Event>, PublishKeys), Error>> = Vec::with_capacity(inputs.len());
        for input in inputs {
            let check = channel_check(prepared.last().and_then(|p| p.as_ref().ok()).map(|(e, _)| e), &input);
            prepared.push(self.prepare(input, max_payload_bytes, check).map(|(event, keys)| (Arc::new(event), keys)));
        }
        let captured = {
            let requests: Vec<CaptureRequest<'_>> =
                prepared.iter().filter_map(|p| p.as_ref().ok()).map(|(e, keys)| keys.request(e)).collect();
            if requests.is_empty() { Vec::new() } else { durable.capture_many(&requests).await }
        };
        let mut captured = captured.into_iter();
        for prepared in prepared {
            let published = match prepared {
                Err(err) => Err(err),
                Ok((event, _)) => match captured.next() {
                    Some(Ok(c)) => self.complete(event, c, start).await,
                    Some(Err(err)) => Err(err.into()),
                    None => Err(Error::Durable(DurableError::unavailable(
                        "not captured: the durable engine failed on an earlier event of the batch",
                    ))),
                },
            };
            out.push(published);
        }
        out
    }

    /// Checks a publish and builds its event.
    fn prepare(
        &self,
        mut input: PublishInput,
        max_payload_bytes: usize,
        channel: ChannelCheck,
    ) -> Result<(Event, PublishKeys), Error> {
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        for (field, value, limit) in [
            ("ordering_key", &input.ordering_key, MAX_KEY_BYTES),
            ("idempotency_key", &input.idempotency_key, MAX_KEY_BYTES),
            ("source", &input.source, MAX_SOURCE_BYTES),
        ] {
            if value.len() > limit {
                return Err(Error::InvalidOption {
                    field,
                    message: format!("{} bytes is over the limit of {limit}", value.len()),
                });
            }
        }
        let keys = PublishKeys {
            ordering: std::mem::take(&mut input.ordering_key),
            idempotency: scoped_key(&input.idempotency_scope, std::mem::take(&mut input.idempotency_key)),
        };
        let event = input.into_event(max_payload_bytes, channel)?;
        if let Some(status) = &self.inner.transport_status {
            let status = *status.borrow();
            if !status.connected {
                // Fail fast while the shared medium is away, durable capture included.
                let reason = if status.stalled {
                    "connected but not answering health checks (hung or overloaded); the event was not published"
                } else {
                    "not connected; the event was not published"
                };
                return Err(Error::Transport(TransportError { transport: self.mode(), reason: reason.into() }));
            }
        }
        if self.inner.durable.get().is_none() && !keys.idempotency.is_empty() {
            // Promising "delivered once" and then not checking would be a silent lie.
            return Err(Error::InvalidOption {
                field: "idempotency_key",
                message: "needs durable consumers, which this broker does not run".into(),
            });
        }
        Ok((event, keys))
    }

    /// Finishes a publish the durable engine has captured: a duplicate is answered as
    /// such, an event the engine forwarded is done, a stored one goes to subscribers.
    async fn complete(&self, event: Arc<Event>, captured: Captured, start: Instant) -> Result<Published, Error> {
        match captured {
            Captured::Duplicate(original) => Ok(Published {
                event_id: original,
                delivered: 0,
                failed: 0,
                duration: start.elapsed(),
                duplicate: true,
            }),
            Captured::Forwarded { fanout, .. } => {
                self.inner.channel(&event.channel).counters.mark_published(event.timestamp);
                self.inner.counters.published.fetch_add(1, Ordering::Relaxed);
                Ok(Published {
                    event_id: event.id.clone(),
                    delivered: fanout.delivered,
                    failed: fanout.failed,
                    duration: start.elapsed(),
                    duplicate: false,
                })
            }
            Captured::Stored(_) => self.deliver(event, start).await,
        }
    }

    /// Hands an event to the local subscribers or the shared transport.
    async fn deliver(&self, event: Arc<Event>, start: Instant) -> Result<Published, Error> {
        let event_id = event.id.clone();
        let fanout = match &self.inner.transport {
            None => self.inner.dispatch_local(event, true).await,
            Some(transport) => {
                let channel = self.inner.channel(&event.channel);
                let at = event.timestamp;
                let fanout = transport.publish(event).await?;
                channel.counters.mark_published(at);
                self.inner.counters.published.fetch_add(1, Ordering::Relaxed);
                fanout
            }
        };
        Ok(Published {
            event_id,
            delivered: fanout.delivered,
            failed: fanout.failed,
            duration: start.elapsed(),
            duplicate: false,
        })
    }

    /// Opens a subscription. It is live (matched by every later publish, on any
    /// instance sharing the transport) on return.
    pub async fn subscribe(&self, opts: SubscribeOptions) -> Result<SubscriptionHandle, Error> {
        let spec = self.inner.spec(opts)?;
        let sub = Arc::new(Subscription::new(new_id().into(), spec, Arc::clone(&self.inner.counters)));
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
            }
        }
        // Built before waiting: if the caller gives up, dropping it unsubscribes.
        let handle = SubscriptionHandle { sub, bus: self.clone() };
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
        let ids: Vec<Arc<str>> = self.inner.router.read().all().map(|s| Arc::clone(&s.id)).collect();
        for id in ids {
            self.inner.remove(&id, CloseReason::ShuttingDown);
        }
    }
}

fn info(s: &Subscription) -> SubscriptionInfo {
    SubscriptionInfo {
        id: s.id.to_string(),
        channels: s.spec.filters.iter().map(|f| f.as_str().to_owned()).collect(),
        group: s.spec.group.as_deref().map(str::to_owned),
        name: s.spec.name.clone(),
        pending: s.pending() as u64,
        capacity: s.spec.capacity as u64,
        queued_bytes: s.queued_bytes() as u64,
        max_queue_bytes: s.spec.max_bytes as u64,
        delivered: s.delivered(),
        dropped: s.dropped(),
        overflow: s.spec.overflow,
        peer: s.spec.peer.clone(),
        owner: s.spec.owner.clone(),
        created_at: s.created_at,
    }
}

fn check_label(field: &'static str, value: &str) -> Result<(), Error> {
    let why = if value.len() > MAX_LABEL_BYTES {
        "longer than 256 bytes"
    } else if value.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    let shown: String = value.chars().take(40).collect();
    Err(Error::InvalidOption { field, message: format!("{shown:?} is {why}") })
}

impl Inner {
    fn new(config: BusConfig, transport: Option<Arc<dyn Transport>>, me: std::sync::Weak<Inner>) -> Self {
        let max_queued_bytes = config.max_queued_bytes;
        Self {
            channels: ChannelTable::new(config.max_channels, config.max_channel_labels),
            config,
            instance_id: new_id(),
            started_at: SystemTime::now(),
            router: RwLock::default(),
            generation: AtomicU64::new(0),
            counters: Arc::new(BusCounters::new(max_queued_bytes)),
            shutting_down: AtomicBool::new(false),
            transport_status: transport.as_ref().map(|t| t.status()),
            transport,
            removed: Notify::new(),
            durable: std::sync::OnceLock::new(),
            owner_budgets: parking_lot::Mutex::default(),
            me,
        }
    }

    /// The queued-bytes share of `owner`, shared with its other open subscriptions; its
    /// bound is the latest one given.
    fn owner_budget(&self, owner: &str, max: usize) -> Arc<OwnerBudget> {
        let mut budgets = self.owner_budgets.lock();
        if let Some(budget) = budgets.get(owner).and_then(std::sync::Weak::upgrade) {
            budget.set_max(max);
            return budget;
        }
        budgets.retain(|_, b| b.strong_count() > 0);
        let budget = Arc::new(OwnerBudget::new(max));
        budgets.insert(owner.to_owned(), Arc::downgrade(&budget));
        budget
    }

    /// Applies defaults and limits to a subscribe request.
    fn spec(&self, opts: SubscribeOptions) -> Result<SubscriptionSpec, Error> {
        if opts.channels.is_empty() {
            return Err(Error::NoChannels);
        }
        if opts.channels.len() > MAX_SUBSCRIBE_CHANNELS {
            return Err(Error::TooManyChannels { count: opts.channels.len(), limit: MAX_SUBSCRIBE_CHANNELS });
        }
        let mut filters: Vec<Pattern> = Vec::with_capacity(opts.channels.len());
        for name in &opts.channels {
            let filter = Pattern::parse(name)?;
            if !filters.contains(&filter) {
                filters.push(filter);
            }
        }
        let capacity = match opts.queue_capacity {
            0 => self.config.default_queue_capacity,
            n if n > self.config.max_queue_capacity => {
                return Err(Error::QueueTooLarge { requested: n, limit: self.config.max_queue_capacity });
            }
            n => n,
        };
        let max_bytes = match opts.max_queue_bytes {
            0 => self.config.default_queue_bytes,
            n if n > self.config.max_queued_bytes => {
                return Err(Error::InvalidOption {
                    field: "max_queue_bytes",
                    message: format!("{n} is above max_queued_bytes = {}", self.config.max_queued_bytes),
                });
            }
            n => n,
        };
        let max_batch = match opts.max_batch {
            0 => self.config.max_batch,
            n if n > MAX_BATCH_LIMIT => {
                return Err(Error::InvalidOption {
                    field: "max_batch",
                    message: format!("{n} is above the limit of {MAX_BATCH_LIMIT}"),
                });
            }
            n => n,
        };
        check_label("group", &opts.group)?;
        check_label("name", &opts.name)?;
        let group: Option<Arc<str>> = (!opts.group.is_empty()).then(|| opts.group.into());
        let group_key = group.as_ref().map(|g| match opts.owner.is_empty() {
            true => Arc::clone(g),
            false => Arc::from(scoped_key(&opts.owner, g.to_string())),
        });
        let owner_budget =
            (opts.owner_max_queued_bytes != 0).then(|| self.owner_budget(&opts.owner, opts.owner_max_queued_bytes));
        Ok(SubscriptionSpec {
            filters,
            owner_budget,
            group,
            group_key,
            name: opts.name,
            peer: opts.peer,
            owner: opts.owner,
            capacity,
            max_bytes,
            overflow: opts.overflow.unwrap_or(self.config.overflow),
            max_batch,
        })
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
        self.dispatch_local(Arc::new(event), false).await
    }

    /// Offers the event to every matching subscription (one member per group). Queues
    /// with room are served first; only then does the publish wait, for all full
    /// DROP_NEWEST queues at once, up to `offer_timeout`.
    async fn dispatch_local(&self, mut event: Arc<Event>, count_publish: bool) -> Fanout {
        let entry = self.channel(&event.channel);
        if count_publish {
            entry.counters.mark_published(event.timestamp);
            self.counters.published.fetch_add(1, Ordering::Relaxed);
        }
        let counters = Some(Arc::clone(&entry.counters));
        let size = event.approx_size() + crate::event::MEMORY_OVERHEAD;
        // Still held elsewhere (a durable engine keeping it), the queues get their own
        // copy, which no queue holds yet (`Event`'s `Clone`).
        let routed = Arc::make_mut(&mut event);
        routed.counters = counters;
        routed.residency.size = size;
        let targets = self.targets(&entry);

        let mut fanout = Fanout::default();
        let mut full: Vec<&Arc<Subscription>> = Vec::new();
        let chosen = targets.groups.iter().map(pick_member);
        for sub in targets.solo.iter().chain(chosen) {
            match sub.try_offer(&event) {
                Offer::Accepted => fanout.delivered += 1,
                Offer::Rejected => fanout.failed += 1,
                Offer::DeadLettered => {
                    fanout.failed += 1;
                    self.dead_letter_overflow(&event, sub);
                }
                Offer::Disconnected => {
                    fanout.failed += 1;
                    self.remove(&sub.id, CloseReason::SlowConsumer);
                }
                Offer::MustWait => full.push(sub),
                Offer::Closed => {}
            }
        }
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
            match bus.publish_within(input, usize::MAX).await {
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
            if let Some((_, unwatch)) = &removed {
                self.generation.fetch_add(1, Ordering::Release);
                if let Some(transport) = &self.transport {
                    unwatch.iter().for_each(|f| transport.unwatch(f));
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

/// A name within a principal's scope (an idempotency key as the durable engines keep
/// it, a group's routing key): `<scope length>:<scope>:<key>`, unambiguous whatever the
/// names contain; the key alone in the empty scope (authentication off).
fn scoped_key(scope: &str, key: String) -> String {
    if scope.is_empty() || key.is_empty() {
        return key;
    }
    format!("{}:{scope}:{key}", scope.len())
}

/// A publish's channel is checked unless the publish before it in the same call, already
/// accepted, had the same one.
fn channel_check(previous: Option<&Arc<Event>>, input: &PublishInput) -> ChannelCheck {
    if previous.is_some_and(|e| e.channel == input.channel) { ChannelCheck::Done } else { ChannelCheck::Needed }
}

/// One member of a group: round-robin, skipping members whose queue is full; if all
/// are full, the round-robin choice (whose overflow policy then applies).
fn pick_member(group: &GroupTargets) -> &Arc<Subscription> {
    let n = group.members.len();
    let start = group.cursor.fetch_add(1, Ordering::Relaxed) % n;
    (0..n).map(|i| &group.members[(start + i) % n]).find(|m| m.has_room()).unwrap_or(&group.members[start])
}

/// An open subscription, owned by whoever streams it. Dropping it unsubscribes.
#[derive(Debug)]
pub struct SubscriptionHandle {
    sub: Arc<Subscription>,
    bus: Bus,
}

impl SubscriptionHandle {
    /// The subscription id.
    pub fn id(&self) -> &str {
        &self.sub.id
    }

    /// Waits for events and moves up to `max_batch` of them into `out` (which should
    /// be empty). `Err` says why the subscription ended, once nothing is left to deliver.
    pub async fn next_batch(&self, out: &mut Vec<Arc<Event>>) -> Result<(), CloseReason> {
        self.sub.next_batch(MAX_BATCH_BYTES, out).await
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        self.bus.inner.remove(&self.sub.id, CloseReason::Unsubscribed);
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;
    use crate::transport::{PublishFuture, TransportError};

    fn opts(channels: &[&str]) -> SubscribeOptions {
        SubscribeOptions { channels: channels.iter().map(|c| c.to_string()).collect(), ..Default::default() }
    }

    fn input(channel: &str, payload: &'static [u8]) -> PublishInput {
        PublishInput { channel: channel.into(), payload: payload.into(), ..Default::default() }
    }

    #[tokio::test]
    async fn keys_and_source_are_capped_before_anything_is_kept() {
        let bus = Bus::new(BusConfig::default());
        let long = |n: usize| "k".repeat(n);
        let cases = [
            ("ordering_key", PublishInput { ordering_key: long(MAX_KEY_BYTES + 1), ..input("a", b"x") }),
            ("idempotency_key", PublishInput { idempotency_key: long(MAX_KEY_BYTES + 1), ..input("a", b"x") }),
            ("source", PublishInput { source: long(MAX_SOURCE_BYTES + 1), ..input("a", b"x") }),
        ];
        for (field, input) in cases {
            let err = bus.publish(input).await.unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{field}");
            assert!(err.to_string().contains(field), "{err}");
        }
        let at_limit =
            PublishInput { ordering_key: long(MAX_KEY_BYTES), source: long(MAX_SOURCE_BYTES), ..input("a", b"x") };
        assert!(bus.publish(at_limit).await.is_ok());
    }

    /// A loopback "remote" transport: records watch/unwatch and feeds publishes back
    /// through `LocalFanout`, as a Redis transport would on receipt.
    #[derive(Debug)]
    struct Loopback {
        local: LocalFanout,
        watched: Mutex<Vec<String>>,
        down: AtomicBool,
    }

    impl Transport for Loopback {
        fn mode(&self) -> &'static str {
            "loopback"
        }
        fn publish(&self, event: Arc<Event>) -> PublishFuture<'_> {
            Box::pin(async move {
                if self.down.load(Ordering::Relaxed) {
                    return Err(TransportError { transport: "loopback", reason: "down".into() });
                }
                let fanout = self.local.dispatch((*event).clone()).await;
                Ok(Fanout { delivered: 1, failed: fanout.failed })
            })
        }
        fn watch(&self, filter: &Pattern) {
            self.watched.lock().push(filter.to_string());
        }
        fn unwatch(&self, filter: &Pattern) {
            self.watched.lock().retain(|f| f != filter.as_str());
        }
        fn watched(&self) -> crate::transport::WatchedFuture<'_> {
            Box::pin(async {})
        }
        fn status(&self) -> tokio::sync::watch::Receiver<TransportStatus> {
            tokio::sync::watch::channel(TransportStatus { connected: true, ..TransportStatus::default() }).1
        }
    }

    #[tokio::test]
    async fn transport_seam_carries_publishes_and_interest() {
        let mut transport = None;
        let bus = Bus::with_transport(BusConfig::default(), |local| {
            let t = Arc::new(Loopback { local, watched: Mutex::default(), down: AtomicBool::new(false) });
            transport = Some(Arc::clone(&t));
            t
        });
        let transport = transport.unwrap();
        assert_eq!(bus.mode(), "loopback");

        let a = bus.subscribe(opts(&["orders.*", "orders.created"])).await.unwrap();
        let b = bus.subscribe(opts(&["orders.*"])).await.unwrap();
        assert_eq!(*transport.watched.lock(), vec!["orders.*", "orders.created"], "each filter watched once");

        let published = bus.publish(input("orders.created", b"x")).await.unwrap();
        assert_eq!(published.delivered, 1, "remote mode reports what the transport reports");
        for handle in [&a, &b] {
            let mut out = Vec::new();
            handle.next_batch(&mut out).await.unwrap();
            assert_eq!(out.len(), 1, "once, though two filters match");
            assert_eq!(out[0].id, published.event_id);
        }
        drop(a);
        assert_eq!(*transport.watched.lock(), vec!["orders.*"]);
        drop(b);
        assert!(transport.watched.lock().is_empty());

        transport.down.store(true, Ordering::Relaxed);
        assert!(matches!(bus.publish(input("orders.created", b"x")).await, Err(Error::Transport(_))));
        assert_eq!(bus.stats().total_published, 1, "a failed transport publish is not counted");
    }

    #[tokio::test]
    async fn groups_split_and_ungrouped_get_copies() {
        let bus = Bus::new(BusConfig::default());
        let group = |g: &str| SubscribeOptions { group: g.into(), ..opts(&["jobs.>"]) };
        let members = [bus.subscribe(group("w")).await.unwrap(), bus.subscribe(group("w")).await.unwrap()];
        let other = bus.subscribe(group("audit")).await.unwrap();
        let solo = bus.subscribe(opts(&["jobs.*"])).await.unwrap();
        for _ in 0..10 {
            let p = bus.publish(input("jobs.run", b"j")).await.unwrap();
            assert_eq!(p.delivered, 3, "one per group plus the solo subscription");
        }
        let pending: Vec<u64> = bus.subscriptions().iter().map(|s| s.pending).collect();
        assert_eq!(pending.iter().sum::<u64>(), 30);
        let w: Vec<usize> = members.iter().map(|m| m.sub.pending()).collect();
        assert_eq!(w, vec![5, 5], "round-robin between members with room");
        assert_eq!(other.sub.pending(), 10);
        assert_eq!(solo.sub.pending(), 10);
    }

    #[tokio::test]
    async fn group_prefers_members_with_room() {
        let bus = Bus::new(BusConfig::default());
        let member = |cap| SubscribeOptions {
            group: "g".into(),
            queue_capacity: cap,
            overflow: Some(Overflow::DropOldest),
            ..opts(&["a"])
        };
        let small = bus.subscribe(member(1)).await.unwrap();
        let big = bus.subscribe(member(100)).await.unwrap();
        for _ in 0..20 {
            bus.publish(input("a", b"")).await.unwrap();
        }
        assert_eq!(small.sub.pending() + big.sub.pending(), 20, "nothing dropped while one member has room");
        assert_eq!(bus.stats().total_dropped, 0);
    }

    #[tokio::test]
    async fn unsubscribe_and_drop_free_everything() {
        let bus = Bus::new(BusConfig::default());
        for _ in 0..1000 {
            let handle = bus.subscribe(opts(&["a.>", "b"])).await.unwrap();
            bus.publish(input("a.x", b"1")).await.unwrap();
            drop(handle);
        }
        assert_eq!(bus.stats().active_subscriptions, 0);
        assert_eq!(bus.stats().total_dropped, 1000, "queued events of closed subscriptions are counted lost");
        assert_eq!(bus.channels()[0].subscriber_count, 0);
        assert!(matches!(bus.unsubscribe("nope"), Err(Error::UnknownSubscription(_))));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn channel_table_stays_bounded_under_a_catch_all_subscriber() {
        let bus = Bus::new(BusConfig { max_channels: 100, ..BusConfig::default() });
        let _all =
            bus.subscribe(SubscribeOptions { overflow: Some(Overflow::DropOldest), ..opts(&[">"]) }).await.unwrap();
        let publishers: Vec<_> = (0..4)
            .map(|p| {
                let bus = bus.clone();
                tokio::spawn(async move {
                    for i in 0..500 {
                        bus.publish(input(&format!("p{p}.c{i}"), b"")).await.unwrap();
                        assert!(bus.stats().active_channels <= 100, "{} tracked", bus.stats().active_channels);
                    }
                })
            })
            .collect();
        for p in publishers {
            p.await.unwrap();
        }
        assert!(bus.channels().len() <= 100, "{} tracked", bus.channels().len());
        assert!(bus.channels_evicted() >= 1900, "what is not tracked is counted: {}", bus.channels_evicted());
        assert_eq!(bus.stats().total_published, 2000);
    }

    #[tokio::test]
    async fn channel_table_is_bounded() {
        let bus = Bus::new(BusConfig { max_channels: 100, ..BusConfig::default() });
        let _keep = bus.subscribe(opts(&["c.0"])).await.unwrap();
        for i in 0..1000 {
            bus.publish(input(&format!("c.{i}"), b"")).await.unwrap();
        }
        let channels = bus.channels();
        assert!(channels.len() <= 100, "{} tracked", channels.len());
        assert!(channels.iter().any(|c| c.channel == "c.0"), "a channel with a subscriber is kept");
    }

    #[tokio::test]
    async fn shutdown_refuses_new_work_and_drains() {
        let bus = Bus::new(BusConfig::default());
        let handle = bus.subscribe(opts(&["a"])).await.unwrap();
        bus.publish(input("a", b"1")).await.unwrap();
        bus.begin_shutdown();
        assert!(matches!(bus.publish(input("a", b"2")).await, Err(Error::ShuttingDown)));
        assert!(matches!(bus.subscribe(opts(&["a"])).await, Err(Error::ShuttingDown)));
        let mut out = Vec::new();
        handle.next_batch(&mut out).await.unwrap();
        assert_eq!(out.len(), 1, "queued events are flushed");
        assert_eq!(handle.next_batch(&mut Vec::new()).await, Err(CloseReason::ShuttingDown));
        drop(handle);
        bus.drained().await;
    }
}
