//! A subscription: its filters, its bounded queue, and the overflow policies (docs/concepts.md).
//!
//! The queue is a `VecDeque` behind a short mutex: it starts empty and grows with the
//! events actually queued, so an idle subscription of capacity 10,000 costs a few
//! hundred bytes, not 10,000 slots. Publishers never wait on the consumer except under
//! DROP_NEWEST with a full queue, and then only for `offer_timeout`.
//!
//! A queue is full when any of three bounds would be passed (docs/concepts.md "Memory bounds"):
//! its capacity in events, its own bytes (`max_queue_bytes`), or the budget of bytes
//! queued across all subscriptions (`eventbus.max_queued_bytes`). The budget counts each
//! event once however many queues hold it (the payload is shared), and a queue may grow
//! only while its own bytes fit in what the budget has left, so one stalled subscriber
//! holds at most half of it and k of them at most k/(k+1), leaving room for the others.
//! An empty queue always takes an event its byte bound alone would refuse, so a bound
//! smaller than an event degrades to one event at a time instead of dropping them all.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::event::Event;
use crate::name::Pattern;
use crate::stats::BusCounters;

/// Queues past this many slots of spare room are shrunk once drained, so a burst does
/// not pin its peak memory for the subscription's lifetime.
const SHRINK_ABOVE: usize = 1024;

/// What a full queue does with a new event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Wait up to `offer_timeout` for room, then drop the new event.
    #[default]
    DropNewest,
    /// Drop the oldest queued event to make room.
    DropOldest,
    /// Close the subscription as a slow consumer.
    Disconnect,
    /// Drop the new event from this queue and publish it to the dead-letter channel
    /// `dlq.overflow.<channel>`, naming the subscription, so nothing leaves unseen. An
    /// event already on a dead-letter channel (`dlq.…`) is only dropped: never recursive.
    DeadLetter,
}

impl Overflow {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DropNewest => "drop_newest",
            Self::DropOldest => "drop_oldest",
            Self::Disconnect => "disconnect",
            Self::DeadLetter => "dead_letter",
        }
    }
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Overflow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "drop_newest" => Ok(Self::DropNewest),
            "drop_oldest" => Ok(Self::DropOldest),
            "disconnect" => Ok(Self::Disconnect),
            "dead_letter" => Ok(Self::DeadLetter),
            other => Err(format!(
                "unknown overflow policy {other:?}; expected drop_newest, drop_oldest, disconnect or dead_letter"
            )),
        }
    }
}

/// Why an event was lost (the `reason` label of `dropped_by_reason_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue held `capacity` events.
    QueueFull,
    /// The queue held `max_queue_bytes`.
    QueueBytes,
    /// The bytes queued across subscriptions reached `eventbus.max_queued_bytes` (or
    /// this queue's share of it).
    MemoryBudget,
    /// Queued when the subscription ended (unsubscribe, slow-consumer disconnect, shutdown timeout).
    Closed,
    /// The bytes queued for the subscription's principal reached its `max_queued_bytes`.
    PrincipalBudget,
}

impl DropReason {
    /// Every reason, in index order.
    pub const ALL: [DropReason; 5] =
        [Self::QueueFull, Self::QueueBytes, Self::MemoryBudget, Self::Closed, Self::PrincipalBudget];

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueBytes => "queue_bytes",
            Self::MemoryBudget => "memory_budget",
            Self::Closed => "closed",
            Self::PrincipalBudget => "principal_budget",
        }
    }
}

/// Why a subscription's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// `Admin.Unsubscribe`: the stream ends normally.
    Unsubscribed,
    /// DISCONNECT policy with a full queue.
    SlowConsumer,
    /// The broker is stopping; queued events were flushed first (or the drain timed out).
    ShuttingDown,
    /// The shared transport (Redis) lost events this subscription may have matched:
    /// its connection was lost or restored, or one of its subscriptions was
    /// interrupted. The client subscribes again, recovering from history what it
    /// missed, or learning that it cannot.
    Interrupted,
}

