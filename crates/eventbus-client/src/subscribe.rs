//! A `Subscribe` stream that outlives connections: after a loss it waits (capped
//! exponential backoff) and subscribes again by itself, from where its reader was.
//!
//! It keeps the position of the last event received on each channel and, subscribing
//! again, asks the broker for what came after (`SubscribeRequest.since`): channels that
//! keep a history (`eventbus.history`) get what was missed first, then live events, with
//! no gap and no copy. Whatever history could not give back — a channel without one,
//! events trimmed meanwhile, an `in_memory` broker restarted — is reported as a
//! [`Gap`]: core pub/sub is at most once. A group's members cannot recover (they share
//! the events), so a loss in a group is always a gap.
//!
//! [`Gap`]: SubscriptionItem::Gap

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use eventbus_proto::pb::{self, subscribe_response::Kind};
use futures::Stream;
use prost_types::Timestamp;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::codec::{self, Method};
use crate::{Backoff, Client, Error};

/// Items a subscription may hold before its task stops reading the broker (which
/// then applies the subscription's overflow policy to its own queue).
const BUFFER: usize = 64;

/// Most positions one `since` may carry (the broker refuses more).
const MAX_POSITIONS: usize = 1024;

/// What to subscribe to, and how to behave when the connection is lost.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// The wire request, sent again on every reconnection (with `since` set to where
    /// the subscriber was, unless it joins a group).
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

    /// Starts from the past: on channels that keep a history, the events after these
    /// positions, and on the others from this time, come first (for instance
    /// [`Subscription::since`] of an earlier subscription, to take over where it was).
    /// [`Started`](SubscriptionItem::Started) then says whether all of it was
    /// recovered. Not with a group.
    pub fn since(mut self, since: pb::SubscribeSince) -> Self {
        self.request.since = Some(since);
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

/// One channel or pattern: `client.subscribe("orders.*")`.
impl From<&str> for SubscribeOptions {
    fn from(channel: &str) -> Self {
        Self::new([channel])
    }
}

/// One channel or pattern.
impl From<String> for SubscribeOptions {
    fn from(channel: String) -> Self {
        Self::new([channel])
    }
}

/// Channels and/or patterns: `client.subscribe(["orders.*", "payments.>"])`.
impl<S: Into<String>, const N: usize> From<[S; N]> for SubscribeOptions {
    fn from(channels: [S; N]) -> Self {
        Self::new(channels)
    }
}

/// Channels and/or patterns.
impl<S: Into<String>> From<Vec<S>> for SubscribeOptions {
    fn from(channels: Vec<S>) -> Self {
        Self::new(channels)
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
        /// Everything asked for was recovered from history: after a reconnection,
        /// nothing was missed; first, the whole of [`SubscribeOptions::since`]. False
        /// without a `since`, and whenever history did not hold it all (a reconnection
        /// then comes with a [`Gap`](Self::Gap) just before).
        recovered: bool,
    },
    /// Events, in publish order per channel and publisher; recovered ones first after a
    /// `Started`, then live ones.
    Events(Vec<pb::Event>),
    /// The subscription was lost and some events published meanwhile are not
    /// delivered (at most once). Without a group it comes once subscribed again, as
    /// only then is it known whether history held what was missed; in a group, at once.
    Gap {
        /// Why it was lost, e.g. "shutting down (Unavailable)".
        reason: String,
    },
}

/// A live subscription, read one event at a time ([`next_event`](Self::next_event), or
/// [`events`](Self::events) for a [`Stream`] of events), or as items: a [`Stream`] of
/// [`SubscriptionItem`]s (batches of events as the broker sent them, starts and gaps),
/// also readable with [`next`](Self::next).
/// It ends (`None`) when the subscription is closed by `Admin.Unsubscribe`, and yields
/// one error then ends when the broker refuses it (rights, arguments) or, with
/// `reconnect(false)`, on the first loss. Dropping it unsubscribes.
///
/// ```no_run
/// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
/// let mut orders = client.subscribe("orders.*").await?;
/// while let Some(event) = orders.next_event().await {
///     let event = event?;
///     println!("{}: {}", event.channel, String::from_utf8_lossy(&event.payload));
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Subscription {
    updates: mpsc::Receiver<Result<Update, Error>>,
    /// Where the reader is: what it has been given, not what the task has read ahead.
    resume: Resume,
    /// Events received and not yet given by [`next_event`](Self::next_event).
    unread: VecDeque<pb::Event>,
    /// The broker's id of the current subscription.
    id: String,
    /// Gaps seen so far.
    gaps: u64,
    _stop: DropGuard,
}

impl Subscription {
    /// The next item; `None` when the subscription has ended. Events not yet read by
    /// [`next_event`](Self::next_event) come first, as one batch.
    pub async fn next(&mut self) -> Option<Result<SubscriptionItem, Error>> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    /// The next event; `None` when the subscription has ended. Starts are not shown; a
    /// [`Gap`](SubscriptionItem::Gap) (events lost while the subscription was down) is
    /// logged as a warning and counted by [`gaps`](Self::gaps): read items with
    /// [`next`](Self::next) to handle them yourself.
    pub async fn next_event(&mut self) -> Option<Result<pb::Event, Error>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// This subscription as a [`Stream`] of events, one at a time (see
    /// [`next_event`](Self::next_event)).
    pub fn events(self) -> Events {
        Events { subscription: self }
    }

    /// The broker's id of the current subscription (for `Admin.Unsubscribe`): known once
    /// subscribed, new once a reconnection's start has been read.
    pub fn subscription_id(&self) -> &str {
        &self.id
    }

    /// How many times events were lost while the subscription was down (each reported
    /// as a [`Gap`](SubscriptionItem::Gap)).
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<SubscriptionItem, Error>>> {
        if !self.unread.is_empty() {
            let events: Vec<pb::Event> = self.unread.drain(..).collect();
            self.resume.received(&events);
            return Poll::Ready(Some(Ok(SubscriptionItem::Events(events))));
        }
        self.updates.poll_recv(cx).map(|update| update.map(|u| u.map(|u| self.item(u))))
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<pb::Event, Error>>> {
        loop {
            if let Some(event) = self.unread.pop_front() {
                self.resume.received(std::slice::from_ref(&event));
                return Poll::Ready(Some(Ok(event)));
            }
            match ready!(self.updates.poll_recv(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(Update::Events(events))) => self.unread.extend(events),
                Some(Ok(update)) => {
                    if let SubscriptionItem::Gap { reason } = self.item(update) {
                        tracing::warn!(%reason, "subscription lost: events published meanwhile were not delivered");
                    }
                }
            }
        }
    }

    /// Notes what the task sent and turns it into what the reader gets.
    fn item(&mut self, update: Update) -> SubscriptionItem {
        let item = self.resume.take(update);
        match &item {
            SubscriptionItem::Started { subscription_id, .. } => self.id.clone_from(subscription_id),
            SubscriptionItem::Gap { .. } => self.gaps += 1,
            SubscriptionItem::Events(_) => {}
        }
        item
    }

    /// Per channel, the position of the last event received (for a channel that keeps
    /// a history), or, before any, the channel's latest position when the subscription
    /// started.
    pub fn positions(&self) -> HashMap<String, pb::EventPosition> {
        self.resume.channels.iter().map(|(channel, last)| (channel.clone(), last.position.clone())).collect()
    }

    /// Where the reader of this subscription is, as a `since` that resumes from there:
    /// the [`positions`](Self::positions), and for channels without one the time the
    /// first subscription went live (or the time of [`SubscribeOptions::since`]).
    /// `None` before anything is known (a broker without history support).
    pub fn since(&self) -> Option<pb::SubscribeSince> {
        self.resume.since()
    }
}

impl Stream for Subscription {
    type Item = Result<SubscriptionItem, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_item(cx)
    }
}

/// A [`Subscription`] read one event at a time: a [`Stream`] of events, also readable
/// with [`next`](Self::next) ([`Subscription::events`]). Gaps are logged and counted,
/// as with [`Subscription::next_event`]. Dropping it unsubscribes.
///
/// ```no_run
/// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
/// use futures::{StreamExt, TryStreamExt};
///
/// let first_ten: Vec<eventbus_client::Event> = client.subscribe("orders.>").await?.events().take(10).try_collect().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Events {
    subscription: Subscription,
}

