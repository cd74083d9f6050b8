//! One conformance suite for both durable engines (docs/durable.md "Durable consumers
//! (at-least-once)"), written against the [`DurableBackend`] trait alone: every check
//! runs on the embedded engine (in-memory redb store, on-disk fjall store) as `embedded_<check>` and on the
//! Redis Streams engine (a private `redis-server` per test) as `redis_<check>`.
//!
//! Where the engines may answer differently by design, the check accepts both and names
//! the section "Mode differences" of docs/durable.md that explains why. Timing is only ever a lower
//! bound ("not before the delay"); every wait is on observable state, bounded by
//! [`DEADLINE`].

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::redis_cluster::RedisCluster;
use common::redis_server::RedisProc;
use common::{DEADLINE, within};
use eventbus_core::Event;
use eventbus_core::durable::*;
use eventbus_durable::{Durable, FjallStore, Fsync, RedbStore};
use eventbus_redis::{RedisDurable, RedisDurableSettings};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Timers in both engines work in whole milliseconds (Redis due times are epoch
/// milliseconds): a redelivery may come this much before the exact delay.
const GRANULARITY: Duration = Duration::from_millis(5);

/// A dead letter as the sink received it: (channel, payload, content type).
type Letter = (String, String, String);

/// A fresh engine and what it needs to run.
struct Harness {
    engine: Box<dyn DurableBackend>,
    /// What the engine published through its [`DeadLetterSink`].
    letters: mpsc::Receiver<Letter>,
    /// Stops the Redis engine's background tasks; keeps its `redis-server` alive.
    _redis: Option<(RedisProc, tokio_util::sync::DropGuard)>,
    /// Stops the engine's background tasks on a cluster.
    _stop: Option<tokio_util::sync::DropGuard>,
}

/// Engine settings shared by both modes: a readable dead-letter encoding
/// ("consumer|attempts|reason;reason"), and a dead-letter sink that records.
fn options() -> (DurableOptions, DeadLetterSink, mpsc::Receiver<Letter>) {
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

const RETENTION: Retention = Retention { max_entries: 1_000, max_age_ms: 86_400_000 };

/// The Redis engine's settings, its keys under `prefix`.
fn redis_settings(prefix: &str) -> RedisDurableSettings {
    RedisDurableSettings {
        prefix: prefix.into(),
        instance_id: "conformance-1".into(),
        retention: RETENTION,
        envelope: eventbus_redis::Envelope::Binary,
        min_replicas_acked: 0,
        replica_ack_timeout: std::time::Duration::from_secs(1),
        history: Default::default(),
    }
}

impl Harness {
    /// The embedded engine on an in-memory redb store.
    fn embedded() -> Self {
        let store = RedbStore::open(Path::new(""), Fsync::Always, RETENTION).expect("in-memory store");
        let (options, sink, letters) = options();
        let engine = Durable::start(Arc::new(store), options).expect("embedded engine");
        engine.set_dead_letter_sink(sink);
        Self { engine: Box::new(engine), letters, _redis: None, _stop: None }
    }

    /// The embedded engine on its on-disk fjall store (commits go through the writer
    /// and sync threads, unlike the in-memory store's inline ones).
    fn embedded_on_disk(dir: &Path) -> Self {
        let store = FjallStore::open(dir, Fsync::Always, RETENTION).expect("on-disk store");
        let (options, sink, letters) = options();
        let engine = Durable::start(Arc::new(store), options).expect("embedded engine");
        engine.set_dead_letter_sink(sink);
        Self { engine: Box::new(engine), letters, _redis: None, _stop: None }
    }

    /// The Redis engine on a private redis-server; None when there is none to start
    /// (see `common::redis_server`).
    async fn redis() -> Option<Self> {
        let redis = RedisProc::start().await?;
        let client = redis::Client::open(redis.url()).expect("redis url");
        let settings = redis_settings("conformance");
        let (options, sink, letters) = options();
        let stop = CancellationToken::new();
        let engine = RedisDurable::start(client, settings, options, stop.clone()).expect("redis engine");
        engine.set_dead_letter_sink(sink);
        Some(Self { engine: Box::new(engine), letters, _redis: Some((redis, stop.drop_guard())), _stop: None })
    }

    /// The Redis engine on a shared Redis Cluster, its keys under a prefix of its own.
    fn redis_cluster(cluster: &RedisCluster, prefix: &str) -> Self {
        let mut config = eventbus_server::config::Settings::default();
        config.eventbus.redis.cluster_nodes = cluster.seeds();
        config.eventbus.redis.prefix = format!("conformance-{prefix}");
        let redis = config.redis_settings();
        let settings = redis_settings(&redis.prefix);
        let (options, sink, letters) = options();
        let stop = CancellationToken::new();
        let engine =
            RedisDurable::start_cluster(&redis, settings, options, stop.clone()).expect("redis cluster engine");
        engine.set_dead_letter_sink(sink);
        Self { engine: Box::new(engine), letters, _redis: None, _stop: Some(stop.drop_guard()) }
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

// ---- the checks ----

async fn create(h: &mut Harness) {
    // The owner (docs/security.md) is part of the definition and kept with it.
    let config = ConsumerConfig { max_attempts: 3, owner: "team-billing".into(), ..consumer("billing", &["orders.>"]) };
    let info = h.create(config.clone()).await;
    assert_eq!(info.config, config, "the definition is kept as given");
    assert_eq!(h.info("billing").await.config.owner, "team-billing");
    assert_eq!((info.pending, info.in_flight, info.clients), (0, 0, 0));
    assert_eq!((info.acked, info.dead_lettered, info.redelivered), (0, 0, 0));
    // Identical again: idempotent, same answer.
    assert_eq!(h.create(config.clone()).await, info);
    // Different: refused, and the first definition stays.
    let other = ConsumerConfig { max_attempts: 9, ..config.clone() };
    let refused = within(h.engine.create_consumer(other)).await;
    assert!(matches!(refused, Err(DurableError::AlreadyExists { ref name, .. }) if name == "billing"), "{refused:?}");
    // The message says what differs, and nothing else.
    let message = refused.unwrap_err().to_string();
    assert!(message.ends_with("max_attempts 3, asked 9"), "{message}");
    assert_eq!(h.info("billing").await.config, config);
    // Invalid: refused before anything is stored.
    let bad = ConsumerConfig { ack_deadline_ms: 0, ..consumer("bad", &["x"]) };
    let refused = within(h.engine.create_consumer(bad)).await;
    assert!(matches!(refused, Err(DurableError::InvalidConfig(_))), "{refused:?}");
    // Unknown names.
    let missing = within(h.engine.get_consumer("nope")).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(ref n)) if n == "nope"), "{missing:?}");
    let missing = within(h.engine.attach("nope", ClientOptions::default(), None)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
    // create_if_missing on attach; an empty name takes the attached one.
    let made = within(h.engine.attach("audit", ClientOptions::default(), Some(consumer("", &["users.*"]))))
        .await
        .expect("attach with create_if_missing");
    assert_eq!(made.info.config.name, "audit");
    assert_eq!(made.info.clients, 1, "the attaching client counts");
    let mismatch = within(h.engine.attach("x", ClientOptions::default(), Some(consumer("y", &["a"])))).await;
    assert!(matches!(mismatch, Err(DurableError::InvalidConfig(ConfigError::NameMismatch { .. }))), "{mismatch:?}");
    let listed = within(h.engine.list_consumers()).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|i| i.config.name.as_str()).collect();
    assert_eq!(names, ["audit", "billing"], "sorted by name, the refused ones absent");
}

async fn capture(h: &mut Harness) {
    h.create(consumer("all-orders", &["orders.>"])).await;
    h.create(consumer("created", &["orders.created"])).await;
    h.create(consumer("users", &["users.*"])).await;
    assert_eq!(stored(&h.publish_keyed("orders.created", "1", None, None).await.1), 2);
    assert_eq!(stored(&h.publish_keyed("orders.paid", "2", None, None).await.1), 1);
    assert_eq!(stored(&h.publish_keyed("billing.run", "3", None, None).await.1), 0);
    // A batch is answered in order, one answer per event.
    let events: Vec<Arc<Event>> = ["orders.x.y", "users.new"].iter().map(|c| new_event(c, "batch")).collect();
    let batch: Vec<CaptureRequest<'_>> =
        events.iter().map(|event| CaptureRequest { event, ordering_key: None, idempotency_key: None }).collect();
    let answers = within(h.engine.capture_many(&batch)).await;
    let counts: Vec<usize> = answers.iter().map(|a| stored(a.as_ref().expect("captured"))).collect();
    assert_eq!(counts, [1, 1]);
    assert_eq!(h.info("all-orders").await.pending, 3);
    assert_eq!(h.info("created").await.pending, 1);
    assert_eq!(h.info("users").await.pending, 1);
}

async fn deliver(h: &mut Harness) {
    h.create(consumer("inbox", &["orders.>"])).await;
    let sent = h.publish("orders.created", "hello").await;
    let before = SystemTime::now();
    let mut a = h.attach("inbox").await;
    let d = one(&mut a.deliveries).await;
    assert_eq!(d.attempt, 1, "attempts are 1-based");
    let e = &d.event;
    assert_eq!((&e.id, &e.channel, &e.payload), (&sent.id, &sent.channel, &sent.payload));
    assert_eq!((&e.metadata, &e.content_type, &e.source), (&sent.metadata, &sent.content_type, &sent.source));
    assert!(d.deadline > before, "the deadline lies ahead");
    assert!(d.deadline <= SystemTime::now() + Duration::from_millis(30_000) + GRANULARITY, "deadline = ack deadline");
    // The attach answer counts the event once, pending or already in flight: the
    // engines take it at different moments (docs/durable.md "Mode differences").
    let i = &a.info;
    assert_eq!((i.config.name.as_str(), i.clients, i.pending + i.in_flight), ("inbox", 1, 1), "{i:?}");
    let info = h.wait_info("inbox", "the delivery to be in flight", |i| i.in_flight == 1).await;
    assert_eq!((info.pending, info.clients), (0, 1));
    // Published while attached: pushed too.
    h.publish("orders.paid", "second").await;
    assert_eq!(payload(&one(&mut a.deliveries).await), "second");
}

async fn ack(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "first").await;
    let first = one(&mut a.deliveries).await;
    a.client.ack(vec![first.event.id.to_string()]).await;
    a.client.ack(vec![first.event.id.to_string()]).await; // a second ack is a no-op
    a.client.ack(vec!["not-an-event".into()]).await; // unknown ids are ignored
    // Failing a finished event does nothing (a zero delay would bring it straight back).
    a.client.nack(first.event.id.to_string(), "too late".into(), Some(Duration::ZERO)).await;
    let info = h.wait_info("inbox", "the ack", |i| i.acked == 1).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0), "nothing left to redeliver");
    // Well past the first one's ack deadline, the only delivery is the next event.
    h.publish("jobs", "second").await;
    let second = one(&mut a.deliveries).await;
    assert_eq!((payload(&second), second.attempt), ("second".into(), 1));
    a.client.ack(vec![second.event.id.to_string()]).await;
    h.wait_info("inbox", "the second ack", |i| i.acked == 2).await;
    assert_nothing_delivered(&mut a.deliveries, "an acked event is never redelivered");
    let log = h.log("inbox", None).await;
    assert_eq!(logged(&log), [first.event.id.to_string(), second.event.id.to_string()]);
    for entry in &log {
        assert_eq!((entry.status, entry.attempts, entry.channel.as_str()), (LogStatus::Completed, 1, "jobs"));
        assert!(entry.failures.is_empty());
        assert!(entry.first_delivered_ms.is_some_and(|ms| ms <= entry.finished_ms), "{entry:?}");
    }
}

