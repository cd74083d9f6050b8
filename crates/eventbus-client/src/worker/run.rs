//! The worker's loop. One task owns all the state (no locks): deliveries in, handler
//! results in, timers for acks, deadline extension, reconnection and the drain.
//!
//! Handlers run as futures polled by this task (a `FuturesUnordered`), not as spawned
//! tasks: no task allocation, no cross-thread wake-up and no result channel per event,
//! which made the worker cost as much as the broker per event. Handlers are concurrent
//! (one awaits while another runs); CPU-heavy work belongs in `spawn_blocking` or a
//! task the handler spawns and awaits ([`Worker::concurrency`]).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use eventbus_proto::pb;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::metrics::ConsumerMetrics;
use super::{Delivery, Handler, Outcome, Worker};
use crate::Error;
use crate::consume::{ConsumeMessage, ConsumeSender, ConsumeStream};
use crate::trace;
use tracing::Instrument as _;

/// The broker's default ack deadline, for a consumer that reports none.
const DEFAULT_ACK_DEADLINE: Duration = Duration::from_secs(30);
/// Bound on the broker's `attached` answer.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the broker confirming the last requests when detaching.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Redelivery delay asked for events whose handler outlived the shutdown timeout.
const RELEASE_DELAY: Duration = Duration::from_millis(1);
/// "Never" for disabled timers (select! still builds every branch's future).
const FAR: Duration = Duration::from_secs(86_400);

/// An event delivered and not yet finished.
struct Held {
    /// Connection it came on: a nack or term only makes sense on that one (a lost
    /// connection already counted the attempt as failed).
    session: u64,
    /// Delivery or last extension, for deadline extension.
    extended_at: Instant,
}

/// A handler's result.
struct Done {
    id: String,
    attempt: u32,
    outcome: Outcome,
    elapsed: Duration,
    /// A copy for the hooks, when there are any.
    event: Option<pb::Event>,
}

struct Conn {
    stream: ConsumeStream,
    sender: ConsumeSender,
    ack_deadline: Duration,
}

pub(super) struct Run<'w, H> {
    worker: &'w Worker,
    handler: Arc<H>,
    metrics: Option<ConsumerMetrics>,
    conn: Option<Conn>,
    session: u64,
    failures: u32,
    retry_at: Instant,
    next_extend: Instant,
    queue: VecDeque<pb::Delivery>,
    held: HashMap<String, Held>,
    tasks: FuturesUnordered<BoxFuture<'static, Done>>,
    acks: Vec<String>,
    flush_at: Option<Instant>,
    /// The broker said no delivery follows (the answer to the drain).
    drained: bool,
}

async fn next_message(conn: &mut Option<Conn>) -> Result<Option<ConsumeMessage>, Error> {
    match conn {
        Some(c) => c.stream.next().await,
        None => std::future::pending().await,
    }
}