impl Events {
    /// The next event; `None` when the subscription has ended.
    pub async fn next(&mut self) -> Option<Result<pb::Event, Error>> {
        self.subscription.next_event().await
    }

    /// The subscription, to read it by items or ask where it is
    /// ([`Subscription::since`], [`Subscription::gaps`]...).
    pub fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    /// Back to the subscription (events received and not yet read come first from it).
    pub fn into_inner(self) -> Subscription {
        self.subscription
    }
}

impl Stream for Events {
    type Item = Result<pb::Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.subscription.poll_event(cx)
    }
}

/// What the subscription's task hands to its [`Subscription`].
#[derive(Debug)]
enum Update {
    Started {
        started: pb::SubscriptionStarted,
        /// See [`Resume::started`].
        seed: bool,
    },
    Events(Vec<pb::Event>),
    Gap {
        reason: String,
    },
}

/// Where a subscriber is: per channel the position of the last event it has, and
/// from when to recover the channels it has no position on.
#[derive(Debug, Clone, Default)]
struct Resume {
    channels: HashMap<String, Last>,
    /// Events received so far, numbering [`Last::seq`].
    received: u64,
    /// Recovery of the channels without a position starts here: the time given in
    /// `since` at first, else when the first subscription went live. Nothing without
    /// a position has been received since (or it would have one).
    from: Option<Timestamp>,
    /// When the first subscription went live, while the earlier `from` asked for is
    /// still being recovered. Recovered events come in time order and before live
    /// ones, so once an event of that time or later is received, nothing before it is
    /// still to come: `from` moves up to it, and a reconnection does not ask again for
    /// a past that history may not hold (which would report a gap for nothing).
    catching_up: Option<Timestamp>,
    /// A subscription went live already.
    live: bool,
}

