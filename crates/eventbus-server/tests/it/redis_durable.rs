//! Durable consumers in redis mode (docs/durable.md on Redis Streams): several instances on one
//! real `redis-server` share each consumer. See `common::redis_server` for what happens
//! without `redis-server`.

use crate::common;

use std::collections::{HashMap, HashSet};

use common::consume::*;
use common::redis_server::*;
use common::*;
use eventbus_proto::pb::{self, consume_request, consume_response};
use prost::Message;
use tonic::Code;

async fn create(server: &TestServer, config: pb::ConsumerConfig) -> pb::ConsumerInfo {
    let req = pb::CreateConsumerRequest { config: Some(config) };
    within(server.admin().await.create_consumer(req)).await.unwrap().into_inner()
}

async fn info(server: &TestServer, name: &str) -> pb::ConsumerInfo {
    let req = pb::GetConsumerRequest { name: name.into() };
    within(server.admin().await.get_consumer(req)).await.unwrap().into_inner()
}

async fn publish(server: &TestServer, req: pb::PublishRequest) -> pb::PublishResponse {
    within(server.client().await.publish(req)).await.unwrap().into_inner()
}

async fn log(server: &TestServer, name: &str, status: pb::EventStatus) -> Vec<pb::EventLogEntry> {
    let req =
        pb::ListEventLogRequest { consumer: name.into(), status: status.into(), limit: 1000, ..Default::default() };
    within(server.admin().await.list_event_log(req)).await.unwrap().into_inner().entries
}

fn payload(d: &pb::Delivery) -> String {
    String::from_utf8(d.event.as_ref().unwrap().payload.to_vec()).unwrap()
}

fn ack(ids: Vec<String>) -> consume_request::Kind {
    consume_request::Kind::Ack(pb::Ack { event_ids: ids })
}

fn nack(id: &str, delay_ms: u64) -> consume_request::Kind {
    consume_request::Kind::Nack(pb::Nack { event_id: id.into(), reason: "try later".into(), delay_ms })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_two_instances_share_one_consumer() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    create(&a, consumer("work", &["jobs.>"])).await;
    // Attached through different instances, each may hold at most 5.
    let mut on_a = attach(a.endpoint(), "work", 5).await.unwrap();
    let mut on_b = attach(b.endpoint(), "work", 5).await.unwrap();
    // Either instance reports the clients of the whole cluster.
    let counted = |server| async move { info(server, "work").await.clients };
    eventually("both instances to count both clients", || async { counted(&a).await == 2 && counted(&b).await == 2 })
        .await;
    // Publishes through both instances, all captured for the one consumer.
    for i in 0..20 {
        let via = if i % 2 == 0 { &a } else { &b };
        publish(via, event("jobs.run", format!("job-{i}"))).await;
    }
    let mut seen = HashSet::new();
    let mut per_instance = [0usize; 2];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while seen.len() < 20 {
        assert!(tokio::time::Instant::now() < deadline, "only {} of 20 delivered", seen.len());
        for (k, c) in [&mut on_a, &mut on_b].into_iter().enumerate() {
            // Each holds up to 5: take what is there, check none was seen before, ack.
            let Some(got) = next_within(c, 300).await else { continue };
            assert!(got.len() <= 5, "a client never holds more than its max_in_flight (it acks all it gets)");
            for d in &got {
                assert!(seen.insert(payload(d)), "{} delivered twice", payload(d));
                assert_eq!(d.attempt, 1);
            }
            per_instance[k] += got.len();
            c.send(ack(ids(&got))).await;
        }
    }
    assert!(per_instance.iter().all(|n| *n > 0), "both instances took work: {per_instance:?}");
    eventually("every ack to be recorded", || async { info(&b, "work").await.acked == 20 }).await;
    let i = info(&b, "work").await;
    assert_eq!((i.pending, i.in_flight), (0, 0), "nothing left: {i:?}");
    assert_eq!(log(&a, "work", pb::EventStatus::Completed).await.len(), 20, "terminal log shared");
    // Acked entries are removed from the stream: memory holds only what is pending.
    let len: u64 =
        redis::cmd("XLEN").arg("socle:eventbus:durable:work:s").query_async(&mut redis.conn().await).await.unwrap();
    assert_eq!(len, 0);
    drop(on_b);
    eventually("instance A to see the client of B leave", || async { counted(&a).await == 1 }).await;
}

