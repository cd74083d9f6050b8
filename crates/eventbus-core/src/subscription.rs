//! A subscription: its filters, its bounded queue, and the overflow policies (README "How it behaves").
//!
//! The queue is a `VecDeque` behind a short mutex: it starts empty and grows with the
//! events actually queued, so an idle subscription of capacity 10,000 costs a few
//! hundred bytes, not 10,000 slots. Publishers never wait on the consumer except under
//! DROP_NEWEST with a full queue, and then only for `offer_timeout`.

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
}

impl Overflow {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DropNewest => "drop_newest",
            Self::DropOldest => "drop_oldest",
            Self::Disconnect => "disconnect",
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
            other => Err(format!("unknown overflow policy {other:?}; expected drop_newest, drop_oldest or disconnect")),
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
    state: State,
    /// Set when a DROP_NEWEST wait timed out; cleared once the queue is below half.
    lagging: bool,
}

/// Settings a subscription was opened with, after defaults were applied.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    /// Filters, deduplicated, in the order given.
    pub filters: Vec<Pattern>,
    /// Group name, if any.
    pub group: Option<Arc<str>>,
    /// Free label.
    pub name: String,
    /// Client address.
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    /// Queue capacity in events.
    pub capacity: usize,
    /// Full-queue policy.
    pub overflow: Overflow,
    /// Most events handed out per batch.
    pub max_batch: usize,
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
            queue: Mutex::new(Queue { events: VecDeque::new(), state: State::Open, lagging: false }),
            len: AtomicUsize::new(0),
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

    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Whether the queue has room now (a hint for choosing a group member).
    pub(crate) fn has_room(&self) -> bool {
        self.pending() < self.spec.capacity
    }

    fn count_dropped(&self, event: &Event, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        self.bus.dropped.fetch_add(n, Ordering::Relaxed);
        if let Some(c) = event.counters() {
            c.add_dropped(n);
        }
    }

    fn push(&self, q: &mut Queue, event: &Arc<Event>) {
        q.events.push_back(Arc::clone(event));
        self.len.store(q.events.len(), Ordering::Relaxed);
    }

    /// Offers an event without waiting. Every refusal is counted here.
    pub(crate) fn try_offer(&self, event: &Arc<Event>) -> Offer {
        let mut q = self.queue.lock();
        if matches!(q.state, State::Closed(_)) {
            return Offer::Closed;
        }
        let capacity = self.spec.capacity;
        if q.lagging {
            if q.events.len() >= capacity.div_ceil(2) {
                drop(q);
                self.count_dropped(event, 1);
                return Offer::Rejected;
            }
            q.lagging = false;
        }
        if q.events.len() < capacity {
            self.push(&mut q, event);
            drop(q);
            self.readable.notify_one();
            return Offer::Accepted;
        }
        match self.spec.overflow {
            Overflow::DropOldest => {
                let oldest = q.events.pop_front();
                self.push(&mut q, event);
                drop(q);
                if let Some(oldest) = oldest {
                    self.count_dropped(&oldest, 1);
                }
                self.readable.notify_one();
                Offer::Accepted
            }
            Overflow::Disconnect => {
                let discarded = std::mem::take(&mut q.events);
                q.state = State::Closed(CloseReason::SlowConsumer);
                self.len.store(0, Ordering::Relaxed);
                drop(q);
                for old in &discarded {
                    self.count_dropped(old, 1);
                }
                self.count_dropped(event, 1);
                self.wake_all();
                Offer::Disconnected
            }
            Overflow::DropNewest => Offer::MustWait,
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
                if q.events.len() < self.spec.capacity {
                    self.push(&mut q, event);
                    drop(q);
                    self.readable.notify_one();
                    return Offer::Accepted;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.queue.lock().lagging = true;
                self.count_dropped(event, 1);
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
                        bytes += next.approx_size();
                        if bytes > max_bytes && !out.is_empty() {
                            break;
                        }
                        out.extend(q.events.pop_front());
                    }
                    if q.events.is_empty() && q.events.capacity() > SHRINK_ABOVE {
                        q.events.shrink_to(64);
                    }
                    self.len.store(q.events.len(), Ordering::Relaxed);
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
            self.len.store(0, Ordering::Relaxed);
            std::mem::take(&mut q.events)
        };
        for event in &discarded {
            self.count_dropped(event, 1);
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
        let spec = SubscriptionSpec {
            filters: vec![Pattern::parse("a").unwrap()],
            group: None,
            name: String::new(),
            peer: String::new(),
            owner: String::new(),
            capacity,
            overflow,
            max_batch: 2,
        };
        Subscription::new("s".into(), spec, Arc::default())
    }

    fn event(n: u8) -> Arc<Event> {
        let input = crate::PublishInput { channel: "a".into(), payload: vec![n].into(), ..Default::default() };
        Arc::new(input.into_event(10).unwrap())
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

    #[test]
    fn idle_queue_reserves_nothing() {
        let s = sub(10_000, Overflow::DropNewest);
        assert_eq!(s.queue.lock().events.capacity(), 0);
    }
}