#[derive(Debug, Clone)]
struct Last {
    position: pb::EventPosition,
    /// When its event was published (unknown for a position not received).
    at: Option<Timestamp>,
    /// [`Resume::received`] when it was received: the least recent channels make room first.
    seq: u64,
}

impl Resume {
    /// Before the first subscription, which asks for `since`.
    fn new(since: Option<&pb::SubscribeSince>) -> Self {
        let Some(since) = since else { return Self::default() };
        let channels = since
            .positions
            .iter()
            .map(|(channel, position)| (channel.clone(), Last { position: position.clone(), at: None, seq: 0 }))
            .collect();
        Self { channels, from: since.timestamp, ..Self::default() }
    }

    /// Turns what the task sent into what the reader gets, noting where it is.
    fn take(&mut self, update: Update) -> SubscriptionItem {
        match update {
            Update::Started { started, seed } => {
                self.started(&started, seed);
                SubscriptionItem::Started { subscription_id: started.subscription_id, recovered: started.recovered }
            }
            Update::Events(events) => {
                self.received(&events);
                SubscriptionItem::Events(events)
            }
            Update::Gap { reason } => SubscriptionItem::Gap { reason },
        }
    }

    /// A subscription went live. With `seed` (its request recovered nothing by time),
    /// the broker's latest positions are where the channels without one start: exact,
    /// where a time could not tell events of the same instant apart. With a recovery
    /// by time under way they would skip the events it has yet to deliver.
    fn started(&mut self, started: &pb::SubscriptionStarted, seed: bool) {
        if !self.live {
            self.live = true;
            match (self.from, started.started_at) {
                (None, at) => self.from = at,
                (Some(from), Some(at)) if earlier(&from, &at) => self.catching_up = Some(at),
                _ => {}
            }
        }
        if seed {
            for (channel, position) in &started.positions {
                let seq = self.received;
                self.channels.entry(channel.clone()).or_insert_with(|| Last {
                    position: position.clone(),
                    at: None,
                    seq,
                });
            }
        }
    }

    /// Events were received: in one epoch positions only move forward; a new epoch
    /// (history lost on the broker) starts over.
    fn received(&mut self, events: &[pb::Event]) {
        for event in events {
            if let (Some(at), Some(t)) = (self.catching_up, event.timestamp)
                && !earlier(&t, &at)
            {
                self.catching_up = None;
                self.move_from_up_to(at);
            }
            let Some(position) = &event.position else { continue };
            self.received += 1;
            let last = Last { position: position.clone(), at: event.timestamp, seq: self.received };
            match self.channels.get_mut(&event.channel) {
                Some(had) if had.position.epoch == position.epoch && had.position.offset >= position.offset => {}
                Some(had) => *had = last,
                None => {
                    self.channels.insert(event.channel.clone(), last);
                }
            }
        }
        // A subscription to patterns may see any number of channels: memory stays bounded.
        if self.channels.len() > 2 * MAX_POSITIONS {
            self.keep_most_recent(MAX_POSITIONS);
        }
    }

    /// Keeps the `keep` channels received from most recently. The others are recovered
    /// by time, from just after the latest event received among them: their events up
    /// to it were received (each channel's in order), and the events published after it
    /// were, or reached the most recent channels instead.
    fn keep_most_recent(&mut self, keep: usize) {
        let over = self.channels.len().saturating_sub(keep);
        if over == 0 {
            return;
        }
        let mut by_age: Vec<(u64, String)> = self.channels.iter().map(|(c, last)| (last.seq, c.clone())).collect();
        by_age.sort_unstable();
        for (_, channel) in by_age.into_iter().take(over) {
            if let Some(at) = self.channels.remove(&channel).and_then(|last| last.at) {
                self.move_from_up_to(Timestamp { seconds: at.seconds, nanos: at.nanos.saturating_add(1) }.normalized());
            }
        }
    }