async fn nack_with_delay(h: &mut Harness) {
    // A backoff far beyond DEADLINE: only the nack's own delay can bring it back in time.
    let backoff = Backoff { initial_ms: 60_000, multiplier: 2.0, max_ms: 60_000, kind: BackoffKind::Exponential };
    h.create(ConsumerConfig { backoff, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let first = one(&mut a.deliveries).await;
    let delay = Duration::from_millis(300);
    let nacked = Instant::now();
    a.client.nack(first.event.id.to_string(), "try later".into(), Some(delay)).await;
    let again = one(&mut a.deliveries).await;
    assert!(nacked.elapsed() + GRANULARITY >= delay, "redelivered after {:?}, before the delay", nacked.elapsed());
    assert_eq!((&again.event.id, again.attempt), (&first.event.id, 2));
    let (info, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!((info.redelivered, reasons(&entry)), (1, vec!["try later"]));
}

async fn deadline_expiry(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "slow").await;
    let first = one(&mut a.deliveries).await;
    let delivered = Instant::now();
    // Not acked: the deadline passes, then the backoff (200 ms), then it is back.
    let again = one(&mut a.deliveries).await;
    assert!(delivered.elapsed() + GRANULARITY >= Duration::from_millis(300), "back before its deadline");
    assert_eq!((&again.event.id, again.attempt), (&first.event.id, 2));
    let (info, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!((info.redelivered, reasons(&entry)), (1, vec![REASON_DEADLINE]));
}

async fn backoff(h: &mut Harness) {
    // 200 ms, then 400 ms: a second wait at least 400 ms shows the multiplier applies.
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let mut d = one(&mut a.deliveries).await;
    for (attempt, wait_ms) in [(1, 200), (2, 400)] {
        assert_eq!(d.attempt, attempt);
        let nacked = Instant::now();
        a.client.nack(d.event.id.to_string(), format!("boom {attempt}"), None).await;
        d = one(&mut a.deliveries).await;
        let waited = nacked.elapsed();
        assert!(waited + GRANULARITY >= Duration::from_millis(wait_ms), "attempt {attempt}: back after {waited:?}");
    }
    assert_eq!(d.attempt, 3);
    let (info, entry) = h.complete_first("inbox", &*a.client, &d).await;
    assert_eq!((info.redelivered, reasons(&entry)), (2, vec!["boom 1", "boom 2"]));
}

async fn max_attempts_dead_letter(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 2, ..consumer("inbox", &["jobs.>"]) }).await;
    let mut a = h.attach("inbox").await;
    let sent = h.publish("jobs.run", "x").await;
    for attempt in 1..=2 {
        let d = one(&mut a.deliveries).await;
        assert_eq!((&d.event.id, d.attempt), (&sent.id, attempt));
        a.client.nack(d.event.id.to_string(), format!("boom {attempt}"), None).await;
    }
    let letter = h.letter().await;
    assert_eq!(letter, ("dlq.jobs.run".into(), "inbox|2|boom 1;boom 2".into(), "text/plain".into()));
    let info = h.wait_info("inbox", "the dead letter to be counted", |i| i.dead_lettered == 1).await;
    assert_eq!((info.pending, info.in_flight, info.acked, info.redelivered), (0, 0, 0, 1));
    let log = h.log("inbox", Some(LogStatus::DeadLettered)).await;
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].event_id.as_str(), log[0].attempts), (&*sent.id, 2));
    assert_eq!(reasons(&log[0]), ["boom 1", "boom 2"]);
    assert!(h.log("inbox", Some(LogStatus::Completed)).await.is_empty());
    assert_nothing_delivered(&mut a.deliveries, "a dead letter is not redelivered");
}

