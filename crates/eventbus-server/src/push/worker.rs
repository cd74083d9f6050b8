//! One push consumer on this instance: attached like a client, with room for
//! `max_concurrency × batch` events, so the engine hands it only what it can POST at
//! once; each request acks, retries or dead-letters the events it carried.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use eventbus_core::durable::{
    Attachment, ClientOptions, ConsumerClient, Delivery, DurableBackend, DurableError, PushConfig,
};
use prometheus::{Histogram, IntCounter, IntGauge};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Endpoints;
use super::owner::Owner;
use super::request::{self, Outcome};
use crate::metrics::{PUSH_CLASSES, PushMetrics};
use crate::spans::{PushSpan, Spans};

/// Delays between attempts to attach (the engine unreachable, the consumer not yet
/// visible here).
const ATTACH_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(10));
/// Most of a successful answer's body read (so its connection can be reused); a
/// longer body closes the connection instead.
const DRAIN_BYTES: usize = 64 * 1024;
/// Most of a refusal's body read, for the failure reason.
const REASON_BYTES: usize = 1024;

/// A push consumer's worker on this instance.
#[derive(Debug)]
pub(crate) struct Worker {
    consumer: String,
    push: PushConfig,
    url: reqwest::Url,
    /// The URL as logs show it (its query redacted).
    shown_url: String,
    /// The client its requests go through.
    client: reqwest::Client,
    /// The configured headers.
    extra: HeaderMap,
    /// Set when no request can be sent (the URL's host is a refused address): every
    /// attempt fails with it, and no endpoint answer is ever read.
    refused: Option<String>,
    timeout: Duration,
    spans: Spans,
    permits: Arc<Semaphore>,
    stop: CancellationToken,
    /// The endpoint's last request failed (logged once per run of failures).
    failing: AtomicBool,
    requests: [IntCounter; PUSH_CLASSES.len()],
    duration: Histogram,
    in_flight: IntGauge,
}

