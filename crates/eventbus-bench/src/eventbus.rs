//! The eventbus target: one gRPC connection per publisher and per subscriber, through
//! `eventbus-client`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::target::{Ack, PublishMode, Publisher, Publishing, Subscriber, Target};
use anyhow::Context;
use bytes::Bytes;
use eventbus_client::{
    AckMode, Client, PublishAnswer, PublishAnswers, PublishSender, SubscribeOptions, Subscription, SubscriptionItem, pb,
};
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
            PublishMode::Unary | PublishMode::Client => Ok(EventBusPublisher::Unary(client)),
            PublishMode::Batch => {
                let size = how.batch.max(1);
                Ok(EventBusPublisher::Batch { client, size, pending: Vec::with_capacity(size), calls: JoinSet::new() })
            }
            PublishMode::Stream => {
                let (tx, answers) = client.publish_stream_with(STREAM_WINDOW, ack_mode(how.ack)).await?;
                let acks = Arc::new(Acks::default());
                tokio::spawn(read_answers(answers, Arc::clone(&acks)));
                Ok(EventBusPublisher::Stream { tx: Some(tx), sent: 0, acks, ack: how.ack })
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

fn ack_mode(ack: Ack) -> AckMode {
    match ack {
        Ack::Each => AckMode::Each,
        Ack::Cumulative => AckMode::Cumulative,
        Ack::None => AckMode::None,
    }
}

/// Counts what the broker answered on a publish stream: each answer (EACH), or the
/// running totals (CUMULATIVE, NONE). A refused publish fails the run.
async fn read_answers(mut answers: PublishAnswers, acks: Arc<Acks>) {
    loop {
        let covered = match answers.next_answer().await {
            Ok(Some(PublishAnswer::Published(_))) => acks.acked.load(Ordering::Acquire) + 1,
            Ok(Some(PublishAnswer::Totals(totals))) if totals.refused == 0 => totals.count,
            Ok(Some(PublishAnswer::Totals(totals))) => {
                *acks.error.lock().await = Some(anyhow::anyhow!("{} publishes were refused", totals.refused));
                break;
            }
            Ok(Some(PublishAnswer::Refused { position, error })) => {
                *acks.error.lock().await = Some(anyhow::anyhow!("publish {position} was refused: {error}"));
                break;
            }
            Ok(None) => break,
            Err(e) => {
                *acks.error.lock().await = Some(e.into());
                break;
            }
        };
        acks.acked.store(covered, Ordering::Release);
        acks.changed.notify_waiters();
    }
    acks.ended.store(true, Ordering::Release);
    acks.changed.notify_waiters();
}

#[derive(Debug, Default)]
pub struct Acks {
    acked: AtomicU64,
    changed: Notify,
    ended: AtomicBool,
    error: Mutex<Option<anyhow::Error>>,
}

#[derive(Debug)]
pub enum EventBusPublisher {
    Unary(Client),
    Stream {
        /// Taken by `flush` with `Ack::None`: closing the stream is what gets its totals.
        tx: Option<PublishSender>,
        sent: u64,
        acks: Arc<Acks>,
        ack: Ack,
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
                client.publish_unary(req).await?;
            }
            Self::Stream { tx, sent, .. } => {
                let tx = tx.as_ref().context("the publish stream was closed by flush")?;
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
        let Self::Stream { tx, sent, acks, ack } = self else { return Ok(()) };
        if *ack == Ack::None {
            drop(tx.take());
        }
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
