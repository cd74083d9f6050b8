//! Events to publish, built without touching the wire types: [`Message`] (for batches and
//! publish streams) and [`Publish`], what [`Client::publish`] returns: the same builder,
//! sent when awaited.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use bytes::Bytes;
use eventbus_proto::pb;

use crate::{Client, Error};

/// One event to publish: a channel, a payload, and optionally metadata, a content type,
/// an ordering key and an idempotency key. Converts into the wire
/// [`pb::PublishRequest`], so it goes wherever one does:
/// [`Client::publish_batch`], [`PublishSender::send`](crate::PublishSender::send).
///
/// ```
/// use eventbus_client::{Message, pb};
///
/// let message = Message::new("orders.created", r#"{"id":42}"#)
///     .content_type("application/json")
///     .ordering_key("customer-7")
///     .metadata("trace-id", "4bf92f35");
/// let request = pb::PublishRequest::from(message);
/// assert_eq!(request.channel, "orders.created");
/// assert_eq!(request.metadata["trace-id"], "4bf92f35");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    request: pb::PublishRequest,
}

impl Message {
    /// An event for an exact channel (no wildcards). The payload is anything that
    /// converts into [`Bytes`]: `&'static str`, `String`, `Vec<u8>`, `&'static [u8]`,
    /// `Bytes` (no copy for the last).
    pub fn new(channel: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self { request: pb::PublishRequest { channel: channel.into(), payload: payload.into(), ..Default::default() } }
    }

    /// Adds one metadata entry (copied to the event; a key given twice keeps the last value).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.metadata.insert(key.into(), value.into());
        self
    }

    /// Adds several metadata entries.
    pub fn metadata_all<K: Into<String>, V: Into<String>>(mut self, entries: impl IntoIterator<Item = (K, V)>) -> Self {
        self.request.metadata.extend(entries.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The payload's media type, e.g. `application/json` (copied to the event; REST
    /// views show JSON and text payloads as such).
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.request.content_type = content_type.into();
        self
    }

    /// Durable consumers deliver the events of one key in publish order, one at a time.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.request.ordering_key = key.into();
        self
    }

    /// A key seen again within the broker's deduplication window makes the publish a
    /// no-op answered with the original event id (`duplicate` set). A shared-stream
    /// publish with a key is also sent again after a lost stream.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.request.idempotency_key = key.into();
        self
    }

    /// The event's source (default: the publisher's address).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.request.source = source.into();
        self
    }

    /// The wire request.
    pub fn into_request(self) -> pb::PublishRequest {
        self.request
    }
}

impl From<Message> for pb::PublishRequest {
    fn from(message: Message) -> Self {
        message.request
    }
}

/// One publish being built: [`Client::publish`]'s answer. Set what you need, then
/// `.await` it (or [`send`](Self::send)): the broker's answer, with the event id.
///
/// ```no_run
/// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::Error> {
/// let published = client
///     .publish("orders.created", r#"{"id":42}"#)
///     .content_type("application/json")
///     .idempotency_key("order-42-created")
///     .await?;
/// println!("event {} (duplicate: {})", published.event_id, published.duplicate);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "nothing is published until the publish is awaited"]
pub struct Publish<'a> {
    client: &'a Client,
    message: Message,
}

impl<'a> Publish<'a> {
    pub(crate) fn new(client: &'a Client, message: Message) -> Self {
        Self { client, message }
    }

    /// See [`Message::metadata`].
    pub fn metadata(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.map(|m| m.metadata(key, value))
    }

    /// See [`Message::metadata_all`].
    pub fn metadata_all<K: Into<String>, V: Into<String>>(self, entries: impl IntoIterator<Item = (K, V)>) -> Self {
        self.map(|m| m.metadata_all(entries))
    }

    /// See [`Message::content_type`].
    pub fn content_type(self, content_type: impl Into<String>) -> Self {
        self.map(|m| m.content_type(content_type))
    }

    /// See [`Message::ordering_key`].
    pub fn ordering_key(self, key: impl Into<String>) -> Self {
        self.map(|m| m.ordering_key(key))
    }

    /// See [`Message::idempotency_key`].
    pub fn idempotency_key(self, key: impl Into<String>) -> Self {
        self.map(|m| m.idempotency_key(key))
    }

    /// See [`Message::source`].
    pub fn source(self, source: impl Into<String>) -> Self {
        self.map(|m| m.source(source))
    }

    fn map(mut self, f: impl FnOnce(Message) -> Message) -> Self {
        self.message = f(self.message);
        self
    }

    /// Publishes, as [`Client::publish_request`] does: same as awaiting the builder.
    pub async fn send(self) -> Result<pb::PublishResponse, Error> {
        self.client.publish_request(self.message.into()).await
    }
}

impl<'a> IntoFuture for Publish<'a> {
    type Output = Result<pb::PublishResponse, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.send())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_sets_each_field_of_the_request() {
        let request: pb::PublishRequest = Message::new("a.b", vec![1u8, 2])
            .metadata("k", "v1")
            .metadata_all([("k", "v2"), ("other", "x")])
            .content_type("application/octet-stream")
            .ordering_key("o")
            .idempotency_key("i")
            .source("s")
            .into();
        assert_eq!(request.channel, "a.b");
        assert_eq!(&request.payload[..], [1, 2]);
        assert_eq!(request.metadata.len(), 2);
        assert_eq!(request.metadata["k"], "v2", "the last value given wins");
        assert_eq!(
            (&*request.content_type, &*request.ordering_key, &*request.idempotency_key, &*request.source),
            ("application/octet-stream", "o", "i", "s")
        );
        assert_eq!(Message::new("c", "text").into_request().payload, Bytes::from_static(b"text"));
    }
}
