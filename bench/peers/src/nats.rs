//! NATS core: one client connection per publisher and per subscriber.

use anyhow::Context;
use bytes::Bytes;
use eventbus_bench::{PublishMode, Publisher, Publishing, Subscriber, Target};
use futures::{FutureExt, StreamExt};

/// Messages taken per `next` when more are already buffered, like an eventbus batch.
const BATCH: usize = 256;

#[derive(Debug)]
pub(crate) struct NatsTarget {
    url: String,
}

impl NatsTarget {
    pub(crate) fn new(url: &str) -> Self {
        Self { url: url.to_owned() }
    }

    async fn client(&self) -> anyhow::Result<async_nats::Client> {
        async_nats::connect(&self.url).await.with_context(|| format!("cannot connect to {}", self.url))
    }
}

impl Target for NatsTarget {
    type Pub = NatsPublisher;
    type Sub = NatsSubscriber;

    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publisher(&self, how: Publishing) -> anyhow::Result<NatsPublisher> {
        Ok(NatsPublisher { client: self.client().await?, mode: how.mode })
    }

    async fn subscriber(&self, subject: &str, group: Option<&str>) -> anyhow::Result<NatsSubscriber> {
        let client = self.client().await?;
        let sub = match group {
            Some(g) => client.queue_subscribe(subject.to_owned(), g.to_owned()).await?,
            None => client.subscribe(subject.to_owned()).await?,
        };
        // The server has processed SUB once it answers the flush's PING.
        client.flush().await?;
        Ok(NatsSubscriber { _client: client, sub })
    }
}

#[derive(Debug)]
pub(crate) struct NatsPublisher {
    client: async_nats::Client,
    mode: PublishMode,
}

impl Publisher for NatsPublisher {
    async fn publish(&mut self, subject: &str, payload: Bytes) -> anyhow::Result<()> {
        self.client.publish(subject.to_owned(), payload).await?;
        if matches!(self.mode, PublishMode::Unary | PublishMode::Client) {
            self.client.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        Ok(self.client.flush().await?)
    }
}

#[derive(Debug)]
pub(crate) struct NatsSubscriber {
    _client: async_nats::Client,
    sub: async_nats::Subscriber,
}

impl Subscriber for NatsSubscriber {
    async fn next(&mut self, out: &mut Vec<Bytes>) -> anyhow::Result<bool> {
        let Some(first) = self.sub.next().await else { return Ok(false) };
        out.push(first.payload);
        while out.len() < BATCH {
            match self.sub.next().now_or_never() {
                Some(Some(msg)) => out.push(msg.payload),
                _ => break,
            }
        }
        Ok(true)
    }
}