impl Worker {
    pub(crate) fn new(
        consumer: String,
        push: PushConfig,
        endpoints: Endpoints,
        metrics: PushMetrics,
        label: String,
        spans: Spans,
        stop: CancellationToken,
    ) -> Self {
        let mut refused = None;
        let shown_url = super::redacted_url(&push.url);
        let url = match reqwest::Url::parse(&push.url) {
            Ok(url) => url,
            Err(err) => {
                refused = Some(format!("push.url {shown_url:?}: {err}"));
                // Never sent to: `refused` fails every attempt first.
                reqwest::Url::from_directory_path("/").unwrap_or_else(|()| unreachable!("/ is a directory"))
            }
        };
        refused = refused.or_else(|| endpoints.reach.refuses(&url));
        let client = match endpoints.client_for(&url) {
            Ok(client) => client,
            Err(err) => {
                refused = refused.or_else(|| Some(format!("cannot build the push HTTP client: {err}")));
                endpoints.client.clone()
            }
        };
        let mut extra = HeaderMap::new();
        for (name, value) in &push.headers {
            match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value.as_bytes())) {
                (Ok(name), Ok(mut value)) => {
                    value.set_sensitive(true);
                    extra.append(name, value);
                }
                _ => refused = Some(format!("push.headers: {name:?} is not a valid header")),
            }
        }
        let requests = PUSH_CLASSES.map(|class| metrics.requests.with_label_values(&[label.as_str(), class]));
        Self {
            timeout: Duration::from_millis(push.timeout_ms),
            spans,
            permits: Arc::new(Semaphore::new(push.max_concurrency as usize)),
            duration: metrics.duration.with_label_values(&[&label]),
            in_flight: metrics.in_flight.with_label_values(&[&label]),
            requests,
            consumer,
            push,
            url,
            shown_url,
            client,
            extra,
            refused,
            stop,
            failing: AtomicBool::new(false),
        }
    }

    /// Attaches and serves until shutdown, attaching again whenever the attachment
    /// ends (the engine lost, the consumer redefined); detached while `owner` may not
    /// receive the consumer's events.
    pub(crate) async fn run(self: Arc<Self>, durable: Arc<dyn DurableBackend>, mut owner: Owner) {
        let mut retry = ATTACH_RETRY.0;
        let options = ClientOptions {
            max_in_flight: self.push.max_concurrency.saturating_mul(self.push.batch),
            max_batch: self.push.batch,
        };
        loop {
            if !owner.allowed(&self.stop).await {
                return;
            }
            let attached = tokio::select! {
                () = self.stop.cancelled() => return,
                attached = durable.attach(&self.consumer, options, None) => attached,
            };
            match attached {
                Ok(attachment) => {
                    retry = ATTACH_RETRY.0;
                    if self.serve(attachment, &mut owner).await == Served::Revoked {
                        continue;
                    }
                }
                Err(DurableError::UnknownConsumer(_)) => {
                    debug!(consumer = %self.consumer, "push consumer not found (yet, or any more)");
                }
                Err(err) => {
                    warn!(consumer = %self.consumer, %err, retry_in = ?retry, "cannot attach to the push consumer")
                }
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
            retry = (retry * 2).min(ATTACH_RETRY.1);
        }
    }

    /// POSTs what the engine hands over, at most `max_concurrency` requests at once,
    /// each carrying up to `push.batch` events: a request that waited for its turn
    /// takes along what arrived meanwhile. Ends when the attachment does, at shutdown,
    /// or when `owner` loses its rights.
    async fn serve(self: &Arc<Self>, attachment: Attachment, owner: &mut Owner) -> Served {
        let Attachment { mut deliveries, client, .. } = attachment;
        let client: Arc<dyn ConsumerClient> = Arc::from(client);
        let acks = Acks::start(Arc::clone(&client), self.push.max_concurrency as usize);
        let batch = self.push.batch as usize;
        let mut waiting: VecDeque<Delivery> = VecDeque::new();
        let mut served = Served::Stopped;
        loop {
            if waiting.is_empty() {
                let handed = tokio::select! {
                    biased;
                    () = self.stop.cancelled() => break,
                    () = owner.revoked() => {
                        served = Served::Revoked;
                        break;
                    }
                    handed = deliveries.recv() => handed,
                };
                let Some(handed) = handed else {
                    match client.closed_reason() {
                        Some(err) => warn!(consumer = %self.consumer, %err, "push consumer detached; attaching again"),
                        None => debug!(consumer = %self.consumer, "push consumer detached"),
                    }
                    return Served::Detached;
                };
                waiting.extend(handed);
                continue;
            }
            // Stopping wins over a free slot: nothing new is sent once the stop is asked.
            let permit = tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                () = owner.revoked() => {
                    served = Served::Revoked;
                    break;
                }
                permit = Arc::clone(&self.permits).acquire_owned() => permit,
            };
            let Ok(permit) = permit else { break };
            while waiting.len() < batch {
                match deliveries.try_recv() {
                    Ok(handed) => waiting.extend(handed),
                    Err(_) => break,
                }
            }
            let chunk: Vec<Delivery> = waiting.drain(..waiting.len().min(batch)).collect();
            tokio::spawn(Arc::clone(self).post(chunk, Arc::clone(&client), acks.clone(), permit));
        }
        // Shutdown or revoked: what was handed over and not sent goes back at once,
        // uncounted.
        deliveries.close();
        while let Ok(handed) = deliveries.try_recv() {
            waiting.extend(handed);
        }
        if !waiting.is_empty() {
            client.release(ids(waiting.iter()), true).await;
        }
        served
    }

    /// Resolves once no request is in flight.
    pub(crate) async fn idle(&self) {
        let _ = self.permits.acquire_many(self.push.max_concurrency).await;
    }

    async fn post(
        self: Arc<Self>,
        deliveries: Vec<Delivery>,
        client: Arc<dyn ConsumerClient>,
        acks: Acks,
        permit: OwnedSemaphorePermit,
    ) {
        let now = SystemTime::now();
        // The ack deadline covers the request: one that waited for its turn has it
        // moved before it is sent.
        if deliveries.iter().any(|d| d.deadline.duration_since(now).unwrap_or_default() < self.timeout) {
            client.extend(ids(deliveries.iter()), Duration::ZERO).await;
        }
        self.in_flight.inc();
        let started = Instant::now();
        let (class, outcome) = self.send(&deliveries, now).await;
        self.duration.observe(started.elapsed().as_secs_f64());
        self.in_flight.dec();
        if let Some(i) = PUSH_CLASSES.iter().position(|c| *c == class) {
            self.requests[i].inc();
        }
        self.settle(outcome, deliveries, client.as_ref(), acks, permit).await;
    }

    /// Sends one request; its answer class and outcome.
    async fn send(&self, deliveries: &[Delivery], now: SystemTime) -> (&'static str, Outcome) {
        if let Some(reason) = &self.refused {
            return ("error", Outcome::Retry { reason: reason.clone(), delay: None });
        }
        // One span per event (each in its own trace), ended with the request's answer.
        let spans: Vec<PushSpan> = match self.spans.enabled() {
            true => deliveries
                .iter()
                .filter_map(|d| self.spans.push(&self.consumer, &self.url, &d.event, d.attempt))
                .collect(),
            false => Vec::new(),
        };
        let (class, outcome, status) = self.request(deliveries, now).await;
        for span in spans {
            match (status, &outcome) {
                (Some(code), _) => span.end(Ok(code)),
                (None, Outcome::Retry { reason, .. }) => span.end(Err(reason)),
                (None, _) => span.end(Err(class)),
            }
        }
        (class, outcome)
    }

    /// Sends one request; its answer class, outcome and HTTP status when it had one.
    async fn request(&self, deliveries: &[Delivery], now: SystemTime) -> (&'static str, Outcome, Option<u16>) {
        let prepared = request::prepare(&self.consumer, &self.push, deliveries, now);
        let mut headers = self.extra.clone();
        headers.extend(prepared.headers);
        let sent =
            self.client.post(self.url.clone()).headers(headers).body(prepared.body).timeout(self.timeout).send().await;
        match sent {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after = request::retry_after(response.headers()).cloned();
                let limit = if response.status().is_success() { DRAIN_BYTES } else { REASON_BYTES };
                let mut body = Vec::new();
                while body.len() < limit {
                    match response.chunk().await {
                        Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                        // A body cut short changes nothing: the status has answered.
                        Ok(None) | Err(_) => break,
                    }
                }
                let outcome = request::classify(status, retry_after.as_ref(), &body, SystemTime::now());
                (request::class(status), outcome, Some(status))
            }
            Err(err) if err.is_timeout() => {
                let reason = format!("no answer within push.timeout_ms ({} ms)", self.push.timeout_ms);
                ("timeout", Outcome::Retry { reason, delay: None }, None)
            }
            Err(err) => (
                "error",
                Outcome::Retry {
                    // The URL stays out: its query may hold a credential.
                    reason: format!("cannot reach the endpoint: {}", eventbus_core::error_chain(&err.without_url())),
                    delay: None,
                },
                None,
            ),
        }
    }

    /// Acks, retries or dead-letters the events of one request.
    /// The request's slot (`permit`) is given back once its outcome is applied.
    async fn settle(
        &self,
        outcome: Outcome,
        deliveries: Vec<Delivery>,
        client: &dyn ConsumerClient,
        acks: Acks,
        permit: OwnedSemaphorePermit,
    ) {
        match outcome {
            Outcome::Ack => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!(consumer = %self.consumer, url = %self.shown_url, "push endpoint answers again");
                }
                acks.send(ids(deliveries.iter()), permit).await;
            }
            Outcome::Retry { reason, delay } => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    warn!(
                        consumer = %self.consumer, url = %self.shown_url, %reason,
                        "push endpoint failing: its events are retried on the consumer's backoff"
                    );
                }
                for d in deliveries {
                    client.nack(d.event.id.to_string(), reason.clone(), delay).await;
                }
            }
            Outcome::Reject { reason } => {
                debug!(consumer = %self.consumer, %reason, events = deliveries.len(), "push endpoint refused: dead-lettering");
                for d in deliveries {
                    client.term(d.event.id.to_string(), reason.clone()).await;
                }
            }
        }
    }
}

