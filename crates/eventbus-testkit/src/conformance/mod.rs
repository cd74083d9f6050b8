//! The checks every durable engine passes (docs/durable.md "Durable consumers
//! (at-least-once)"), written against the [`DurableBackend`] trait alone. An engine's
//! crate runs them on its engine: [`durable_conformance!`](crate::durable_conformance)
//! makes one test per check, [`every_check`] runs them all in turn on one setup (an
//! on-disk store, a Redis Cluster).
//!
//! Where the engines may answer differently by design, the check accepts both and names
//! the section "Mode differences" of docs/durable.md that explains why. Timing is only ever a lower
//! bound ("not before the delay"); every wait is on observable state, bounded by
//! [`DEADLINE`].

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::durable::*;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::{DEADLINE, within};

/// Timers in both engines work in whole milliseconds (Redis due times are epoch
/// milliseconds): a redelivery may come this much before the exact delay.
const GRANULARITY: Duration = Duration::from_millis(5);

/// A dead letter as the sink received it: (channel, payload, content type).
pub type Letter = (String, String, String);

/// An engine under test and what it needs to run.
pub struct Harness {
    engine: Box<dyn DurableBackend>,
    /// What the engine published through its [`DeadLetterSink`].
    letters: mpsc::Receiver<Letter>,
    /// Kept alive as long as the engine: its `redis-server`, what stops its tasks.
    _keep: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").finish_non_exhaustive()
    }
}

/// Engine settings every harness starts its engine with: a readable dead-letter encoding
/// ("consumer|attempts|reason;reason"), and a dead-letter sink that records.
pub fn options() -> (DurableOptions, DeadLetterSink, mpsc::Receiver<Letter>) {
    let options = DurableOptions {
        dedup_window: Duration::from_secs(120),
        dead_letter_encoder: Arc::new(|dl: &PublishedDeadLetter| {
            let reasons: Vec<&str> = dl.failures.iter().map(|f| f.reason.as_str()).collect();
            (Bytes::from(format!("{}|{}|{}", dl.consumer, dl.attempts, reasons.join(";"))), "text/plain".into())
        }),
        on_ack: None,
        min_free_disk_bytes: 0,
        max_captures_per_publish: 3,
        supervisor: eventbus_core::Supervisor::new(),
    };
    let (tx, rx) = mpsc::channel(64);
    let sink: DeadLetterSink = Arc::new(move |channel, payload: Bytes, content_type| {
        let tx = tx.clone();
        Box::pin(async move {
            let payload = String::from_utf8_lossy(&payload).into_owned();
            let _ = tx.send((channel, payload, content_type)).await;
            Ok(())
        })
    });
    (options, sink, rx)
}

pub const RETENTION: Retention = Retention { max_entries: 1_000, max_age_ms: 86_400_000 };

impl Harness {
    /// The harness of `engine`, started with [`options`]: `letters` is the receiver
    /// [`options`] gave with its sink, which the engine publishes dead letters to;
    /// `keep` lives as long as the engine.
    pub fn new(
        engine: Box<dyn DurableBackend>,
        letters: mpsc::Receiver<Letter>,
        keep: Vec<Box<dyn Any + Send>>,
    ) -> Self {
        Self { engine, letters, _keep: keep }
    }

    async fn create(&self, config: ConsumerConfig) -> ConsumerInfo {
        within(self.engine.create_consumer(config)).await.expect("create consumer")
    }

    /// Captures one event on `channel` with the given keys.
    async fn publish_keyed(
        &self,
        channel: &str,
        payload: &str,
        ordering: Option<&str>,
        idempotency: Option<&str>,
    ) -> (Arc<Event>, Captured) {
        let event = new_event(channel, payload);
        let captured = within(self.engine.capture(&event, ordering, idempotency)).await.expect("capture");
        (event, captured)
    }

    async fn publish(&self, channel: &str, payload: &str) -> Arc<Event> {
        self.publish_keyed(channel, payload, None, None).await.0
    }

    async fn info(&self, name: &str) -> ConsumerInfo {
        within(self.engine.get_consumer(name)).await.expect("get consumer")
    }