/// Result of offering one event to a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Queued (possibly after evicting the oldest event).
    Accepted,
    /// Refused and counted as dropped.
    Rejected,
    /// Full under DISCONNECT: refused, and the subscription is now closed.
    Disconnected,
    /// Full under DROP_NEWEST: the caller may wait for room with [`Subscription::offer_wait`].
    MustWait,
    /// The subscription is closing; it no longer counts as a match.
    Closed,
    /// Full under DEAD_LETTER: refused and counted as dropped here; the caller publishes
    /// it to the overflow dead-letter channel.
    DeadLettered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Shutdown: deliver what is queued, then end with [`CloseReason::ShuttingDown`].
    Draining,
    Closed(CloseReason),
}

#[derive(Debug)]
struct Queue {
    events: VecDeque<Arc<Event>>,
    /// Sum of the queued events' sizes.
    bytes: usize,
    state: State,
    /// Set (with the bound that was hit) when a DROP_NEWEST wait timed out; cleared
    /// once the queue is below half its capacity and half its bytes.
    lagging: Option<DropReason>,
}

/// Settings a subscription was opened with, after defaults were applied.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    /// Filters, deduplicated, in the order given.
    pub filters: Vec<Pattern>,
    /// Group name, if any.
    pub group: Option<Arc<str>>,
    /// The bytes its principal may have queued across all its subscriptions, shared by
    /// them (`None`: no bound but the broker's).
    pub owner_budget: Option<Arc<OwnerBudget>>,
    /// What members of one group share: the group name within its owner's scope, so a
    /// principal can never join another's group and take its events.
    pub group_key: Option<Arc<str>>,
    /// Free label.
    pub name: String,
    /// Client address.
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    /// Queue capacity in events.
    pub capacity: usize,
    /// Queue bound in bytes (see [`crate::event::MEMORY_OVERHEAD`]).
    pub max_bytes: usize,
    /// Full-queue policy.
    pub overflow: Overflow,
    /// Most events handed out per batch.
    pub max_batch: usize,
}

/// The bytes queued in one principal's subscriptions, and its bound: one principal
/// whose subscriptions never read cannot take the broker's whole budget from the others.
#[derive(Debug)]
pub struct OwnerBudget {
    queued: AtomicUsize,
    max: AtomicUsize,
}

impl OwnerBudget {
    pub(crate) fn new(max: usize) -> Self {
        Self { queued: AtomicUsize::new(0), max: AtomicUsize::new(max) }
    }

    /// A reload may change the bound; queued events stay.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Bytes queued now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// One open subscription. Shared between the router (publishers) and its stream.
#[derive(Debug)]
pub struct Subscription {
    pub(crate) id: Arc<str>,
    pub(crate) spec: SubscriptionSpec,
    pub(crate) created_at: SystemTime,
    queue: Mutex<Queue>,
    /// Mirror of the queue length, read without the lock (stats, group choice).
    len: AtomicUsize,
    /// Mirror of the queued bytes, read without the lock.
    bytes: AtomicUsize,
    readable: Notify,
    writable: Notify,
    waiting_writers: AtomicUsize,
    delivered: AtomicU64,
    dropped: AtomicU64,
    bus: Arc<BusCounters>,
}

impl Subscription {
    pub(crate) fn new(id: Arc<str>, spec: SubscriptionSpec, bus: Arc<BusCounters>) -> Self {
        Self {
            id,
            spec,
            created_at: SystemTime::now(),
            queue: Mutex::new(Queue { events: VecDeque::new(), bytes: 0, state: State::Open, lagging: None }),
            len: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            readable: Notify::new(),
            writable: Notify::new(),
            waiting_writers: AtomicUsize::new(0),
            delivered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            bus,
        }
    }

