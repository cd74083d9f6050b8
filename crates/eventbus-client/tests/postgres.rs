//! Outbox relay and inbox wrapper, against a real eventbusd and a real
//! PostgreSQL on 127.0.0.1:5432 (each test in its own schema). Without PostgreSQL the
//! tests print a NOTICE and pass, unless `EVENTBUS_REQUIRE_POSTGRES=1`.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use eventbus_client::deadpool_postgres::{Manager, Pool};
use eventbus_client::inbox::Inbox;
use eventbus_client::outbox::{Relay, RelayMetrics, RelayOptions};
use eventbus_client::tokio_postgres::{self, NoTls};
use eventbus_client::{Client, Delivery, Handler, Outcome, Worker};
use tokio_util::sync::CancellationToken;

const OUTBOX_SQL: &str = include_str!("../sql/outbox.sql");
const INBOX_SQL: &str = include_str!("../sql/inbox.sql");

/// A schema of its own on the test server, with the shipped DDL applied.
struct Pg {
    schema: String,
    url: String,
    db: tokio_postgres::Client,
}

impl Pg {
    /// `None` (after a NOTICE) when no PostgreSQL answers and none is required.
    async fn start() -> Option<Self> {
        let base = std::env::var("EVENTBUS_TEST_POSTGRES")
            .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".into());
        let (admin, connection) = match tokio_postgres::connect(&base, NoTls).await {
            Ok(pair) => pair,
            Err(err) => {
                assert!(
                    std::env::var("EVENTBUS_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                    "EVENTBUS_REQUIRE_POSTGRES=1 but PostgreSQL does not answer ({base}): {err}"
                );
                eprintln!("NOTICE: PostgreSQL test skipped: no server at {base} ({err})");
                return None;
            }
        };
        tokio::spawn(connection);
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let schema = format!("eventbus_test_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, SeqCst));
        admin.batch_execute(&format!("create schema {schema}")).await.unwrap();
        drop(admin);
        let url = format!("{base} options='-c search_path={schema}'");
        let (db, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        db.batch_execute(OUTBOX_SQL).await.unwrap();
        db.batch_execute(INBOX_SQL).await.unwrap();
        db.batch_execute("create table side_effects (event_id text not null)").await.unwrap();
        Some(Self { schema, url, db })
    }

    fn pool(&self, size: usize) -> Pool {
        let manager = Manager::new(self.url.parse().unwrap(), NoTls);
        Pool::builder(manager).max_size(size).build().unwrap()
    }

    async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.unwrap().get(0)
    }

    async fn unpublished(&self) -> i64 {
        self.count("select count(*) from eventbus_outbox where published_at is null").await
    }

    /// Inserts rows with payloads `from..to` (as text) on `outbox.test`, in one transaction.
    async fn insert(&self, from: i64, to: i64) {
        self.db
            .execute(
                "insert into eventbus_outbox (channel, payload, metadata, content_type) \
                 select 'outbox.test', convert_to(g::text, 'UTF8'), '{\"k\": \"v\"}', 'text/plain' \
                 from generate_series($1::bigint, $2::bigint - 1) g",
                &[&from, &to],
            )
            .await
            .unwrap();
    }

    async fn drop_schema(self) {
        self.db.batch_execute(&format!("drop schema {} cascade", self.schema)).await.unwrap();
    }
}

fn relay(client: &Client, pg: &Pg, batch: usize, registry: &prometheus::Registry) -> Relay {
    let mut options = RelayOptions::new(pg.url.clone());
    options.batch = batch;
    options.backoff = FAST;
    let metrics = RelayMetrics::register(registry).unwrap();
    Relay::new(client.clone(), options).unwrap().metrics(&metrics)
}

/// Runs `relay` in a task; returns its shutdown token and handle.
fn spawn_relay(relay: Relay) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    (shutdown, tokio::spawn(async move { relay.run(stop).await.unwrap() }))
}

type Counts = Arc<Mutex<HashMap<String, u32>>>;

/// A worker on `sink` counting deliveries by payload (and checking what the relay sent).
fn spawn_counting_worker(client: &Client) -> (Counts, CancellationToken, tokio::task::JoinHandle<()>) {
    let counts = Counts::default();
    let worker = Worker::new(client.clone(), "sink").concurrency(8).backoff(FAST);
    let shutdown = CancellationToken::new();
    let (c, stop) = (counts.clone(), shutdown.clone());
    let task = tokio::spawn(async move {
        let handler = move |d: Delivery| {
            let c = c.clone();
            async move {
                assert_eq!(d.event.channel, "outbox.test");
                assert_eq!(d.event.content_type, "text/plain");
                assert_eq!(d.event.metadata.get("k").map(String::as_str), Some("v"));
                let payload = String::from_utf8(d.event.payload.to_vec()).unwrap();
                *c.lock().unwrap().entry(payload).or_default() += 1;
                Outcome::Ack
            }
        };
        worker.run(handler, stop).await.unwrap();
    });
    (counts, shutdown, task)
}

/// Waits until every row is published and delivered; then checks each was delivered once.
async fn assert_each_delivered_once(pg: &Pg, client: &Client, counts: &Counts, n: i64) {
    eventually("every row published", || async { pg.unpublished().await == 0 }).await;
    eventually("every row delivered", || async { counts.lock().unwrap().len() == n as usize }).await;
    let info = settled(client, "sink").await;
    assert_eq!(info.acked, n as u64, "{info:?}");
    let counts = counts.lock().unwrap().clone();
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert!((0..n).all(|i| counts.contains_key(&i.to_string())), "every payload delivered");
}

/// Stops the tasks, the broker, and drops the test's schema.
async fn finish(tasks: Vec<(CancellationToken, tokio::task::JoinHandle<()>)>, broker: Broker, pg: Pg) {
    for (stop, task) in tasks {
        stop.cancel();
        within(task).await.unwrap();
    }
    broker.stop().await;
    pg.drop_schema().await;
}

fn published_total(registry: &prometheus::Registry) -> u64 {
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    let line = text.lines().find(|l| l.starts_with("socle_eventbus_relay_published_total{")).unwrap_or("x 0");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_table_publish_every_row_exactly_once() {
    let Some(pg) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("sink", "outbox.>")).await.unwrap();
    let (counts, stop_worker, worker) = spawn_counting_worker(&client);
    let (r1, r2) = (prometheus::Registry::new(), prometheus::Registry::new());
    let (stop1, relay1) = spawn_relay(relay(&client, &pg, 50, &r1));
    let (stop2, relay2) = spawn_relay(relay(&broker.client().await, &pg, 50, &r2));

    const N: i64 = 2000;
    for chunk in 0..20 {
        pg.insert(chunk * 100, chunk * 100 + 100).await;
    }
    assert_each_delivered_once(&pg, &client, &counts, N).await;
    assert_eq!(published_total(&r1) + published_total(&r2), N as u64, "each row counted once");

    finish(vec![(stop1, relay1), (stop2, relay2), (stop_worker, worker)], broker, pg).await;
}

/// Two services' outboxes on one broker: their rows have the same ids (1, 2, …), and
/// every row of both is delivered, none answered `duplicate` for the other's: the
/// idempotency key names the outbox (`outbox:<system id>:<database>:<schema>:<table>:<id>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_on_one_broker_do_not_collide() {
    let Some(first) = Pg::start().await else { return };
    let Some(second) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("sink", "outbox.>")).await.unwrap();
    let (counts, stop_worker, worker) = spawn_counting_worker(&client);
    let registry = prometheus::Registry::new();
    let (stop1, relay1) = spawn_relay(relay(&client, &first, 50, &registry));
    let mut options = RelayOptions::new(second.url.clone());
    options.backoff = FAST;
    let (stop2, relay2) = spawn_relay(Relay::new(broker.client().await, options).unwrap());
    first.insert(0, 50).await;
    second.insert(50, 100).await;
    eventually("both outboxes published", || async { first.unpublished().await + second.unpublished().await == 0 })
        .await;
    eventually("every row of both delivered", || async { counts.lock().unwrap().len() == 100 }).await;
    let counts = counts.lock().unwrap().clone();
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    finish(vec![(stop1, relay1), (stop2, relay2), (stop_worker, worker)], broker, first).await;
    second.drop_schema().await;
}