async fn term(h: &mut Harness) {
    // A backoff beyond DEADLINE: a term that merely failed the attempt would never
    // produce a letter in time.
    let backoff = Backoff { initial_ms: 60_000, multiplier: 2.0, max_ms: 60_000, kind: BackoffKind::Exponential };
    let config =
        ConsumerConfig { backoff, dead_letter_channel: Some("dead.jobs".into()), ..consumer("inbox", &["jobs"]) };
    h.create(config).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "one").await;
    h.publish("jobs", "two").await;
    let got = take(&mut a.deliveries, 2).await;
    a.client.term(got[0].event.id.to_string(), "bad input".into()).await;
    assert_eq!(h.letter().await, ("dead.jobs".into(), "inbox|1|bad input".into(), "text/plain".into()));
    a.client.term(got[1].event.id.to_string(), String::new()).await;
    assert_eq!(h.letter().await, ("dead.jobs".into(), format!("inbox|1|{REASON_TERM}"), "text/plain".into()));
    let info = h.wait_info("inbox", "both dead letters counted", |i| i.dead_lettered == 2).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
    let log = h.log("inbox", None).await;
    assert!(log.iter().all(|e| e.status == LogStatus::DeadLettered && e.attempts == 1), "{log:?}");
}

/// docs/durable.md "Dead letters": a channel too long for the `dlq.` prefix (16 tokens) gets the
/// documented shortened dead-letter channel, in both engines.
async fn dead_letter_of_a_sixteen_token_channel(h: &mut Harness) {
    let channel = (1..=16).map(|i| format!("t{i}")).collect::<Vec<_>>().join(".");
    h.create(consumer("deep", &["t1.>"])).await;
    let mut a = h.attach("deep").await;
    h.publish(&channel, "x").await;
    let got = one(&mut a.deliveries).await;
    a.client.term(got.event.id.to_string(), "too deep".into()).await;
    let (letter_channel, body, _) = h.letter().await;
    assert_eq!(letter_channel, eventbus_core::durable::default_dead_letter_channel(&channel));
    assert!(eventbus_core::name::validate_channel(&letter_channel).is_ok(), "{letter_channel}");
    assert!(letter_channel.starts_with("dlq.t1."), "{letter_channel}");
    assert_eq!(body, "deep|1|too deep");
}

