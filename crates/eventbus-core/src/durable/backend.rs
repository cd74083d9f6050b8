//! The seam between the wire layer and a durable consumer implementation.
//!
//! Two implementations exist: the embedded engine of the `eventbus-durable` crate
//! (`in_memory` mode: working state in memory, persisted to redb) and the Redis Streams
//! engine of the `eventbus-redis` crate (`redis` mode: state lives in Redis, shared by
//! every instance). The gRPC, REST and metrics layers only see this trait; one
//! conformance suite checks that both engines answer it the same way.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::durable::config::ConsumerConfig;
use crate::durable::dead_letter::DeadLetterSink;
use crate::durable::delivery::{ClientOptions, Delivery};
use crate::durable::error::DurableError;
use crate::durable::log::{LogSlice, LogStatus};
use crate::event::Event;
use crate::transport::Fanout;

/// A boxed future, so the trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Outcome of capturing a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Captured {
    /// Stored for `n` consumers (possibly 0); the bus still has to fan the event out.
    Stored(usize),
    /// Stored for `consumers` and fanned out in the same atomic step (redis mode): the
    /// bus must not publish it again.
    Forwarded { consumers: usize, fanout: Fanout },
    /// The idempotency key was seen within the window: the original event id.
    Duplicate(String),
}

/// A consumer's state for `GetConsumer`/`ListConsumers`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerInfo {
    pub config: ConsumerConfig,
    /// Unfinished events not in flight (ready, waiting for redelivery, or behind their key).
    pub pending: u64,
    pub in_flight: u64,
    pub clients: u32,
    pub acked: u64,
    pub dead_lettered: u64,
    pub redelivered: u64,
    /// Dead-lettered events put back by `RedriveDeadLetters`.
    pub redriven: u64,
    /// Captures dropped because the consumer held `max_pending` events.
    pub dropped: u64,
    /// Paused: events are kept, none is delivered (`PauseConsumer`).
    pub paused: bool,
    /// Dead-lettered events kept for `RedriveDeadLetters` (bounded like the terminal log).
    pub redrivable: u64,
}

/// Where a pending event stands (`ListPending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PendingState {
    /// Deliverable now (waiting for a client with room, or for `ResumeConsumer`).
    Ready,
    /// Waiting for its redelivery after a failed attempt.
    Delayed,
    /// Delivered, not yet acked.
    InFlight,
    /// Behind an older unfinished event with the same ordering key.
    BlockedByOrderingKey,
}

/// One unfinished event of a consumer (`ListPending`).
#[derive(Debug, Clone)]
pub struct PendingEntry {
    pub event: Arc<Event>,
    /// Deliveries so far (0 = never delivered; for an event in flight, the current one).
    pub attempt: u32,
    /// When it is delivered (again): the redelivery time of a delayed event, the ack
    /// deadline of one in flight; `None` for ready and blocked events.
    pub next_delivery_ms: Option<u64>,
    pub failures: Vec<crate::durable::log::Failure>,
    pub state: PendingState,
}

/// A page of a consumer's pending events (the order is the engine's: docs/durable.md "Mode differences").
#[derive(Debug, Clone, Default)]
pub struct PendingSlice {
    pub entries: Vec<PendingEntry>,
    /// Pass back as `page_token` to continue; empty at the end.
    pub next_page_token: String,
}

/// Most dead letters one `RedriveDeadLetters` call puts back (its `limit` defaults to it).
pub const MAX_REDRIVE: usize = 10_000;

/// Answer of [`DurableBackend::redrive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Redriven {
    /// Events put back to the consumer.
    pub redriven: u64,
    /// Dead-lettered events still kept for redrive after this call.
    pub remaining: u64,
}

/// Acks and friends for one attached client. Dropping it detaches the client: events
/// it holds count a failed attempt ("consumer disconnected") and are released at once.
///
/// The calls resolve once the request is queued (not committed): a client sending
/// faster than the engine absorbs is slowed down, never buffered without bound.
pub trait ConsumerClient: Send + Sync + fmt::Debug {
    /// Completes events (also late acks; unknown ids are ignored: already done). An
    /// event this client does not hold and that is not waiting for its redelivery is
    /// completed by the embedded engine, ignored by the Redis one (docs/durable.md "Mode
    /// differences").
    fn ack(&self, event_ids: Vec<String>) -> BoxFuture<'_, ()>;
    /// Fails one in-flight event now; redelivered after `delay` or the backoff.
    fn nack(&self, event_id: String, reason: String, delay: Option<Duration>) -> BoxFuture<'_, ()>;
    /// Moves the deadlines of in-flight events to `by` from now (0 = the ack deadline).
    fn extend(&self, event_ids: Vec<String>, by: Duration) -> BoxFuture<'_, ()>;
    /// Dead-letters an in-flight event now.
    fn term(&self, event_id: String, reason: String) -> BoxFuture<'_, ()>;
    /// Hands in-flight events this client has not started back to the consumer at
    /// once: no attempt counted, no backoff. With `drain`, the client takes no more
    /// deliveries, and its deliveries channel carries one empty batch after the last
    /// one it was sent (the wire's `drained`).
    fn release(&self, event_ids: Vec<String>, drain: bool) -> BoxFuture<'_, ()>;
    /// Why the deliveries stream ended, when the engine ended it (for example the
    /// store became unreachable); `None` for a normal end.
    fn closed_reason(&self) -> Option<DurableError> {
        None
    }
}