/// Rows of one ordering key go out in id order with several relays, some of them killed
/// and restarted on the way: each key's deliveries come in id order (no inversion), every
/// row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_rows_keep_their_id_order_across_relays_and_crashes() {
    let Some(pg) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("sink", "outbox.>")).await.unwrap();
    const N: i64 = 3000;
    const KEYS: i64 = 20;
    pg.db
        .execute(
            "insert into eventbus_outbox (channel, payload, metadata, content_type, ordering_key) \
             select 'outbox.test', convert_to(g::text, 'UTF8'), '{\"k\": \"v\"}', 'text/plain', 'key-' || (g % $2) \
             from generate_series(0::bigint, $1::bigint - 1) g order by g",
            &[&N, &KEYS],
        )
        .await
        .unwrap();
    // Deliveries per key, in the order the worker saw them (one at a time per key).
    let seen: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let worker = Worker::new(client.clone(), "sink").concurrency(8).backoff(FAST);
    let stop_worker = CancellationToken::new();
    let (record, stop) = (seen.clone(), stop_worker.clone());
    let worker = tokio::spawn(async move {
        let handler = move |d: Delivery| {
            let record = record.clone();
            async move {
                let n: i64 = String::from_utf8(d.event.payload.to_vec()).unwrap().parse().unwrap();
                record.lock().unwrap().entry(format!("key-{}", n % KEYS)).or_default().push(n);
                Outcome::Ack
            }
        };
        worker.run(handler, stop).await.unwrap();
    });
    let mut relays: Vec<_> =
        (0..3).map(|_| spawn_relay(relay(&client, &pg, 20, &prometheus::Registry::new()))).collect();
    // Two crashes on the way: a relay's task dropped mid-round, another started.
    for kill_after in [600usize, 1500] {
        eventually("rows going out", || async {
            seen.lock().unwrap().values().map(Vec::len).sum::<usize>() >= kill_after
        })
        .await;
        let (_, victim) = relays.remove(0);
        victim.abort();
        let _ = victim.await;
        relays.push(spawn_relay(relay(&client, &pg, 20, &prometheus::Registry::new())));
    }
    eventually("every row delivered", || async {
        seen.lock().unwrap().values().map(Vec::len).sum::<usize>() >= N as usize
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    let inversions: usize = seen.values().map(|ids| ids.windows(2).filter(|w| w[0] > w[1]).count()).sum();
    assert_eq!(inversions, 0, "keyed rows out of id order: {seen:?}");
    let mut all: Vec<i64> = seen.into_values().flatten().collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "every row once");
    let mut tasks = relays;
    tasks.push((stop_worker, worker));
    finish(tasks, broker, pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_batch_and_restarted_loses_and_duplicates_nothing() {
    let Some(pg) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("sink", "outbox.>")).await.unwrap();
    const N: i64 = 3000;
    pg.insert(0, N).await;

    // A relay that died after publishing its first batch and before committing it (its
    // keys name this outbox as the relay does by default).
    let source: String = pg
        .db
        .query_one(
            "select (select system_identifier::text from pg_control_system()) || ':' || current_database() \
             || ':' || current_schema()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let rows = pg.db.query("select id, payload from eventbus_outbox order by id limit 100", &[]).await.unwrap();
    for row in rows {
        let (id, payload): (i64, Vec<u8>) = (row.get(0), row.get(1));
        let mut request = event("outbox.test", payload);
        request.content_type = "text/plain".into();
        request.metadata.insert("k".into(), "v".into());
        request.idempotency_key = format!("outbox:{source}:eventbus_outbox:{id}");
        client.publish_request(request).await.unwrap();
    }
    let (counts, stop_worker, worker) = spawn_counting_worker(&client);

    // Killed at whatever point it has reached once some rows are out (mid-batch or not:
    // dropping its future drops its connections, so the server rolls its round back).
    let (_, first) = spawn_relay(relay(&client, &pg, 100, &prometheus::Registry::new()));
    eventually("a first part delivered", || async { counts.lock().unwrap().len() >= 500 }).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert!(pg.unpublished().await > 0, "the kill came before the end");

    let (stop, restarted) = spawn_relay(relay(&client, &pg, 100, &prometheus::Registry::new()));
    assert_each_delivered_once(&pg, &client, &counts, N).await;
    assert_eq!(settled(&client, "sink").await.redelivered, 0);

    finish(vec![(stop, restarted), (stop_worker, worker)], broker, pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_wait_while_the_broker_is_down_and_go_out_after() {
    let Some(pg) = Pg::start().await else { return };
    let data = tempfile::tempdir().unwrap();
    let mut s = settings();
    s.durable.data_dir = data.path().to_string_lossy().into_owned();
    let broker = Broker::start_with(s.clone()).await;
    let client = broker.client().await;
    client.create_consumer(consumer("sink", "outbox.>")).await.unwrap();
    let (stop_relay, relay_task) = spawn_relay(relay(&client, &pg, 100, &prometheus::Registry::new()));
    pg.insert(0, 10).await;
    eventually("the first rows published", || async { pg.unpublished().await == 0 }).await;

    let addr = broker.addr;
    broker.stop().await;
    const N: i64 = 200;
    pg.insert(10, N).await;
    // Down for 5 s: the relay keeps trying and marks nothing.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        assert_eq!(pg.unpublished().await, N - 10, "no row marked while the broker is down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The same port and the store as the stopped broker left it.
    let (broker, _store) = Broker::restart(addr, s, data.path()).await;
    let (counts, stop_worker, worker) = spawn_counting_worker(&client);
    assert_each_delivered_once(&pg, &client, &counts, N).await;

    finish(vec![(stop_relay, relay_task), (stop_worker, worker)], broker, pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_rows_are_deleted_after_the_retention_and_only_they() {
    let Some(pg) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut options = RelayOptions::new(pg.url.clone());
    options.retention = Duration::from_millis(200);
    options.idle = Duration::from_millis(50);
    let (stop, task) = spawn_relay(Relay::new(client.clone(), options).unwrap());
    pg.insert(0, 10).await;
    eventually("published rows deleted", || async { pg.count("select count(*) from eventbus_outbox").await == 0 })
        .await;
    // A row the broker refuses (invalid channel) stays, unpublished, however old.
    pg.db.execute("insert into eventbus_outbox (channel, payload) values ('bad channel!', 'x')", &[]).await.unwrap();
    pg.db.execute("update eventbus_outbox set created_at = now() - interval '1 day'", &[]).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while tokio::time::Instant::now() < until {
        assert_eq!(pg.unpublished().await, 1, "the refused row is kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    finish(vec![(stop, task)], broker, pg).await;
}

/// At start, a missing table stops the relay with an error naming it, and an address
/// where no database answers with an error naming the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refuses_to_start_on_a_missing_table_or_an_unreachable_database() {
    let Some(pg) = Pg::start().await else { return };
    RelayOptions::new(pg.url.clone()).preflight().await.expect("the shipped table is there");
    let mut options = RelayOptions::new(pg.url.clone());
    options.table = "no_such_outbox".into();
    let err = options.preflight().await.unwrap_err();
    assert!(matches!(err, eventbus_client::outbox::RelayError::MissingTable { .. }), "{err:?}");
    assert!(err.to_string().contains("no_such_outbox"), "{err}");
    let err = RelayOptions::new("postgres://postgres@127.0.0.1:1/nowhere").preflight().await.unwrap_err();
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stops_naming_the_error_when_its_table_goes_away() {
    let Some(pg) = Pg::start().await else { return };
    let broker = Broker::start().await;
    let client = broker.client().await;
    let relay = relay(&client, &pg, 100, &prometheus::Registry::new());
    pg.db.batch_execute("drop table eventbus_outbox").await.unwrap();
    // No retry brings a table back: the relay stops, saying what PostgreSQL said.
    let err = within(relay.run(CancellationToken::new())).await.unwrap_err();
    assert!(err.is_permanent(), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("eventbus_outbox") && message.contains("SQLSTATE 42P01"), "{message}");
    pg.drop_schema().await;
}

/// An inbox whose handler records each call and writes one side effect, then answers
/// what `outcome(attempt)` says.
fn inbox(pg: &Pg, calls: &Arc<AtomicUsize>, outcome: fn(u32) -> Outcome) -> Inbox {
    let calls = calls.clone();
    Inbox::new(pg.pool(4), "billing", move |d, tx| {
        let calls = calls.clone();
        Box::pin(async move {
            calls.fetch_add(1, SeqCst);
            tx.execute("insert into side_effects (event_id) values ($1)", &[&d.event.id]).await.unwrap();
            outcome(d.attempt)
        })
    })
}

/// Runs `handler` on consumer `billing` until `N` events are acked and settled.
async fn work_inbox(pg: &Pg, handler: impl Handler, n: usize) {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    publish_n(&client, "orders.created", n).await;
    let worker = Worker::new(client.clone(), "billing").concurrency(4).backoff(FAST);
    let shutdown = CancellationToken::new();
    let task = {
        let (worker, stop) = (worker.clone(), shutdown.clone());
        tokio::spawn(async move { worker.run(handler, stop).await })
    };
    eventually("every event acked", || async { client.consumer("billing").await.unwrap().acked == n as u64 }).await;
    settled(&client, "billing").await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    broker.stop().await;
    assert_eq!(pg.count("select count(*) from eventbus_inbox where consumer = 'billing'").await, n as i64);
    assert_eq!(pg.count("select count(*) from side_effects").await, n as i64, "one side effect per event");
    assert_eq!(pg.count("select count(distinct event_id) from side_effects").await, n as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_performs_the_side_effect_once_under_redelivery() {
    let Some(pg) = Pg::start().await else { return };
    const N: usize = 20;
    let calls = Arc::new(AtomicUsize::new(0));
    let inbox = inbox(&pg, &calls, |_| Outcome::Ack);
    // The handler commits, then the ack is lost (the first attempt answers retry
    // whatever happened): the redelivery finds the mark and is acked, not handled.
    let lossy = move |d: Delivery| {
        let inbox = inbox.clone();
        async move {
            let attempt = d.attempt;
            let outcome = inbox.handle(d).await;
            if attempt == 1 { Outcome::retry("ack lost") } else { outcome }
        }
    };
    work_inbox(&pg, lossy, N).await;
    assert_eq!(calls.load(SeqCst), N, "the handler ran once per event, not on the redelivery");
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_rolls_back_its_mark_and_its_side_effect() {
    let Some(pg) = Pg::start().await else { return };
    const N: usize = 20;
    let calls = Arc::new(AtomicUsize::new(0));
    let inbox = inbox(&pg, &calls, |attempt| if attempt == 1 { Outcome::retry("boom") } else { Outcome::Ack });
    work_inbox(&pg, inbox, N).await;
    assert_eq!(calls.load(SeqCst), 2 * N, "the retried attempt ran the handler again: its mark was rolled back");
    pg.drop_schema().await;
}