    /// Polls the consumer's state until `ok` holds.
    async fn wait_info(&self, name: &str, what: &str, ok: impl Fn(&ConsumerInfo) -> bool) -> ConsumerInfo {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let info = self.info(name).await;
            if ok(&info) {
                return info;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {info:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Acks `d`, the consumer's first event to complete, through `client`; returns the
    /// consumer's state once the ack counts, and the event's log entry, which must
    /// say completed after as many attempts as `d` was.
    async fn complete_first(&self, name: &str, client: &dyn ConsumerClient, d: &Delivery) -> (ConsumerInfo, LogEntry) {
        client.ack(vec![d.event.id.to_string()]).await;
        let info = self.wait_info(name, "the ack", |i| i.acked == 1).await;
        let log = self.log(name, None).await;
        assert_eq!(logged(&log), [d.event.id.to_string()]);
        let entry = log.into_iter().next().expect("one entry");
        assert_eq!((entry.status, entry.attempts), (LogStatus::Completed, d.attempt), "{entry:?}");
        (info, entry)
    }

    async fn attach(&self, name: &str) -> Attachment {
        within(self.engine.attach(name, ClientOptions::default(), None)).await.expect("attach")
    }

    /// The next dead letter the engine published.
    async fn letter(&mut self) -> Letter {
        within(self.letters.recv()).await.expect("dead-letter sink open")
    }

    /// Every log entry, in one page.
    async fn log(&self, name: &str, status: Option<LogStatus>) -> Vec<LogEntry> {
        let page = within(self.engine.log(name, status, 1_000, "")).await.expect("log");
        assert!(page.next_page_token.is_empty(), "one page holds the whole log");
        page.entries
    }
}

/// A fresh event, as the bus would hand it over.
fn new_event(channel: &str, payload: &str) -> Arc<Event> {
    Arc::new(Event::from_parts(
        eventbus_core::event::new_id().to_string(),
        channel.into(),
        SystemTime::now(),
        "conformance".into(),
        Bytes::from(payload.to_owned()),
        HashMap::from([("k".to_owned(), "v".to_owned())]),
        "text/plain".into(),
    ))
}

/// A consumer on `channels` with short, test-sized timings.
fn consumer(name: &str, channels: &[&str]) -> ConsumerConfig {
    ConsumerConfig {
        ack_deadline_ms: 30_000,
        backoff: Backoff { initial_ms: 200, multiplier: 2.0, max_ms: 1_000, kind: BackoffKind::Exponential },
        ..ConsumerConfig::new(name, channels.iter().map(|c| c.to_string()).collect())
    }
}

/// How many consumers stored a capture. The Redis engine also fans the event out in
/// the same script and says so (docs/durable.md "Mode differences": `Forwarded`).
fn stored(captured: &Captured) -> usize {
    match captured {
        Captured::Stored(n) => *n,
        Captured::Forwarded { consumers, .. } => *consumers,
        Captured::Duplicate(id) => panic!("not a duplicate of {id}"),
    }
}

/// Exactly `n` deliveries, across batches.
async fn take(rx: &mut mpsc::Receiver<Vec<Delivery>>, n: usize) -> Vec<Delivery> {
    let mut out = Vec::new();
    while out.len() < n {
        let batch = within(rx.recv()).await.expect("deliveries stream open");
        assert!(!batch.is_empty(), "batches are never empty");
        out.extend(batch);
    }
    assert_eq!(out.len(), n, "more deliveries than expected: {out:?}");
    out
}

/// The one next delivery.
async fn one(rx: &mut mpsc::Receiver<Vec<Delivery>>) -> Delivery {
    take(rx, 1).await.remove(0)
}

fn payload(d: &Delivery) -> String {
    String::from_utf8(d.event.payload.to_vec()).unwrap()
}

fn ids(d: &[Delivery]) -> Vec<String> {
    d.iter().map(|d| d.event.id.to_string()).collect()
}

/// The event ids of log entries.
fn logged(entries: &[LogEntry]) -> Vec<String> {
    entries.iter().map(|e| e.event_id.clone()).collect()
}

fn reasons(entry: &LogEntry) -> Vec<&str> {
    entry.failures.iter().map(|f| f.reason.as_str()).collect()
}

/// Asserts nothing is waiting in the deliveries stream right now.
fn assert_nothing_delivered(rx: &mut mpsc::Receiver<Vec<Delivery>>, why: &str) {
    match rx.try_recv() {
        Err(mpsc::error::TryRecvError::Empty) => {}
        other => panic!("{why}: got {other:?}"),
    }
}

/// Waits for the deliveries stream to end, with nothing more delivered.
async fn assert_ends(rx: &mut mpsc::Receiver<Vec<Delivery>>, when: &str) {
    if let Some(batch) = within(rx.recv()).await {
        panic!("a delivery {when}: {batch:?}");
    }
}

mod delivery;
mod operations;

pub use delivery::*;
pub use operations::*;

/// Runs every check in turn, each on a harness `make` gives for it (told the check's
/// name, for a key prefix or a directory of its own).
pub async fn every_check<F, Fut>(mut make: F)
where
    F: FnMut(&'static str) -> Fut,
    Fut: Future<Output = Harness>,
{
    crate::__with_checks! { __every_check(make) }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __every_check {
    (($make:ident) $($check:ident)*) => {$(
        eprintln!("conformance: {}", stringify!($check));
        $crate::conformance::$check(&mut $make(stringify!($check)).await).await;
    )*};
}

/// Calls `$callback!((args) check check ...)` with every check's name.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_checks {
    ($callback:ident($($args:tt)*)) => {
        $crate::$callback! { ($($args)*) create capture deliver ack nack_with_delay deadline_expiry backoff max_attempts_dead_letter term dead_letter_of_a_sixteen_token_channel ordering_keys idempotency log_paging delete_while_attached disconnect late_ack extend competing_clients declare detach_all ack_by_another_client list_pending linear_backoff redrive pause_resume exclusive max_pending dropped_capture_callers release too_many_captures}
    };
}

/// One `#[tokio::test]` (multi-threaded runtime) per check, named after it, each on the
/// harness `$make` gives: an expression of type `impl Future<Output = Option<Harness>>`,
/// `None` skipping the test (no `redis-server` to start, and none required).
#[macro_export]
macro_rules! durable_conformance {
    ($make:expr) => {
        $crate::__with_checks! { __conformance_tests($make) }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (($make:expr) $($check:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let Some(mut harness) = $make.await else { return };
            $crate::conformance::$check(&mut harness).await;
        }
    )*};
}
