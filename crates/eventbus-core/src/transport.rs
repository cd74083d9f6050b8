//! The seam between the router and the fan-out medium.
//!
//! In `in_memory` mode there is no transport: a publish is routed straight to local
//! queues. A distributed mode (Redis Pub/Sub) implements [`Transport`]: publishes go
//! out through it, events it receives come back in through [`LocalFanout::dispatch`],
//! and [`Transport::watch`]/[`Transport::unwatch`] tell it which filters local
//! subscriptions need (called once per filter on first use and last release).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use crate::bus::Inner;
use crate::event::Event;
use crate::history::{HistoryInfo, Recovery, Start, Take};
use crate::name::Pattern;

/// How a publish went: subscriptions (or instances, for a remote transport) that took
/// the event, and matching ones that could not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fanout {
    /// Copies accepted.
    pub delivered: u32,
    /// Copies refused (full queue, slow-consumer disconnect).
    pub failed: u32,
}

/// A transport could not carry an event (for example Redis is unreachable).
#[derive(Debug, thiserror::Error)]
#[error("{transport} is unavailable: {reason}")]
pub struct TransportError {
    /// Which transport, e.g. `redis`.
    pub transport: &'static str,
    /// What went wrong, for the client and the logs.
    pub reason: String,
}

/// Connection state of a transport, for readiness and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportStatus {
    /// Whether the transport can carry events now.
    pub connected: bool,
    /// Connected, but the medium stopped answering health checks (a hung or stopped
    /// Redis): `connected` is false meanwhile, so publishes fail at once instead of
    /// each waiting for a command timeout.
    pub stalled: bool,
    /// Successful reconnections after a lost connection, since start.
    pub reconnects: u64,
    /// Interruptions of a subscription while connected (Redis Cluster: a failover or a
    /// slot migration moved a shard channel), since start. Events published meanwhile
    /// were missed; the subscription was restored.
    pub gaps: u64,
    /// Messages received without a channel to route them to (Redis Cluster: a shard
    /// channel's payload without an envelope), dropped, since start.
    pub unroutable: u64,
    /// Redis Cluster: hash slots without a serving master now. Publishes to their
    /// channels fail; the other shards keep serving.
    pub degraded_slots: u32,
}

/// Future returned by [`Transport::watched`].
pub type WatchedFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Future returned by [`Transport::publish`].
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Result<Fanout, TransportError>> + Send + 'a>>;

/// Future returned by [`Transport::publish_all`]: one answer per event, in order.
pub type PublishAllFuture<'a> = Pin<Box<dyn Future<Output = Vec<Result<Fanout, TransportError>>> + Send + 'a>>;

/// Future returned by the history calls of a [`Transport`].
pub type HistoryFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, TransportError>> + Send + 'a>>;

/// A fan-out medium shared by several broker instances.
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Short name reported as the bus mode, e.g. `redis`.
    fn mode(&self) -> &'static str;

    /// Sends an accepted event to every instance. Must fail rather than report
    /// success for an event that went nowhere.
    fn publish(&self, event: Arc<Event>) -> PublishFuture<'_>;

    /// Sends several events of one publisher, each channel's in the order given, and
    /// answers each, in that order. By default one after another; a transport that can
    /// send them together (a pipeline per destination) saves a round trip per event.
    fn publish_all(&self, events: Vec<Arc<Event>>) -> PublishAllFuture<'_> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(events.len());
            for event in events {
                out.push(self.publish(event).await);
            }
            out
        })
    }

    /// A local subscription now needs events matching `filter`.
    fn watch(&self, filter: &Pattern);

    /// No local subscription needs `filter` any more.
    fn unwatch(&self, filter: &Pattern);

    /// Resolves once every filter passed to [`Transport::watch`] so far is in effect,
    /// so a subscription is live everywhere before its `started` message. Resolves at
    /// once while disconnected (the filters are restored on reconnect).
    fn watched(&self) -> WatchedFuture<'_>;

    /// Follows the connection state (readiness, health and metrics use it).
    fn status(&self) -> tokio::sync::watch::Receiver<TransportStatus>;

    /// This instance now has `members` subscriptions in the group keyed `group` (0: it
    /// left). A transport that makes groups span its instances tells the others.
    fn group_members(&self, group: &str, members: usize) {
        let _ = (group, members);
    }

    /// Whether this instance is the one that hands `event` to a member of `group`
    /// (every instance receives the event; one of those with members delivers it).
    /// By default every instance does: the group spans one instance.
    fn delivers_to_group(&self, group: &str, event: &Event) -> bool {
        let _ = (group, event);
        true
    }

    /// Reads `channel`'s history from `start`, the events `take` says; `None` when the
    /// channel keeps none. A transport that keeps history gives every event of such a
    /// channel its position as it publishes it.
    fn read_history<'a>(
        &'a self,
        channel: &'a str,
        start: &'a Start,
        take: Take,
    ) -> HistoryFuture<'a, Option<Recovery>> {
        let _ = (channel, start, take);
        Box::pin(async { Ok(None) })
    }

    /// Channels matching `filter` that have a history now, sorted.
    fn history_channels<'a>(&'a self, filter: &'a Pattern) -> HistoryFuture<'a, Vec<String>> {
        let _ = filter;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// What `channel`'s history holds; `None` when it keeps none.
    fn history_info<'a>(&'a self, channel: &'a str) -> HistoryFuture<'a, Option<HistoryInfo>> {
        let _ = channel;
        Box::pin(async { Ok(None) })
    }
}

/// Handle a transport uses to hand received events to this instance's subscriptions.
/// Holds the bus weakly, so a transport never keeps a stopped bus alive.
#[derive(Debug, Clone)]
pub struct LocalFanout {
    pub(crate) bus: Weak<Inner>,
}

impl LocalFanout {
    /// Routes an event that arrived from the transport to the matching local
    /// subscriptions. Returns zero counts when the bus is gone.
    pub async fn dispatch(&self, event: Event) -> Fanout {
        match self.bus.upgrade() {
            Some(inner) => inner.dispatch(event).await,
            None => Fanout::default(),
        }
    }

    /// Applies `change` to the transport's `status`: how a transport changes its
    /// connection state and counts its interruptions. When the change means events may have been lost for local subscriptions —
    /// the connection lost or restored, one of the transport's own subscriptions
    /// interrupted — every local subscription is ended first, with
    /// [`CloseReason::Interrupted`](crate::CloseReason::Interrupted), so that no subscriber goes on believing it missed
    /// nothing: its client subscribes again from where it was and recovers from
    /// history, or is told of the gap. First, so that a subscription made once the
    /// new state shows (readiness back) is never ended for the change before it.
    pub fn set_status(
        &self,
        status: &tokio::sync::watch::Sender<TransportStatus>,
        change: impl FnOnce(&mut TransportStatus),
    ) {
        let before = *status.borrow();
        let mut after = before;
        change(&mut after);
        let lossy =
            after.connected != before.connected || after.reconnects != before.reconnects || after.gaps != before.gaps;
        if lossy && let Some(inner) = self.bus.upgrade() {
            inner.interrupt();
        }
        status.send_replace(after);
    }
}
