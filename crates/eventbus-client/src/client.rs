//! [`Client`]: one connection to eventbusd, with every RPC of the API as a method.

use std::sync::Arc;

use bytes::Bytes;
use eventbus_proto::pb::{self, admin_client::AdminClient, event_bus_client::EventBusClient};

use crate::Error;
use crate::consume::ConsumeStream;
use crate::message::{Message, Publish};
use crate::options::{AuthChannel, ClientOptions, Connector, MAX_MESSAGE};
use crate::publish::{self, AckMode, PublishAnswers, PublishSender};
use crate::publisher::SharedPublisher;
use crate::subscribe::{self, SubscribeOptions, Subscription};
use crate::trace;
use tracing::Instrument as _;

/// A connection to eventbusd. Cheap to clone: clones share the connection (HTTP/2
/// multiplexes their calls), which reconnects by itself after the broker comes back.
///
/// ```no_run
/// # async fn demo() -> Result<(), eventbus_client::Error> {
/// use eventbus_client::{Client, ClientOptions};
///
/// let client = Client::connect(ClientOptions::new("http://127.0.0.1:50051").token("ebt_0123")).await?;
/// let answer = client.publish("orders.created", r#"{"id":42}"#).content_type("application/json").await?;
/// println!("published {}", answer.event_id);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connector: Connector,
    /// For the calls made with the crate's own codec (`codec`).
    channel: AuthChannel,
    bus: EventBusClient<AuthChannel>,
    admin: AdminClient<AuthChannel>,
    /// The stream `publish` shares; `None` with [`ClientOptions::unary_publish`].
    publisher: Option<SharedPublisher>,
}

impl Client {
    /// Checks `options` (token, TLS files), then connects.
    pub async fn connect(options: ClientOptions) -> Result<Self, Error> {
        Connector::new(&options)?.client().await
    }

    /// A new, separate connection with the same options (the TLS files are not read
    /// again): for spreading load over several connections.
    pub async fn new_connection(&self) -> Result<Self, Error> {
        self.inner.connector.client().await
    }

    /// The broker address, as given.
    pub fn server(&self) -> &str {
        self.inner.connector.server()
    }

    fn admin(&self) -> AdminClient<AuthChannel> {
        self.inner.admin.clone()
    }

    pub(crate) fn channel(&self) -> AuthChannel {
        self.inner.channel.clone()
    }

    pub(crate) fn bus(&self) -> EventBusClient<AuthChannel> {
        self.inner.bus.clone()
    }

