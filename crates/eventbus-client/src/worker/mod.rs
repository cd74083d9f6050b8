//! The push worker: a durable consumer's Consume loop written once.
//!
//! [`Worker`] attaches to a consumer, runs a handler on each delivery with bounded
//! concurrency, turns each [`Outcome`] into an ack (batched), a nack (retry, optionally
//! after a delay) or a term (dead letter), extends the ack deadline of events it still
//! holds, reconnects with backoff when the stream is lost, and drains on shutdown.
//! `run` holds the loop; `metrics` the Prometheus side.

mod metrics;
mod run;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eventbus_proto::pb;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

pub use metrics::WorkerMetrics;

use crate::{Backoff, Client, Error};

/// One event handed to the handler.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The event as published.
    pub event: pb::Event,
    /// 1-based: 2 and more are redeliveries.
    pub attempt: u32,
    /// The broker's ack deadline for this attempt (the worker extends it while it holds
    /// the event, so a long handler is not redelivered).
    pub deadline: Option<prost_types::Timestamp>,
}

/// What the handler decided for one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done: ack it (acks are sent in batches).
    Ack,
    /// Failed, try again: nack it. Redelivered after `after`, or after the consumer's
    /// backoff when `None`; dead-lettered once the consumer's `max_attempts` is reached.
    Retry {
        /// Delay before redelivery; `None` = the consumer's backoff.
        after: Option<Duration>,
        /// Recorded in the event's failures (terminal log, dead letter).
        reason: String,
    },
    /// Failed for good: dead-letter it now (term) with this reason.
    Term(String),
}

impl Outcome {
    /// Retry after the consumer's backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry { after: None, reason: reason.into() }
    }

    /// Retry after `after`.
    pub fn retry_after(after: Duration, reason: impl Into<String>) -> Self {
        Self::Retry { after: Some(after), reason: reason.into() }
    }

    /// Dead-letter now.
    pub fn term(reason: impl Into<String>) -> Self {
        Self::Term(reason.into())
    }
}

/// What a handler may return: an [`Outcome`], `()` (ack), or a `Result` whose error
/// means "retry after the backoff", its text becoming the failure's reason.
pub trait IntoOutcome {
    /// The outcome this value stands for.
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Outcome::Ack
    }
}

impl<E: fmt::Display> IntoOutcome for Result<(), E> {
    fn into_outcome(self) -> Outcome {
        self.map_or_else(|e| Outcome::retry(e.to_string()), |()| Outcome::Ack)
    }
}

impl<E: fmt::Display> IntoOutcome for Result<Outcome, E> {
    fn into_outcome(self) -> Outcome {
        self.unwrap_or_else(|e| Outcome::retry(e.to_string()))
    }
}

/// Handles one delivery. Implemented for every `async` closure or function
/// `Fn(Delivery) -> impl Future<Output = impl IntoOutcome>`.
pub trait Handler: Send + Sync + 'static {
    /// Handles `delivery`; a panic counts as a retry with reason "handler panicked".
    fn handle(&self, delivery: Delivery) -> BoxFuture<'static, Outcome>;
}

impl<F, Fut> Handler for F
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn handle(&self, delivery: Delivery) -> BoxFuture<'static, Outcome> {
        let fut = self(delivery);
        Box::pin(async move { fut.await.into_outcome() })
    }
}

type Hook = Arc<dyn Fn() + Send + Sync>;
type SuccessHook = Arc<dyn Fn(&pb::Event, u32) + Send + Sync>;
type ErrorHook = Arc<dyn Fn(&pb::Event, &str, u32) + Send + Sync>;

/// The host's callbacks. They run on the worker's loop: keep them quick.
#[derive(Clone, Default)]
struct Hooks {
    on_start: Option<Hook>,
    on_success: Option<SuccessHook>,
    on_error: Option<ErrorHook>,
    on_stop: Option<Hook>,
}

impl Hooks {
    /// Whether a hook needs its own copy of each event.
    fn want_events(&self) -> bool {
        self.on_success.is_some() || self.on_error.is_some()
    }
}

/// Counts since the worker was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Events whose handler succeeded (acked).
    pub processed: u64,
    /// Handler attempts that failed (retried or terminal).
    pub failed: u64,
    /// Failed attempts nacked for a retry (a subset of `failed`).
    pub retried: u64,
    /// Handlers running now.
    pub in_flight: u64,
}

#[derive(Debug, Default)]
struct Counters {
    processed: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    in_flight: AtomicU64,
    backlog: AtomicU64,
}

/// The worker's settings.
#[derive(Debug, Clone)]
struct Settings {
    concurrency: usize,
    queue_capacity: u32,
    shutdown_timeout: Duration,
    ack_batch: usize,
    ack_interval: Duration,
    max_batch: u32,
    backoff: Backoff,
    create_if_missing: Option<pb::ConsumerConfig>,
}

