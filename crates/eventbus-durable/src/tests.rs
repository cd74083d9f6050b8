//! Engine semantics (docs/durable.md) through the bus, with an in-memory store: paused time wherever
//! timing is the subject, the multi-threaded runtime (where background tasks race) elsewhere.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use eventbus_core::durable::*;
use eventbus_core::{Bus, BusConfig, PublishInput, SubscribeOptions};

use crate::store::{self, StoreOp};
use crate::{Durable, FjallStore, Fsync, MemoryStore, Retention, Store, StoreError};

fn options(dedup_window: Duration) -> DurableOptions {
    DurableOptions {
        max_captures_per_publish: 0,
        dedup_window,
        // A readable test encoding: "consumer|attempts|reason;reason".
        dead_letter_encoder: Arc::new(|dl: &PublishedDeadLetter| {
            let reasons: Vec<&str> = dl.failures.iter().map(|f| f.reason.as_str()).collect();
            (Bytes::from(format!("{}|{}|{}", dl.consumer, dl.attempts, reasons.join(";"))), "text/plain".into())
        }),
        on_ack: None,
        min_free_disk_bytes: 0,
        supervisor: eventbus_core::Supervisor::new(),
    }
}

fn bus_with(store: Arc<dyn Store>, dedup_window: Duration) -> (Bus, Durable) {
    let bus = Bus::new(BusConfig::default());
    let durable = Durable::start(store, options(dedup_window)).unwrap();
    bus.enable_durable(durable.clone());
    (bus, durable)
}

fn memory() -> Arc<dyn Store> {
    let retention = Retention { max_entries: 100, max_age_ms: 86_400_000 };
    Arc::new(MemoryStore::new(retention))
}

fn consumer(name: &str, channels: &[&str]) -> ConsumerConfig {
    ConsumerConfig {
        backoff: Backoff { initial_ms: 1_000, multiplier: 2.0, max_ms: 5_000, kind: BackoffKind::Exponential },
        ..ConsumerConfig::new(name, channels.iter().map(|c| c.to_string()).collect())
    }
}

