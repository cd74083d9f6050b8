//! Dead letters: what a consumer gave up on, published on a dead-letter channel.

use std::sync::Arc;

use bytes::Bytes;

use crate::durable::backend::BoxFuture;
use crate::durable::log::Failure;
use crate::event::Event;

/// A dead-lettered event, to be published on its dead-letter channel.
#[derive(Debug, Clone)]
pub struct PublishedDeadLetter {
    pub channel: String,
    pub event: Arc<Event>,
    pub consumer: String,
    /// The consumer's owner: the principal on whose behalf the dead letter is published.
    pub owner: String,
    pub attempts: u32,
    pub failures: Vec<Failure>,
}

/// Encodes a dead letter for publishing: (payload, content type). The wire layer
/// provides it (the `eventbus.v1.DeadLetter` protobuf).
pub type DeadLetterEncoder = Arc<dyn Fn(&PublishedDeadLetter) -> (Bytes, String) + Send + Sync>;

/// Publishes an encoded dead letter (channel, payload, content type) through the bus;
/// the future ends when the publish has been answered. A dead letter is not held to
/// `max_payload_bytes`: it wraps an event that was.
pub type DeadLetterSink =
    Arc<dyn Fn(String, Bytes, String) -> BoxFuture<'static, Result<(), crate::Error>> + Send + Sync>;