    /// Events queued now.
    pub(crate) fn pending(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Bytes queued now.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Whether the queue has room now (a hint for choosing a group member).
    pub(crate) fn has_room(&self) -> bool {
        self.pending() < self.spec.capacity && self.queued_bytes() < self.spec.max_bytes
    }

    fn count_dropped(&self, event: &Event, reason: DropReason) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.bus.dropped.fetch_add(1, Ordering::Relaxed);
        self.bus.dropped_by_reason[reason as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(c) = event.counters() {
            c.add_dropped(1);
        }
    }

    /// Queues the event if every bound allows it, else says which bound refuses it.
    /// Only atomics beyond the queue's own lock: the shared budget is one counter.
    fn admit(&self, q: &mut Queue, event: &Arc<Event>) -> Result<(), DropReason> {
        let size = event.residency.size;
        if q.events.len() >= self.spec.capacity {
            return Err(DropReason::QueueFull);
        }
        let own = if q.events.is_empty() { 0 } else { q.bytes + size };
        if own > self.spec.max_bytes {
            return Err(DropReason::QueueBytes);
        }
        // The first queue to take the event pays for it in the shared budget; later
        // copies are free (the payload is shared).
        let first = event.residency.copies.fetch_add(1, Ordering::Relaxed) == 0;
        let total = if first {
            self.bus.queued_bytes.fetch_add(size, Ordering::Relaxed).saturating_add(size)
        } else {
            self.bus.queued_bytes.load(Ordering::Relaxed)
        };
        // Within the budget, and this queue no bigger than what is left of it.
        let budget = self.bus.max_queued_bytes;
        if total > budget || own > budget - total {
            self.release(event);
            return Err(DropReason::MemoryBudget);
        }
        // Within its principal's share (a principal with nothing queued takes one event,
        // so a bound smaller than an event slows it down rather than silencing it).
        if let Some(owner) = &self.spec.owner_budget {
            let before = owner.queued.fetch_add(size, Ordering::Relaxed);
            if before != 0 && before + size > owner.max.load(Ordering::Relaxed) {
                owner.queued.fetch_sub(size, Ordering::Relaxed);
                self.release(event);
                return Err(DropReason::PrincipalBudget);
            }
        }
        q.events.push_back(Arc::clone(event));
        q.bytes += size;
        self.len.store(q.events.len(), Ordering::Relaxed);
        self.bytes.store(q.bytes, Ordering::Relaxed);
        Ok(())
    }

    /// One copy of `event` left this queue: its principal's share is freed.
    fn unqueue(&self, event: &Event) {
        if let Some(owner) = &self.spec.owner_budget {
            owner.queued.fetch_sub(event.residency.size, Ordering::Relaxed);
        }
        self.release(event);
    }

    /// One copy of `event` left a queue: the last one frees its bytes in the budget.
    fn release(&self, event: &Event) {
        if event.residency.copies.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.bus.queued_bytes.fetch_sub(event.residency.size, Ordering::Relaxed);
        }
    }

    /// Takes the oldest event out of the queue (its lock held).
    fn pop(&self, q: &mut Queue) -> Option<Arc<Event>> {
        let event = q.events.pop_front()?;
        q.bytes -= event.residency.size;
        self.unqueue(&event);
        Some(event)
    }

    /// Empties the queue (its lock held), freeing its bytes.
    fn take_all(&self, q: &mut Queue) -> VecDeque<Arc<Event>> {
        let events = std::mem::take(&mut q.events);
        events.iter().for_each(|e| self.unqueue(e));
        q.bytes = 0;
        self.len.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        events
    }

    fn sync_mirrors(&self, q: &Queue) {
        self.len.store(q.events.len(), Ordering::Relaxed);
        self.bytes.store(q.bytes, Ordering::Relaxed);
    }