    /// Publishes one event on an exact channel; answers once the broker has offered it
    /// to every matching subscription and stored it for every matching durable
    /// consumer. The payload is anything that converts into [`Bytes`] (`&'static str`,
    /// `String`, `Vec<u8>`, `Bytes`...). The answer is a [`Publish`] builder: set
    /// metadata, content type, ordering or idempotency key on it, then `.await` it.
    ///
    /// ```no_run
    /// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
    /// client.publish("orders.created", "first").await?;
    /// let answer = client
    ///     .publish("orders.created", r#"{"id":42}"#)
    ///     .content_type("application/json")
    ///     .ordering_key("customer-7")
    ///     .metadata("trace-id", "4bf92f35")
    ///     .await?;
    /// println!("published {} to {} subscribers", answer.event_id, answer.delivered_count);
    /// # Ok(()) }
    /// ```
    ///
    /// How it is sent is [`publish_request`](Self::publish_request)'s.
    pub fn publish(&self, channel: impl Into<String>, payload: impl Into<Bytes>) -> Publish<'_> {
        Publish::new(self, Message::new(channel, payload))
    }

    /// Publishes a [`Message`] built beforehand; same as [`publish`](Self::publish).
    pub async fn publish_message(&self, message: Message) -> Result<pb::PublishResponse, Error> {
        self.publish_request(message.into()).await
    }

    /// Publishes one event given as the wire request; answers once the broker has
    /// offered it to every matching subscription and stored it for every matching
    /// durable consumer.
    ///
    /// Concurrent calls share one `PublishStream` per client (clones included): each
    /// call is sent as soon as the stream can take it, together with the calls that
    /// came meanwhile, and gets its own answer or its own error (the stream answers a
    /// refused event in place, `ACK_MODE_EACH_IN_PLACE`): a refused event fails its own
    /// call only. Should the stream be lost before an event is answered, the
    /// call fails with [`Error::Unavailable`] (the event may or may not be published),
    /// unless the event has an idempotency key: then it is sent again, and the broker
    /// answers a duplicate with the original id. To bound a call, wrap it in
    /// `tokio::time::timeout`: an event not yet sent when the caller gives up is never
    /// sent. [`ClientOptions::unary_publish`] makes one `Publish` call per event instead,
    /// as [`publish_unary`](Self::publish_unary) does.
    ///
    /// The call runs in a `send <channel>` span whose context the event carries to its
    /// subscribers and workers (W3C Trace Context in its metadata; see the crate's docs
    /// on tracing).
    pub async fn publish_request(&self, request: pb::PublishRequest) -> Result<pb::PublishResponse, Error> {
        traced(request, |request| async move {
            match &self.inner.publisher {
                Some(publisher) => publisher.publish(request).await,
                None => self.unary(request).await,
            }
        })
        .await
    }

    /// Publishes one event with a unary `Publish` call of its own.
    pub async fn publish_unary(&self, request: pb::PublishRequest) -> Result<pb::PublishResponse, Error> {
        traced(request, |request| self.unary(request)).await
    }

    async fn unary(&self, request: pb::PublishRequest) -> Result<pb::PublishResponse, Error> {
        Ok(self.bus().publish(request).await?.into_inner())
    }

    /// Publishes several events in one call (`PublishBatch`): the call's cost is shared
    /// by its events, many times cheaper than one [`publish`](Self::publish) each. In
    /// their order, as on one `PublishStream`, durable captures sharing one commit. Answers one result per event, in the same order: the broker's answer, or
    /// that event's own refusal (bad channel, payload too large, no right on its
    /// channel...), which does not stop the others. The call itself fails only for the
    /// whole batch: more than the broker's `eventbus.max_publish_batch` events or a
    /// request over its read limit, no room for the batch in the caller's rate, bad
    /// credentials, the broker unreachable or shutting down.
    ///
    /// ```no_run
    /// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
    /// use eventbus_client::Message;
    ///
    /// let events = (0..3).map(|i| Message::new("orders.created", format!("{{\"id\":{i}}}")));
    /// for (i, answer) in client.publish_batch(events).await?.into_iter().enumerate() {
    ///     match answer {
    ///         Ok(published) => println!("event {i}: {}", published.event_id),
    ///         Err(refused) => eprintln!("event {i} refused: {refused}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// The events are [`Message`]s or raw [`pb::PublishRequest`]s.
    pub async fn publish_batch<E: Into<pb::PublishRequest>>(
        &self,
        events: impl IntoIterator<Item = E>,
    ) -> Result<Vec<Result<pb::PublishResponse, Error>>, Error> {
        let mut events: Vec<pb::PublishRequest> = events.into_iter().map(Into::into).collect();
        let spans: Vec<tracing::Span> = events.iter_mut().map(trace::send).collect();
        let sent = events.len();
        let answers = match self.bus().publish_batch(pb::PublishBatchRequest { events }).await {
            Ok(response) => publish::batch_results(sent, response.into_inner()),
            Err(status) => Err(Error::from(status)),
        };
        match &answers {
            Ok(answers) => spans.iter().zip(answers).for_each(|(span, answer)| trace::sent(span, answer.as_ref())),
            Err(err) => spans.iter().for_each(|span| trace::sent(span, Err::<&pb::PublishResponse, _>(err))),
        }
        answers
    }

    /// Opens a `PublishStream`: send many publishes without waiting, read the answers
    /// (one per publish, in order) from the other half. At most `window` publishes wait
    /// to be sent before [`PublishSender::send`] waits.
    pub async fn publish_stream(&self, window: usize) -> Result<(PublishSender, PublishAnswers), Error> {
        publish::open(self.channel(), window, AckMode::Each).await
    }

    /// [`publish_stream`](Self::publish_stream) in the given [`AckMode`]: with
    /// `Cumulative` the answers are running totals, with `None` only refusals (each
    /// with its position) and the totals at the end; a refused publish does not stop
    /// the ones after it. With `None`, `window` bounds only what waits to be sent.
    ///
    /// ```no_run
    /// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
    /// use eventbus_client::{AckMode, Message, PublishAnswer};
    ///
    /// let (sender, mut answers) = client.publish_stream_with(1024, AckMode::None).await?;
    /// for i in 0..1000 {
    ///     sender.send(Message::new("orders.created", format!("{{\"id\":{i}}}"))).await?;
    /// }
    /// sender.close();
    /// while let Some(answer) = answers.next_answer().await? {
    ///     match answer {
    ///         PublishAnswer::Refused { position, error } => eprintln!("event {position} refused: {error}"),
    ///         PublishAnswer::Totals(t) if t.end => println!("{} published, {} refused", t.count, t.refused),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn publish_stream_with(
        &self,
        window: usize,
        ack: AckMode,
    ) -> Result<(PublishSender, PublishAnswers), Error> {
        publish::open(self.channel(), window, ack).await
    }

    /// Subscribes, and waits until the subscription is live: anything published after
    /// this returns is delivered. The [`Subscription`] reconnects and subscribes again
    /// by itself, from where it was on channels that keep a history, reporting each
    /// [`Gap`](crate::SubscriptionItem::Gap) that history could not fill.
    pub async fn subscribe(&self, options: impl Into<SubscribeOptions>) -> Result<Subscription, Error> {
        subscribe::open(self.clone(), options.into()).await
    }

    /// Attaches to a durable consumer: the raw `Consume` stream, for callers that ack
    /// by hand. [`Worker`](crate::Worker) does all of it for you.
    pub async fn consume(&self, attach: pb::Attach) -> Result<ConsumeStream, Error> {
        ConsumeStream::open(self.bus(), attach).await
    }

    /// Broker totals (`Admin.GetStats`).
    pub async fn stats(&self) -> Result<pb::GetStatsResponse, Error> {
        Ok(self.admin().get_stats(pb::GetStatsRequest {}).await?.into_inner())
    }

    /// Channels with their counters (`Admin.ListChannels`).
    pub async fn channels(&self) -> Result<Vec<pb::ChannelStats>, Error> {
        Ok(self.admin().list_channels(pb::ListChannelsRequest {}).await?.into_inner().channels)
    }

    /// Open subscriptions (`Admin.ListSubscriptions`).
    pub async fn subscriptions(&self) -> Result<Vec<pb::SubscriptionInfo>, Error> {
        let list = self.admin().list_subscriptions(pb::ListSubscriptionsRequest {}).await?;
        Ok(list.into_inner().subscriptions)
    }

    /// Closes a subscription by id; [`Error::NotFound`] when there is none.
    pub async fn unsubscribe(&self, subscription_id: impl Into<String>) -> Result<(), Error> {
        let request = pb::UnsubscribeRequest { subscription_id: subscription_id.into() };
        self.admin().unsubscribe(request).await?;
        Ok(())
    }

    /// What a channel's history holds and a page of its events, oldest first, each with
    /// its position (`Admin.GetChannelHistory`); [`Error::NotFound`] when no
    /// `eventbus.history` rule covers the channel.
    pub async fn channel_history(
        &self,
        request: pb::GetChannelHistoryRequest,
    ) -> Result<pb::GetChannelHistoryResponse, Error> {
        Ok(self.admin().get_channel_history(request).await?.into_inner())
    }

    /// Creates a durable consumer (idempotent for an identical definition,
    /// [`Error::AlreadyExists`] for another one), defined by a [`ConsumerBuilder`](crate::ConsumerBuilder) or a
    /// raw [`pb::ConsumerConfig`].
    ///
    /// ```no_run
    /// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
    /// use std::time::Duration;
    /// use eventbus_client::ConsumerBuilder;
    ///
    /// let billing = ConsumerBuilder::new("billing", ["orders.>"]).ack_deadline(Duration::from_secs(60)).max_attempts(10);
    /// let info = client.create_consumer(billing).await?;
    /// println!("{} pending", info.pending);
    /// # Ok(()) }
    /// ```
    pub async fn create_consumer(&self, config: impl Into<pb::ConsumerConfig>) -> Result<pb::ConsumerInfo, Error> {
        let request = pb::CreateConsumerRequest { config: Some(config.into()) };
        Ok(self.admin().create_consumer(request).await?.into_inner())
    }

    /// One consumer's definition and counts; [`Error::NotFound`] when unknown.
    pub async fn consumer(&self, name: impl Into<String>) -> Result<pb::ConsumerInfo, Error> {
        Ok(self.admin().get_consumer(pb::GetConsumerRequest { name: name.into() }).await?.into_inner())
    }

    /// Every consumer with its counts.
    pub async fn consumers(&self) -> Result<Vec<pb::ConsumerInfo>, Error> {
        Ok(self.admin().list_consumers(pb::ListConsumersRequest {}).await?.into_inner().consumers)
    }

    /// Deletes a consumer, the events it holds and its log.
    pub async fn delete_consumer(&self, name: impl Into<String>) -> Result<(), Error> {
        self.admin().delete_consumer(pb::DeleteConsumerRequest { name: name.into() }).await?;
        Ok(())
    }

    /// One page of a consumer's terminal log (follow `next_page_token` for the next).
    pub async fn event_log(&self, request: pb::ListEventLogRequest) -> Result<pb::ListEventLogResponse, Error> {
        Ok(self.admin().list_event_log(request).await?.into_inner())
    }

    /// One page of a consumer's unfinished events, oldest first, each with its attempt,
    /// next delivery time, failures and state (`Admin.ListPending`). `limit` 0 = 100, at
    /// most 1,000; pass the previous page's `next_page_token` (empty = from the oldest).
    pub async fn pending(
        &self,
        consumer: impl Into<String>,
        limit: u32,
        page_token: impl Into<String>,
    ) -> Result<pb::ListPendingResponse, Error> {
        let request = pb::ListPendingRequest { consumer: consumer.into(), limit, page_token: page_token.into() };
        Ok(self.admin().list_pending(request).await?.into_inner())
    }

    /// Puts dead-lettered events back to their consumer with attempts reset
    /// (`Admin.RedriveDeadLetters`): the ones named by `event_ids`, or with none named
    /// the oldest `limit` (0 = 10,000). Answers how many went back and how many remain.
    pub async fn redrive(
        &self,
        consumer: impl Into<String>,
        event_ids: Vec<String>,
        limit: u32,
    ) -> Result<pb::RedriveResponse, Error> {
        let request = pb::RedriveRequest { consumer: consumer.into(), event_ids, limit };
        Ok(self.admin().redrive_dead_letters(request).await?.into_inner())
    }

    /// Pauses a consumer: it keeps capturing and delivers nothing until [`resume`](Self::resume).
    pub async fn pause(&self, name: impl Into<String>) -> Result<pb::ConsumerInfo, Error> {
        Ok(self.admin().pause_consumer(pb::PauseConsumerRequest { name: name.into() }).await?.into_inner())
    }

    /// Resumes delivery after [`pause`](Self::pause).
    pub async fn resume(&self, name: impl Into<String>) -> Result<pb::ConsumerInfo, Error> {
        Ok(self.admin().resume_consumer(pb::ResumeConsumerRequest { name: name.into() }).await?.into_inner())
    }
}

impl Connector {
    /// A [`Client`] on a new connection.
    pub async fn client(&self) -> Result<Client, Error> {
        let channel = self.channel().await?;
        let inner = Inner {
            connector: self.clone(),
            channel: channel.clone(),
            bus: EventBusClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE),
            admin: AdminClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE),
            publisher: self.publishing().map(|tuning| SharedPublisher::start(channel, tuning)),
        };
        Ok(Client { inner: Arc::new(inner) })
    }
}

/// Publishes `request` with `send` inside its `send` span (the event carrying the
/// span's context), and records the answer on the span.
async fn traced<F, Fut>(mut request: pb::PublishRequest, send: F) -> Result<pb::PublishResponse, Error>
where
    F: FnOnce(pb::PublishRequest) -> Fut,
    Fut: std::future::Future<Output = Result<pb::PublishResponse, Error>>,
{
    let span = trace::send(&mut request);
    let answer = send(request).instrument(span.clone()).await;
    trace::sent(&span, answer.as_ref());
    answer
}