async fn publish(bus: &Bus, channel: &str, payload: &str) -> eventbus_core::Published {
    bus.publish(PublishInput {
        channel: channel.into(),
        payload: Bytes::from(payload.to_owned()),
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn publish_keyed(
    bus: &Bus,
    channel: &str,
    payload: &str,
    ordering: &str,
    idempotency: &str,
) -> eventbus_core::Published {
    let input = PublishInput {
        channel: channel.into(),
        payload: Bytes::from(payload.to_owned()),
        ordering_key: ordering.into(),
        idempotency_key: idempotency.into(),
        ..Default::default()
    };
    bus.publish(input).await.unwrap()
}

async fn next(rx: &mut mpsc::Receiver<Vec<Delivery>>) -> Vec<Delivery> {
    tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a delivery").expect("attached")
}

fn payloads(batch: &[Delivery]) -> Vec<String> {
    batch.iter().map(|d| String::from_utf8(d.event.payload.to_vec()).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_while_nobody_is_attached_then_pushes() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(120));
    durable.create_consumer(consumer("inbox", &["orders.>"])).await.unwrap();
    for p in ["a", "b", "c"] {
        publish(&bus, "orders.created", p).await;
    }
    publish(&bus, "users.created", "ignored").await;
    assert_eq!(durable.get_consumer("inbox").unwrap().pending, 3);
    let mut attached = durable.attach("inbox", ClientOptions::default(), None).await.unwrap();
    let batch = next(&mut attached.deliveries).await;
    assert_eq!(payloads(&batch), ["a", "b", "c"]);
    assert!(batch.iter().all(|d| d.attempt == 1));
    let ids: Vec<String> = batch.iter().map(|d| d.event.id.to_string()).collect();
    attached.client.ack(&ids);
    attached.client.ack(&ids); // a second ack is a no-op
    let info = durable.get_consumer("inbox").unwrap();
    assert_eq!((info.pending, info.in_flight, info.acked), (0, 0, 3));
    let log = durable.log("inbox", None, 10, None).await.unwrap();
    assert_eq!(log.entries.len(), 3);
    assert!(log.entries.iter().all(|e| e.status == LogStatus::Completed && e.attempts == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_is_idempotent_and_conflicts_are_refused() {
    let (_bus, durable) = bus_with(memory(), Duration::from_secs(1));
    let config = consumer("c", &["a"]);
    durable.create_consumer(config.clone()).await.unwrap();
    durable.create_consumer(config.clone()).await.unwrap();
    let other = ConsumerConfig { max_attempts: 9, ..config };
    assert!(matches!(durable.create_consumer(other).await, Err(DurableError::AlreadyExists { .. })));
    assert!(matches!(
        durable.attach("nope", ClientOptions::default(), None).await,
        Err(DurableError::UnknownConsumer(_))
    ));
    let made = durable.attach("made", ClientOptions::default(), Some(consumer("", &["x"]))).await.unwrap();
    assert_eq!(made.info.config.name, "made", "create_if_missing");
}

#[tokio::test(start_paused = true)]
async fn nacks_follow_the_backoff_schedule_exactly() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
    durable.create_consumer(ConsumerConfig { max_attempts: 0, ..consumer("r", &["jobs"]) }).await.unwrap();
    let mut a = durable.attach("r", ClientOptions::default(), None).await.unwrap();
    publish(&bus, "jobs", "x").await;
    let mut waits = Vec::new();
    let mut last = tokio::time::Instant::now();
    for attempt in 1..=5 {
        let batch = next(&mut a.deliveries).await;
        assert_eq!(batch[0].attempt, attempt);
        waits.push((tokio::time::Instant::now() - last).as_millis() as u64);
        last = tokio::time::Instant::now();
        a.client.nack(&batch[0].event.id, "boom", None);
    }
    assert_eq!(waits, [0, 1_000, 2_000, 4_000, 5_000], "min(max, initial × multiplier^(attempt−1))");
    // A nack's own delay wins.
    let batch = next(&mut a.deliveries).await;
    let t = tokio::time::Instant::now();
    a.client.nack(&batch[0].event.id, "later", Some(Duration::from_millis(300)));
    next(&mut a.deliveries).await;
    assert_eq!((tokio::time::Instant::now() - t).as_millis(), 300);
    assert_eq!(durable.get_consumer("r").unwrap().redelivered, 6);
}

#[tokio::test(start_paused = true)]
async fn expired_deadlines_and_disconnects_count_as_failures() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
    durable.create_consumer(ConsumerConfig { ack_deadline_ms: 500, ..consumer("d", &["jobs"]) }).await.unwrap();
    let mut a = durable.attach("d", ClientOptions::default(), None).await.unwrap();
    publish(&bus, "jobs", "x").await;
    let first = next(&mut a.deliveries).await;
    let t = tokio::time::Instant::now();
    let second = next(&mut a.deliveries).await; // no ack: deadline, then backoff
    assert_eq!(second[0].attempt, 2);
    assert_eq!((tokio::time::Instant::now() - t).as_millis(), 500 + 1_000);
    assert_eq!(first[0].event.id, second[0].event.id);

    // Extend keeps it in flight past the deadline.
    a.client.extend(&[second[0].event.id.to_string()], Duration::from_secs(10));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(durable.get_consumer("d").unwrap().in_flight, 1);

    // Disconnecting releases it at once as a failure; the next client gets it.
    drop(a);
    let info = durable.get_consumer("d").unwrap();
    assert_eq!((info.in_flight, info.pending, info.clients), (0, 1, 0));
    let mut b = durable.attach("d", ClientOptions::default(), None).await.unwrap();
    let third = next(&mut b.deliveries).await;
    assert_eq!(third[0].attempt, 3);
    b.client.term(&third[0].event.id, "");
    let log = durable.log("d", Some(LogStatus::DeadLettered), 10, None).await.unwrap();
    let reasons: Vec<&str> = log.entries[0].failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons, [REASON_DEADLINE, REASON_DISCONNECT, REASON_TERM]);
}

#[tokio::test(start_paused = true)]
async fn dead_letters_after_max_attempts_with_every_reason() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
    let mut dlq =
        bus.subscribe(SubscribeOptions { channels: vec!["dlq.>".into()], ..Default::default() }).await.unwrap();
    durable.create_consumer(ConsumerConfig { max_attempts: 3, ..consumer("m", &["pay"]) }).await.unwrap();
    let mut a = durable.attach("m", ClientOptions::default(), None).await.unwrap();
    publish(&bus, "pay", "p").await;
    for i in 1..=3 {
        let batch = next(&mut a.deliveries).await;
        a.client.nack(&batch[0].event.id, &format!("fail {i}"), None);
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), dlq.next_batch(&mut out)).await.unwrap().unwrap();
    assert_eq!(out[0].channel, "dlq.pay");
    assert_eq!(&out[0].payload[..], b"m|3|fail 1;fail 2;fail 3");
    let info = durable.get_consumer("m").unwrap();
    assert_eq!((info.pending, info.dead_lettered), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_clients_never_hold_the_same_event() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
    durable.create_consumer(consumer("w", &["work"])).await.unwrap();
    let one = ClientOptions { max_in_flight: 1, max_batch: 0 };
    let mut a = durable.attach("w", one, None).await.unwrap();
    let mut b = durable.attach("w", one, None).await.unwrap();
    for i in 0..4 {
        publish(&bus, "work", &i.to_string()).await;
    }
    let (x, y) = (next(&mut a.deliveries).await, next(&mut b.deliveries).await);
    assert_eq!((x.len(), y.len()), (1, 1), "max_in_flight 1 each");
    assert_ne!(x[0].event.id, y[0].event.id);
    assert_eq!(durable.get_consumer("w").unwrap().in_flight, 2);
    a.client.ack(&[x[0].event.id.to_string()]);
    let z = next(&mut a.deliveries).await;
    let seen = [&x[0].event.id, &y[0].event.id];
    assert!(!seen.contains(&&z[0].event.id));
}

#[tokio::test(start_paused = true)]
async fn ordering_keys_hold_order_without_blocking_other_keys() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
    durable.create_consumer(consumer("o", &["acct"])).await.unwrap();
    publish_keyed(&bus, "acct", "k1-first", "k1", "").await;
    publish_keyed(&bus, "acct", "k1-second", "k1", "").await;
    publish_keyed(&bus, "acct", "k2-only", "k2", "").await;
    let mut a = durable.attach("o", ClientOptions::default(), None).await.unwrap();
    let batch = next(&mut a.deliveries).await;
    assert_eq!(payloads(&batch), ["k1-first", "k2-only"], "one in flight per key; k2 not blocked by k1");
    a.client.ack(&[batch[1].event.id.to_string()]);
    a.client.nack(&batch[0].event.id, "slow", None);
    let again = next(&mut a.deliveries).await;
    assert_eq!(payloads(&again), ["k1-first"], "a nacked event keeps its key's turn");
    a.client.ack(&[again[0].event.id.to_string()]);
    assert_eq!(payloads(&next(&mut a.deliveries).await), ["k1-second"]);
}

#[tokio::test(start_paused = true)]
async fn idempotent_publish_inside_and_outside_the_window() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(120));
    durable.create_consumer(consumer("i", &["orders"])).await.unwrap();
    let mut ephemeral =
        bus.subscribe(SubscribeOptions { channels: vec!["orders".into()], ..Default::default() }).await.unwrap();
    let first = publish_keyed(&bus, "orders", "x", "", "order-42").await;
    let again = publish_keyed(&bus, "orders", "x", "", "order-42").await;
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(again.event_id, first.event_id);
    assert_eq!(durable.get_consumer("i").unwrap().pending, 1, "not captured twice");
    let mut out = Vec::new();
    ephemeral.next_batch(&mut out).await.unwrap();
    assert_eq!(out.len(), 1, "nor delivered twice to ephemeral subscribers");
    tokio::time::advance(Duration::from_secs(121)).await;
    let later = publish_keyed(&bus, "orders", "x", "", "order-42").await;
    assert!(!later.duplicate && later.event_id != first.event_id, "outside the window it is new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_restores_pending_events_with_their_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_entries: 100, max_age_ms: 86_400_000 };
    let open = || -> Arc<dyn Store> { Arc::new(FjallStore::open(dir.path(), Fsync::Always, retention).unwrap()) };
    let delivered_id = {
        let (bus, durable) = bus_with(open(), Duration::from_secs(1));
        durable.create_consumer(consumer("keep", &["k"])).await.unwrap();
        publish(&bus, "k", "one").await;
        let mut a = durable.attach("keep", ClientOptions { max_in_flight: 1, max_batch: 1 }, None).await.unwrap();
        let id = next(&mut a.deliveries).await[0].event.id.clone();
        publish(&bus, "k", "two").await;
        durable.flush().await.unwrap();
        // The client leaves without acking (one failed attempt), then the broker stops.
        drop(a);
        durable.flush().await.unwrap();
        drop((bus, durable));
        id
    };
    // The old engine's writer thread releases the file once it has drained.
    let store = loop {
        match FjallStore::open(dir.path(), Fsync::Always, retention) {
            Ok(s) => break Arc::new(s) as Arc<dyn Store>,
            Err(_) => tokio::task::yield_now().await,
        }
    };
    let (_bus, durable) = bus_with(store, Duration::from_secs(1));
    assert_eq!(durable.get_consumer("keep").unwrap().pending, 2);
    let mut b = durable.attach("keep", ClientOptions::default(), None).await.unwrap();
    let mut batch = next(&mut b.deliveries).await;
    if batch.len() < 2 {
        // "one" waits out its backoff after the failed attempt.
        batch.extend(next(&mut b.deliveries).await);
    }
    let mut got = payloads(&batch);
    got.sort();
    assert_eq!(got, ["one", "two"]);
    let by_payload: std::collections::HashMap<String, &Delivery> =
        payloads(&batch).into_iter().zip(batch.iter()).collect();
    assert_eq!(by_payload["one"].event.id, delivered_id);
    assert_eq!(by_payload["one"].attempt, 2, "delivered before the restart: attempt + 1");
    assert_eq!(by_payload["two"].attempt, 1);
}