    /// Whether a lagging queue has drained enough to take events again.
    fn lag_over(&self, q: &Queue) -> bool {
        q.events.len() < self.spec.capacity.div_ceil(2) && q.bytes <= self.spec.max_bytes / 2
    }

    /// Offers an event without waiting. Every refusal is counted here.
    pub(crate) fn try_offer(&self, event: &Arc<Event>) -> Offer {
        let mut q = self.queue.lock();
        if matches!(q.state, State::Closed(_)) {
            return Offer::Closed;
        }
        if let Some(reason) = q.lagging {
            if !self.lag_over(&q) {
                drop(q);
                self.count_dropped(event, reason);
                return Offer::Rejected;
            }
            q.lagging = None;
        }
        let reason = match self.admit(&mut q, event) {
            Ok(()) => {
                drop(q);
                self.readable.notify_one();
                return Offer::Accepted;
            }
            Err(reason) => reason,
        };
        match self.spec.overflow {
            Overflow::DropOldest => {
                // Make room, oldest first, until the new event fits or nothing is left.
                let mut reason = reason;
                loop {
                    let Some(oldest) = self.pop(&mut q) else {
                        self.sync_mirrors(&q);
                        drop(q);
                        self.count_dropped(event, reason);
                        return Offer::Rejected;
                    };
                    self.count_dropped(&oldest, reason);
                    match self.admit(&mut q, event) {
                        Ok(()) => break,
                        Err(next) => reason = next,
                    }
                }
                drop(q);
                self.readable.notify_one();
                Offer::Accepted
            }
            Overflow::Disconnect => {
                q.state = State::Closed(CloseReason::SlowConsumer);
                let discarded = self.take_all(&mut q);
                drop(q);
                for old in &discarded {
                    self.count_dropped(old, DropReason::Closed);
                }
                self.count_dropped(event, reason);
                self.wake_all();
                Offer::Disconnected
            }
            // Others fill the budget and this queue is empty: nothing this queue's
            // consumer does will make room, so waiting would only stall the publisher.
            // Nor does a publisher wait on a principal's share: its subscriptions'
            // slowness is its own, never another tenant's publishers'.
            Overflow::DropNewest if q.events.is_empty() || reason == DropReason::PrincipalBudget => {
                drop(q);
                self.count_dropped(event, reason);
                Offer::Rejected
            }
            Overflow::DropNewest => Offer::MustWait,
            Overflow::DeadLetter => {
                drop(q);
                self.count_dropped(event, reason);
                Offer::DeadLettered
            }
        }
    }