/// A client attached to a consumer.
#[derive(Debug)]
pub struct Attachment {
    /// The consumer as the client joins (whether its first events already count in
    /// flight differs by engine: docs/durable.md "Mode differences").
    pub info: ConsumerInfo,
    /// Delivery batches, pushed as events become available; ends when the client is
    /// detached (consumer deleted, shutdown, store lost). An empty batch answers a
    /// draining release ([`ConsumerClient::release`]): no delivery follows it.
    pub deliveries: mpsc::Receiver<Vec<Delivery>>,
    pub client: Box<dyn ConsumerClient>,
}

/// One event for [`DurableBackend::capture_many`], with its publish options.
#[derive(Debug, Clone, Copy)]
pub struct CaptureRequest<'a> {
    pub event: &'a Arc<Event>,
    pub ordering_key: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
}

/// Durable consumers (docs/durable.md), whatever keeps them.
pub trait DurableBackend: Send + Sync + fmt::Debug + 'static {
    /// Where dead letters are published (the bus, set once it exists).
    fn set_dead_letter_sink(&self, sink: DeadLetterSink);

    /// Stores published events of one publisher, in their order, for every consumer
    /// each matches, before the publishes are answered (one commit for all of them
    /// where the store allows); detects repeated idempotency keys, within the batch
    /// too. The answers come in the same order and stop at the first error (the last
    /// answer is then that error, and the later events go unanswered: like any
    /// publish whose answer was lost, a shared store may have captured some of them).
    fn capture_many<'a>(
        &'a self,
        batch: &'a [CaptureRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Captured, DurableError>>>;

    /// [`DurableBackend::capture_many`] for one event.
    fn capture<'a>(
        &'a self,
        event: &'a Arc<Event>,
        ordering_key: Option<&'a str>,
        idempotency_key: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Captured, DurableError>> {
        Box::pin(async move {
            let request = [CaptureRequest { event, ordering_key, idempotency_key }];
            let answer = self.capture_many(&request).await.pop();
            answer.unwrap_or_else(|| Err(DurableError::unavailable("the durable engine gave no answer")))
        })
    }

    /// Creates a consumer. Idempotent for an identical configuration.
    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<ConsumerInfo, DurableError>>;

    /// Creates or replaces a consumer declared in the configuration file (what it
    /// holds is kept).
    fn declare_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<(), DurableError>>;

    fn get_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>>;

    /// Every consumer, sorted by name.
    fn list_consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, DurableError>>;

    /// The last known state of every consumer, without I/O (for metrics scrapes; the
    /// Redis engine refreshes it on [`DurableBackend::list_consumers`]).
    fn consumers_snapshot(&self) -> Vec<ConsumerInfo>;

    /// Follows the consumer definitions: the value changes whenever a consumer is
    /// created, redefined or deleted (in redis mode, by any instance), so a watcher
    /// reads [`DurableBackend::consumers_snapshot`] again.
    fn definitions(&self) -> watch::Receiver<u64>;

    /// Deletes a consumer, what it holds and its log; attached clients are detached.
    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>>;

    /// The terminal log of a consumer, oldest first, from `page_token` (empty = start).
    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>>;

    /// The consumer's unfinished events, in the engine's order (docs/durable.md "Mode
    /// differences"), from `page_token` (empty = start);
    /// `limit` is clamped to 1..=1000.
    fn list_pending<'a>(
        &'a self,
        name: &'a str,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<PendingSlice, DurableError>>;

    /// Puts dead-lettered events back to the consumer with their attempts reset: the
    /// ones named by `event_ids` (ids not kept for redrive are skipped), or with none
    /// named the oldest `limit` (0 = [`MAX_REDRIVE`]). They queue behind what is pending,
    /// in their original order; each is logged `Redriven` and can be redriven once.
    fn redrive<'a>(
        &'a self,
        name: &'a str,
        event_ids: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Redriven, DurableError>>;

    /// Pauses (`true`) or resumes a consumer. While paused it keeps capturing and
    /// delivers nothing; clients stay attached and may still ack what they hold. The
    /// state is stored (it survives restarts and is shared by every instance).
    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>>;

    /// Attaches a client (creating the consumer from `create_if_missing` when absent).
    fn attach<'a>(
        &'a self,
        name: &'a str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> BoxFuture<'a, Result<Attachment, DurableError>>;

    /// Shutdown: detaches every client of this instance.
    fn detach_all(&self);

    /// Why the engine cannot take captures now (for readiness), if it cannot: for
    /// example its disk is nearly full.
    fn unready(&self) -> Option<String> {
        None
    }

    /// Why the engine cannot go on until the process restarts, if it cannot: a write
    /// to its store failed (a full disk, an I/O error) and what the store holds is
    /// known again only by recovering from its journal at the next start. Liveness and
    /// readiness turn off, so that a supervisor restarts the process.
    fn failed(&self) -> Option<String> {
        None
    }

    /// Waits until every change made so far is durable.
    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>>;
}