mod model {
    //! The engine against a simple model: random publishes (with and without ordering
    //! keys), acks, nacks and passing time, checking after every step that nothing is
    //! in flight twice, per-key exclusivity, the in-flight ceiling, no redelivery of a
    //! finished event, the attempt bound, and conservation of events.

    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Publish(Option<u8>),
        Ack,
        Nack,
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => prop::option::of(0u8..3).prop_map(Op::Publish),
            2 => Just(Op::Ack),
            2 => Just(Op::Nack),
            1 => (1u64..3_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn engine_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async move {
                let (bus, durable) = bus_with(memory(), Duration::from_secs(1));
                let config = ConsumerConfig { max_attempts: 3, max_in_flight: 2, ack_deadline_ms: 3_600_000, ..consumer("m", &["m"]) };
                durable.create_consumer(config).await.unwrap();
                let mut a = durable.attach("m", ClientOptions::default(), None).await.unwrap();
                let mut in_flight: Vec<(String, Option<String>, u32)> = Vec::new();
                let mut keys: HashMap<String, Option<String>> = HashMap::new();
                let mut finished: HashSet<String> = HashSet::new();
                let mut published = 0u64;
                for op in ops {
                    match op {
                        Op::Publish(key) => {
                            let key = key.map(|k| format!("k{k}")).unwrap_or_default();
                            let p = publish_keyed(&bus, "m", "x", &key, "").await;
                            keys.insert(p.event_id.to_string(), (!key.is_empty()).then_some(key));
                            published += 1;
                        }
                        Op::Ack => {
                            if !in_flight.is_empty() {
                                let (id, _, _) = in_flight.remove(0);
                                a.client.ack(std::slice::from_ref(&id));
                                finished.insert(id);
                            }
                        }
                        Op::Nack => {
                            if !in_flight.is_empty() {
                                let (id, _, attempt) = in_flight.remove(0);
                                a.client.nack(&id, "no", None);
                                if attempt >= 3 {
                                    finished.insert(id); // dead-lettered
                                }
                            }
                        }
                        Op::Advance(ms) => {
                            tokio::time::advance(Duration::from_millis(ms)).await;
                            tokio::task::yield_now().await;
                        }
                    }
                    tokio::task::yield_now().await;
                    while let Ok(batch) = a.deliveries.try_recv() {
                        for d in batch {
                            assert!(!finished.contains(&*d.event.id), "a finished event came back");
                            assert!(in_flight.iter().all(|(id, _, _)| **id != *d.event.id), "in flight twice");
                            assert!(d.attempt <= 3, "attempt bound");
                            in_flight.push((d.event.id.to_string(), keys[&*d.event.id].clone(), d.attempt));
                        }
                    }
                    assert!(in_flight.len() <= 2, "max_in_flight");
                    let mut held = HashSet::new();
                    for (_, key, _) in &in_flight {
                        if let Some(k) = key {
                            assert!(held.insert(k.clone()), "two events of key {k} in flight");
                        }
                    }
                    let info = durable.get_consumer("m").unwrap();
                    assert_eq!(info.in_flight, in_flight.len() as u64);
                    assert_eq!(info.pending + info.in_flight + finished.len() as u64, published, "events are conserved");
                    assert_eq!(info.acked + info.dead_lettered, finished.len() as u64);
                }
            });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_many_captures_in_order_and_stops_at_the_first_error() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(120));
    durable.create_consumer(consumer("inbox", &["orders.>"])).await.unwrap();
    let mut ephemeral =
        bus.subscribe(SubscribeOptions { channels: vec!["orders.>".into()], ..Default::default() }).await.unwrap();
    let input = |channel: &str, payload: &str, idempotency: &str| PublishInput {
        channel: channel.into(),
        payload: Bytes::from(payload.to_owned()),
        idempotency_key: idempotency.into(),
        ..Default::default()
    };
    let answers = bus
        .publish_many(vec![
            input("orders.created", "a", ""),
            input("orders.created", "b", "key-1"),
            input("orders.created", "c", "key-1"),
            input("orders.paid", "d", ""),
            input("orders.*", "bad", ""),
            input("orders.created", "never", ""),
        ])
        .await;
    assert_eq!(answers.len(), 5, "answers stop at the first error");
    let ok: Vec<&eventbus_core::Published> = answers[..4].iter().map(|a| a.as_ref().unwrap()).collect();
    assert!(ok[2].duplicate && ok[2].event_id == ok[1].event_id, "a repeat within the batch is a duplicate");
    assert!(!ok[0].duplicate && !ok[1].duplicate && !ok[3].duplicate);
    assert!(matches!(answers[4], Err(eventbus_core::Error::Name(_))), "{:?}", answers[4]);

    let mut attached = durable.attach("inbox", ClientOptions::default(), None).await.unwrap();
    assert_eq!(payloads(&next(&mut attached.deliveries).await), ["a", "b", "d"]);
    let mut out = Vec::new();
    ephemeral.next_batch(&mut out).await.unwrap();
    let seen: Vec<&[u8]> = out.iter().map(|e| &e.payload[..]).collect();
    assert_eq!(seen, [&b"a"[..], b"b", b"d"], "subscribers get the same events, in order");
}