    /// Waits until `deadline` for room under DROP_NEWEST. On time-out the event is
    /// dropped (and counted) and the subscription becomes lagging.
    pub(crate) async fn offer_wait(&self, event: &Arc<Event>, deadline: Instant) -> Offer {
        self.waiting_writers.fetch_add(1, Ordering::SeqCst);
        let outcome = self.offer_wait_inner(event, deadline).await;
        self.waiting_writers.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    async fn offer_wait_inner(&self, event: &Arc<Event>, deadline: Instant) -> Offer {
        let mut last: DropReason;
        loop {
            let notified = self.writable.notified();
            tokio::pin!(notified);
            // Register before checking, so room made in between still wakes us.
            notified.as_mut().enable();
            {
                let mut q = self.queue.lock();
                if matches!(q.state, State::Closed(_)) {
                    return Offer::Closed;
                }
                match self.admit(&mut q, event) {
                    Ok(()) => {
                        drop(q);
                        self.readable.notify_one();
                        return Offer::Accepted;
                    }
                    Err(reason) => last = reason,
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.queue.lock().lagging = Some(last);
                self.count_dropped(event, last);
                return Offer::Rejected;
            }
        }
    }

    /// Waits for queued events and moves up to `max_batch` of them (and about
    /// `max_bytes`, but always at least one) into `out`. Returns why the stream must
    /// end instead, once there is nothing more to deliver.
    pub(crate) async fn next_batch(&self, max_bytes: usize, out: &mut Vec<Arc<Event>>) -> Result<(), CloseReason> {
        loop {
            let notified = self.readable.notified();
            {
                let mut q = self.queue.lock();
                if let State::Closed(reason) = q.state {
                    return Err(reason);
                }
                if !q.events.is_empty() {
                    let mut bytes = 0;
                    while out.len() < self.spec.max_batch {
                        let Some(next) = q.events.front() else { break };
                        bytes += next.residency.size;
                        if bytes > max_bytes && !out.is_empty() {
                            break;
                        }
                        out.extend(self.pop(&mut q));
                    }
                    if q.events.is_empty() && q.events.capacity() > SHRINK_ABOVE {
                        q.events.shrink_to(64);
                    }
                    self.sync_mirrors(&q);
                    drop(q);
                    self.delivered.fetch_add(out.len() as u64, Ordering::Relaxed);
                    if self.waiting_writers.load(Ordering::SeqCst) > 0 {
                        self.writable.notify_waiters();
                    }
                    return Ok(());
                }
                if q.state == State::Draining {
                    return Err(CloseReason::ShuttingDown);
                }
            }
            // `notify_one` leaves a permit when nobody waits, so an event queued
            // between the check above and this await is not missed.
            notified.await;
        }
    }

    /// Closes the subscription; queued events are discarded and counted as dropped.
    /// Returns false when it was already closed.
    pub(crate) fn close(&self, reason: CloseReason) -> bool {
        let discarded = {
            let mut q = self.queue.lock();
            if matches!(q.state, State::Closed(_)) {
                return false;
            }
            q.state = State::Closed(reason);
            self.take_all(&mut q)
        };
        for event in &discarded {
            self.count_dropped(event, DropReason::Closed);
        }
        self.wake_all();
        true
    }

    /// Shutdown: keep delivering what is queued, then end with `ShuttingDown`.
    pub(crate) fn drain(&self) {
        let mut q = self.queue.lock();
        if q.state == State::Open {
            q.state = State::Draining;
        }
        drop(q);
        self.wake_all();
    }

    fn wake_all(&self) {
        self.readable.notify_one();
        self.writable.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sub(capacity: usize, overflow: Overflow) -> Subscription {
        sub_bytes(capacity, usize::MAX, overflow, Arc::default())
    }

    fn sub_bytes(capacity: usize, max_bytes: usize, overflow: Overflow, bus: Arc<BusCounters>) -> Subscription {
        let spec = SubscriptionSpec {
            filters: vec![Pattern::parse("a").unwrap()],
            group: None,
            owner_budget: None,
            group_key: None,
            name: String::new(),
            peer: String::new(),
            owner: String::new(),
            capacity,
            max_bytes,
            overflow,
            max_batch: 2,
        };
        Subscription::new("s".into(), spec, bus)
    }

    fn event(n: u8) -> Arc<Event> {
        sized(n, 100)
    }

    /// An event of exactly `size` bytes by [`Event::approx_size`] (at least 66).
    fn sized(n: u8, size: usize) -> Arc<Event> {
        let input = crate::PublishInput { channel: "a".into(), payload: vec![n].into(), ..Default::default() };
        let mut event = input.into_event(10, crate::event::ChannelCheck::Needed, crate::event::Stamp::now()).unwrap();
        event.payload = vec![n; size - (event.approx_size() - 1)].into();
        event.residency.size = event.approx_size();
        assert_eq!(event.residency.size, size);
        Arc::new(event)
    }

    async fn take(s: &Subscription) -> Vec<u8> {
        let mut out = Vec::new();
        s.next_batch(usize::MAX, &mut out).await.unwrap();
        out.iter().map(|e| e.payload[0]).collect()
    }

    #[tokio::test]
    async fn batches_respect_max_batch_and_order() {
        let s = sub(10, Overflow::DropNewest);
        for n in 1..=5 {
            assert_eq!(s.try_offer(&event(n)), Offer::Accepted);
        }
        assert_eq!(take(&s).await, vec![1, 2]);
        assert_eq!(take(&s).await, vec![3, 4]);
        assert_eq!(take(&s).await, vec![5]);
        assert_eq!(s.delivered(), 5);
    }

    #[tokio::test]
    async fn drop_oldest_evicts_and_counts() {
        let s = sub(2, Overflow::DropOldest);
        for n in 1..=3 {
            assert_eq!(s.try_offer(&event(n)), Offer::Accepted);
        }
        assert_eq!(s.dropped(), 1);
        assert_eq!(take(&s).await, vec![2, 3]);
    }

    #[tokio::test]
    async fn disconnect_closes_as_slow_consumer() {
        let s = sub(1, Overflow::Disconnect);
        assert_eq!(s.try_offer(&event(1)), Offer::Accepted);
        assert_eq!(s.try_offer(&event(2)), Offer::Disconnected);
        assert_eq!(s.dropped(), 2, "the queued event and the refused one");
        let mut out = Vec::new();
        assert_eq!(s.next_batch(usize::MAX, &mut out).await, Err(CloseReason::SlowConsumer));
    }

    #[tokio::test(start_paused = true)]
    async fn drop_newest_waits_then_lags_until_half_drained() {
        let s = sub(2, Overflow::DropNewest);
        s.try_offer(&event(1));
        s.try_offer(&event(2));
        assert_eq!(s.try_offer(&event(3)), Offer::MustWait);
        let deadline = Instant::now() + Duration::from_millis(100);
        assert_eq!(s.offer_wait(&event(3), deadline).await, Offer::Rejected);
        // Lagging: refused at once even though nothing changed.
        assert_eq!(s.try_offer(&event(4)), Offer::Rejected);
        assert_eq!(s.dropped(), 2);
        assert_eq!(take(&s).await, vec![1, 2]);
        assert_eq!(s.try_offer(&event(5)), Offer::Accepted, "drained below half: no longer lagging");
    }

    #[tokio::test(start_paused = true)]
    async fn drop_newest_wait_succeeds_when_room_appears() {
        let s = Arc::new(sub(1, Overflow::DropNewest));
        s.try_offer(&event(1));
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                s.offer_wait(&event(2), deadline).await
            })
        };
        assert_eq!(take(&s).await, vec![1]);
        assert_eq!(waiter.await.unwrap(), Offer::Accepted);
        assert_eq!(take(&s).await, vec![2]);
    }

