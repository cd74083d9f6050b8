//! A `Subscribe` stream that outlives connections: after a loss it waits (capped
//! exponential backoff), subscribes again by itself and reports the [`Gap`] — core
//! pub/sub is at most once, so whatever was published in between is not delivered.
//!
//! [`Gap`]: SubscriptionItem::Gap

use std::pin::Pin;
use std::task::{Context, Poll};

use eventbus_proto::pb::{self, subscribe_response::Kind};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::codec::{self, Method};
use crate::{Backoff, Client, Error};

/// Items a subscription may hold before its task stops reading the broker (which
/// then applies the subscription's overflow policy to its own queue).
const BUFFER: usize = 64;

/// What to subscribe to, and how to behave when the connection is lost.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// The wire request, sent again on every reconnection.
    pub request: pb::SubscribeRequest,
    /// Subscribe again after a loss (default). When false, the first loss ends the
    /// subscription with its error.
    pub reconnect: bool,
    /// Delays between reconnection attempts.
    pub backoff: Backoff,
}

impl SubscribeOptions {
    /// Exact channels and/or patterns (`orders.*`, `orders.>`), with the server's defaults.
    pub fn new<S: Into<String>>(channels: impl IntoIterator<Item = S>) -> Self {
        let request =
            pb::SubscribeRequest { channels: channels.into_iter().map(Into::into).collect(), ..Default::default() };
        Self::from(request)
    }

    /// Joins a group: its members share the matching events.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.request.group = group.into();
        self
    }

    /// Queue size on the broker (0: the server default).
    pub fn queue_capacity(mut self, capacity: u32) -> Self {
        self.request.queue_capacity = capacity;
        self
    }

    /// Queue bound in bytes on the broker (0: the server default).
    pub fn max_queue_bytes(mut self, bytes: u64) -> Self {
        self.request.max_queue_bytes = bytes;
        self
    }

    /// What the broker does when the queue is full.
    pub fn overflow(mut self, policy: pb::OverflowPolicy) -> Self {
        self.request.overflow = policy.into();
        self
    }

    /// Label shown in `ListSubscriptions`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.request.name = name.into();
        self
    }

    /// Whether to subscribe again after a loss (default true).
    pub fn reconnect(mut self, reconnect: bool) -> Self {
        self.reconnect = reconnect;
        self
    }

    /// Delays between reconnection attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

impl From<pb::SubscribeRequest> for SubscribeOptions {
    fn from(request: pb::SubscribeRequest) -> Self {
        Self { request, reconnect: true, backoff: Backoff::default() }
    }
}

/// What a [`Subscription`] yields.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SubscriptionItem {
    /// The subscription is live (first, and again after each reconnection).
    Started {
        /// Id for `Admin.Unsubscribe`, new on each reconnection.
        subscription_id: String,
    },
    /// Events, in publish order per channel and publisher.
    Events(Vec<pb::Event>),
    /// The subscription was lost; events published until the next `Started` are not
    /// delivered (at most once).
    Gap {
        /// Why it was lost, e.g. "shutting down (Unavailable)".
        reason: String,
    },
}

/// A live subscription: a [`Stream`] of items, also readable with [`next`](Self::next).
/// It ends (`None`) when the subscription is closed by `Admin.Unsubscribe`, and yields
/// one error then ends when the broker refuses it (rights, arguments) or, with
/// `reconnect(false)`, on the first loss. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    items: mpsc::Receiver<Result<SubscriptionItem, Error>>,
    _stop: DropGuard,
}

impl Subscription {
    /// The next item; `None` when the subscription has ended.
    pub async fn next(&mut self) -> Option<Result<SubscriptionItem, Error>> {
        self.items.recv().await
    }
}

impl Stream for Subscription {
    type Item = Result<SubscriptionItem, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.items.poll_recv(cx)
    }
}

/// One subscribe call, up to its `started` message.
async fn start(
    client: &Client,
    request: &pb::SubscribeRequest,
) -> Result<(String, tonic::Streaming<pb::SubscribeResponse>), Error> {
    let mut stream = codec::server_streaming(client.channel(), Method::Subscribe, request.clone()).await?;
    match stream.message().await? {
        Some(pb::SubscribeResponse { kind: Some(Kind::Started(s)) }) => Ok((s.subscription_id, stream)),
        other => Err(Error::Protocol(format!("expected `started` first, got {other:?}"))),
    }
}

pub(crate) async fn open(client: Client, options: SubscribeOptions) -> Result<Subscription, Error> {
    let (id, stream) = start(&client, &options.request).await?;
    let (tx, items) = mpsc::channel(BUFFER);
    // Room for this first item is certain: the channel is new.
    let _ = tx.try_send(Ok(SubscriptionItem::Started { subscription_id: id }));
    let stop = CancellationToken::new();
    tokio::spawn(pump(client, options, stream, tx, stop.clone()));
    Ok(Subscription { items, _stop: stop.drop_guard() })
}

/// Forwards events until the subscription ends, subscribing again after each loss.
async fn pump(
    client: Client,
    options: SubscribeOptions,
    mut stream: tonic::Streaming<pb::SubscribeResponse>,
    tx: mpsc::Sender<Result<SubscriptionItem, Error>>,
    stop: CancellationToken,
) {
    let send = |item| async {
        tokio::select! { _ = stop.cancelled() => false, r = tx.send(item) => r.is_ok() }
    };
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = stream.message() => m,
        };
        let lost = match message {
            Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) })) => {
                if !send(Ok(SubscriptionItem::Events(batch.events))).await {
                    return;
                }
                continue;
            }
            Ok(Some(_)) => continue,
            Ok(None) => return, // closed by Admin.Unsubscribe
            Err(status) => Error::from(status),
        };
        if !options.reconnect || !lost.is_transient() {
            let _ = send(Err(lost)).await;
            return;
        }
        if !send(Ok(SubscriptionItem::Gap { reason: lost.to_string() })).await {
            return;
        }
        let mut failures = 0;
        stream = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                () = tokio::time::sleep(options.backoff.delay(failures)) => {}
            }
            match start(&client, &options.request).await {
                Ok((id, stream)) => {
                    if !send(Ok(SubscriptionItem::Started { subscription_id: id })).await {
                        return;
                    }
                    break stream;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(error = %e, "subscribe again failed; retrying");
                    failures = failures.saturating_add(1);
                }
                Err(e) => {
                    let _ = send(Err(e)).await;
                    return;
                }
            }
        };
    }
}