/// A run of publishes on one channel checks the name once; every other name, and a
/// name after a refused publish, is still checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_are_checked_for_every_new_name_in_a_batch() {
    let (bus, durable) = bus_with(memory(), Duration::from_secs(120));
    durable.create_consumer(consumer("all", &[">"])).await.unwrap();
    let input = |channel: &str| PublishInput { channel: channel.into(), ..Default::default() };
    let answers = bus
        .publish_each(vec![
            input("a.b"),
            input("a.b"),
            input("$sys.x"),
            input("$sys.x"),
            input("a..b"),
            input("a.b"),
            input("a.*"),
        ])
        .await;
    let refused: Vec<bool> = answers.iter().map(Result::is_err).collect();
    assert_eq!(refused, [false, false, true, true, true, false, true], "{answers:?}");

    let answers = bus.publish_many(vec![input("x.y"), input("x.y"), input("x..y"), input("x.y")]).await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(answers[..2].iter().all(Result::is_ok) && answers[2].is_err(), "{answers:?}");
    assert_eq!(durable.get_consumer("all").unwrap().pending, 5, "only the accepted events are kept");
}

/// On the multi-threaded runtime the timer scheduler of every fresh engine
/// must run. Engines are started the way the daemon starts its one: from the thread
/// that blocks on the runtime, while the worker threads are idle and pick a spawned
/// task up at once. Each must redeliver one event whose ack deadline passed.
#[test]
fn every_fresh_engine_fires_its_timers_on_the_multi_threaded_runtime() {
    const ENGINES: usize = 200;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let engines: Vec<(Bus, Durable)> = (0..ENGINES).map(|_| bus_with(memory(), Duration::from_secs(1))).collect();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (bus, durable)) in engines.into_iter().enumerate() {
            tasks.spawn(async move {
                let config = ConsumerConfig { ack_deadline_ms: 50, ..consumer("inbox", &["orders.>"]) };
                durable.create_consumer(config).await.unwrap();
                let mut attached = durable.attach("inbox", ClientOptions::default(), None).await.unwrap();
                publish(&bus, "orders.created", "x").await;
                assert_eq!(next(&mut attached.deliveries).await[0].attempt, 1);
                // Not acked: the deadline must bring it back.
                let again = tokio::time::timeout(Duration::from_secs(10), attached.deliveries.recv()).await;
                (i, again.ok().flatten().map(|b| b[0].attempt))
            });
        }
        let mut silent = Vec::new();
        while let Some(done) = tasks.join_next().await {
            let (i, attempt) = done.unwrap();
            if attempt != Some(2) {
                silent.push(i);
            }
        }
        assert!(silent.is_empty(), "{} of {ENGINES} engines never redelivered: {silent:?}", silent.len());
    });
}