impl<'w, H: Handler> Run<'w, H> {
    pub(super) fn new(worker: &'w Worker, handler: Arc<H>) -> Self {
        let now = Instant::now();
        Self {
            worker,
            handler,
            metrics: worker.metrics.as_ref().map(|m| m.for_consumer(&worker.consumer)),
            conn: None,
            session: 0,
            failures: 0,
            retry_at: now,
            next_extend: now + FAR,
            queue: VecDeque::new(),
            held: HashMap::new(),
            tasks: FuturesUnordered::new(),
            acks: Vec::new(),
            flush_at: None,
            drained: false,
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        let result = self.serve(&shutdown).await;
        // Whatever happened: stop what still runs (the drain gave up on it), send the
        // acks gathered, and detach cleanly.
        let aborted = std::mem::take(&mut self.tasks).len() as u64;
        self.worker.counters.in_flight.fetch_sub(aborted, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.in_flight.sub(aborted as i64);
        }
        self.flush().await;
        if let Some(Conn { stream, sender, .. }) = self.conn.take() {
            drop(sender);
            stream.close(CLOSE_TIMEOUT).await;
        }
        result
    }

    async fn serve(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        let mut drain_until: Option<Instant> = None;
        // Once the handlers are done, how long to wait for `drained` (a broker that
        // predates it never answers; what it still sends then counts an attempt).
        let mut drained_by = Instant::now() + FAR;
        loop {
            if drain_until.is_none() {
                self.dispatch();
            } else if self.tasks.is_empty() && (self.drained || self.conn.is_none() || Instant::now() >= drained_by) {
                return Ok(());
            }
            if self.flush_at.is_some() && self.queue.is_empty() && self.tasks.is_empty() {
                self.flush().await; // idle: nothing to gain by waiting
            }
            let far = Instant::now() + FAR;
            tokio::select! {
                biased;
                () = shutdown.cancelled(), if drain_until.is_none() => {
                    drain_until = Some(Instant::now() + self.worker.settings.shutdown_timeout);
                    drained_by = Instant::now() + CLOSE_TIMEOUT;
                    let queued: Vec<_> = self.queue.drain(..).collect();
                    self.release(queued, true).await;
                }
                () = sleep_until(drain_until.unwrap_or(far)), if drain_until.is_some() => {
                    self.flush().await;
                    let ids: Vec<String> = self.held.iter().filter(|(_, h)| h.session == self.session).map(|(id, _)| id.clone()).collect();
                    self.nack_ids(ids, "worker shutdown timeout: handler still running").await;
                    return Ok(());
                }
                () = sleep_until(drained_by), if drain_until.is_some() && self.tasks.is_empty() && !self.drained => {}
                Some(done) = self.tasks.next() => {
                    self.finished(done).await;
                    // Whatever else has finished too, in one go: one turn of this loop
                    // per batch of results, not per event.
                    while let Some(Some(done)) = self.tasks.next().now_or_never() {
                        self.finished(done).await;
                    }
                }
                message = next_message(&mut self.conn) => self.received(message, drain_until.is_some()).await?,
                () = sleep_until(self.retry_at), if self.conn.is_none() && drain_until.is_none() => self.connect().await?,
                () = sleep_until(self.flush_at.unwrap_or(far)), if self.flush_at.is_some() => self.flush().await,
                () = sleep_until(self.next_extend), if self.conn.is_some() => self.extend().await,
            }
        }
    }

    /// Attaches (again); a refusal that retrying cannot fix ends the worker.
    async fn connect(&mut self) -> Result<(), Error> {
        let settings = &self.worker.settings;
        let attach = pb::Attach {
            consumer: self.worker.consumer.clone(),
            max_in_flight: settings.queue_capacity,
            max_batch: settings.max_batch,
            create_if_missing: settings.create_if_missing.clone(),
        };
        let attached = async {
            let mut stream = self.worker.client.consume(attach).await?;
            match tokio::time::timeout(ATTACH_TIMEOUT, stream.next()).await {
                Ok(Ok(Some(ConsumeMessage::Attached(info)))) => Ok((stream, info)),
                Ok(Err(e)) => Err(e),
                Ok(Ok(other)) => Err(Error::Protocol(format!("expected `attached` first, got {other:?}"))),
                Err(_) => Err(Error::from(tonic::Status::unavailable("no `attached` answer in time"))),
            }
        };
        match attached.await {
            Ok((stream, info)) => {
                let ms = info.config.map_or(0, |c| c.ack_deadline_ms);
                let ack_deadline = if ms == 0 { DEFAULT_ACK_DEADLINE } else { Duration::from_millis(ms) };
                self.session += 1;
                self.failures = 0;
                self.next_extend = Instant::now() + extend_period(ack_deadline);
                let sender = stream.sender();
                self.conn = Some(Conn { stream, sender, ack_deadline });
                if !self.acks.is_empty() {
                    self.flush_at = Some(Instant::now());
                }
                tracing::debug!(consumer = %self.worker.consumer, "attached");
                Ok(())
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(consumer = %self.worker.consumer, error = %e, "cannot attach; retrying");
                self.retry_at = Instant::now() + self.worker.settings.backoff.delay(self.failures);
                self.failures = self.failures.saturating_add(1);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn received(&mut self, message: Result<Option<ConsumeMessage>, Error>, draining: bool) -> Result<(), Error> {
        let lost = match message {
            Ok(Some(ConsumeMessage::Deliveries(deliveries))) => {
                let now = Instant::now();
                for d in &deliveries {
                    let id = d.event.as_ref().map(|e| e.id.clone()).unwrap_or_default();
                    self.held.insert(id, Held { session: self.session, extended_at: now });
                }
                if draining {
                    self.release(deliveries, false).await;
                } else {
                    self.queue.extend(deliveries);
                    self.sync_backlog();
                }
                return Ok(());
            }
            Ok(Some(ConsumeMessage::Drained)) => {
                self.drained = true;
                return Ok(());
            }
            Ok(Some(_)) => return Ok(()),
            Ok(None) => Error::from(tonic::Status::unavailable("the broker ended the consume stream")),
            Err(e) => e,
        };
        if !lost.is_transient() {
            return Err(lost);
        }
        tracing::warn!(consumer = %self.worker.consumer, error = %lost, "consume stream lost; reconnecting");
        self.conn = None;
        // The broker released every event of that connection; those not started will
        // come again. Running handlers go on: their acks are still welcome later.
        for d in self.queue.drain(..) {
            if let Some(e) = &d.event {
                self.held.remove(&e.id);
            }
        }
        self.sync_backlog();
        self.retry_at = Instant::now() + self.worker.settings.backoff.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        Ok(())
    }

    /// Starts handlers while there is room.
    fn dispatch(&mut self) {
        let want_events = self.worker.hooks.want_events();
        let mut started = 0;
        while self.tasks.len() < self.worker.settings.concurrency {
            let Some(d) = self.queue.pop_front() else { break };
            let event = d.event.unwrap_or_default();
            let (id, attempt) = (event.id.clone(), d.attempt);
            let copy = want_events.then(|| event.clone());
            let span = trace::process(&self.worker.consumer, &event, attempt);
            let delivery = Delivery { event, attempt, deadline: d.deadline };
            let handler = Arc::clone(&self.handler);
            self.tasks.push(Box::pin(async move {
                let start = Instant::now();
                // Inside the guarded future: a handler may also panic before its first await.
                let outcome = AssertUnwindSafe(async move { handler.handle(delivery).await })
                    .catch_unwind()
                    .instrument(span.clone())
                    .await
                    .unwrap_or_else(|_| Outcome::retry("handler panicked"));
                trace::processed(&span, &outcome);
                Done { id, attempt, outcome, elapsed: start.elapsed(), event: copy }
            }));
            started += 1;
        }
        if started > 0 {
            self.worker.counters.in_flight.fetch_add(started, Ordering::Relaxed);
            if let Some(m) = &self.metrics {
                m.in_flight.add(started as i64);
            }
            self.sync_backlog();
        }
    }

    async fn finished(&mut self, done: Done) {
        let counters = &self.worker.counters;
        counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.in_flight.dec();
            m.handle_seconds.observe(done.elapsed.as_secs_f64());
        }
        let current = self.held.remove(&done.id).is_some_and(|h| h.session == self.session) && self.conn.is_some();
        let hooks = &self.worker.hooks;
        let reason = match done.outcome {
            Outcome::Ack => {
                counters.processed.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.processed.inc();
                }
                if let (Some(hook), Some(event)) = (&hooks.on_success, &done.event) {
                    hook(event, done.attempt);
                }
                // Even from a lost connection: a late ack completes the event.
                self.acks.push(done.id);
                if self.acks.len() >= self.worker.settings.ack_batch {
                    self.flush().await;
                } else if self.flush_at.is_none() {
                    self.flush_at = Some(Instant::now() + self.worker.settings.ack_interval);
                }
                return;
            }
            Outcome::Retry { after, reason } => {
                counters.retried.fetch_add(1, Ordering::Relaxed);
                if let Some(conn) = self.conn.as_ref().filter(|_| current) {
                    let _ = conn.sender.nack(done.id, reason.clone(), after).await;
                }
                reason
            }
            Outcome::Term(reason) => {
                if let Some(conn) = self.conn.as_ref().filter(|_| current) {
                    let _ = conn.sender.term(done.id, reason.clone()).await;
                }
                reason
            }
        };
        counters.failed.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.failed.inc();
        }
        if let (Some(hook), Some(event)) = (&hooks.on_error, &done.event) {
            hook(event, &reason, done.attempt);
        }
    }

    /// Sends the waiting acks (kept for the next connection when there is none).
    async fn flush(&mut self) {
        self.flush_at = None;
        let Some(conn) = &self.conn else { return };
        if self.acks.is_empty() {
            return;
        }
        let acks = std::mem::take(&mut self.acks);
        let _ = conn.sender.ack(acks).await;
    }

    /// Moves the deadline of every event held past half its ack deadline: running
    /// handlers and those waiting for one (this worker will handle them).
    async fn extend(&mut self) {
        let Some(conn) = &self.conn else { return };
        let now = Instant::now();
        let half = conn.ack_deadline / 2;
        let mut ids = Vec::new();
        for (id, held) in &mut self.held {
            if held.session == self.session && now.duration_since(held.extended_at) >= half {
                held.extended_at = now;
                ids.push(id.clone());
            }
        }
        self.next_extend = now + extend_period(conn.ack_deadline);
        if !ids.is_empty() {
            let _ = conn.sender.extend(ids).await;
        }
    }

    /// Hands deliveries not started back to the broker: redelivered at once, no attempt
    /// counted. `drain`: this worker is stopping (it takes no more deliveries).
    async fn release(&mut self, deliveries: impl IntoIterator<Item = pb::Delivery>, drain: bool) {
        let ids: Vec<String> = deliveries
            .into_iter()
            .filter_map(|d| d.event.map(|e| e.id))
            .filter(|id| self.held.remove(id).is_some_and(|h| h.session == self.session))
            .collect();
        if let Some(conn) = &self.conn
            && (!ids.is_empty() || drain)
        {
            let _ = conn.sender.release(ids, drain).await;
        }
        self.sync_backlog();
    }

    /// Fails events whose handler is still running: redelivered after a short delay.
    async fn nack_ids(&mut self, ids: Vec<String>, reason: &str) {
        for id in ids {
            let current = self.held.remove(&id).is_some_and(|h| h.session == self.session);
            if let Some(conn) = self.conn.as_ref().filter(|_| current) {
                let _ = conn.sender.nack(id, reason.to_owned(), Some(RELEASE_DELAY)).await;
            }
        }
    }

    fn sync_backlog(&self) {
        self.worker.counters.backlog.store(self.queue.len() as u64, Ordering::Relaxed);
    }
}

/// How often held events are checked for extension: a quarter of the ack deadline, so
/// each is extended between half and three quarters of the way to its deadline.
fn extend_period(ack_deadline: Duration) -> Duration {
    (ack_deadline / 4).max(Duration::from_millis(5))
}
