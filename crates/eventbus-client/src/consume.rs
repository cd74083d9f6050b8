//! The raw `Consume` stream of a durable consumer: attach, then deliveries in and
//! ack / nack / extend / term / release out.

use std::time::Duration;

use eventbus_proto::pb::{self, consume_request::Kind, consume_response, event_bus_client::EventBusClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::Error;
use crate::options::AuthChannel;

/// Requests that may wait to be sent before a sender waits.
const REQUESTS_IN_FLIGHT: usize = 1024;

/// What the broker sends on a `Consume` stream.
#[derive(Debug)]
#[non_exhaustive]
// `Attached` comes once per stream: its size costs nothing worth a box in every match.
#[allow(clippy::large_enum_variant)]
pub enum ConsumeMessage {
    /// The first message: the consumer's definition and counts.
    Attached(pb::ConsumerInfo),
    /// Events to handle, then ack, nack or term.
    Deliveries(Vec<pb::Delivery>),
    /// The answer to [`ConsumeSender::release`] with `drain`: no delivery follows.
    Drained,
}

/// An attached `Consume` stream. Dropping it (and every [`ConsumeSender`]) detaches:
/// events still in flight count one failed attempt and are released at once.
#[derive(Debug)]
pub struct ConsumeStream {
    sender: ConsumeSender,
    responses: tonic::Streaming<pb::ConsumeResponse>,
}

/// Sends acks, nacks, extensions and terms on a `Consume` stream. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConsumeSender {
    tx: mpsc::Sender<pb::ConsumeRequest>,
}

fn ended() -> Error {
    Error::from(tonic::Status::unavailable("the consume stream ended"))
}

impl ConsumeSender {
    async fn send(&self, kind: Kind) -> Result<(), Error> {
        self.tx.send(pb::ConsumeRequest { kind: Some(kind) }).await.map_err(|_| ended())
    }

    /// Completes these events.
    pub async fn ack(&self, event_ids: Vec<String>) -> Result<(), Error> {
        self.send(Kind::Ack(pb::Ack { event_ids })).await
    }

    /// Fails one event now; redelivered after `delay` (`None`: the consumer's backoff).
    pub async fn nack(&self, event_id: String, reason: String, delay: Option<Duration>) -> Result<(), Error> {
        // 0 means "the backoff" on the wire, so an explicit delay is at least 1 ms.
        let delay_ms = delay.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1));
        self.send(Kind::Nack(pb::Nack { event_id, reason, delay_ms })).await
    }

    /// Still working: moves the ack deadline of these events one full ack deadline ahead.
    pub async fn extend(&self, event_ids: Vec<String>) -> Result<(), Error> {
        self.send(Kind::Extend(pb::Extend { event_ids, by_ms: 0 })).await
    }

    /// Dead-letters one event now.
    pub async fn term(&self, event_id: String, reason: String) -> Result<(), Error> {
        self.send(Kind::Term(pb::Term { event_id, reason })).await
    }

    /// Hands back events not started: redelivered at once, no attempt counted. With
    /// `drain` (a stopping client), no delivery follows [`ConsumeMessage::Drained`].
    pub async fn release(&self, event_ids: Vec<String>, drain: bool) -> Result<(), Error> {
        self.send(Kind::Release(pb::Release { event_ids, drain })).await
    }
}

impl ConsumeStream {
    pub(crate) async fn open(mut bus: EventBusClient<AuthChannel>, attach: pb::Attach) -> Result<Self, Error> {
        let (tx, rx) = mpsc::channel(REQUESTS_IN_FLIGHT);
        let sender = ConsumeSender { tx };
        sender.send(Kind::Attach(attach)).await?;
        let responses = bus.consume(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { sender, responses })
    }

    /// A sender for this stream (e.g. for another task).
    pub fn sender(&self) -> ConsumeSender {
        self.sender.clone()
    }

    /// The next message; `None` when the broker ended the stream normally.
    pub async fn next(&mut self) -> Result<Option<ConsumeMessage>, Error> {
        loop {
            let Some(message) = self.responses.message().await? else { return Ok(None) };
            match message.kind {
                Some(consume_response::Kind::Attached(a)) => {
                    return Ok(Some(ConsumeMessage::Attached(a.consumer.unwrap_or_default())));
                }
                Some(consume_response::Kind::Deliveries(d)) => {
                    return Ok(Some(ConsumeMessage::Deliveries(d.deliveries)));
                }
                Some(consume_response::Kind::Drained(_)) => return Ok(Some(ConsumeMessage::Drained)),
                None => {}
            }
        }
    }

    /// Closes this side and waits (up to `timeout`) for the broker to end its side,
    /// which tells that every request sent before was received. Senders cloned from
    /// this stream must be dropped too, or this waits the whole timeout.
    pub async fn close(self, timeout: Duration) {
        let Self { sender, mut responses } = self;
        drop(sender);
        let drain = async { while let Ok(Some(_)) = responses.message().await {} };
        let _ = tokio::time::timeout(timeout, drain).await;
    }
}
