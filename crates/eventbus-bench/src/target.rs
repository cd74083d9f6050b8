//! The seam between the workloads and a pub/sub system.

use std::future::Future;

use bytes::Bytes;

/// How a publisher sends: one acknowledged call at a time, a pipelined stream, or
/// batches of events per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishMode {
    /// Each publish waits for its answer (eventbus `Publish`).
    Unary,
    /// Publishes are pipelined (eventbus `PublishStream`); answers are read concurrently.
    Stream,
    /// `--batch` events per call (eventbus `PublishBatch`), a few calls in flight. Systems
    /// without a batch call (NATS, Redis, JetStream) publish as with `stream`: their
    /// clients already coalesce pipelined publishes into large writes.
    Batch,
    /// The publishers are tasks of one process sharing one client, each awaiting its
    /// client's `publish()` before the next, as request handlers publish (eventbus: one
    /// `Client`, whose calls share its `PublishStream`; JetStream: one connection,
    /// `publish().await` then its ack). Elsewhere as `unary`.
    Client,
}

impl PublishMode {
    /// The mode's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unary => "unary",
            Self::Stream => "stream",
            Self::Batch => "batch",
            Self::Client => "client",
        }
    }
}

/// What a streaming publisher waits for (eventbus `PublishStream` ack modes). Systems
/// without the choice (NATS core and Redis answer no publish) publish as they always do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Ack {
    /// One answer per publish.
    #[default]
    Each,
    /// Running totals per chunk of publishes the broker read.
    Cumulative,
    /// Only refusals, and the totals at the end.
    None,
}

impl Ack {
    /// The mode's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Each => "each",
            Self::Cumulative => "cumulative",
            Self::None => "none",
        }
    }
}

/// How a publisher is to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publishing {
    pub mode: PublishMode,
    /// Events per call in [`PublishMode::Batch`] (at least 1).
    pub batch: usize,
    /// What a [`PublishMode::Stream`] publisher waits for.
    pub ack: Ack,
}

/// A system under test.
pub trait Target: Send + Sync + 'static {
    type Pub: Publisher;
    type Sub: Subscriber;

    /// Short name for reports, e.g. `eventbus`.
    fn name(&self) -> &'static str;

    /// A new publisher (its own connection or stream).
    fn publisher(&self, how: Publishing) -> impl Future<Output = anyhow::Result<Self::Pub>> + Send;

    /// A subscriber on `subject`, optionally in a queue group; live (it will receive
    /// anything published after this returns) when the future resolves.
    fn subscriber(&self, subject: &str, group: Option<&str>) -> impl Future<Output = anyhow::Result<Self::Sub>> + Send;
}

pub trait Publisher: Send + 'static {
    fn publish(&mut self, subject: &str, payload: Bytes) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Waits until everything published so far was accepted by the system.
    fn flush(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

pub trait Subscriber: Send + 'static {
    /// Appends the next payloads to arrive (at least one) to `out`; `false` when the
    /// subscription ended.
    fn next(&mut self, out: &mut Vec<Bytes>) -> impl Future<Output = anyhow::Result<bool>> + Send;
}