/// Why [`Worker::serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// The attachment ended (the engine lost, the consumer redefined or deleted).
    Detached,
    /// Shutdown.
    Stopped,
    /// The owner lost its rights: attach again once they are back.
    Revoked,
}

/// The acks of one attachment's requests, applied together: requests answered while
/// an ack call is under way go in the next one, so a store commit carries many. A
/// request's slot is given back once its ack is applied (a stopping worker waits for
/// its slots, so no answered event is redelivered after a graceful stop).
#[derive(Debug, Clone)]
struct Acks {
    tx: mpsc::Sender<(Vec<String>, OwnedSemaphorePermit)>,
}

impl Acks {
    fn start(client: Arc<dyn ConsumerClient>, capacity: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Vec<String>, OwnedSemaphorePermit)>(capacity.max(1));
        // Ends once every request of the attachment is settled (the senders dropped).
        tokio::spawn(async move {
            while let Some((mut ids, permit)) = rx.recv().await {
                let mut permits = vec![permit];
                while let Ok((more, permit)) = rx.try_recv() {
                    ids.extend(more);
                    permits.push(permit);
                }
                client.ack(ids).await;
                drop(permits);
            }
        });
        Self { tx }
    }

    async fn send(&self, ids: Vec<String>, permit: OwnedSemaphorePermit) {
        // The receiver lives while any sender does.
        let _ = self.tx.send((ids, permit)).await;
    }
}

fn ids<'a>(deliveries: impl Iterator<Item = &'a Delivery>) -> Vec<String> {
    deliveries.map(|d| d.event.id.to_string()).collect()
}