    #[tokio::test]
    async fn drain_flushes_then_ends() {
        let s = sub(10, Overflow::DropNewest);
        s.try_offer(&event(1));
        s.drain();
        assert_eq!(take(&s).await, vec![1]);
        let mut out = Vec::new();
        assert_eq!(s.next_batch(usize::MAX, &mut out).await, Err(CloseReason::ShuttingDown));
    }

    #[tokio::test]
    async fn close_discards_and_counts() {
        let s = sub(10, Overflow::DropNewest);
        s.try_offer(&event(1));
        assert!(s.close(CloseReason::Unsubscribed));
        assert!(!s.close(CloseReason::Unsubscribed));
        assert_eq!(s.dropped(), 1);
        assert_eq!(s.try_offer(&event(2)), Offer::Closed);
    }

    #[tokio::test]
    async fn byte_bound_applies_the_overflow_policy() {
        // Room for 3 events of 100 bytes, though the capacity is 10.
        let s = sub_bytes(10, 300, Overflow::DropOldest, Arc::default());
        for n in 1..=4 {
            assert_eq!(s.try_offer(&event(n)), Offer::Accepted);
        }
        assert_eq!((s.pending(), s.queued_bytes(), s.dropped()), (3, 300, 1));
        assert_eq!(take(&s).await, vec![2, 3]);
        assert_eq!(s.queued_bytes(), 100, "bytes leave with the events");

        let s = sub_bytes(10, 300, Overflow::Disconnect, Arc::default());
        for n in 1..=3 {
            s.try_offer(&event(n));
        }
        assert_eq!(s.try_offer(&event(4)), Offer::Disconnected);
        assert_eq!(s.queued_bytes(), 0);

        let s = sub_bytes(10, 300, Overflow::DropNewest, Arc::default());
        for n in 1..=3 {
            s.try_offer(&event(n));
        }
        assert_eq!(s.try_offer(&event(4)), Offer::MustWait);
    }