/// A store that runs a hook before each commit (to fail it, or hold it), around
/// another store.
struct HookedStore<H> {
    inner: Arc<dyn Store>,
    before_apply: H,
}

impl<H> std::fmt::Debug for HookedStore<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedStore").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<H: Fn() + Send + Sync + 'static> Store for HookedStore<H> {
    fn load(&self) -> Result<store::Loaded, StoreError> {
        self.inner.load()
    }

    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError> {
        (self.before_apply)();
        self.inner.apply(ops)
    }

    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<store::LogPage, StoreError> {
        self.inner.log(consumer, status, limit, after)
    }

    fn redrive(
        &self,
        consumer: &str,
        selection: store::RedriveSelection<'_>,
        next_seq: &std::sync::atomic::AtomicU64,
    ) -> Result<Vec<store::RedrivenEvent>, StoreError> {
        self.inner.redrive(consumer, selection, next_seq)
    }

    fn redrivable(&self, consumer: &str) -> u64 {
        self.inner.redrivable(consumer)
    }
}

/// The engine's writer thread dying is reported, not silent; a retired
/// engine's tasks end quietly.
#[test]
fn a_dead_store_writer_is_reported_and_a_dropped_engine_is_not() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        // Its commits panic once armed: the writer thread dies on it.
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fire = Arc::clone(&armed);
        let before_apply = move || assert!(!fire.load(std::sync::atomic::Ordering::Acquire), "the disk caught fire");
        let store = Arc::new(HookedStore { inner: memory(), before_apply });
        let opts = options(Duration::from_secs(1));
        let supervisor = opts.supervisor.clone();
        let durable = Durable::start(store.clone(), opts).unwrap();
        durable.create_consumer(consumer("inbox", &["a"])).await.unwrap();
        armed.store(true, std::sync::atomic::Ordering::Release);
        assert!(durable.flush().await.is_err(), "a commit on a dead writer is an error");
        let mut failures = supervisor.failures();
        let failure = tokio::time::timeout(Duration::from_secs(10), failures.wait_for(Option::is_some))
            .await
            .expect("reported in time")
            .unwrap()
            .clone()
            .unwrap();
        // The sync thread ends with the writer: either may be reported first (both are logged).
        assert!(["durable store writer", "durable store sync"].contains(&failure.task), "{}", failure.task);

        let opts = options(Duration::from_secs(1));
        let quiet = opts.supervisor.clone();
        let durable = Durable::start(memory(), opts).unwrap();
        durable.create_consumer(consumer("inbox", &["a"])).await.unwrap();
        drop(durable);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while quiet.ended() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "the dropped engine's tasks did not end");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(quiet.failure(), None);
    });
}