/// A push worker for one durable consumer.
///
/// Build it, then [`run`](Self::run) it with a handler until a shutdown token is
/// cancelled. A `Worker` is a cheap handle: clones share the counters, so one clone can
/// run while another reports [`stats`](Self::stats) and [`backlog`](Self::backlog).
///
/// ```no_run
/// # async fn demo() -> Result<(), eventbus_client::Error> {
/// use std::time::Duration;
/// use eventbus_client::{Client, ClientOptions, Delivery, Outcome, Worker};
/// use tokio_util::sync::CancellationToken;
///
/// let client = Client::connect(ClientOptions::new("http://127.0.0.1:50051")).await?;
/// let worker = Worker::new(client, "billing").concurrency(16).shutdown_timeout(Duration::from_secs(10));
/// let shutdown = CancellationToken::new();
/// worker
///     .run(
///         |d: Delivery| async move {
///             if d.event.payload.is_empty() { Outcome::term("empty invoice") } else { Outcome::Ack }
///         },
///         shutdown,
///     )
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Worker {
    client: Client,
    consumer: String,
    settings: Settings,
    hooks: Hooks,
    metrics: Option<WorkerMetrics>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("consumer", &self.consumer)
            .field("settings", &self.settings)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker for the durable consumer `consumer`: concurrency 1, the consumer's
    /// `max_in_flight` as queue capacity, 30 s shutdown timeout.
    pub fn new(client: Client, consumer: impl Into<String>) -> Self {
        Self {
            client,
            consumer: consumer.into(),
            settings: Settings {
                concurrency: 1,
                queue_capacity: 0,
                shutdown_timeout: Duration::from_secs(30),
                ack_batch: 128,
                ack_interval: Duration::from_millis(2),
                max_batch: 0,
                backoff: Backoff::default(),
                create_if_missing: None,
            },
            hooks: Hooks::default(),
            metrics: None,
            counters: Arc::default(),
        }
    }

    /// Handlers running at once (at least 1). They run as futures of the worker's own
    /// task, concurrently (one awaits while another goes on), not in parallel on
    /// several threads: a handler with CPU-heavy or blocking work should move it to
    /// `tokio::task::spawn_blocking` (or a task it spawns) and await that, so that acks,
    /// deadline extensions and the other handlers keep going.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.settings.concurrency = n.max(1);
        self
    }

    /// Events this worker holds at once, running or waiting for a handler: the
    /// `max_in_flight` it attaches with (0 = the consumer's, also the ceiling).
    pub fn queue_capacity(mut self, n: u32) -> Self {
        self.settings.queue_capacity = n;
        self
    }

    /// On shutdown, how long running handlers may take to finish before their events
    /// are nacked.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.settings.shutdown_timeout = timeout;
        self
    }

    /// Acks are sent once this many are waiting (default 128), or after
    /// [`ack_interval`](Self::ack_interval), or when the worker is idle.
    pub fn ack_batch(mut self, n: usize) -> Self {
        self.settings.ack_batch = n.max(1);
        self
    }

    /// Longest time an ack waits to be sent (default 2 ms).
    pub fn ack_interval(mut self, interval: Duration) -> Self {
        self.settings.ack_interval = interval;
        self
    }

    /// Most deliveries per message from the broker (0 = the broker's default, 256).
    pub fn max_batch(mut self, n: u32) -> Self {
        self.settings.max_batch = n;
        self
    }

    /// Delays between reconnection attempts after the stream is lost.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = backoff;
        self
    }

    /// Creates the consumer with this definition on attach when it does not exist.
    pub fn create_if_missing(mut self, config: impl Into<pb::ConsumerConfig>) -> Self {
        self.settings.create_if_missing = Some(config.into());
        self
    }

    /// Exports `socle_push_worker_*` for this consumer on the host's registry.
    pub fn metrics(mut self, metrics: WorkerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Called once when [`run`](Self::run) starts.
    pub fn on_start(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.on_start = Some(Arc::new(hook));
        self
    }

    /// Called after each successful handler, with the event and its attempt.
    pub fn on_success(mut self, hook: impl Fn(&pb::Event, u32) + Send + Sync + 'static) -> Self {
        self.hooks.on_success = Some(Arc::new(hook));
        self
    }

    /// Called after each failed handler (retry, term or panic), with the event, the
    /// failure's reason and the attempt.
    pub fn on_error(mut self, hook: impl Fn(&pb::Event, &str, u32) + Send + Sync + 'static) -> Self {
        self.hooks.on_error = Some(Arc::new(hook));
        self
    }

    /// Called once when [`run`](Self::run) returns.
    pub fn on_stop(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.on_stop = Some(Arc::new(hook));
        self
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Counts so far (shared by every clone of this worker).
    pub fn stats(&self) -> WorkerStats {
        let c = &self.counters;
        WorkerStats {
            processed: c.processed.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
        }
    }

    /// Events received and waiting for a free handler.
    pub fn backlog(&self) -> u64 {
        self.counters.backlog.load(Ordering::Relaxed)
    }

    /// Runs `handler` on the consumer's events until `shutdown` is cancelled, then
    /// drains: takes no more events, hands back those no handler started (no attempt
    /// counted: they go to another worker at once), waits up to the shutdown timeout
    /// for running handlers, nacks those still running and detaches. Lost connections are re-established
    /// with backoff. Returns an error only when the broker refuses the worker (unknown
    /// consumer, credentials, rights).
    pub async fn run<H: Handler>(&self, handler: H, shutdown: CancellationToken) -> Result<(), Error> {
        if let Some(hook) = &self.hooks.on_start {
            hook();
        }
        let result = run::Run::new(self, Arc::new(handler)).run(shutdown).await;
        if let Some(hook) = &self.hooks.on_stop {
            hook();
        }
        result
    }
}
