//! The eventbus target: one gRPC connection per publisher and per subscriber, through
//! `eventbus-client`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::target::{PublishMode, Publisher, Publishing, Subscriber, Target};
use anyhow::Context;
use bytes::Bytes;
use eventbus_client::{Client, PublishSender, SubscribeOptions, Subscription, SubscriptionItem, pb};
use tokio::sync::{Mutex, Notify};
use tokio::task::JoinSet;

/// Publishes in flight on one `PublishStream` before the sender waits.
const STREAM_WINDOW: usize = 4096;
/// `PublishBatch` calls in flight per publisher before it waits for the oldest.
const BATCH_WINDOW: usize = 4;
/// Bench subscribers ask for the largest queue, so a run measures throughput, not drops.
const QUEUE_CAPACITY: u32 = 1_000_000;

/// A running eventbusd.
#[derive(Debug, Clone)]
pub struct EventBusTarget {
    client: Client,
}

impl EventBusTarget {
    /// `client`'s options, with a new connection for each publisher and subscriber.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl Target for EventBusTarget {
    type Pub = EventBusPublisher;
    type Sub = EventBusSubscriber;

    fn name(&self) -> &'static str {
        "eventbus"
    }

    async fn publisher(&self, how: Publishing) -> anyhow::Result<EventBusPublisher> {
        let client = self.client.new_connection().await?;
        match how.mode {
            PublishMode::Unary => Ok(EventBusPublisher::Unary(client)),
            PublishMode::Batch => {
                let size = how.batch.max(1);
                Ok(EventBusPublisher::Batch { client, size, pending: Vec::with_capacity(size), calls: JoinSet::new() })
            }
            PublishMode::Stream => {
                let (tx, mut answers) = client.publish_stream(STREAM_WINDOW).await?;
                let acks = Arc::new(Acks::default());
                let reader = Arc::clone(&acks);
                tokio::spawn(async move {
                    loop {
                        match answers.next().await {
                            Ok(Some(_)) => {
                                reader.acked.fetch_add(1, Ordering::Release);
                                reader.changed.notify_waiters();
                            }
                            Ok(None) => break,
                            Err(e) => {
                                *reader.error.lock().await = Some(e);
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
        let client = self.client.new_connection().await?;
        let options = SubscribeOptions::new([subject])
            .group(group.unwrap_or_default())
            .queue_capacity(QUEUE_CAPACITY)
            .name("bench")
            .reconnect(false);
        Ok(EventBusSubscriber { subscription: client.subscribe(options).await? })
    }
}

#[derive(Debug, Default)]
pub struct Acks {
    acked: AtomicU64,
    changed: Notify,
    ended: AtomicBool,
    error: Mutex<Option<eventbus_client::Error>>,
}

#[derive(Debug)]
pub enum EventBusPublisher {
    Unary(Client),
    Stream {
        tx: PublishSender,
        sent: u64,
        acks: Arc<Acks>,
    },
    /// Events gathered `size` at a time, sent in one `PublishBatch`, up to
    /// [`BATCH_WINDOW`] calls in flight.
    Batch {
        client: Client,
        size: usize,
        pending: Vec<pb::PublishRequest>,
        calls: JoinSet<anyhow::Result<()>>,
    },
}

/// Sends what is pending as one `PublishBatch`, then waits while too many are in flight.
async fn send_batch(
    client: &Client,
    size: usize,
    pending: &mut Vec<pb::PublishRequest>,
    calls: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let events = std::mem::replace(pending, Vec::with_capacity(size));
    let client = client.clone();
    calls.spawn(async move {
        for (i, answer) in client.publish_batch(events).await?.into_iter().enumerate() {
            answer.with_context(|| format!("event {i} of a batch was refused"))?;
        }
        Ok(())
    });
    while calls.len() >= BATCH_WINDOW {
        if let Some(done) = calls.join_next().await {
            done??;
        }
    }
    Ok(())
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
            Self::Batch { client, size, pending, calls } => {
                pending.push(req);
                if pending.len() >= *size {
                    send_batch(client, *size, pending, calls).await?;
                }
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if let Self::Batch { client, size, pending, calls } = self {
            if !pending.is_empty() {
                send_batch(client, *size, pending, calls).await?;
            }
            while let Some(done) = calls.join_next().await {
                done??;
            }
            return Ok(());
        }
        let Self::Stream { sent, acks, .. } = self else { return Ok(()) };
        loop {
            let changed = acks.changed.notified();
            if let Some(e) = acks.error.lock().await.take() {
                anyhow::bail!("publish stream failed: {e}");
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
    subscription: Subscription,
}

impl Subscriber for EventBusSubscriber {
    async fn next(&mut self, out: &mut Vec<Bytes>) -> anyhow::Result<bool> {
        loop {
            match self.subscription.next().await.transpose()? {
                None => return Ok(false),
                Some(SubscriptionItem::Events(events)) => {
                    out.extend(events.into_iter().map(|e| e.payload));
                    return Ok(true);
                }
                Some(_) => {}
            }
        }
    }
}
