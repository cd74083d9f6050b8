//! The eventbus target: one gRPC connection per publisher and per subscriber.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::client::{AuthChannel, Connector};
use crate::target::{PublishMode, Publisher, Subscriber, Target};
use anyhow::Context;
use bytes::Bytes;
use eventbus_proto::pb::{self, event_bus_client::EventBusClient, subscribe_response::Kind};
use tokio::sync::{Mutex, Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Publishes in flight on one `PublishStream` before the sender waits.
const STREAM_WINDOW: usize = 4096;
/// Bench subscribers ask for the largest queue, so a run measures throughput, not drops.
const QUEUE_CAPACITY: u32 = 1_000_000;

/// A running eventbusd.
#[derive(Debug, Clone)]
pub struct EventBusTarget {
    connector: Connector,
}

impl EventBusTarget {
    pub fn new(connector: Connector) -> Self {
        Self { connector }
    }
}

impl Target for EventBusTarget {
    type Pub = EventBusPublisher;
    type Sub = EventBusSubscriber;

    fn name(&self) -> &'static str {
        "eventbus"
    }

    async fn publisher(&self, mode: PublishMode) -> anyhow::Result<EventBusPublisher> {
        let mut client = self.connector.event_bus().await?;
        match mode {
            PublishMode::Unary => Ok(EventBusPublisher::Unary(client)),
            PublishMode::Stream => {
                let (tx, rx) = mpsc::channel(STREAM_WINDOW);
                let mut responses = client.publish_stream(ReceiverStream::new(rx)).await?.into_inner();
                let acks = Arc::new(Acks::default());
                let reader = Arc::clone(&acks);
                tokio::spawn(async move {
                    loop {
                        match responses.message().await {
                            Ok(Some(_)) => {
                                reader.acked.fetch_add(1, Ordering::Release);
                                reader.changed.notify_waiters();
                            }
                            Ok(None) => break,
                            Err(status) => {
                                *reader.error.lock().await = Some(status);
                                break;
                            }
                        }
                    }
                    reader.ended.store(true, Ordering::Release);
                    reader.changed.notify_waiters();
                });
                Ok(EventBusPublisher::Stream { tx, sent: 0, acks })
            }
        }
    }

    async fn subscriber(&self, subject: &str, group: Option<&str>) -> anyhow::Result<EventBusSubscriber> {
        let mut client = self.connector.event_bus().await?;
        let req = pb::SubscribeRequest {
            channels: vec![subject.to_owned()],
            group: group.unwrap_or_default().to_owned(),
            queue_capacity: QUEUE_CAPACITY,
            name: "bench".into(),
            ..Default::default()
        };
        let mut stream = client.subscribe(req).await?.into_inner();
        match stream.message().await? {
            Some(pb::SubscribeResponse { kind: Some(Kind::Started(_)) }) => Ok(EventBusSubscriber { stream }),
            other => anyhow::bail!("expected `started`, got {other:?}"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Acks {
    acked: AtomicU64,
    changed: Notify,
    ended: std::sync::atomic::AtomicBool,
    error: Mutex<Option<tonic::Status>>,
}

#[derive(Debug)]
pub enum EventBusPublisher {
    Unary(EventBusClient<AuthChannel>),
    Stream { tx: mpsc::Sender<pb::PublishRequest>, sent: u64, acks: Arc<Acks> },
}

impl Publisher for EventBusPublisher {
    async fn publish(&mut self, subject: &str, payload: Bytes) -> anyhow::Result<()> {
        let req = pb::PublishRequest { channel: subject.to_owned(), payload, ..Default::default() };
        match self {
            Self::Unary(client) => {
                client.publish(req).await?;
            }
            Self::Stream { tx, sent, .. } => {
                tx.send(req).await.context("the publish stream ended")?;
                *sent += 1;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        let Self::Stream { sent, acks, .. } = self else { return Ok(()) };
        loop {
            let changed = acks.changed.notified();
            if let Some(status) = acks.error.lock().await.take() {
                anyhow::bail!("publish stream failed: {status}");
            }
            if acks.acked.load(Ordering::Acquire) >= *sent {
                return Ok(());
            }
            if acks.ended.load(Ordering::Acquire) {
                anyhow::bail!("the publish stream ended before every event was acknowledged");
            }
            changed.await;
        }
    }
}

#[derive(Debug)]
pub struct EventBusSubscriber {
    stream: tonic::Streaming<pb::SubscribeResponse>,
}

impl Subscriber for EventBusSubscriber {
    async fn next(&mut self, out: &mut Vec<Bytes>) -> anyhow::Result<bool> {
        loop {
            match self.stream.message().await? {
                None => return Ok(false),
                Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) }) => {
                    out.extend(batch.events.into_iter().map(|e| e.payload));
                    return Ok(true);
                }
                Some(_) => {}
            }
        }
    }
}