    fn move_from_up_to(&mut self, at: Timestamp) {
        if self.from.is_none_or(|from| earlier(&from, &at)) {
            self.from = Some(at);
        }
    }

    /// The `since` that resumes from here (at most [`MAX_POSITIONS`] positions).
    fn since(&self) -> Option<pb::SubscribeSince> {
        let pruned;
        let resume = if self.channels.len() > MAX_POSITIONS {
            let mut copy = self.clone();
            copy.keep_most_recent(MAX_POSITIONS);
            pruned = copy;
            &pruned
        } else {
            self
        };
        if resume.channels.is_empty() && resume.from.is_none() {
            return None;
        }
        let positions = resume.channels.iter().map(|(c, last)| (c.clone(), last.position.clone())).collect();
        Some(pb::SubscribeSince { positions, timestamp: resume.from })
    }
}

fn earlier(a: &Timestamp, b: &Timestamp) -> bool {
    let (a, b) = (a.normalized(), b.normalized());
    (a.seconds, a.nanos) < (b.seconds, b.nanos)
}

/// One subscribe call, up to its `started` message.
async fn start(
    client: &Client,
    request: &pb::SubscribeRequest,
) -> Result<(pb::SubscriptionStarted, tonic::Streaming<pb::SubscribeResponse>), Error> {
    let mut stream = codec::server_streaming(client.channel(), Method::Subscribe, request.clone()).await?;
    match stream.message().await? {
        Some(pb::SubscribeResponse { kind: Some(Kind::Started(s)) }) => Ok((s, stream)),
        other => Err(Error::Protocol(format!("expected `started` first, got {other:?}"))),
    }
}

/// Whether the broker's latest positions may seed a request's channels (see
/// [`Resume::started`]).
fn seeds(request: &pb::SubscribeRequest) -> bool {
    request.since.as_ref().is_none_or(|since| since.timestamp.is_none())
}

pub(crate) async fn open(client: Client, options: SubscribeOptions) -> Result<Subscription, Error> {
    let (started, stream) = start(&client, &options.request).await?;
    let resume = Resume::new(options.request.since.as_ref());
    // The task's, ahead of the reader's by what waits in the channel: where to resume.
    let mut ahead = resume.clone();
    let seed = seeds(&options.request);
    ahead.started(&started, seed);
    let (tx, updates) = mpsc::channel(BUFFER);
    let id = started.subscription_id.clone();
    // Room for this first item is certain: the channel is new.
    let _ = tx.try_send(Ok(Update::Started { started, seed }));
    let stop = CancellationToken::new();
    tokio::spawn(pump(client, options, ahead, stream, tx, stop.clone()));
    Ok(Subscription { updates, resume, unread: VecDeque::new(), id, gaps: 0, _stop: stop.drop_guard() })
}