    #[tokio::test]
    async fn an_empty_queue_takes_an_event_above_its_byte_bound() {
        let s = sub_bytes(10, 50, Overflow::DropNewest, Arc::default());
        assert_eq!(s.try_offer(&event(1)), Offer::Accepted);
        assert_eq!(s.try_offer(&event(2)), Offer::MustWait);
        assert_eq!(take(&s).await, vec![1]);
        assert_eq!(s.try_offer(&event(2)), Offer::Accepted);
    }

    #[tokio::test]
    async fn the_budget_counts_a_shared_event_once_and_frees_it_with_the_last_copy() {
        let bus = Arc::new(BusCounters::new(1000));
        let (a, b) = (
            sub_bytes(10, usize::MAX, Overflow::DropNewest, Arc::clone(&bus)),
            sub_bytes(10, usize::MAX, Overflow::DropNewest, Arc::clone(&bus)),
        );
        let e = event(1);
        assert_eq!(a.try_offer(&e), Offer::Accepted);
        assert_eq!(b.try_offer(&e), Offer::Accepted);
        assert_eq!(bus.queued_bytes.load(Ordering::Relaxed), 100, "one payload, one charge");
        assert_eq!((a.queued_bytes(), b.queued_bytes()), (100, 100), "each queue's own view");
        take(&a).await;
        assert_eq!(bus.queued_bytes.load(Ordering::Relaxed), 100, "still queued in b");
        b.close(CloseReason::Unsubscribed);
        assert_eq!(bus.queued_bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn one_stalled_queue_leaves_half_the_budget_to_the_others() {
        let bus = Arc::new(BusCounters::new(1000));
        let stalled = sub_bytes(100, usize::MAX, Overflow::DropOldest, Arc::clone(&bus));
        for n in 0..50 {
            assert_eq!(stalled.try_offer(&event(n)), Offer::Accepted);
        }
        // Its queue may not outgrow what is left of the budget: 500 bytes at most.
        assert_eq!(stalled.queued_bytes(), 500);
        assert_eq!(bus.queued_bytes.load(Ordering::Relaxed), 500);
        assert_eq!(bus.dropped_by_reason[DropReason::MemoryBudget as usize].load(Ordering::Relaxed), 45);
        // Another subscriber still gets events.
        let other = sub_bytes(100, usize::MAX, Overflow::DropNewest, Arc::clone(&bus));
        for n in 0..2 {
            assert_eq!(other.try_offer(&event(n)), Offer::Accepted);
        }
        // A full budget refuses an empty queue at once rather than stall the publisher.
        let full = Arc::new(BusCounters::new(150));
        let (x, y) = (
            sub_bytes(10, usize::MAX, Overflow::DropNewest, Arc::clone(&full)),
            sub_bytes(10, usize::MAX, Overflow::DropNewest, Arc::clone(&full)),
        );
        assert_eq!(x.try_offer(&event(1)), Offer::Accepted);
        assert_eq!(y.try_offer(&event(2)), Offer::Rejected);
        assert_eq!(y.dropped(), 1);
    }

    #[test]
    fn idle_queue_reserves_nothing() {
        let s = sub(10_000, Overflow::DropNewest);
        assert_eq!(s.queue.lock().events.capacity(), 0);
    }
}