/// A dead letter whose publication never happened (here: every publish fails,
/// then the engine stops, as a crash would stop it) is still in the store's outbox and
/// is published by the next engine on the same data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublished_dead_letter_survives_a_restart_and_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_entries: 100, max_age_ms: 86_400_000 };
    let open = || FjallStore::open(dir.path(), Fsync::Always, retention);
    {
        let durable = Durable::start(Arc::new(open().unwrap()), options(Duration::from_secs(1))).unwrap();
        let refused: DeadLetterSink = Arc::new(|_, _, _| Box::pin(async { Err(eventbus_core::Error::ShuttingDown) }));
        durable.set_dead_letter_sink(refused);
        let config = ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["orders.>"]) };
        durable.create_consumer(config).await.unwrap();
        let event = Arc::new(eventbus_core::Event::from_parts(
            "e-1".into(),
            "orders.created".into(),
            std::time::SystemTime::now(),
            String::new(),
            Bytes::from_static(b"x"),
            Default::default(),
            String::new(),
        ));
        let captured =
            durable.capture_many(&[CaptureRequest { event: &event, ordering_key: None, idempotency_key: None }]).await;
        assert!(matches!(captured[0], Ok(Captured::Stored(1))));
        let mut a = durable.attach("inbox", ClientOptions::default(), None).await.unwrap();
        let id = next(&mut a.deliveries).await[0].event.id.clone();
        a.client.term(&id, "poison");
        durable.flush().await.unwrap();
        assert_eq!(durable.get_consumer("inbox").unwrap().dead_lettered, 1);
    }
    // The old engine's writer thread releases the file once it has drained.
    let store = loop {
        match open() {
            Ok(store) => break store,
            Err(_) => tokio::task::yield_now().await,
        }
    };
    let durable = Durable::start(Arc::new(store), options(Duration::from_secs(1))).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink: DeadLetterSink = Arc::new(move |channel, payload, _| {
        let _ = tx.send((channel, payload));
        Box::pin(async { Ok(()) })
    });
    durable.set_dead_letter_sink(sink);
    let (channel, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
    assert_eq!(channel, "dlq.orders.created");
    assert_eq!(&payload[..], b"inbox|1|poison");
}