/// Forwards events until the subscription ends, subscribing again after each loss
/// from `resume`: where the reader will be once it has read what was forwarded.
async fn pump(
    client: Client,
    options: SubscribeOptions,
    mut resume: Resume,
    mut stream: tonic::Streaming<pb::SubscribeResponse>,
    tx: mpsc::Sender<Result<Update, Error>>,
    stop: CancellationToken,
) {
    let send = |update| async {
        tokio::select! { _ = stop.cancelled() => false, r = tx.send(update) => r.is_ok() }
    };
    let grouped = !options.request.group.is_empty();
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = stream.message() => m,
        };
        let lost = match message {
            Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) })) => {
                resume.received(&batch.events);
                if !send(Ok(Update::Events(batch.events))).await {
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
        let gap = Update::Gap { reason: lost.to_string() };
        let mut request = options.request.clone();
        let gap = if grouped {
            if !send(Ok(gap)).await {
                return;
            }
            None
        } else {
            request.since = resume.since();
            Some(gap)
        };
        let mut failures = 0;
        stream = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                () = tokio::time::sleep(options.backoff.delay(failures)) => {}
            }
            match start(&client, &request).await {
                Ok((started, stream)) => {
                    if let Some(gap) = gap.filter(|_| !started.recovered)
                        && !send(Ok(gap)).await
                    {
                        return;
                    }
                    let seed = seeds(&request);
                    resume.started(&started, seed);
                    if !send(Ok(Update::Started { started, seed })).await {
                        return;
                    }
                    break stream;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(error = %e, "subscribe again failed; retrying");
                    failures = failures.saturating_add(1);
                }
                Err(e) => {
                    if let Some(gap) = gap {
                        let _ = send(Ok(gap)).await;
                    }
                    let _ = send(Err(e)).await;
                    return;
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos: 0 })
    }

    fn position(epoch: &str, offset: u64) -> pb::EventPosition {
        pb::EventPosition { epoch: epoch.into(), offset }
    }

    fn event(channel: &str, epoch: &str, offset: u64, seconds: i64) -> pb::Event {
        pb::Event {
            channel: channel.into(),
            position: Some(position(epoch, offset)),
            timestamp: at(seconds),
            ..Default::default()
        }
    }

    fn started(seconds: i64, positions: &[(&str, pb::EventPosition)]) -> pb::SubscriptionStarted {
        pb::SubscriptionStarted {
            started_at: at(seconds),
            positions: positions.iter().map(|(c, p)| ((*c).to_owned(), p.clone())).collect(),
            ..Default::default()
        }
    }

    fn offset(resume: &Resume, channel: &str) -> Option<(String, u64)> {
        resume.channels.get(channel).map(|l| (l.position.epoch.clone(), l.position.offset))
    }

    #[test]
    fn positions_move_forward_within_an_epoch_and_start_over_with_a_new_one() {
        let mut resume = Resume::default();
        resume.received(&[event("a", "e1", 3, 10), event("a", "e1", 2, 11), event("b", "e1", 7, 12)]);
        assert_eq!(offset(&resume, "a"), Some(("e1".into(), 3)), "never back");
        resume.received(&[event("a", "e2", 1, 13), pb::Event { channel: "c".into(), ..Default::default() }]);
        assert_eq!(offset(&resume, "a"), Some(("e2".into(), 1)), "another epoch replaces");
        assert_eq!(offset(&resume, "c"), None, "a channel without history has no position");
    }

    #[test]
    fn resumes_from_the_first_start_and_seeds_only_where_nothing_is_being_recovered_by_time() {
        let mut resume = Resume::default();
        assert_eq!(resume.since(), None, "nothing known yet");
        resume.received(&[event("a", "e1", 5, 10)]);
        resume.started(&started(20, &[("a", position("e1", 9)), ("b", position("e1", 4))]), true);
        assert_eq!(offset(&resume, "a"), Some(("e1".into(), 5)), "a position received is kept");
        assert_eq!(offset(&resume, "b"), Some(("e1".into(), 4)), "seeded");
        resume.started(&started(30, &[("c", position("e1", 2))]), false);
        assert_eq!(offset(&resume, "c"), None, "a recovery by time may still deliver c's events up to 2");
        let since = resume.since().unwrap();
        assert_eq!((since.positions.len(), since.timestamp), (2, at(20)), "the first start's time");

        let asked = pb::SubscribeSince { positions: [("a".to_owned(), position("e0", 8))].into(), timestamp: at(5) };
        let mut resume = Resume::new(Some(&asked));
        resume.started(&started(20, &[]), false);
        assert_eq!(resume.since(), Some(asked), "the time asked for, before the start's");
        resume.received(&[event("b", "e1", 1, 15)]);
        assert_eq!(resume.since().unwrap().timestamp, at(5), "still recovering the past");
        resume.received(&[pb::Event { channel: "plain".into(), timestamp: at(21), ..Default::default() }]);
        assert_eq!(resume.since().unwrap().timestamp, at(20), "past recovered: from the first start on");
        resume.started(&started(40, &[]), false);
        assert_eq!(resume.since().unwrap().timestamp, at(20), "the first start, not a later one");
    }

    #[test]
    fn a_since_holds_at_most_the_brokers_limit_of_positions() {
        let mut resume = Resume::default();
        resume.started(&started(1, &[]), true);
        let total = 2 * MAX_POSITIONS;
        let events: Vec<pb::Event> =
            (0..total).map(|i| event(&format!("c{i}"), "e", 1, 100 + i64::try_from(i).unwrap())).collect();
        resume.received(&events);
        let since = resume.since().unwrap();
        assert_eq!(since.positions.len(), MAX_POSITIONS);
        assert!(since.positions.contains_key(&format!("c{}", total - 1)), "the most recent are kept");
        assert!(!since.positions.contains_key("c0"));
        let last_dropped = 100 + i64::try_from(MAX_POSITIONS).unwrap() - 1;
        assert_eq!(since.timestamp, Some(Timestamp { seconds: last_dropped, nanos: 1 }), "just after them");

        resume.received(&[event("one.more", "e", 1, 10_000)]);
        assert_eq!(resume.channels.len(), MAX_POSITIONS, "memory stays bounded");
    }
}