/// Reads the next deliveries message, or None when nothing comes within `ms`.
async fn next_within(c: &mut Consumer, ms: u64) -> Option<Vec<pb::Delivery>> {
    match tokio::time::timeout(std::time::Duration::from_millis(ms), c.responses.message()).await {
        Ok(Ok(Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(d)) }))) => Some(d.deliveries),
        Ok(other) => panic!("expected deliveries, got {other:?}"),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_and_captures_follow_at_once_across_instances() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    // Created on A, published on B at once: B has not heard of it yet, and captures anyway.
    create(&a, consumer("inbox", &["orders.*"])).await;
    let first = publish(&b, event("orders.created", "first")).await;
    assert!(!first.duplicate);
    assert_eq!(info(&b, "inbox").await.pending, 1, "B sees the consumer A created");
    // All clients on B, publisher on A.
    let mut on_b = attach(b.endpoint(), "inbox", 0).await.unwrap();
    publish(&a, event("orders.paid", "second")).await;
    let got = on_b.deliveries(2).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["first", "second"]);
    on_b.send(ack(ids(&got))).await;
    eventually("acks", || async { info(&a, "inbox").await.acked == 2 }).await;

    // Deleted on A: B's client is detached, B no longer captures, and knows it is gone.
    within(a.admin().await.delete_consumer(pb::DeleteConsumerRequest { name: "inbox".into() })).await.unwrap();
    let end = within(on_b.responses.message()).await;
    assert!(matches!(end, Ok(None)), "B's Consume stream ends when A deletes the consumer: {end:?}");
    publish(&b, event("orders.created", "after")).await;
    let gone = within(b.admin().await.get_consumer(pb::GetConsumerRequest { name: "inbox".into() })).await;
    assert_eq!(gone.unwrap_err().code(), Code::NotFound);
    let keys: Vec<String> =
        redis::cmd("KEYS").arg("socle:eventbus:durable:inbox*").query_async(&mut redis.conn().await).await.unwrap();
    assert!(keys.is_empty(), "delete removes everything the consumer held: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_publish_across_instances() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    create(&a, consumer("billing", &["payments.>"])).await;
    let mut req = event("payments.captured", "once");
    req.idempotency_key = "payment-42".into();
    let first = publish(&a, req.clone()).await;
    let again = publish(&b, req.clone()).await;
    assert!(!first.duplicate && again.duplicate, "{first:?} / {again:?}");
    assert_eq!(first.event_id, again.event_id, "the duplicate names the original");
    assert_eq!(info(&b, "billing").await.pending, 1, "captured once");
    // Without consumers involved, the key is still remembered cluster-wide.
    let mut other = event("unrelated.channel", "x");
    other.idempotency_key = "solo".into();
    assert!(!publish(&b, other.clone()).await.duplicate);
    assert!(publish(&a, other).await.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_the_terminal_log_across_instances() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    let config = pb::ConsumerConfig {
        max_attempts: Some(2),
        backoff: Some(pb::Backoff { initial_ms: 20, multiplier: 1.0, max_ms: 20, ..Default::default() }),
        ..consumer("fragile", &["jobs.>"])
    };
    create(&b, config).await;
    // The dead letter is published on B's side too: subscribe there.
    let mut dlq = b.subscribe(sub(&["dlq.jobs.>"])).await;
    let mut c = attach(a.endpoint(), "fragile", 0).await.unwrap();
    let published = publish(&b, event("jobs.resize", "img-1")).await;
    let d1 = c.deliveries(1).await;
    assert_eq!(d1[0].attempt, 1);
    c.send(nack(&published.event_id, 0)).await;
    let d2 = c.deliveries(1).await;
    assert_eq!((d2[0].attempt, payload(&d2[0])), (2, "img-1".into()), "redelivered after the backoff");
    c.send(consume_request::Kind::Nack(pb::Nack {
        event_id: published.event_id.clone(),
        reason: "still broken".into(),
        delay_ms: 0,
    }))
    .await;

    let letter = dlq.take(1).await.remove(0);
    assert_eq!(letter.channel, "dlq.jobs.resize");
    let dl = pb::DeadLetter::decode(letter.payload).unwrap();
    assert_eq!((dl.consumer.as_str(), dl.attempts), ("fragile", 2));
    assert_eq!(dl.event.unwrap().id, published.event_id);
    let reasons: Vec<&str> = dl.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons, ["try later", "still broken"]);
    // Published, so out of the outbox.
    eventually("the outbox to empty", || async { outbox_len(&redis, "fragile").await == 0 }).await;

    let entries = log(&b, "fragile", pb::EventStatus::DeadLettered).await;
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].event_id.as_str(), entries[0].attempts), (published.event_id.as_str(), 2));
    assert_eq!(entries[0].channel, "jobs.resize");
    assert!(entries[0].first_delivered_at.is_some() && entries[0].finished_at.is_some());
    assert!(log(&a, "fragile", pb::EventStatus::Completed).await.is_empty());
    let i = info(&a, "fragile").await;
    assert_eq!((i.pending, i.in_flight, i.dead_lettered), (0, 0, 1));

    // A late ack of an event waiting for its retry completes it.
    let late = publish(&a, event("jobs.resize", "img-2")).await;
    c.deliveries(1).await;
    c.send(nack(&late.event_id, 60_000)).await;
    eventually("the nack to be recorded", || async { info(&b, "fragile").await.in_flight == 0 }).await;
    c.send(ack(vec![late.event_id.clone()])).await;
    eventually("the late ack to complete it", || async { info(&b, "fragile").await.acked == 1 }).await;
    let done = log(&a, "fragile", pb::EventStatus::Completed).await;
    assert_eq!(done.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), [late.event_id.as_str()]);
}

