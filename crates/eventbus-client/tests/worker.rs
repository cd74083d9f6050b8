//! Push worker, against a real eventbusd: concurrency, retries with the
//! backoff, dead letters, deadline extension, graceful drain, and a daemon restart.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use eventbus_client::{Delivery, Outcome, SubscribeOptions, SubscriptionItem, Worker, WorkerMetrics, pb};
use prost::Message as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs `worker` with `handler` in a task; returns its shutdown token and join handle.
fn spawn<H: eventbus_client::Handler>(
    worker: &Worker,
    handler: H,
) -> (CancellationToken, tokio::task::JoinHandle<Result<(), eventbus_client::Error>>) {
    let shutdown = CancellationToken::new();
    let (w, s) = (worker.clone(), shutdown.clone());
    (shutdown, tokio::spawn(async move { w.run(handler, s).await }))
}

type Calls = Arc<Mutex<HashMap<String, Vec<u32>>>>;

/// Records each call's event id and attempt.
fn record(calls: &Calls, d: &Delivery) {
    calls.lock().unwrap().entry(d.event.id.clone()).or_default().push(d.attempt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_events_with_concurrency_8_are_each_handled_once_and_acked() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    const N: usize = 200;
    let ids = publish_n(&client, "orders.created", N).await;

    let registry = prometheus::Registry::new();
    let worker =
        Worker::new(client.clone(), "billing").concurrency(8).metrics(WorkerMetrics::register(&registry).unwrap());
    let calls = Calls::default();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (shutdown, task) = {
        let (calls, running, peak) = (calls.clone(), running.clone(), peak.clone());
        spawn(&worker, move |d: Delivery| {
            let (calls, running, peak) = (calls.clone(), running.clone(), peak.clone());
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                let now = running.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                record(&calls, &d);
                tokio::task::yield_now().await;
                running.fetch_sub(1, SeqCst);
                Outcome::Ack
            }
        })
    };
    eventually("every event acked", || async { client.consumer("billing").await.unwrap().acked == N as u64 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), N);
    assert!(ids.iter().all(|id| calls.get(id).is_some_and(|a| a == &[1])), "each handled once, at attempt 1");
    assert!(peak.load(std::sync::atomic::Ordering::SeqCst) <= 8, "never more than 8 handlers at once");
    let stats = worker.stats();
    assert_eq!((stats.processed, stats.failed, stats.in_flight), (N as u64, 0, 0));
    let info = settled(&client, "billing").await;
    assert_eq!((info.acked, info.redelivered, info.dead_lettered), (N as u64, 0, 0));

    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    assert!(text.contains(&format!("socle_push_worker_processed_total{{consumer=\"billing\"}} {N}")), "{text}");
    assert!(text.contains("socle_push_worker_in_flight{consumer=\"billing\"} 0"), "{text}");
    assert!(text.contains(&format!("socle_push_worker_handle_seconds_count{{consumer=\"billing\"}} {N}")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_twice_is_acked_at_attempt_3_after_the_backoff() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    let id = publish_n(&client, "orders.created", 1).await.remove(0);

    let seen: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let worker = Worker::new(client.clone(), "billing").on_error({
        let errors = errors.clone();
        move |_, reason, attempt| errors.lock().unwrap().push((reason.to_owned(), attempt))
    });
    let (shutdown, task) = {
        let seen = seen.clone();
        spawn(&worker, move |d: Delivery| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((d.attempt, Instant::now()));
                if d.attempt < 3 { Err(format!("boom {}", d.attempt)) } else { Ok(()) }
            }
        })
    };
    eventually("the event acked", || async { client.consumer("billing").await.unwrap().acked == 1 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
    // The consumer's backoff: 20 ms after the first failure, 40 ms after the second.
    assert!(seen[1].1 - seen[0].1 >= Duration::from_millis(20), "{seen:?}");
    assert!(seen[2].1 - seen[1].1 >= Duration::from_millis(40), "{seen:?}");
    assert_eq!(*errors.lock().unwrap(), [("boom 1".to_owned(), 1), ("boom 2".to_owned(), 2)]);
    let stats = worker.stats();
    assert_eq!((stats.processed, stats.failed, stats.retried), (1, 2, 2));

    let log =
        client.event_log(pb::ListEventLogRequest { consumer: "billing".into(), ..Default::default() }).await.unwrap();
    let entry = &log.entries[0];
    assert_eq!(
        (entry.event_id.as_str(), entry.status, entry.attempts),
        (id.as_str(), pb::EventStatus::Completed as i32, 3)
    );
    let reasons: Vec<&str> = entry.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons, ["boom 1", "boom 2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_fails_sends_the_event_to_the_dead_letter_channel() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let config = pb::ConsumerConfig { max_attempts: Some(3), ..consumer("billing", "orders.>") };
    client.create_consumer(config).await.unwrap();
    let mut dead = client.subscribe(SubscribeOptions::new(["dlq.orders.created"])).await.unwrap();
    let id = publish_n(&client, "orders.created", 1).await.remove(0);

    let worker = Worker::new(client.clone(), "billing");
    let (shutdown, task) =
        spawn(&worker, |d: Delivery| async move { Err::<(), _>(format!("card declined (attempt {})", d.attempt)) });
    let letter = within(async {
        loop {
            match dead.next().await.unwrap().unwrap() {
                SubscriptionItem::Events(events) => break events[0].clone(),
                _ => continue,
            }
        }
    })
    .await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();

    assert_eq!(letter.content_type, "application/x-protobuf; type=eventbus.v1.DeadLetter");
    let letter = pb::DeadLetter::decode(letter.payload).unwrap();
    assert_eq!((letter.consumer.as_str(), letter.attempts), ("billing", 3));
    assert_eq!(letter.event.unwrap().id, id);
    let reasons: Vec<String> = letter.failures.into_iter().map(|f| f.reason).collect();
    assert_eq!(reasons, ["card declined (attempt 1)", "card declined (attempt 2)", "card declined (attempt 3)"]);
    let stats = worker.stats();
    assert_eq!((stats.processed, stats.failed), (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_outcome_dead_letters_at_once() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    publish_n(&client, "orders.created", 1).await;
    let worker = Worker::new(client.clone(), "billing");
    let (shutdown, task) = spawn(&worker, |_: Delivery| async { Outcome::term("unknown customer") });
    eventually("dead-lettered", || async { client.consumer("billing").await.unwrap().dead_lettered == 1 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    let log =
        client.event_log(pb::ListEventLogRequest { consumer: "billing".into(), ..Default::default() }).await.unwrap();
    assert_eq!(log.entries[0].attempts, 1);
    assert_eq!(log.entries[0].failures[0].reason, "unknown customer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_past_the_ack_deadline_is_not_redelivered() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let config = pb::ConsumerConfig { ack_deadline_ms: 400, ..consumer("billing", "orders.>") };
    client.create_consumer(config).await.unwrap();
    publish_n(&client, "orders.created", 1).await;

    let calls = Calls::default();
    let worker = Worker::new(client.clone(), "billing").concurrency(2);
    let (shutdown, task) = {
        let calls = calls.clone();
        spawn(&worker, move |d: Delivery| {
            let calls = calls.clone();
            async move {
                record(&calls, &d);
                // The work itself: three ack deadlines long.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Outcome::Ack
            }
        })
    };
    eventually("the event acked", || async { client.consumer("billing").await.unwrap().acked == 1 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.values().collect::<Vec<_>>(), [&vec![1]], "handled once, never redelivered");
    assert_eq!(client.consumer("billing").await.unwrap().redelivered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_handlers_finish_and_hands_the_rest_back() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    // One attempt allowed: handing back an event no handler started must not count one
    // (it would be dead-lettered).
    let config = pb::ConsumerConfig { max_attempts: Some(1), ..consumer("billing", "orders.>") };
    client.create_consumer(config).await.unwrap();
    const N: usize = 10;
    let ids = publish_n(&client, "orders.created", N).await;

    let calls = Calls::default();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first =
        Worker::new(client.clone(), "billing").concurrency(2).shutdown_timeout(Duration::from_secs(10)).on_stop({
            let stopped = stopped.clone();
            move || stopped.store(true, std::sync::atomic::Ordering::SeqCst)
        });
    let (shutdown, task) = {
        let (calls, release) = (calls.clone(), release.clone());
        spawn(&first, move |d: Delivery| {
            let (calls, release) = (calls.clone(), release.clone());
            async move {
                record(&calls, &d);
                release.acquire().await.unwrap().forget(); // busy until the test lets it finish
                Outcome::Ack
            }
        })
    };
    eventually("two handlers running", || async { first.stats().in_flight == 2 }).await;
    eventually("the rest waiting", || async { first.backlog() == (N - 2) as u64 }).await;
    shutdown.cancel();
    // Draining: the handlers still run, the worker has not stopped.
    eventually("the queue handed back", || async { first.backlog() == 0 }).await;
    assert!(!stopped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(first.stats().in_flight, 2);
    release.add_permits(2);
    within(task).await.unwrap().unwrap();
    assert!(stopped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(first.stats().processed, 2, "the running handlers finished and were acked");

    // Nothing lost: another worker gets the other eight.
    let second = Worker::new(client.clone(), "billing").concurrency(4);
    let (shutdown, task) = {
        let calls = calls.clone();
        spawn(&second, move |d: Delivery| {
            let calls = calls.clone();
            async move {
                record(&calls, &d);
                Outcome::Ack
            }
        })
    };
    eventually("every event acked", || async { client.consumer("billing").await.unwrap().acked == N as u64 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    assert_eq!(second.stats().processed, (N - 2) as u64);
    let calls = calls.lock().unwrap().clone();
    assert!(ids.iter().all(|id| calls.get(id) == Some(&vec![1])), "every event handled once, at attempt 1: {calls:?}");
    let info = client.consumer("billing").await.unwrap();
    assert_eq!((info.dead_lettered, info.redelivered), (0, 0), "nothing dead-lettered, nothing counted as failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reconnects_after_a_daemon_restart_and_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let mut s = settings();
    s.durable.data_dir = data.path().to_string_lossy().into_owned();
    let broker = Broker::start_with(s.clone()).await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    const N: usize = 100;
    let ids = publish_n(&client, "orders.created", N).await;

    let calls = Calls::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(20)); // 20 events before the restart
    let worker = Worker::new(client.clone(), "billing").concurrency(4).backoff(FAST);
    let (shutdown, task) = {
        let (calls, gate) = (calls.clone(), gate.clone());
        spawn(&worker, move |d: Delivery| {
            let (calls, gate) = (calls.clone(), gate.clone());
            async move {
                gate.acquire().await.unwrap().forget();
                record(&calls, &d);
                Outcome::Ack
            }
        })
    };
    eventually("20 handled", || async { worker.stats().processed == 20 }).await;
    let addr = broker.addr;
    broker.stop().await;
    // The restarted daemon: same port, the store as the stopped one left it on disk.
    let (broker, _store) = Broker::restart(addr, s, data.path()).await;
    gate.add_permits(N * 10);
    eventually("every event handled", || async {
        let calls = calls.lock().unwrap().clone();
        ids.iter().all(|id| calls.contains_key(id))
    })
    .await;
    let info = settled(&client, "billing").await;
    assert_eq!(info.pending + info.in_flight, 0, "nothing left on the restarted broker");
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_counts_as_a_retry() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    publish_n(&client, "orders.created", 1).await;
    let worker = Worker::new(client.clone(), "billing");
    let (shutdown, task) = spawn(&worker, |d: Delivery| {
        assert!(d.attempt > 1, "first attempt panics before any await");
        async {}
    });
    eventually("acked at the second attempt", || async { client.consumer("billing").await.unwrap().acked == 1 }).await;
    shutdown.cancel();
    within(task).await.unwrap().unwrap();
    let stats = worker.stats();
    assert_eq!((stats.processed, stats.failed, stats.retried, stats.in_flight), (1, 1, 1, 0));
    let log =
        client.event_log(pb::ListEventLogRequest { consumer: "billing".into(), ..Default::default() }).await.unwrap();
    assert_eq!(log.entries[0].failures[0].reason, "handler panicked");
}