async fn ordering_keys(h: &mut Harness) {
    h.create(consumer("inbox", &["orders"])).await;
    let a1 = h.publish_keyed("orders", "a1", Some("a"), None).await.0;
    let a2 = h.publish_keyed("orders", "a2", Some("a"), None).await.0;
    let a3 = h.publish_keyed("orders", "a3", Some("a"), None).await.0;
    let b1 = h.publish_keyed("orders", "b1", Some("b"), None).await.0;
    let mut a = h.attach("inbox").await;
    // The first of each key; "b" is not held up by "a".
    let mut first = take(&mut a.deliveries, 2).await;
    first.sort_by_key(payload);
    assert_eq!(ids(&first), [a1.id.to_string(), b1.id.to_string()]);
    // Acking b1 frees nothing of "a": a2 still waits behind a1.
    a.client.ack(vec![b1.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack of b1", |i| i.acked == 1).await;
    assert_eq!((info.in_flight, info.pending), (1, 2), "a2 and a3 wait behind their key");
    assert_nothing_delivered(&mut a.deliveries, "a2 before a1 is finished");
    // A nack does not let a2 overtake a1 either.
    a.client.nack(a1.id.to_string(), "again".into(), None).await;
    let again = one(&mut a.deliveries).await;
    assert_eq!((&again.event.id, again.attempt), (&a1.id, 2), "a1 again before a2");
    a.client.ack(vec![a1.id.to_string()]).await;
    let next = one(&mut a.deliveries).await;
    assert_eq!((&next.event.id, next.attempt), (&a2.id, 1));
    // A dead letter frees its key too.
    a.client.term(a2.id.to_string(), "bad".into()).await;
    let last = one(&mut a.deliveries).await;
    assert_eq!((&last.event.id, last.attempt), (&a3.id, 1));
}

async fn idempotency(h: &mut Harness) {
    h.create(consumer("inbox", &["orders"])).await;
    let (original, captured) = h.publish_keyed("orders", "first", None, Some("order-1")).await;
    assert_eq!(stored(&captured), 1);
    let (_, again) = h.publish_keyed("orders", "second", None, Some("order-1")).await;
    assert_eq!(again, Captured::Duplicate(original.id.to_string()));
    // Keys are global, not per channel, and remembered with no consumer matching.
    let (_, elsewhere) = h.publish_keyed("users", "third", None, Some("order-1")).await;
    assert_eq!(elsewhere, Captured::Duplicate(original.id.to_string()));
    let (unmatched, captured) = h.publish_keyed("users", "fourth", None, Some("user-1")).await;
    assert_eq!(stored(&captured), 0);
    let (_, again) = h.publish_keyed("users", "fifth", None, Some("user-1")).await;
    assert_eq!(again, Captured::Duplicate(unmatched.id.to_string()));
    // Within one batch too.
    let events: Vec<Arc<Event>> = (0..2).map(|_| new_event("orders", "batch")).collect();
    let batch: Vec<CaptureRequest<'_>> = events
        .iter()
        .map(|event| CaptureRequest { event, ordering_key: None, idempotency_key: Some("order-2") })
        .collect();
    let answers: Vec<Captured> =
        within(h.engine.capture_many(&batch)).await.into_iter().map(|a| a.expect("captured")).collect();
    assert_eq!(stored(&answers[0]), 1);
    assert_eq!(answers[1], Captured::Duplicate(events[0].id.to_string()));
    assert_eq!(h.info("inbox").await.pending, 2, "one stored per key");
    let mut a = h.attach("inbox").await;
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(ids(&got), [original.id.to_string(), events[0].id.to_string()]);
}

async fn log_paging(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    // Finished one at a time, so the log's order is known: every third dead-lettered.
    let mut finished = Vec::new();
    for i in 0..7u64 {
        let sent = h.publish("jobs", &format!("{i}")).await;
        let d = one(&mut a.deliveries).await;
        assert_eq!(d.event.id, sent.id);
        if i % 3 == 2 {
            a.client.term(sent.id.to_string(), "no".into()).await;
            h.letter().await;
        } else {
            a.client.ack(vec![sent.id.to_string()]).await;
        }
        let done = i + 1;
        h.wait_info("inbox", "the event to finish", |info| info.acked + info.dead_lettered == done).await;
        finished.push(sent.id.to_string());
    }
    let mut walked = Vec::new();
    let mut token = String::new();
    loop {
        let page = within(h.engine.log("inbox", None, 3, &token)).await.expect("log page");
        assert!(page.entries.len() <= 3, "a page holds at most `limit`");
        walked.extend(page.entries);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(logged(&walked), finished, "every entry once, in order");
    assert_eq!(walked, h.log("inbox", None).await, "pages add up to the whole log");
    let dead = h.log("inbox", Some(LogStatus::DeadLettered)).await;
    assert_eq!(logged(&dead), [finished[2].clone(), finished[5].clone()]);
    let page = within(h.engine.log("inbox", Some(LogStatus::Completed), 2, "")).await.expect("filtered page");
    assert_eq!(logged(&page.entries), finished[..2]);
    let rest =
        within(h.engine.log("inbox", Some(LogStatus::Completed), 10, &page.next_page_token)).await.expect("rest");
    let rest: Vec<String> = rest.entries.into_iter().map(|e| e.event_id).collect();
    assert_eq!(rest, [finished[3].clone(), finished[4].clone(), finished[6].clone()], "the filter holds across pages");
    let bad = within(h.engine.log("inbox", None, 3, "not a token")).await;
    assert!(matches!(bad, Err(DurableError::InvalidArgument { field: "page_token", .. })), "{bad:?}");
    let missing = within(h.engine.log("nope", None, 3, "")).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

async fn delete_while_attached(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "held").await;
    one(&mut a.deliveries).await;
    within(h.engine.delete_consumer("inbox")).await.expect("delete");
    // The attached client's stream ends (normally: nothing went wrong).
    assert_ends(&mut a.deliveries, "after the delete").await;
    assert!(a.client.closed_reason().is_none(), "a delete is a normal end");
    let gone = within(h.engine.get_consumer("inbox")).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    let gone = within(h.engine.attach("inbox", ClientOptions::default(), None)).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    let gone = within(h.engine.delete_consumer("inbox")).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    assert!(within(h.engine.list_consumers()).await.expect("list").is_empty());
    assert_eq!(stored(&h.publish_keyed("jobs", "after", None, None).await.1), 0, "nothing captures for it");
    // The name is free again, and starts empty.
    let fresh = h.create(consumer("inbox", &["jobs"])).await;
    assert_eq!((fresh.pending, fresh.in_flight, fresh.acked), (0, 0, 0));
}

async fn disconnect(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut first = h.attach("inbox").await;
    let sent = h.publish("jobs", "x").await;
    assert_eq!(one(&mut first.deliveries).await.attempt, 1);
    let mut second = h.attach("inbox").await;
    h.wait_info("inbox", "two clients", |i| i.clients == 2).await;
    drop(first);
    let d = one(&mut second.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&sent.id, 2), "released to the other client");
    let (info, entry) = h.complete_first("inbox", &*second.client, &d).await;
    assert_eq!((info.clients, info.redelivered, reasons(&entry)), (1, 1, vec![REASON_DISCONNECT]));
}

async fn late_ack(h: &mut Harness) {
    // An ack while the event waits for its redelivery completes it (docs/durable.md "Durable
    // consumers (at-least-once)": "also a late ack").
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let d = one(&mut a.deliveries).await;
    a.client.nack(d.event.id.to_string(), "later".into(), Some(Duration::from_secs(60))).await;
    h.wait_info("inbox", "the nack", |i| i.in_flight == 0 && i.pending == 1).await;
    let (info, entry) = h.complete_first("inbox", &*a.client, &d).await;
    assert_eq!((info.pending, info.in_flight), (0, 0), "nothing left to redeliver");
    assert_eq!(reasons(&entry), ["later"]);
}

async fn extend(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let d = one(&mut a.deliveries).await;
    // Without the extension it would be back after 300 + 200 ms.
    let extended = Instant::now();
    a.client.extend(vec![d.event.id.to_string()], Duration::from_millis(700)).await;
    let again = one(&mut a.deliveries).await;
    let waited = extended.elapsed();
    assert!(waited + GRANULARITY >= Duration::from_millis(700 + 200), "back after {waited:?}: extension ignored");
    assert_eq!((&again.event.id, again.attempt), (&d.event.id, 2));
    let (_, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!(reasons(&entry), [REASON_DEADLINE]);
}

async fn competing_clients(h: &mut Harness) {
    h.create(ConsumerConfig { max_in_flight: 3, ..consumer("inbox", &["jobs"]) }).await;
    let options = ClientOptions { max_in_flight: 2, max_batch: 1 };
    let mut a = within(h.engine.attach("inbox", options, None)).await.expect("attach");
    let mut b = h.attach("inbox").await;
    for i in 0..10 {
        h.publish("jobs", &format!("{i}")).await;
    }
    // Each holds at most its max_in_flight (the client's 2, the consumer's 3).
    let (got_a, got_b) = (take(&mut a.deliveries, 2).await, take(&mut b.deliveries, 3).await);
    // (`take` reads batch by batch: with max_batch 1 it would have failed on a bigger one.)
    let info = h.wait_info("inbox", "five in flight", |i| i.in_flight == 5).await;
    assert_eq!((info.pending, info.clients), (5, 2));
    assert_nothing_delivered(&mut a.deliveries, "a client beyond its max_in_flight");
    assert_nothing_delivered(&mut b.deliveries, "a client beyond the consumer's max_in_flight");
    let mut seen: Vec<String> = got_a.iter().chain(&got_b).map(payload).collect();
    // Acks make room; every event reaches exactly one client once.
    a.client.ack(ids(&got_a)).await;
    b.client.ack(ids(&got_b)).await;
    while seen.len() < 10 {
        tokio::select! {
            Some(batch) = a.deliveries.recv() => {
                assert_eq!(batch.len(), 1, "max_batch");
                seen.extend(batch.iter().map(payload));
                a.client.ack(ids(&batch)).await;
            }
            Some(batch) = b.deliveries.recv() => {
                seen.extend(batch.iter().map(payload));
                b.client.ack(ids(&batch)).await;
            }
            () = tokio::time::sleep(DEADLINE) => panic!("only {} of 10 delivered", seen.len()),
        }
    }
    seen.sort_by_key(|p| p.parse::<u32>().unwrap());
    assert_eq!(seen, (0..10).map(|i| i.to_string()).collect::<Vec<_>>(), "each event once");
    let info = h.wait_info("inbox", "every ack", |i| i.acked == 10).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
}

async fn declare(h: &mut Harness) {
    let config = consumer("inbox", &["jobs"]);
    within(h.engine.declare_consumer(config.clone())).await.expect("declare");
    h.publish("jobs", "1").await;
    h.publish("jobs", "2").await;
    // Declared again with another definition: replaced, what it holds is kept.
    let changed = ConsumerConfig { max_attempts: 9, ..config.clone() };
    within(h.engine.declare_consumer(changed.clone())).await.expect("declare again");
    let info = h.info("inbox").await;
    assert_eq!((info.config.clone(), info.pending), (changed.clone(), 2));
    let refused = within(h.engine.create_consumer(config)).await;
    assert!(matches!(refused, Err(DurableError::AlreadyExists { .. })), "{refused:?}");
    within(h.engine.flush()).await.expect("flush");
    // The snapshot (no I/O) agrees with a listing once one was made (docs/durable.md "Mode
    // differences": the Redis engine refreshes its snapshot when listing).
    let listed = within(h.engine.list_consumers()).await.expect("list");
    assert_eq!(listed, [info]);
    assert_eq!(h.engine.consumers_snapshot(), listed);
}

async fn detach_all(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    let sent = h.publish("jobs", "x").await;
    one(&mut a.deliveries).await;
    // Shutdown: the client's stream ends and what it held is released.
    h.engine.detach_all();
    assert_ends(&mut a.deliveries, "after detach_all").await;
    let mut b = h.attach("inbox").await;
    let d = one(&mut b.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&sent.id, 2));
    let (_, entry) = h.complete_first("inbox", &*b.client, &d).await;
    assert_eq!(reasons(&entry), [REASON_DISCONNECT]);
}

async fn ack_by_another_client(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let options = ClientOptions { max_in_flight: 1, max_batch: 0 };
    let mut a = within(h.engine.attach("inbox", options, None)).await.expect("attach a");
    let sent = h.publish("jobs", "x").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, sent.id);
    let b = h.attach("inbox").await;
    // B acks what A holds, then A acks it too. The embedded engine completes it on
    // B's ack, the Redis engine on A's (docs/durable.md "Mode differences"): either way it
    // completes exactly once and A's slot is free again.
    b.client.ack(vec![sent.id.to_string()]).await;
    a.client.ack(vec![sent.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack", |i| i.acked == 1).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
    drop(b);
    h.wait_info("inbox", "B to leave", |i| i.clients == 1).await;
    let next = h.publish("jobs", "y").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, next.id, "A has room again");
    a.client.ack(vec![next.id.to_string()]).await;
    h.wait_info("inbox", "the second ack", |i| i.acked == 2).await;
    let log = h.log("inbox", None).await;
    assert_eq!(logged(&log), [sent.id.to_string(), next.id.to_string()]);
}

// ---- consumer operations (docs/consumer-operations.md) ----

/// Every pending entry, walking pages of `limit`.
async fn pending(h: &Harness, name: &str, limit: usize) -> Vec<PendingEntry> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = within(h.engine.list_pending(name, limit, &token)).await.expect("pending page");
        assert!(page.entries.len() <= limit, "a page holds at most `limit`");
        out.extend(page.entries);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

/// Polls the pending list until `ok` holds.
async fn wait_pending(h: &Harness, name: &str, what: &str, ok: impl Fn(&[PendingEntry]) -> bool) -> Vec<PendingEntry> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let entries = pending(h, name, 1_000).await;
        if ok(&entries) {
            return entries;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {entries:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn states(entries: &[PendingEntry]) -> Vec<(String, PendingState)> {
    entries.iter().map(|e| (String::from_utf8_lossy(&e.event.payload).into_owned(), e.state)).collect()
}

async fn list_pending(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let a1 = h.publish_keyed("jobs", "a1", Some("a"), None).await.0;
    h.publish_keyed("jobs", "a2", Some("a"), None).await;
    h.publish("jobs", "x").await;
    let empty = within(h.engine.list_pending("nope", 10, "")).await;
    assert!(matches!(empty, Err(DurableError::UnknownConsumer(_))), "{empty:?}");
    let bad = within(h.engine.list_pending("inbox", 10, "not-a-token")).await;
    assert!(matches!(bad, Err(DurableError::InvalidArgument { field: "page_token", .. })), "{bad:?}");
    let before = pending(h, "inbox", 1_000).await;
    // The embedded engine lists in capture order; the Redis engine the live stream
    // first, then what waits off it (docs/durable.md "Mode differences"). Compared sorted.
    let sorted = |entries: &[PendingEntry]| {
        let mut s = states(entries);
        s.sort();
        s
    };
    assert_eq!(
        sorted(&before),
        [
            ("a1".into(), PendingState::Ready),
            ("a2".into(), PendingState::BlockedByOrderingKey),
            ("x".into(), PendingState::Ready)
        ],
    );
    assert!(before.iter().all(|e| e.attempt == 0 && e.next_delivery_ms.is_none() && e.failures.is_empty()));
    assert_eq!(
        pending(h, "inbox", 1).await.iter().map(|e| e.event.id.to_string()).collect::<Vec<_>>(),
        before.iter().map(|e| e.event.id.to_string()).collect::<Vec<_>>(),
        "pages of one add up to the list"
    );
    // One client with room for one: a1 goes out first.
    let options = ClientOptions { max_in_flight: 1, max_batch: 0 };
    let mut c = within(h.engine.attach("inbox", options, None)).await.expect("attach");
    let d = one(&mut c.deliveries).await;
    assert_eq!(d.event.id, a1.id);
    let attached = epoch_ms(SystemTime::now());
    let of_a1 = |entries: &[PendingEntry]| entries.iter().find(|e| e.event.id == a1.id).cloned();
    let now =
        wait_pending(h, "inbox", "a1 in flight", |e| of_a1(e).is_some_and(|e| e.state == PendingState::InFlight)).await;
    let now = of_a1(&now).expect("a1 listed");
    assert_eq!(now.attempt, 1);
    let deadline = now.next_delivery_ms.expect("an ack deadline");
    assert!(
        deadline + 5 >= attached + 30_000 - 2_000 && deadline <= epoch_ms(SystemTime::now()) + 30_000 + 5,
        "{deadline}"
    );
    // Nacked for a minute: a1 waits with its failure, x goes out, a2 stays behind a1.
    let nacked = epoch_ms(SystemTime::now());
    c.client.nack(a1.id.to_string(), "later".into(), Some(Duration::from_secs(60))).await;
    assert_eq!(payload(&one(&mut c.deliveries).await), "x");
    let after =
        wait_pending(h, "inbox", "a1 delayed", |e| of_a1(e).is_some_and(|e| e.state == PendingState::Delayed)).await;
    assert_eq!(
        sorted(&after),
        [
            ("a1".into(), PendingState::Delayed),
            ("a2".into(), PendingState::BlockedByOrderingKey),
            ("x".into(), PendingState::InFlight)
        ],
    );
    let delayed = of_a1(&after).expect("a1 listed");
    let due = delayed.next_delivery_ms.expect("a redelivery time");
    assert!(
        due + GRANULARITY.as_millis() as u64 >= nacked + 60_000 && due <= epoch_ms(SystemTime::now()) + 60_000,
        "{due}"
    );
    assert_eq!((delayed.attempt, delayed.failures.len()), (1, 1));
    assert_eq!(delayed.failures[0].reason, "later");
}

async fn linear_backoff(h: &mut Harness) {
    // Linear: 200 ms × attempt. Exponential with this multiplier would wait 200, 600.
    let backoff = Backoff { initial_ms: 200, multiplier: 3.0, max_ms: 10_000, kind: BackoffKind::Linear };
    h.create(ConsumerConfig { backoff, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let mut d = one(&mut a.deliveries).await;
    for attempt in 1..=2u32 {
        assert_eq!(d.attempt, attempt);
        let nacked = epoch_ms(SystemTime::now());
        a.client.nack(d.event.id.to_string(), "boom".into(), None).await;
        // The scheduled redelivery is exactly the linear delay after the failure was
        // recorded, which happened between the nack and this observation.
        let seen = wait_pending(h, "inbox", "the retry", |e| {
            e.first().is_some_and(|e| e.state == PendingState::Delayed || e.attempt > attempt)
        })
        .await;
        let observed = epoch_ms(SystemTime::now());
        if seen[0].state == PendingState::Delayed {
            let failed_at = seen[0].next_delivery_ms.expect("due") - 200 * u64::from(attempt);
            assert!(
                failed_at + 1 >= nacked && failed_at <= observed,
                "attempt {attempt}: due {seen:?}, nacked {nacked}, seen {observed}"
            );
        }
        d = one(&mut a.deliveries).await;
    }
    assert_eq!(d.attempt, 3);
}

async fn redrive(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    let e1 = h.publish_keyed("jobs", "e1", Some("k"), None).await.0;
    let e2 = h.publish_keyed("jobs", "e2", Some("k"), None).await.0;
    let e3 = h.publish("jobs", "e3").await;
    // e1 first, e3 beside it (in one batch or two), e2 once e1 is dead-lettered.
    let mut termed = 0;
    while termed < 3 {
        let batch = within(a.deliveries.recv()).await.expect("deliveries stream open");
        for d in batch {
            a.client.term(d.event.id.to_string(), "bug".into()).await;
            h.letter().await;
            termed += 1;
        }
    }
    let info = h.wait_info("inbox", "three dead letters", |i| i.dead_lettered == 3 && i.redrivable == 3).await;
    assert_eq!((info.pending, info.in_flight, info.redriven), (0, 0, 0));
    // A newer event of key k is in flight: the redriven ones queue behind it.
    let e4 = h.publish_keyed("jobs", "e4", Some("k"), None).await.0;
    assert_eq!(one(&mut a.deliveries).await.event.id, e4.id);
    let done = within(h.engine.redrive("inbox", &[e2.id.to_string(), e1.id.to_string(), "unknown".into()], 0))
        .await
        .expect("redrive");
    assert_eq!(done, Redriven { redriven: 2, remaining: 1 });
    let again =
        within(h.engine.redrive("inbox", &[e1.id.to_string(), e2.id.to_string()], 0)).await.expect("redrive again");
    assert_eq!(again, Redriven { redriven: 0, remaining: 1 }, "each dead letter is redriven once");
    let waiting = wait_pending(h, "inbox", "the redriven events", |e| e.len() == 3).await;
    assert_eq!(
        states(&waiting).into_iter().filter(|(p, _)| p != "e4").collect::<Vec<_>>(),
        [("e1".into(), PendingState::BlockedByOrderingKey), ("e2".into(), PendingState::BlockedByOrderingKey)],
        "behind e4, in their original order"
    );
    assert!(
        waiting.iter().filter(|e| e.event.id != e4.id).all(|e| e.attempt == 0 && e.failures.is_empty()),
        "attempts reset: {waiting:?}"
    );
    assert_nothing_delivered(&mut a.deliveries, "redriven events wait for their key");
    a.client.ack(vec![e4.id.to_string()]).await;
    for e in [&e1, &e2] {
        let d = one(&mut a.deliveries).await;
        assert_eq!(
            (&d.event.id, d.attempt, &d.event.payload),
            (&e.id, 1, &e.payload),
            "original order, attempts reset"
        );
        a.client.ack(vec![d.event.id.to_string()]).await;
    }
    // Everything else (with no ids): e3.
    let rest = within(h.engine.redrive("inbox", &[], 0)).await.expect("redrive all");
    assert_eq!(rest, Redriven { redriven: 1, remaining: 0 });
    let d = one(&mut a.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&e3.id, 1));
    a.client.ack(vec![d.event.id.to_string()]).await;
    let info = h.wait_info("inbox", "all acked", |i| i.acked == 4).await;
    assert_eq!((info.redriven, info.redrivable, info.pending, info.in_flight), (3, 0, 0, 0));
    let redriven = h.log("inbox", Some(LogStatus::Redriven)).await;
    assert_eq!(
        logged(&redriven),
        [e1.id.to_string(), e2.id.to_string(), e3.id.to_string()],
        "logged as redriven, in order"
    );
    let missing = within(h.engine.redrive("nope", &[], 0)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

async fn pause_resume(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    let held = h.publish("jobs", "before").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, held.id);
    let info = within(h.engine.set_paused("inbox", true)).await.expect("pause");
    assert!(info.paused);
    // Still captured, not delivered; what the client holds can still be acked.
    h.publish("jobs", "p1").await;
    h.publish("jobs", "p2").await;
    a.client.ack(vec![held.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack while paused", |i| i.acked == 1).await;
    assert_eq!((info.paused, info.pending, info.in_flight, info.clients), (true, 2, 0, 1));
    let entries = pending(h, "inbox", 100).await;
    assert!(entries.iter().all(|e| e.state == PendingState::Ready), "{entries:?}");
    assert_nothing_delivered(&mut a.deliveries, "nothing while paused");
    let again = within(h.engine.set_paused("inbox", true)).await.expect("pause twice");
    assert!(again.paused, "pausing a paused consumer is a no-op");
    let info = within(h.engine.set_paused("inbox", false)).await.expect("resume");
    assert!(!info.paused);
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["p1", "p2"]);
    let missing = within(h.engine.set_paused("nope", true)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

async fn exclusive(h: &mut Harness) {
    h.create(ConsumerConfig { exclusive: true, ..consumer("runner", &["jobs"]) }).await;
    assert!(h.info("runner").await.config.exclusive);
    let mut first = h.attach("runner").await;
    let mut second = h.attach("runner").await;
    h.wait_info("runner", "two clients", |i| i.clients == 2).await;
    for i in 0..3 {
        h.publish("jobs", &format!("{i}")).await;
    }
    let got = take(&mut first.deliveries, 3).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["0", "1", "2"], "all to the first client");
    first.client.ack(vec![got[0].event.id.to_string()]).await;
    h.wait_info("runner", "the ack", |i| i.acked == 1).await;
    assert_nothing_delivered(&mut second.deliveries, "the second client waits while the first is attached");
    // The first leaves holding two: they are released, and the second takes over.
    drop(first);
    let mut taken: Vec<(String, u32)> =
        take(&mut second.deliveries, 2).await.iter().map(|d| (payload(d), d.attempt)).collect();
    taken.sort();
    assert_eq!(taken, [("1".into(), 2), ("2".into(), 2)]);
    h.publish("jobs", "3").await;
    assert_eq!(payload(&one(&mut second.deliveries).await), "3");
}

/// A consumer holding `max_pending` events takes no more; the
/// captures it misses are counted, and it takes them again once it has room.
async fn max_pending(h: &mut Harness) {
    h.create(ConsumerConfig { max_pending: 2, ..consumer("small", &["jobs"]) }).await;
    h.create(consumer("big", &["jobs"])).await;
    for i in 0..3 {
        h.publish("jobs", &format!("{i}")).await;
    }
    let small = h.info("small").await;
    assert_eq!((small.pending, small.dropped, small.config.max_pending), (2, 1, 2), "{small:?}");
    assert_eq!((h.info("big").await.pending, h.info("big").await.dropped), (3, 0), "other consumers unaffected");
    let mut a = h.attach("small").await;
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["0", "1"]);
    a.client.ack(vec![got[0].event.id.to_string()]).await;
    h.wait_info("small", "room again", |i| i.acked == 1).await;
    h.publish("jobs", "3").await;
    assert_eq!(payload(&one(&mut a.deliveries).await), "3");
    assert_eq!(h.info("small").await.dropped, 1);
}

/// A publisher that goes away mid-capture (a killed client: its future is dropped at
/// whatever await it had reached) never strands an event: once a capture is stored,
/// it reaches its consumer, and a retry with the same idempotency key that is told
/// `duplicate` is told so about an event the consumer does get.
async fn dropped_capture_callers(h: &mut Harness) {
    h.create(consumer("inbox", &["orders.>"])).await;
    const ROUNDS: usize = 12;
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for round in 0..ROUNDS {
        let events: Vec<Arc<Event>> = (0..4).map(|i| new_event("orders.created", &format!("{round}-{i}"))).collect();
        let keys: Vec<String> = (0..4).map(|i| format!("key-{round}-{i}")).collect();
        let batch: Vec<CaptureRequest<'_>> = events
            .iter()
            .zip(&keys)
            .map(|(event, key)| CaptureRequest { event, ordering_key: None, idempotency_key: Some(key) })
            .collect();
        // Round n polls the capture n times, letting the engine run in between, then
        // drops it: every await point of the capture is a place where a caller can go.
        let mut capture = h.engine.capture_many(&batch);
        for _ in 0..round {
            if capture.as_mut().poll(&mut cx).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(capture);
    }
    // The producer retries everything with the same keys, as an outbox relay does.
    let mut expected = std::collections::BTreeSet::new();
    for round in 0..ROUNDS {
        for i in 0..4 {
            let key = format!("key-{round}-{i}");
            let (event, captured) = h.publish_keyed("orders.created", &format!("{round}-{i}"), None, Some(&key)).await;
            match captured {
                Captured::Duplicate(original) => expected.insert(original),
                other => {
                    assert_eq!(stored(&other), 1, "a retry stored anew is stored for the consumer");
                    expected.insert(event.id.to_string())
                }
            };
        }
    }
    assert_eq!(expected.len(), ROUNDS * 4, "one event per key");
    // Every event a producer was told about reaches the consumer.
    let mut a = h.attach("inbox").await;
    let mut received = std::collections::BTreeSet::new();
    while !expected.is_subset(&received) {
        let batch = within(a.deliveries.recv()).await.expect("deliveries stream open");
        for d in batch {
            a.client.ack(vec![d.event.id.to_string()]).await;
            received.insert(d.event.id.to_string());
        }
    }
    h.wait_info("inbox", "everything acked", |i| i.pending == 0 && i.in_flight == 0).await;
}

/// A publish matching more consumers than `max_captures_per_publish` (3 here) is
/// refused whole: stored for none, its idempotency key not kept.
async fn release(h: &mut Harness) {
    // With one attempt allowed, a failed attempt would dead-letter: a release must not
    // count one, must not wait for a backoff, and must take the event back whoever
    // holds the rest.
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    for i in 0..3 {
        h.publish("jobs", &i.to_string()).await;
    }
    let held = take(&mut a.deliveries, 3).await;
    // Without drain: back at once, to the one client there is, with the same attempt.
    a.client.release(vec![held[0].event.id.to_string()], false).await;
    let again = one(&mut a.deliveries).await;
    assert_eq!((&again.event.id, again.attempt), (&held[0].event.id, 1), "released without drain");
    // With drain: the client hears `drained` (the empty batch) and gets nothing more;
    // what it released goes to another client, unattempted.
    let mut b = h.attach("inbox").await;
    a.client.release(vec![held[0].event.id.to_string(), held[1].event.id.to_string()], true).await;
    let marker = within(a.deliveries.recv()).await.expect("deliveries stream open");
    assert!(marker.is_empty(), "the drain's answer is an empty batch: {marker:?}");
    let mut moved = take(&mut b.deliveries, 2).await;
    moved.sort_by_key(payload);
    assert_eq!(moved.iter().map(|d| (payload(d), d.attempt)).collect::<Vec<_>>(), [("0".into(), 1), ("1".into(), 1)]);
    let later = h.publish("jobs", "3").await;
    assert_eq!(one(&mut b.deliveries).await.event.id, later.id, "new events go to the client not draining");
    assert_nothing_delivered(&mut a.deliveries, "a draining client");
    // The draining client still finishes what it started.
    a.client.ack(vec![held[2].event.id.to_string()]).await;
    b.client.ack(ids(&moved)).await;
    b.client.ack(vec![later.id.to_string()]).await;
    let info = h.wait_info("inbox", "every ack", |i| i.acked == 4).await;
    assert_eq!((info.pending, info.in_flight, info.dead_lettered, info.redelivered), (0, 0, 0, 0));
    let log = h.log("inbox", Some(LogStatus::Completed)).await;
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|e| e.attempts == 1 && e.failures.is_empty()), "no attempt counted: {log:?}");
}

async fn too_many_captures(h: &mut Harness) {
    for name in ["a", "b", "c"] {
        h.create(consumer(name, &["fan.>"])).await;
    }
    assert_eq!(stored(&h.publish_keyed("fan.out", "three", None, None).await.1), 3, "at the bound: captured");
    h.create(consumer("d", &["fan.*"])).await;
    let event = new_event("fan.out", "four");
    let refused = within(h.engine.capture(&event, None, Some("k"))).await;
    assert!(
        matches!(refused, Err(DurableError::TooManyCaptures { matched: 4, limit: 3, ref channel }) if channel == "fan.out"),
        "{refused:?}"
    );
    assert_eq!(h.info("d").await.pending, 0, "stored for none");
    assert_eq!(h.info("a").await.pending, 1);
    // Below the bound again, the key is free.
    within(h.engine.delete_consumer("d")).await.unwrap();
    assert_eq!(stored(&h.publish_keyed("fan.out", "retry", None, Some("k")).await.1), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_on_disk_dropped_capture_callers() {
    let dir = tempfile::tempdir().expect("temp dir");
    dropped_capture_callers(&mut Harness::embedded_on_disk(dir.path())).await;
}

/// `embedded_<check>` and `redis_<check>` for each check, every check in turn on the
/// on-disk store, and every check in turn on one Redis Cluster (3 masters, 3 replicas; a cluster per check would cost minutes).
macro_rules! conformance {
    ($($check:ident: $embedded:ident, $redis:ident;)*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_passes_every_check() {
            let Some(cluster) = RedisCluster::start().await else { return };
            $(
                eprintln!("conformance on a Redis Cluster: {}", stringify!($check));
                $check(&mut Harness::redis_cluster(&cluster, stringify!($check))).await;
            )*
        }
        /// Every check on the on-disk store, each on a directory of its own.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn embedded_on_disk_passes_every_check() {
            $(
                let dir = tempfile::tempdir().unwrap();
                $check(&mut Harness::embedded_on_disk(dir.path())).await;
            )*
        }
        $(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $embedded() {
            $check(&mut Harness::embedded()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            let Some(mut harness) = Harness::redis().await else { return };
            $check(&mut harness).await;
        }
    )*};
}

conformance! {
    create: embedded_create, redis_create;
    capture: embedded_capture, redis_capture;
    deliver: embedded_deliver, redis_deliver;
    ack: embedded_ack, redis_ack;
    nack_with_delay: embedded_nack_with_delay, redis_nack_with_delay;
    deadline_expiry: embedded_deadline_expiry, redis_deadline_expiry;
    backoff: embedded_backoff, redis_backoff;
    max_attempts_dead_letter: embedded_max_attempts_dead_letter, redis_max_attempts_dead_letter;
    term: embedded_term, redis_term;
    dead_letter_of_a_sixteen_token_channel: embedded_dead_letter_of_a_sixteen_token_channel, redis_dead_letter_of_a_sixteen_token_channel;
    ordering_keys: embedded_ordering_keys, redis_ordering_keys;
    idempotency: embedded_idempotency, redis_idempotency;
    log_paging: embedded_log_paging, redis_log_paging;
    delete_while_attached: embedded_delete_while_attached, redis_delete_while_attached;
    disconnect: embedded_disconnect, redis_disconnect;
    late_ack: embedded_late_ack, redis_late_ack;
    extend: embedded_extend, redis_extend;
    competing_clients: embedded_competing_clients, redis_competing_clients;
    declare: embedded_declare, redis_declare;
    detach_all: embedded_detach_all, redis_detach_all;
    ack_by_another_client: embedded_ack_by_another_client, redis_ack_by_another_client;
    list_pending: embedded_list_pending, redis_list_pending;
    linear_backoff: embedded_linear_backoff, redis_linear_backoff;
    redrive: embedded_redrive, redis_redrive;
    pause_resume: embedded_pause_resume, redis_pause_resume;
    exclusive: embedded_exclusive, redis_exclusive;
    max_pending: embedded_max_pending, redis_max_pending;
    dropped_capture_callers: embedded_dropped_capture_callers, redis_dropped_capture_callers;
    too_many_captures: embedded_too_many_captures, redis_too_many_captures;
    release: embedded_release, redis_release;
}