async fn outbox_len(redis: &RedisProc, consumer: &str) -> u64 {
    let key = format!("socle:eventbus:durable:{consumer}:o");
    redis::cmd("HLEN").arg(key).query_async(&mut redis.conn().await).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_publisher_died_is_published_by_a_janitor() {
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker(&redis).await;
    create(&a, consumer("orphans", &["jobs.>"])).await;
    let published = publish(&a, event("jobs.run", "lost-letter")).await;
    // What an instance killed between dead-lettering an event and publishing its dead
    // letter leaves: the entry gone from the stream, the letter in the outbox, stamped
    // long ago.
    let mut conn = redis.conn().await;
    let stream = "socle:eventbus:durable:orphans:s";
    let entries: Vec<(String, HashMap<String, Vec<u8>>)> =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(&mut conn).await.unwrap();
    let (sid, fields) = entries.into_iter().next().unwrap();
    let _: i64 = redis::cmd("XDEL").arg(stream).arg(&sid).query_async(&mut conn).await.unwrap();
    let record = r#"return redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack({ARGV[2], 3, '[{"at_ms":1,"reason":"gave up"}]', 0}))"#;
    let _: i64 = redis::Script::new(record)
        .key("socle:eventbus:durable:orphans:o")
        .arg(&published.event_id)
        .arg(&fields["e"][..])
        .invoke_async(&mut conn)
        .await
        .unwrap();

    let mut dlq = a.subscribe(sub(&["dlq.>"])).await;
    // A client attaching starts this instance's janitor for the consumer.
    let _c = attach(a.endpoint(), "orphans", 0).await.unwrap();
    let letter = dlq.take(1).await.remove(0);
    assert_eq!(letter.channel, "dlq.jobs.run");
    let dl = pb::DeadLetter::decode(letter.payload).unwrap();
    assert_eq!((dl.consumer.as_str(), dl.attempts), ("orphans", 3));
    assert_eq!(dl.event.unwrap().id, published.event_id);
    assert_eq!(dl.failures[0].reason, "gave up");
    eventually("the outbox to empty", || async { outbox_len(&redis, "orphans").await == 0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_keys_hold_across_instances() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    create(&a, consumer("seq", &["accounts.>"])).await;
    let mut on_a = attach(a.endpoint(), "seq", 0).await.unwrap();
    let mut on_b = attach(b.endpoint(), "seq", 0).await.unwrap();
    // Key k1 published alternately through both instances; k2 alongside.
    for i in 0..4 {
        let via = if i % 2 == 0 { &a } else { &b };
        let mut req = event("accounts.debit", format!("k1-{i}"));
        req.ordering_key = "k1".into();
        publish(via, req).await;
    }
    let mut req = event("accounts.debit", "k2-0");
    req.ordering_key = "k2".into();
    publish(&b, req).await;

    let mut k1_order = Vec::new();
    let mut k2_seen = false;
    while k1_order.len() < 4 || !k2_seen {
        // Everything in flight now, across both instances.
        let mut in_flight = Vec::new();
        for c in [&mut on_a, &mut on_b] {
            while let Some(got) = next_within(c, 200).await {
                in_flight.extend(got.into_iter().map(|d| (payload(&d), d.event.unwrap().id)));
            }
        }
        assert!(!in_flight.is_empty(), "progress stalled: k1 so far {k1_order:?}");
        let k1: Vec<&String> = in_flight.iter().map(|(p, _)| p).filter(|p| p.starts_with("k1")).collect();
        assert!(k1.len() <= 1, "one event of a key in flight at a time, cluster-wide: {k1:?}");
        for (p, id) in &in_flight {
            if p.starts_with("k1") {
                k1_order.push(p.clone());
            } else {
                k2_seen = true;
            }
            // Ack through the instance that delivered it: any one works for the ack,
            // since both clients attach to one consumer; send to both.
            on_a.send(ack(vec![id.clone()])).await;
            on_b.send(ack(vec![id.clone()])).await;
        }
    }
    assert_eq!(k1_order, ["k1-0", "k1-1", "k1-2", "k1-3"], "in publish order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_events_are_redelivered_by_another() {
    let Some(redis) = RedisProc::start().await else { return };
    let b = broker(&redis).await;
    let config = pb::ConsumerConfig { ack_deadline_ms: 1_000, ..consumer("jobs", &["jobs.>"]) };
    create(&b, config).await;
    // Instance A is the real binary, so it can be killed -9.
    let dir = tempfile::tempdir().unwrap();
    let (mut a, endpoint) = redis_daemon(&redis, dir.path()).await;
    let mut on_a = attach(endpoint, "jobs", 0).await.unwrap();
    for i in 0..3 {
        publish(&b, event("jobs.run", format!("job-{i}"))).await;
    }
    let held = on_a.deliveries(3).await;
    assert!(held.iter().all(|d| d.attempt == 1));
    kill_9(&mut a).await;

    // B reclaims them once their ack deadline has passed: attempt 2.
    let mut on_b = attach(b.endpoint(), "jobs", 0).await.unwrap();
    let again = on_b.deliveries(3).await;
    let want: HashSet<String> = ids(&held).into_iter().collect();
    assert_eq!(ids(&again).into_iter().collect::<HashSet<_>>(), want);
    assert!(again.iter().all(|d| d.attempt == 2), "{:?}", again.iter().map(|d| d.attempt).collect::<Vec<_>>());
    on_b.send(ack(ids(&again))).await;
    eventually("acks", || async { info(&b, "jobs").await.acked == 3 }).await;
    let entries = log(&b, "jobs", pb::EventStatus::Completed).await;
    let reasons: HashMap<&str, Vec<&str>> =
        entries.iter().map(|e| (e.event_id.as_str(), e.failures.iter().map(|f| f.reason.as_str()).collect())).collect();
    assert!(reasons.values().all(|r| *r == ["ack deadline exceeded"]), "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_redis_restart_loses_nothing_acknowledged() {
    let Some(mut redis) = RedisProc::start_persistent().await else { return };
    let a = broker(&redis).await;
    create(&a, consumer("keep", &["ledger.>"])).await;
    let mut published = HashSet::new();
    for i in 0..50 {
        published.insert(publish(&a, event("ledger.entry", format!("e-{i}"))).await.event_id);
    }
    redis.kill();
    let down = within(a.client().await.publish(event("ledger.entry", "lost?"))).await;
    assert_eq!(down.unwrap_err().code(), Code::Unavailable, "never an OK for an event that went nowhere");
    let attach_down = attach(a.endpoint(), "keep", 0).await;
    assert_eq!(attach_down.err().map(|s| s.code()), Some(Code::Unavailable));
    redis.spawn().await;
    wait_ready(&a, true).await;

    let mut c = eventually_attach(&a, "keep").await;
    let got = c.deliveries(50).await;
    assert_eq!(ids(&got).into_iter().collect::<HashSet<_>>(), published, "every event answered OK survived");
    assert!(got.iter().all(|d| d.attempt == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_held_when_redis_went_away_come_back_as_soon_as_their_client_reattaches() {
    let Some(mut redis) = RedisProc::start_persistent().await else { return };
    let a = broker(&redis).await;
    // An ack deadline far beyond this test's patience: only their release on
    // reattach can bring the held events back in time.
    let config = pb::ConsumerConfig { ack_deadline_ms: 600_000, ..consumer("held", &["held.>"]) };
    create(&a, config).await;
    let mut c = attach(a.endpoint(), "held", 0).await.unwrap();
    for i in 0..3 {
        publish(&a, event("held.x", format!("h-{i}"))).await;
    }
    let held = c.deliveries(3).await;
    redis.kill();
    let end = within(c.responses.message()).await;
    assert_eq!(end.err().map(|s| s.code()), Some(Code::Unavailable), "the client is told to reconnect");
    redis.spawn().await;
    wait_ready(&a, true).await;

    let mut c = eventually_attach(&a, "held").await;
    let again = c.deliveries(3).await;
    assert_eq!(ids(&again).into_iter().collect::<HashSet<_>>(), ids(&held).into_iter().collect::<HashSet<_>>());
    assert!(again.iter().all(|d| d.attempt == 2), "one failed attempt each: {again:?}");
    c.send(ack(ids(&again))).await;
    eventually("acks", || async { info(&a, "held").await.acked == 3 }).await;
    let entries = log(&a, "held", pb::EventStatus::Completed).await;
    assert!(
        entries.iter().all(|e| e.failures.len() == 1 && e.failures[0].reason == "consumer disconnected"),
        "{entries:?}"
    );
}

/// Attaches once Redis answers again (the connection comes back with backoff).
async fn eventually_attach(server: &TestServer, name: &str) -> Consumer {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match attach(server.endpoint(), name, 0).await {
            Ok(c) => return c,
            Err(status) if status.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(status) => panic!("attach failed: {status:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_redis_ends_consume_streams_with_unavailable_and_clients_recover() {
    let Some(mut redis) = RedisProc::start().await else { return };
    let a = broker(&redis).await;
    create(&a, consumer("w", &["w.>"])).await;
    let mut c = attach(a.endpoint(), "w", 0).await.unwrap();
    redis.kill();
    let end = within(c.responses.message()).await;
    assert_eq!(end.err().map(|s| s.code()), Some(Code::Unavailable), "the client is told to reconnect");
    redis.spawn().await;
    wait_ready(&a, true).await;
    // Without persistence the restarted Redis is empty: the consumer is gone; with
    // `create_if_missing` the client recreates it and carries on.
    let mut client = a.client().await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let attach_req =
        pb::Attach { consumer: "w".into(), create_if_missing: Some(consumer("w", &["w.>"])), ..Default::default() };
    tx.send(req(consume_request::Kind::Attach(attach_req))).await.unwrap();
    let mut responses = within(client.consume(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .expect("attach after recovery")
        .into_inner();
    assert!(matches!(
        within(responses.message()).await.unwrap(),
        Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Attached(_)) })
    ));
    publish(&a, event("w.x", "back")).await;
    match within(responses.message()).await.unwrap() {
        Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(d)) }) => {
            assert_eq!(payload(&d.deliveries[0]), "back")
        }
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_declared_in_the_configuration_outlive_a_redis_that_lost_its_data() {
    let Some(mut redis) = RedisProc::start().await else { return };
    let declared = eventbus_server::config::ConsumerSetting {
        name: "declared".into(),
        channels: vec!["jobs.>".into()],
        ack_deadline_ms: 30_000,
        max_attempts: 5,
        backoff: Default::default(),
        max_in_flight: 100,
        dead_letter_channel: String::new(),
        exclusive: false,
        max_pending: 0,
        push: None,
    };
    let a = broker_with(&redis, |s| s.durable.consumers = vec![declared]).await;
    eventually("the declared consumer", || async { get(&a, "declared").await.is_ok() }).await;
    // Restarted without persistence: every definition is gone from Redis.
    redis.kill();
    redis.spawn().await;
    wait_ready(&a, true).await;
    eventually("the declared consumer to be declared again", || async { get(&a, "declared").await.is_ok() }).await;
    let published = publish(&a, event("jobs.run", "after")).await;
    let mut c = attach(a.endpoint(), "declared", 0).await.unwrap();
    assert_eq!(ids(&c.deliveries(1).await), [published.event_id], "captured again");
}

async fn get(server: &TestServer, name: &str) -> Result<pb::ConsumerInfo, tonic::Status> {
    let request = pb::GetConsumerRequest { name: name.into() };
    server.admin().await.get_consumer(request).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_is_captured_in_order_and_stops_at_its_first_error() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker(&redis).await;
    create(&server, consumer("ps", &["ps.>"])).await;
    // Sent all at once, so the broker publishes them in chunks (one capture script
    // for many); a repeated idempotency key inside the stream is still caught.
    let reqs: Vec<pb::PublishRequest> = (0..300)
        .map(|i| {
            let mut req = event("ps.x", format!("{i}"));
            if i == 150 || i == 151 {
                req.idempotency_key = "once".into();
            }
            req
        })
        .collect();
    let mut client = server.client().await;
    let mut responses = within(client.publish_stream(tokio_stream::iter(reqs))).await.unwrap().into_inner();
    let mut answers = Vec::new();
    while let Some(resp) = within(responses.message()).await.unwrap() {
        answers.push(resp);
    }
    assert_eq!(answers.len(), 300, "one answer per request");
    assert!(answers[151].duplicate && answers[151].event_id == answers[150].event_id);
    assert_eq!(answers.iter().filter(|a| a.duplicate).count(), 1);

    // An invalid request ends the stream with its status; earlier ones are published,
    // later ones are not.
    let reqs = vec![event("ps.ok", "ok"), event("ps.*", "bad"), event("ps.never", "never")];
    let mut responses = within(client.publish_stream(tokio_stream::iter(reqs))).await.unwrap().into_inner();
    assert!(!within(responses.message()).await.unwrap().unwrap().duplicate);
    let err = within(responses.message()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("ps.*"), "{}", err.message());

    let mut c = attach(server.endpoint(), "ps", 0).await.unwrap();
    let got = c.deliveries(300).await;
    let payloads: Vec<String> = got.iter().map(payload).collect();
    let mut expected: Vec<String> = (0..300).filter(|i| *i != 151).map(|i| i.to_string()).collect();
    expected.push("ok".into());
    assert_eq!(payloads, expected, "captured in publish order, the duplicate once, nothing after the error");
    let published: Vec<&String> = answers.iter().filter(|a| !a.duplicate).map(|a| &a.event_id).collect();
    assert_eq!(ids(&got)[..299].iter().collect::<Vec<_>>(), published);
    assert_eq!(info(&server, "ps").await.pending, 0);
}

/// Stream id of the entry holding `event_id`, read straight from Redis.
async fn stream_id_of(redis: &RedisProc, stream: &str, event_id: &str) -> String {
    let rows: redis::Value =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(&mut redis.conn().await).await.unwrap();
    let redis::Value::Array(rows) = rows else { panic!("XRANGE: {rows:?}") };
    for row in rows {
        let redis::Value::Array(row) = row else { continue };
        let (redis::Value::BulkString(id), redis::Value::Array(fields)) = (&row[0], &row[1]) else { continue };
        let holds = fields.iter().any(
            |f| matches!(f, redis::Value::BulkString(b) if b.windows(event_id.len()).any(|w| w == event_id.as_bytes())),
        );
        if holds {
            return String::from_utf8(id.clone()).unwrap();
        }
    }
    panic!("no entry of {stream} holds {event_id}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_batch_completes_only_the_entries_still_pending() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker(&redis).await;
    create(&server, consumer("mixed", &["mix.>"])).await;
    let mut c = attach(server.endpoint(), "mixed", 0).await.unwrap();
    let first = publish(&server, event("mix.a", "first")).await;
    let second = publish(&server, event("mix.a", "second")).await;
    c.deliveries(2).await;
    // Meanwhile the first left the pending list behind this instance's back (as when
    // another instance's janitor reclaims an event held past its deadline).
    let stream = "socle:eventbus:durable:mixed:s";
    let sid = stream_id_of(&redis, stream, &first.event_id).await;
    let mut conn = redis.conn().await;
    let _: i64 = redis::cmd("XACK").arg(stream).arg("eventbus").arg(&sid).query_async(&mut conn).await.unwrap();
    let _: i64 = redis::cmd("XDEL").arg(stream).arg(&sid).query_async(&mut conn).await.unwrap();

    c.send(ack(vec![first.event_id.clone(), second.event_id.clone()])).await;
    eventually("the ack batch to be applied", || async { info(&server, "mixed").await.in_flight == 0 }).await;
    let i = info(&server, "mixed").await;
    assert_eq!((i.acked, i.pending), (1, 0), "only the entry still pending completed");
    let done = log(&server, "mixed", pb::EventStatus::Completed).await;
    let ids: Vec<&str> = done.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, [second.event_id.as_str()]);
    assert_eq!(done[0].channel, "mix.a");
}

/// The real binary in redis mode on `redis` (so a test can kill it -9), and its endpoint.
async fn redis_daemon(redis: &RedisProc, dir: &std::path::Path) -> (tokio::process::Child, tonic::transport::Endpoint) {
    let env = [
        ("EVENTBUS_MODE", "redis".to_owned()),
        ("REDIS_HOST", "127.0.0.1".to_owned()),
        ("REDIS_PORT", redis.port.to_string()),
    ];
    let (child, addr) = daemon_with(dir, &env).await;
    (child, tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap())
}

async fn set_paused(server: &TestServer, name: &str, paused: bool) -> pb::ConsumerInfo {
    let mut admin = server.admin().await;
    let answer = if paused {
        admin.pause_consumer(pb::PauseConsumerRequest { name: name.into() }).await
    } else {
        admin.resume_consumer(pb::ResumeConsumerRequest { name: name.into() }).await
    };
    within(async { answer }).await.unwrap().into_inner()
}

/// A pause made through one instance holds on every instance at once, the
/// next publish included, and survives a restart of the instances (it lives in Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_on_every_instance_at_once() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    create(&a, consumer("inbox", &["jobs.>"])).await;
    let mut on_b = attach(b.endpoint(), "inbox", 0).await.unwrap();
    assert!(set_paused(&a, "inbox", true).await.paused);
    // Published the moment the pause is answered, through either instance.
    for i in 0..4 {
        let via = if i % 2 == 0 { &a } else { &b };
        publish(via, event("jobs.run", format!("job-{i}"))).await;
    }
    let held = info(&b, "inbox").await;
    assert_eq!((held.paused, held.pending + held.in_flight), (true, 4), "{held:?}");
    assert!(next_within(&mut on_b, 300).await.is_none(), "nothing delivered while paused");
    eventually("nothing in flight while paused", || async { info(&b, "inbox").await.in_flight == 0 }).await;
    // A new instance learns the pause from Redis.
    let c = broker(&redis).await;
    assert!(info(&c, "inbox").await.paused);
    let mut on_c = attach(c.endpoint(), "inbox", 0).await.unwrap();
    assert!(next_within(&mut on_c, 300).await.is_none(), "nothing delivered through a new instance either");
    drop(on_c);
    assert!(!set_paused(&b, "inbox", false).await.paused);
    let got = on_b.deliveries(4).await;
    let mut payloads: Vec<String> = got.iter().map(payload).collect();
    payloads.sort();
    assert_eq!(payloads, ["job-0", "job-1", "job-2", "job-3"]);
    assert!(got.iter().all(|d| d.attempt == 1), "a pause costs no attempt");
}

/// An exclusive consumer's clients on two instances: only one receives; when
/// it leaves, the other instance's client takes over once the events it held are
/// released. Prints the failover time (docs/consumer-operations.md "Exclusive consumers").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_consumer_fails_over_across_instances() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    let config = pb::ConsumerConfig {
        exclusive: true,
        backoff: Some(pb::Backoff { initial_ms: 50, multiplier: 1.0, max_ms: 50, ..Default::default() }),
        ..consumer("runner", &["cron.>"])
    };
    create(&a, config).await;
    let mut on_a = attach(a.endpoint(), "runner", 0).await.unwrap();
    // A receives first: it holds the lease before B's client exists.
    publish(&a, event("cron.tick", "probe")).await;
    let probe = on_a.deliveries(1).await;
    on_a.send(ack(ids(&probe))).await;
    let mut on_b = attach(b.endpoint(), "runner", 0).await.unwrap();
    for i in 0..3 {
        publish(&b, event("cron.tick", format!("t{i}"))).await;
    }
    let got = on_a.deliveries(3).await;
    assert!(next_within(&mut on_b, 500).await.is_none(), "the second client waits while the first is attached");
    on_a.send(ack(vec![ids(&got)[0].clone()])).await;
    eventually("the ack of t0", || async { info(&a, "runner").await.acked == 2 }).await;
    let left = std::time::Instant::now();
    drop(on_a);
    let mut taken = on_b.deliveries(2).await;
    let failover = left.elapsed();
    eprintln!("exclusive failover across instances (clean detach): {failover:?}");
    taken.sort_by_key(payload);
    assert_eq!(taken.iter().map(|d| (payload(d), d.attempt)).collect::<Vec<_>>(), [("t1".into(), 2), ("t2".into(), 2)]);
    on_b.send(ack(ids(&taken))).await;
    publish(&a, event("cron.tick", "after")).await;
    assert_eq!(payload(&on_b.deliveries(1).await[0]), "after");
}

/// The instance whose client receives for an exclusive consumer dies (kill -9):
/// the other instance's client takes over once the lease has expired and the dead
/// client's events are reclaimed past their ack deadline. Prints the failover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_consumer_fails_over_when_its_instance_dies() {
    let Some(redis) = RedisProc::start().await else { return };
    let b = broker(&redis).await;
    let config = pb::ConsumerConfig { exclusive: true, ack_deadline_ms: 1_000, ..consumer("runner", &["cron.>"]) };
    create(&b, config).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut a, endpoint) = redis_daemon(&redis, dir.path()).await;
    let mut on_a = attach(endpoint, "runner", 0).await.unwrap();
    publish(&b, event("cron.tick", "probe")).await;
    let held = on_a.deliveries(1).await;
    let mut on_b = attach(b.endpoint(), "runner", 0).await.unwrap();
    publish(&b, event("cron.tick", "next")).await;
    let more = on_a.deliveries(1).await;
    assert!(next_within(&mut on_b, 300).await.is_none(), "B waits while A's client receives");
    kill_9(&mut a).await;
    let died = std::time::Instant::now();
    let mut taken = on_b.deliveries(2).await;
    eprintln!("exclusive failover across instances (instance killed): {:?}", died.elapsed());
    taken.sort_by_key(payload);
    assert_eq!(
        taken.iter().map(|d| (payload(d), d.attempt)).collect::<Vec<_>>(),
        [("next".into(), 2), ("probe".into(), 2)]
    );
    let want: HashSet<String> = ids(&held).into_iter().chain(ids(&more)).collect();
    assert_eq!(ids(&taken).into_iter().collect::<HashSet<_>>(), want);
}

/// The terminal log of `consumer`, read page by page (`limit` a page) through ListEventLog
/// from `token` on.
async fn log_pages(server: &TestServer, consumer: &str, limit: u32, mut token: String) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let req = pb::ListEventLogRequest { consumer: consumer.into(), limit, page_token: token, ..Default::default() };
        let page = within(server.admin().await.list_event_log(req)).await.unwrap().into_inner();
        assert!(page.entries.len() <= limit as usize, "a page holds at most `limit`");
        ids.extend(page.entries.into_iter().map(|e| e.event_id));
        if page.next_page_token.is_empty() {
            return ids;
        }
        token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_log_packs_an_ack_batch_and_still_reads_lines_logged_one_per_entry() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker(&redis).await;
    create(&server, consumer("packed", &["pk.>"])).await;
    // Two lines as every version before packing logged them: one entry, field `j`, each.
    let key = "socle:eventbus:durable:packed:l";
    let mut conn = redis.conn().await;
    let mut old_ids = Vec::new();
    for (id, status) in [("old-1", "Completed"), ("old-2", "DeadLettered")] {
        let line = format!(
            r#"{{"event_id":"{id}","channel":"pk.old","status":"{status}","attempts":1,"first_delivered_ms":1,"finished_ms":2,"failures":[]}}"#
        );
        let sid: String = redis::cmd("XADD").arg(key).arg("*").arg("j").arg(line).query_async(&mut conn).await.unwrap();
        old_ids.push(sid);
    }
    let mut c = attach(server.endpoint(), "packed", 0).await.unwrap();
    let mut sent = Vec::new();
    for i in 0..7 {
        sent.push(publish(&server, event("pk.new", format!("{i}"))).await.event_id);
    }
    let got = c.deliveries(7).await;
    let got: Vec<String> = got.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
    c.send(ack(got.clone())).await;
    eventually("the batch to be acked", || async { info(&server, "packed").await.acked == 7 }).await;
    // One ack script, one log entry for its seven lines.
    let entries: u64 = redis::cmd("XLEN").arg(key).query_async(&mut conn).await.unwrap();
    assert_eq!(entries, 3, "the two old entries and one pack");
    let stream: u64 = redis::cmd("XLEN").arg("socle:eventbus:durable:packed:s").query_async(&mut conn).await.unwrap();
    assert_eq!(stream, 0, "acked entries leave the stream");

    let mut all: Vec<String> = vec!["old-1".into(), "old-2".into()];
    all.extend(got.iter().cloned());
    let whole: Vec<String> =
        log(&server, "packed", pb::EventStatus::Unspecified).await.into_iter().map(|e| e.event_id).collect();
    assert_eq!(whole, all, "old lines, then the pack's in ack order");
    for limit in [1, 2, 3, 4, 9, 10] {
        assert_eq!(log_pages(&server, "packed", limit, String::new()).await, all, "pages of {limit}");
    }
    // A token handed out before packing (an entry id) still reads on past that entry.
    assert_eq!(log_pages(&server, "packed", 3, old_ids[0].clone()).await, all[1..]);
    let done: Vec<String> =
        log(&server, "packed", pb::EventStatus::Completed).await.into_iter().map(|e| e.event_id).collect();
    assert_eq!(done[0], "old-1");
    assert_eq!(done[1..], got[..]);
    let dead = log(&server, "packed", pb::EventStatus::DeadLettered).await;
    assert_eq!((dead.len(), dead[0].event_id.as_str()), (1, "old-2"));
    for bad in ["nope", "1-1.x", "1-1.", ".3"] {
        let req = pb::ListEventLogRequest { consumer: "packed".into(), page_token: bad.into(), ..Default::default() };
        let err = within(server.admin().await.list_event_log(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packed_terminal_log_keeps_about_log_max_entries_lines() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, |s| s.durable.log_max_entries = 10).await;
    create(&server, consumer("short", &["sh.>"])).await;
    let mut c = attach(server.endpoint(), "short", 0).await.unwrap();
    let mut last = Vec::new();
    for round in 1..=6u64 {
        for i in 0..8 {
            publish(&server, event("sh.x", format!("{round}-{i}"))).await;
        }
        let got = c.deliveries(8).await;
        last = got.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
        c.send(ack(last.clone())).await;
        eventually("the batch to be acked", || async { info(&server, "short").await.acked == round * 8 }).await;
        let kept = log(&server, "short", pb::EventStatus::Unspecified).await;
        assert!(kept.len() <= 16, "round {round}: {} lines kept", kept.len());
    }
    let kept: Vec<String> =
        log(&server, "short", pb::EventStatus::Unspecified).await.into_iter().map(|e| e.event_id).collect();
    assert!(kept.len() <= 10 && kept.ends_with(&last), "the newest batch is kept: {kept:?}");
    let counted: u64 = redis::cmd("HGET")
        .arg("socle:eventbus:durable:short:n")
        .arg("logged")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    assert_eq!(counted, kept.len() as u64, "the line count matches the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_out_of_order_leave_exactly_the_unacked_entries_on_the_stream() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker(&redis).await;
    create(&server, consumer("ooo", &["ooo.>"])).await;
    let mut c = attach(server.endpoint(), "ooo", 0).await.unwrap();
    for i in 0..4 {
        publish(&server, event("ooo.x", format!("{i}"))).await;
    }
    let got = c.deliveries(4).await;
    let ids: Vec<String> = got.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
    let stream_len = || async {
        let n: u64 =
            redis::cmd("XLEN").arg("socle:eventbus:durable:ooo:s").query_async(&mut redis.conn().await).await.unwrap();
        n
    };
    // Acked ahead of older events still in flight: those stay on the stream (pending).
    for (k, at) in [2usize, 3, 0, 1].into_iter().enumerate() {
        c.send(ack(vec![ids[at].clone()])).await;
        let acked = k as u64 + 1;
        eventually("the ack to apply", || async { info(&server, "ooo").await.acked == acked }).await;
        assert_eq!(stream_len().await, 4 - acked, "after acking {at}");
        assert_eq!(info(&server, "ooo").await.in_flight, 4 - acked);
    }
    let done: Vec<String> =
        log(&server, "ooo", pb::EventStatus::Completed).await.into_iter().map(|e| e.event_id).collect();
    assert_eq!(done, [ids[2].clone(), ids[3].clone(), ids[0].clone(), ids[1].clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packed_terminal_log_ages_out_by_log_max_age_ms() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, |s| s.durable.log_max_age_ms = 300).await;
    create(&server, pb::ConsumerConfig { ack_deadline_ms: 200, ..consumer("aging", &["ag.>"]) }).await;
    let mut c = attach(server.endpoint(), "aging", 0).await.unwrap();
    for i in 0..5 {
        publish(&server, event("ag.x", format!("{i}"))).await;
    }
    let got = c.deliveries(5).await;
    c.send(ack(got.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect())).await;
    eventually("the batch to be acked", || async { info(&server, "aging").await.acked == 5 }).await;
    // The janitor (running while a client is attached) drops lines past their age.
    eventually("the log to age out", || async { log(&server, "aging", pb::EventStatus::Unspecified).await.is_empty() })
        .await;
    let counted: u64 = redis::cmd("HGET")
        .arg("socle:eventbus:durable:aging:n")
        .arg("logged")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    assert_eq!(counted, 0, "the line count follows");
    // Still consuming: the janitor's trim did not break anything.
    let later = publish(&server, event("ag.x", "later")).await;
    let d = c.deliveries(1).await;
    assert_eq!(d[0].event.as_ref().unwrap().id, later.event_id);
}

/// The terminal log's entries, as the previous release's reader takes them: each must
/// be one line in field `j`; returns the event ids, or `None` at the first entry that
/// reader could not read (a pack).
async fn log_as_the_previous_release_reads_it(redis: &RedisProc, consumer: &str) -> Option<Vec<String>> {
    let key = format!("socle:eventbus:durable:{consumer}:l");
    let rows: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut redis.conn().await).await.unwrap();
    let mut ids = Vec::new();
    for (_, fields) in rows {
        let [(field, line)] = fields.as_slice() else { return None };
        if field != "j" {
            return None;
        }
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        ids.push(entry["event_id"].as_str().unwrap().to_owned());
    }
    Some(ids)
}

/// A rolling upgrade: Redis holds what the previous release wrote (a recorded fixture:
/// the consumer's definition, its group, a live event, log lines one per entry, no log
/// format key). This build reads it all, and keeps writing the log one line per entry,
/// which the previous release reads, until the fleet's format is set to packed once
/// every instance runs this build; a fresh Redis starts packed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_keeps_the_log_readable_by_the_previous_release() {
    let Some(redis) = RedisProc::start().await else { return };
    let mut conn = redis.conn().await;
    let fixture_event = pb::Event {
        id: "01930000-0000-7000-8000-000000000001".into(),
        channel: "lg.created".into(),
        timestamp: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
        source: "legacy".into(),
        payload: b"from before".to_vec().into(),
        ..Default::default()
    };
    let envelope = [&[0xEB, 0x42, 0x55, 0x01][..], &fixture_event.encode_to_vec()].concat();
    let definition = r#"{"name":"legacy","channels":["lg.>"],"ack_deadline_ms":30000,"max_attempts":5,"backoff":{"initial_ms":1000,"multiplier":2.0,"max_ms":60000},"max_in_flight":100,"dead_letter_channel":null}"#;
    let base = "socle:eventbus:durable:legacy";
    let mut fixture = redis::pipe();
    fixture
        .cmd("HSET")
        .arg("socle:eventbus:durable:consumers")
        .arg("legacy")
        .arg(definition)
        .cmd("SET")
        .arg("socle:eventbus:durable:version")
        .arg(1)
        .cmd("XGROUP")
        .arg("CREATE")
        .arg(format!("{base}:s"))
        .arg("eventbus")
        .arg("0")
        .arg("MKSTREAM")
        .cmd("XADD")
        .arg(format!("{base}:s"))
        .arg("*")
        .arg("e")
        .arg(envelope)
        .cmd("HSET")
        .arg(format!("{base}:n"))
        .arg("acked")
        .arg(2);
    for id in ["old-1", "old-2"] {
        let line = format!(
            r#"{{"event_id":"{id}","channel":"lg.old","status":"Completed","attempts":1,"first_delivered_ms":1,"finished_ms":2,"failures":[]}}"#
        );
        fixture.cmd("XADD").arg(format!("{base}:l")).arg("*").arg("j").arg(line);
    }
    let _: () = fixture.query_async(&mut conn).await.unwrap();

    let server = broker(&redis).await;
    assert_eq!(info(&server, "legacy").await.acked, 2, "the previous release's counters read");
    let mut c = attach(server.endpoint(), "legacy", 0).await.unwrap();
    let mut new_ids = Vec::new();
    for i in 0..5 {
        new_ids.push(publish(&server, event("lg.created", format!("{i}"))).await.event_id);
    }
    let got: Vec<String> = c.deliveries(6).await.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
    assert_eq!(got[0], fixture_event.id, "the previous release's live event is delivered");
    c.send(ack(got.clone())).await;
    eventually("the batch acked", || async { info(&server, "legacy").await.acked == 8 }).await;
    let format: Option<String> =
        redis::cmd("GET").arg("socle:eventbus:durable:log_format").query_async(&mut conn).await.unwrap();
    assert_eq!(format, None, "an upgraded Redis is not switched by itself");
    let mut expected: Vec<String> = vec!["old-1".into(), "old-2".into()];
    expected.extend(got.iter().cloned());
    assert_eq!(
        log_as_the_previous_release_reads_it(&redis, "legacy").await.as_deref(),
        Some(&expected[..]),
        "one line per entry while the previous release may still read the log"
    );

    // Every instance upgraded: the operator switches the fleet to packed entries.
    let _: () = redis::cmd("SET").arg("socle:eventbus:durable:log_format").arg(2).query_async(&mut conn).await.unwrap();
    let mut later = Vec::new();
    for i in 0..3 {
        later.push(publish(&server, event("lg.created", format!("late {i}"))).await.event_id);
    }
    let got_later: Vec<String> = c.deliveries(3).await.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
    c.send(ack(got_later.clone())).await;
    eventually("the second batch acked", || async { info(&server, "legacy").await.acked == 11 }).await;
    let entries: u64 = redis::cmd("XLEN").arg(format!("{base}:l")).query_async(&mut conn).await.unwrap();
    assert_eq!(entries, 2 + 6 + 1, "the second batch's three lines packed in one entry");
    assert_eq!(log_as_the_previous_release_reads_it(&redis, "legacy").await, None, "a pack: this build only");
    expected.extend(got_later.iter().cloned());
    let whole: Vec<String> =
        log(&server, "legacy", pb::EventStatus::Unspecified).await.into_iter().map(|e| e.event_id).collect();
    assert_eq!(whole, expected, "this build reads both kinds of entry");

    // A fresh Redis has no earlier release to wait for: packed from the first definition.
    let Some(fresh) = RedisProc::start().await else { return };
    let server = broker(&fresh).await;
    create(&server, consumer("fresh", &["fr.>"])).await;
    let format: Option<String> =
        redis::cmd("GET").arg("socle:eventbus:durable:log_format").query_async(&mut fresh.conn().await).await.unwrap();
    assert_eq!(format.as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_acked_an_ok_means_the_replica_has_the_capture() {
    let Some(master) = RedisProc::start().await else { return };
    let Some(mut replica) = RedisProc::start_replica_of(&master).await else { return };
    let server = broker_with(&master, |s| s.eventbus.redis.min_replicas_acked = 1).await;
    create(&server, consumer("replicated", &["pay.>"])).await;
    let stream = "socle:eventbus:durable:replicated:s";
    let mut on_replica = replica.conn().await;
    for i in 1..=20 {
        publish(&server, event("pay.in", format!("p{i}"))).await;
        // Answered OK: the replica has it already, nothing to wait for.
        let len: u64 = redis::cmd("XLEN").arg(stream).query_async(&mut on_replica).await.unwrap();
        assert_eq!(len, i, "publish {i} was answered before the replica had it");
    }
    replica.kill();
    let err = server.client().await.publish(event("pay.in", "alone")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("min_replicas_acked"), "{err:?}");
}
