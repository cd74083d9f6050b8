//! Subscribing: a subscription's stream of frames, `started` first, then the batches,
//! for the gRPC `Subscribe` and the browser's Server-Sent Events alike.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use eventbus_core::history::Position;
use eventbus_core::{CloseReason, Event, Since, SubscribeOptions, SubscriptionHandle};
use futures::{Stream, StreamExt, stream};

use super::{Ops, Refusal};
use crate::access::{Caller, StreamUse};
use crate::metrics::Metrics;
use crate::spans::{Delivered, Recipient, Spans};

/// The first frame of a subscription.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    pub(crate) id: String,
    /// What was asked to be recovered was, completely.
    pub(crate) recovered: bool,
    /// The latest position of each subscribed channel with history, read before the
    /// subscription went live.
    pub(crate) positions: HashMap<String, Position>,
    pub(crate) started_at: SystemTime,
}

/// One frame of a subscription.
#[derive(Debug)]
pub(crate) enum Frame {
    Started(Started),
    /// A batch of events, shared with the other subscribers.
    Events(Vec<Arc<Event>>),
}

/// The frames of one subscription; a refusal ends it (the broker closed it, or a
/// reload withdrew the right it lives on), a plain end is an operator's unsubscribe.
pub(crate) type Frames = Pin<Box<dyn Stream<Item = Result<Frame, Refusal>> + Send + 'static>>;

impl Ops {
    /// Opens a subscription for `caller`: the right to subscribe to every filter, room
    /// under its `max_subscriptions`, then the bus; recovered from history after `since`
    /// when asked.
    pub(crate) async fn subscribe(
        &self,
        caller: &Caller,
        mut options: SubscribeOptions,
        since: Option<Since>,
    ) -> Result<Frames, Refusal> {
        options.owner = caller.name().to_owned();
        options.owner_max_queued_bytes = self.access.max_queued_bytes(caller);
        self.access.check_subscribe(caller, &options.channels)?;
        let guard = self.access.open_stream(caller, StreamUse::Subscribe(options.channels.clone()))?;
        // Read before the subscription goes live: a subscriber that resumes from them
        // gets anything published meanwhile.
        let started_at = SystemTime::now();
        let positions = match self.bus.history_rules().is_empty() {
            true => HashMap::new(),
            false => self.bus.latest_positions(&options.channels).await?,
        };
        let mut handle = self.bus.subscribe(options).await?;
        let recovered = match &since {
            Some(since) => {
                let complete = self.bus.recover(&mut handle, since).await?;
                if let Some(metrics) = &self.metrics {
                    metrics.count_recovery(complete, handle.recovered());
                }
                complete
            }
            None => false,
        };
        let started = Started { id: handle.id().to_owned(), recovered, positions, started_at };
        tracing::debug!(subscription = handle.id(), recovered, "subscription started");
        let batches = stream::unfold(
            Some(Streamer { handle, metrics: self.metrics.clone(), spans: self.spans.clone() }),
            next_batch,
        );
        Ok(Box::pin(guard.guard(stream::once(async { Ok(Frame::Started(started)) }).chain(batches))))
    }
}

/// What a subscription stream carries between frames. The handle lives inside the
/// stream, so a client that goes away drops it and unsubscribes.
struct Streamer {
    handle: SubscriptionHandle,
    metrics: Option<Arc<Metrics>>,
    spans: Spans,
}

/// The next batch, or the refusal that ends the stream.
async fn next_batch(state: Option<Streamer>) -> Option<(Result<Frame, Refusal>, Option<Streamer>)> {
    let mut s = state?;
    let mut events = Vec::new();
    // Recovered events come first, in batches of their own: their age is the time the
    // subscriber was away, not a delivery latency.
    let recovered = s.handle.recovered() > 0;
    match s.handle.next_batch(&mut events).await {
        Ok(()) => {
            if let Some(metrics) = s.metrics.as_ref().filter(|_| !recovered) {
                metrics.observe_delivery(&events);
            }
            if s.spans.enabled() {
                let delivered = events.iter().map(|event| Delivered { event, attempt: None, recovered });
                s.spans.deliver(Recipient::Subscription(s.handle.id()), delivered);
            }
            Some((Ok(Frame::Events(events)), Some(s)))
        }
        Err(reason) => {
            tracing::debug!(subscription = s.handle.id(), ?reason, "subscription ended");
            match reason {
                CloseReason::Unsubscribed => None,
                reason => Some((Err(Refusal::Closed(reason)), None)),
            }
        }
    }
}