/// With `fsync: batch`, a commit is answered before its sync; the sync thread syncs it
/// within the flush interval even when nothing else is written after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_fsync_syncs_the_last_commit_without_further_writes() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_entries: 100, max_age_ms: 86_400_000 };
    let store = Arc::new(FjallStore::open(dir.path(), Fsync::Batch, retention).unwrap());
    let (bus, durable) = bus_with(store.clone(), Duration::from_secs(1));
    durable.create_consumer(consumer("inbox", &["orders"])).await.unwrap();
    // Commits in a burst: the later ones land within the interval of the first sync.
    for i in 0..20 {
        publish(&bus, "orders", &format!("o{i}")).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.unsynced() {
        assert!(tokio::time::Instant::now() < deadline, "the last commits were never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A gate commits wait at until the test opens it, so many at a time.
#[derive(Debug)]
struct Gate {
    /// Commits let through; `u64::MAX`: every one.
    passes: std::sync::Mutex<u64>,
    opened: std::sync::Condvar,
    /// Told each time a commit reaches the gate.
    reached: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
}

impl Gate {
    fn pass(&self, commits: u64) {
        *self.passes.lock().unwrap() = commits;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let _ = self.reached.lock().unwrap().send(());
        let mut passes = self.opened.wait_while(self.passes.lock().unwrap(), |p| *p == 0).unwrap();
        if *passes != u64::MAX {
            *passes -= 1;
        }
    }
}

/// The writer's queue stays first in first out when it is full: a keyed capture that
/// found it full is not overtaken by the next capture of its key, which found room.
/// (One thread: the capture that waits for room cannot be sent before the test says.)
#[tokio::test]
async fn keyed_captures_keep_their_order_through_a_full_writer_queue() {
    let (reached, at_gate) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        passes: std::sync::Mutex::new(u64::MAX),
        opened: std::sync::Condvar::new(),
        reached: std::sync::Mutex::new(reached),
    });
    let at = Arc::clone(&gate);
    let store: Arc<dyn Store> = Arc::new(HookedStore { inner: memory(), before_apply: move || at.wait() });
    let durable = Durable::start(store, options(Duration::from_secs(1))).unwrap();
    durable.create_consumer(consumer("o", &["orders.>"])).await.unwrap();
    let wait_at_gate = || at_gate.recv_timeout(Duration::from_secs(20)).expect("a commit at the gate");
    while at_gate.try_recv().is_ok() {}

    // The writer holds one commit at the closed gate; its queue then fills up.
    gate.pass(0);
    let fill = |i: usize| {
        let record = store::DedupRecord { key: format!("fill-{i}"), event_id: String::new(), expires_ms: 0 };
        vec![StoreOp::Dedup(record)]
    };
    durable.submit(fill(0));
    wait_at_gate();
    for i in 1..=crate::writer::WRITER_QUEUE {
        durable.submit(fill(i));
    }
    let (first, second) = (crate::store_tests::event("first"), crate::store_tests::event("second"));
    let keyed = |event| [CaptureRequest { event, ordering_key: Some("k1"), idempotency_key: None }];
    let (first_request, second_request) = (keyed(&first), keyed(&second));
    // Queued (finding the queue full) on its first poll, answered once committed.
    let mut first_captured = std::pin::pin!(durable.capture_many(&first_request));
    tokio::select! {
        biased;
        _ = &mut first_captured => panic!("answered before its commit"),
        () = std::future::ready(()) => {}
    }
    // One commit through: the writer takes the next group off the queue (room frees
    // up) and holds it at the gate.
    gate.pass(1);
    wait_at_gate();
    let mut second_captured = std::pin::pin!(durable.capture_many(&second_request));
    tokio::select! {
        biased;
        _ = &mut second_captured => panic!("answered before its commit"),
        () = std::future::ready(()) => {}
    }
    gate.pass(u64::MAX);
    for captured in [first_captured.await, second_captured.await] {
        assert!(matches!(captured[..], [Ok(Captured::Stored(1))]), "{captured:?}");
    }
    let mut attached = durable.attach("o", ClientOptions::default(), None).await.unwrap();
    let batch = next(&mut attached.deliveries).await;
    let ids: Vec<&str> = batch.iter().map(|d| &*d.event.id).collect();
    assert_eq!(ids, ["first"], "one in flight per key, the first published first");
}
