//! Redis Pub/Sub: a multiplexed connection per publisher (pipelined in stream mode) and a
//! pub/sub connection per subscriber.

use anyhow::Context;
use bytes::Bytes;
use eventbus_bench::{PublishMode, Publisher, Publishing, Subscriber, Target};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redis::aio::MultiplexedConnection;

/// PUBLISH commands in flight per publisher in stream mode.
const WINDOW: usize = 256;
const BATCH: usize = 256;

type Pending = FuturesUnordered<futures::future::BoxFuture<'static, redis::RedisResult<i64>>>;

#[derive(Debug)]
pub(crate) struct RedisTarget {
    client: redis::Client,
}

impl RedisTarget {
    pub(crate) fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self { client: redis::Client::open(url).with_context(|| format!("invalid Redis URL {url}"))? })
    }
}

impl Target for RedisTarget {
    type Pub = RedisPublisher;
    type Sub = RedisSubscriber;

    fn name(&self) -> &'static str {
        "redis"
    }

    async fn publisher(&self, how: Publishing) -> anyhow::Result<RedisPublisher> {
        let conn = self.client.get_multiplexed_async_connection().await?;
        Ok(RedisPublisher { conn, mode: how.mode, pending: FuturesUnordered::new() })
    }

    async fn subscriber(&self, subject: &str, group: Option<&str>) -> anyhow::Result<RedisSubscriber> {
        anyhow::ensure!(group.is_none(), "Redis Pub/Sub has no queue groups");
        let mut pubsub = self.client.get_async_pubsub().await?;
        // Returns once Redis has confirmed the subscription.
        pubsub.subscribe(subject).await?;
        Ok(RedisSubscriber { stream: pubsub.into_on_message() })
    }
}

pub(crate) struct RedisPublisher {
    conn: MultiplexedConnection,
    mode: PublishMode,
    pending: Pending,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher").field("in_flight", &self.pending.len()).finish()
    }
}

impl Publisher for RedisPublisher {
    async fn publish(&mut self, subject: &str, payload: Bytes) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let subject = subject.to_owned();
        let send = async move { redis::cmd("PUBLISH").arg(subject).arg(payload.as_ref()).query_async(&mut conn).await };
        match self.mode {
            PublishMode::Unary | PublishMode::Client => {
                send.await?;
            }
            // Redis has no batch call; pipelined like `stream`.
            PublishMode::Stream | PublishMode::Batch => {
                self.pending.push(send.boxed());
                // Futures only run when polled: poll now so the command goes out, and
                // collect whatever already finished.
                while let Some(Some(done)) = self.pending.next().now_or_never() {
                    done?;
                }
                if self.pending.len() >= WINDOW
                    && let Some(done) = self.pending.next().await
                {
                    done?;
                }
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        while let Some(done) = self.pending.next().await {
            done?;
        }
        Ok(())
    }
}

pub(crate) struct RedisSubscriber {
    stream: redis::aio::PubSubStream,
}

impl std::fmt::Debug for RedisSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisSubscriber")
    }
}

impl Subscriber for RedisSubscriber {
    async fn next(&mut self, out: &mut Vec<Bytes>) -> anyhow::Result<bool> {
        let Some(first) = self.stream.next().await else { return Ok(false) };
        out.push(Bytes::copy_from_slice(first.get_payload_bytes()));
        while out.len() < BATCH {
            match self.stream.next().now_or_never() {
                Some(Some(msg)) => out.push(Bytes::copy_from_slice(msg.get_payload_bytes())),
                _ => break,
            }
        }
        Ok(true)
    }
}
