//! Durable consumers (docs/durable.md) over the real gRPC API, and a kill -9 crash test of the
//! real binary on a real data directory.

use crate::common;

use std::collections::HashSet;

use common::consume::*;
use common::*;
use eventbus_proto::pb::{self, consume_request};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_acks_and_the_log_over_grpc() {
    let server = start().await;
    let mut admin = server.admin().await;
    let info = admin
        .create_consumer(pb::CreateConsumerRequest { config: Some(consumer("inbox", &["orders.>"])) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.config.as_ref().unwrap().max_attempts, Some(5), "defaults filled in");
    let mut client = server.client().await;
    for i in 0..3 {
        client.publish(event("orders.created", format!("o{i}"))).await.unwrap();
    }
    let before = admin.get_consumer(pb::GetConsumerRequest { name: "inbox".into() }).await.unwrap().into_inner();
    assert_eq!((before.pending, before.clients), (3, 0), "captured while nobody was attached");
    let mut c = attach(server.endpoint(), "inbox", 0).await.unwrap();
    assert_eq!(c.info.pending + c.info.in_flight, 3);
    let got = c.deliveries(3).await;
    assert!(got.iter().all(|d| d.attempt == 1 && d.deadline.is_some()));
    c.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&got) })).await;
    eventually("the acks to land", || {
        let mut admin = admin.clone();
        async move {
            let info = admin.get_consumer(pb::GetConsumerRequest { name: "inbox".into() }).await.unwrap().into_inner();
            info.acked == 3 && info.pending == 0 && info.in_flight == 0
        }
    })
    .await;
    let log = admin
        .list_event_log(pb::ListEventLogRequest { consumer: "inbox".into(), limit: 2, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(log.entries.len(), 2);
    assert!(!log.next_page_token.is_empty());
    assert_eq!(log.entries[0].status, pb::EventStatus::Completed as i32);
    let rest = admin
        .list_event_log(pb::ListEventLogRequest {
            consumer: "inbox".into(),
            page_token: log.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((rest.entries.len(), rest.next_page_token.as_str()), (1, ""));
    let list = admin.list_consumers(pb::ListConsumersRequest {}).await.unwrap().into_inner();
    assert_eq!(list.consumers.len(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_errors_have_their_status_codes() {
    let server = start().await;
    let mut admin = server.admin().await;
    let err = attach(server.endpoint(), "ghost", 0).await.err().unwrap();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("ghost"), "{}", err.message());
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("c", &["a"])) }).await.unwrap();
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("c", &["a"])) }).await.unwrap();
    let err =
        admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("c", &["b"])) }).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let err =
        admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("x", &["a.>.b"])) }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("a.>.b"), "{}", err.message());
    let err = admin.delete_consumer(pb::DeleteConsumerRequest { name: "ghost".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = admin
        .list_event_log(pb::ListEventLogRequest { consumer: "c".into(), page_token: "x".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // The first Consume request must be an attach.
    let mut client = server.client().await;
    let ack = req(consume_request::Kind::Ack(pb::Ack::default()));
    let err = client.consume(tokio_stream::iter([ack])).await.err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    // create_if_missing.
    let (tx, rx) = mpsc::channel(4);
    let attach_req =
        pb::Attach { consumer: "made".into(), create_if_missing: Some(consumer("", &["m"])), ..Default::default() };
    tx.send(req(consume_request::Kind::Attach(attach_req))).await.unwrap();
    client.consume(ReceiverStream::new(rx)).await.unwrap();
    admin.get_consumer(pb::GetConsumerRequest { name: "made".into() }).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_decodable_and_consumable() {
    // The event takes the whole payload limit: its dead letter, which wraps it, is
    // over the limit and must be published all the same.
    let server = start_with(|s| s.eventbus.max_payload_bytes = 64).await;
    let mut admin = server.admin().await;
    let config = pb::ConsumerConfig { max_attempts: Some(1), ..consumer("pay", &["pay.*"]) };
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
    admin
        .create_consumer(pb::CreateConsumerRequest { config: Some(consumer("dlq-keeper", &["dlq.>"])) })
        .await
        .unwrap();
    let mut watcher = server.subscribe(sub(&["dlq.>"])).await;
    let charge = format!("{:<64}", "charge");
    server.client().await.publish(event("pay.card", charge.clone())).await.unwrap();
    let mut c = attach(server.endpoint(), "pay", 0).await.unwrap();
    let got = c.deliveries(1).await;
    let nack = pb::Nack { event_id: ids(&got)[0].clone(), reason: "card declined".into(), delay_ms: 0 };
    c.send(consume_request::Kind::Nack(nack)).await;

    let dead = watcher.take(1).await.remove(0);
    assert_eq!(dead.channel, "dlq.pay.card");
    assert_eq!(dead.content_type, "application/x-protobuf; type=eventbus.v1.DeadLetter");
    let letter = pb::DeadLetter::decode(dead.payload.clone()).unwrap();
    assert_eq!((letter.consumer.as_str(), letter.attempts), ("pay", 1));
    assert_eq!(letter.failures[0].reason, "card declined");
    let wrapped = letter.event.unwrap();
    assert_eq!((wrapped.id.as_str(), wrapped.payload.as_ref()), (ids(&got)[0].as_str(), charge.as_bytes()));
    // Captured durably by a consumer of the dead-letter channel too.
    let mut keeper = attach(server.endpoint(), "dlq-keeper", 0).await.unwrap();
    assert_eq!(keeper.deliveries(1).await[0].event.as_ref().unwrap().id, dead.id);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_releases_in_flight_events_at_once() {
    let server = start().await;
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("d", &["d"])) }).await.unwrap();
    server.client().await.publish(event("d", "x")).await.unwrap();
    let mut c = attach(server.endpoint(), "d", 0).await.unwrap();
    c.deliveries(1).await;
    drop(c);
    eventually("the event to be released", || {
        let mut admin = admin.clone();
        async move {
            let info = admin.get_consumer(pb::GetConsumerRequest { name: "d".into() }).await.unwrap().into_inner();
            info.in_flight == 0 && info.pending == 1 && info.clients == 0
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_publish_over_grpc() {
    let server = start().await;
    let mut client = server.client().await;
    let mut req = event("orders", "x");
    req.idempotency_key = "order-1".into();
    let first = client.publish(req.clone()).await.unwrap().into_inner();
    let again = client.publish(req).await.unwrap().into_inner();
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(first.event_id, again.event_id);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_published_and_redelivers_nothing_completed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("crash", &["load.>"])) }).await.unwrap();

    // Complete a few first.
    let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
    for i in 0..5 {
        client.publish(event("load.early", format!("early-{i}"))).await.unwrap();
    }
    let mut c = attach(endpoint.clone(), "crash", 0).await.unwrap();
    let early = c.deliveries(5).await;
    c.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&early) })).await;
    eventually("the early acks to be logged", || {
        let mut admin = admin.clone();
        async move {
            let log = admin
                .list_event_log(pb::ListEventLogRequest { consumer: "crash".into(), ..Default::default() })
                .await
                .unwrap();
            log.into_inner().entries.len() == 5
        }
    })
    .await;
    drop(c);

    // Publish under load from 4 concurrent publishers; kill -9 mid-stream.
    let (ok_tx, mut ok_rx) = mpsc::unbounded_channel::<String>();
    for p in 0..4 {
        let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
        let ok_tx = ok_tx.clone();
        tokio::spawn(async move {
            for i in 0..100_000 {
                match client.publish(event("load.burst", format!("p{p}-{i}"))).await {
                    Ok(resp) => {
                        let _ = ok_tx.send(resp.into_inner().event_id);
                    }
                    Err(_) => return,
                }
            }
        });
    }
    drop(ok_tx);
    let mut acknowledged = HashSet::new();
    while acknowledged.len() < 300 {
        acknowledged.insert(within(ok_rx.recv()).await.unwrap());
    }
    kill_9(&mut child).await;
    while let Some(id) = within(ok_rx.recv()).await {
        acknowledged.insert(id);
    }

    // Restart on the same directory: every OK'd event is there, nothing completed returns.
    let (_child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "crash".into() }).await.unwrap().into_inner();
    assert!(
        info.pending as usize >= acknowledged.len(),
        "{} pending < {} acknowledged",
        info.pending,
        acknowledged.len()
    );
    let mut c = attach(endpoint, "crash", 0).await.unwrap();
    let redelivered: HashSet<String> = ids(&c.deliveries(info.pending as usize).await).into_iter().collect();
    let missing: Vec<&String> = acknowledged.iter().filter(|id| !redelivered.contains(*id)).collect();
    assert!(missing.is_empty(), "{} acknowledged-as-published events lost", missing.len());
    let early: HashSet<String> = ids(&early).into_iter().collect();
    assert!(redelivered.is_disjoint(&early), "completed events came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_rest_routes_and_metrics() {
    let server = start().await;
    let http = reqwest::Client::new();
    let url = |p: &str| server.url(p);
    let created = http
        .post(url("/admin/eventbus/consumers"))
        .header("content-type", "application/json")
        .body(r#"{"name":"rest","channels":["r.>"],"max_attempts":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    let body: serde_json::Value = created.json().await.unwrap();
    assert_eq!((body["max_attempts"].as_u64(), body["ack_deadline_ms"].as_u64()), (Some(2), Some(30_000)));
    let conflict = http
        .post(url("/admin/eventbus/consumers"))
        .header("content-type", "application/json")
        .body(r#"{"name":"rest","channels":["other"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), reqwest::StatusCode::CONFLICT);
    let bad = http
        .post(url("/admin/eventbus/consumers"))
        .json(&serde_json::json!({"name":"x","channels":["a.>.b"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(bad.text().await.unwrap().contains("a.>.b"));

    server.client().await.publish(event("r.one", "1")).await.unwrap();
    let mut c = attach(server.endpoint(), "rest", 0).await.unwrap();
    let got = c.deliveries(1).await;
    c.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&got) })).await;
    eventually("the ack", || async {
        let v: serde_json::Value =
            reqwest::get(url("/admin/eventbus/consumers/rest")).await.unwrap().json().await.unwrap();
        v["acked"] == 1
    })
    .await;
    let list: serde_json::Value = reqwest::get(url("/admin/eventbus/consumers")).await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"][0]["name"], "rest");
    let log: serde_json::Value =
        reqwest::get(url("/admin/eventbus/consumers/rest/log?status=completed")).await.unwrap().json().await.unwrap();
    assert_eq!(log["entries"][0]["event_id"], ids(&got)[0].as_str());
    assert_eq!(log["entries"][0]["status"], "completed");
    let bad = reqwest::get(url("/admin/eventbus/consumers/rest/log?status=lost")).await.unwrap();
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);

    let metrics = reqwest::get(url("/metrics")).await.unwrap().text().await.unwrap();
    for line in [
        r#"socle_eventbus_consumer_acked_total{consumer="rest"} 1"#,
        r#"socle_eventbus_consumer_pending{consumer="rest"} 0"#,
        r#"socle_eventbus_consumer_in_flight{consumer="rest"} 0"#,
        r#"socle_eventbus_consumer_dead_lettered_total{consumer="rest"} 0"#,
        r#"socle_eventbus_consumer_redelivered_total{consumer="rest"} 0"#,
        r#"socle_eventbus_consumer_ack_latency_seconds_count{consumer="rest"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line}");
    }

    assert_eq!(
        http.delete(url("/admin/eventbus/consumers/rest")).send().await.unwrap().status(),
        reqwest::StatusCode::NO_CONTENT
    );
    assert_eq!(
        reqwest::get(url("/admin/eventbus/consumers/rest")).await.unwrap().status(),
        reqwest::StatusCode::NOT_FOUND
    );
    let metrics = reqwest::get(url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(!metrics.contains(r#"consumer="rest""#), "a deleted consumer leaves /metrics:\n{metrics}");
    server.stop().await;
}

/// In fresh `eventbusd` processes (default on-disk store, multi-threaded
/// runtime), the timers run: an event not acked within its deadline comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fresh_daemon_redelivers_after_the_ack_deadline() {
    const DAEMONS: usize = 10;
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..DAEMONS {
        runs.spawn(async move {
            let dir = tempfile::tempdir().unwrap();
            let (_child, addr) = daemon(dir.path()).await;
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
            let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
            let config = pb::ConsumerConfig { ack_deadline_ms: 200, ..consumer("inbox", &["orders.>"]) };
            admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
            let mut c = attach(endpoint.clone(), "inbox", 0).await.unwrap();
            let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
            client.publish(event("orders.created", &b"x"[..])).await.unwrap();
            let first = c.deliveries(1).await;
            // Not acked: the deadline must bring it back, on every process.
            let again = c.deliveries(1).await;
            (i, first[0].attempt, again[0].attempt, ids(&first) == ids(&again))
        });
    }
    while let Some(run) = runs.join_next().await {
        let (i, first, again, same) = run.unwrap();
        assert_eq!((first, again, same), (1, 2, true), "daemon {i}");
    }
}

/// A `ConsumerInfo` as the REST routes must render it.
fn consumer_as_rest(i: &pb::ConsumerInfo) -> serde_json::Value {
    let c = i.config.as_ref().unwrap();
    let b = c.backoff.unwrap();
    let kind = match pb::BackoffKind::try_from(b.kind).unwrap() {
        pb::BackoffKind::Exponential => "exponential",
        pb::BackoffKind::Linear => "linear",
    };
    serde_json::json!({
        "name": c.name, "channels": c.channels, "ack_deadline_ms": c.ack_deadline_ms,
        "max_attempts": c.max_attempts.unwrap(), "max_in_flight": c.max_in_flight,
        "backoff": {"initial_ms": b.initial_ms, "multiplier": b.multiplier, "max_ms": b.max_ms, "kind": kind},
        "dead_letter_channel": if c.dead_letter_channel.is_empty() { "dlq.<channel>" } else { &c.dead_letter_channel },
        "exclusive": c.exclusive, "paused": i.paused,
        "pending": i.pending, "in_flight": i.in_flight, "clients": i.clients,
        "acked": i.acked, "dead_lettered": i.dead_lettered, "redelivered": i.redelivered, "owner": i.owner,
        "redriven": i.redriven, "redrivable": i.redrivable,
        "max_pending": c.max_pending.unwrap(), "dropped": i.dropped,
    })
}

/// An `EventLogEntry` as the REST routes must render it.
fn log_entry_as_rest(e: &pb::EventLogEntry) -> serde_json::Value {
    let status = if e.status == pb::EventStatus::Completed as i32 { "completed" } else { "dead_lettered" };
    let failures: Vec<_> =
        e.failures.iter().map(|f| serde_json::json!({"at": f.at.unwrap().to_string(), "reason": f.reason})).collect();
    serde_json::json!({
        "event_id": e.event_id, "channel": e.channel, "status": status, "attempts": e.attempts,
        "first_delivered_at": e.first_delivered_at.map(|t| t.to_string()),
        "finished_at": e.finished_at.unwrap().to_string(), "failures": failures,
    })
}

/// One wire edge: a consumer, its log and its refusals read the same over
/// gRPC and REST; `redelivered` shows on both after a nack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_rest_agree_on_consumers_logs_and_errors() {
    let server = start().await;
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        async move {
            let resp = http.get(path).send().await.unwrap();
            (resp.status(), resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("agree", &["agree.>"])) }).await.unwrap();
    server.client().await.publish(event("agree.one", "1")).await.unwrap();
    let mut c = attach(server.endpoint(), "agree", 0).await.unwrap();
    let first = c.deliveries(1).await;
    let nack = pb::Nack { event_id: ids(&first)[0].clone(), reason: "not yet".into(), delay_ms: 1 };
    c.send(consume_request::Kind::Nack(nack)).await;
    let again = c.deliveries(1).await;
    assert_eq!((ids(&again), again[0].attempt), (ids(&first), 2));
    c.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&again) })).await;
    let info = || {
        let mut admin = admin.clone();
        async move { admin.get_consumer(pb::GetConsumerRequest { name: "agree".into() }).await.unwrap().into_inner() }
    };
    eventually("the ack", || async { info().await.acked == 1 }).await;

    let grpc = info().await;
    assert_eq!((grpc.redelivered, grpc.clients), (1, 1));
    let (status, rest) = get(server.url("/admin/eventbus/consumers/agree")).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(rest, consumer_as_rest(&grpc));
    let grpc_list = admin.list_consumers(pb::ListConsumersRequest {}).await.unwrap().into_inner();
    let (_, rest_list) = get(server.url("/admin/eventbus/consumers")).await;
    assert_eq!(rest_list["consumers"], serde_json::json!([consumer_as_rest(&grpc_list.consumers[0])]));

    let grpc_log = admin
        .list_event_log(pb::ListEventLogRequest { consumer: "agree".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_log.entries[0].failures[0].reason, "not yet");
    let (_, rest_log) = get(server.url("/admin/eventbus/consumers/agree/log")).await;
    let entries: Vec<_> = grpc_log.entries.iter().map(log_entry_as_rest).collect();
    assert_eq!(rest_log, serde_json::json!({"entries": entries, "next_page_token": grpc_log.next_page_token}));

    // Refusals: the same code class and the same message on both.
    let grpc_err = admin.get_consumer(pb::GetConsumerRequest { name: "ghost".into() }).await.unwrap_err();
    let (status, rest_err) = get(server.url("/admin/eventbus/consumers/ghost")).await;
    assert_eq!((grpc_err.code(), status), (Code::NotFound, reqwest::StatusCode::NOT_FOUND));
    assert_eq!(rest_err["error"], grpc_err.message());
    let conflicting = consumer("agree", &["other"]);
    let grpc_err = admin.create_consumer(pb::CreateConsumerRequest { config: Some(conflicting) }).await.unwrap_err();
    let resp = http
        .post(server.url("/admin/eventbus/consumers"))
        .header("content-type", "application/json")
        .body(r#"{"name":"agree","channels":["other"]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!((grpc_err.code(), resp.status()), (Code::AlreadyExists, reqwest::StatusCode::CONFLICT));
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["error"], grpc_err.message());
    drop(c);
    server.stop().await;
}

/// A redrive in progress when the daemon is killed -9. Every dead letter is
/// afterwards either still kept for redrive or back with the consumer, never both and
/// never neither; redriving what is left and consuming everything yields each event
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_redrive_loses_and_doubles_nothing() {
    const EVENTS: usize = 1_500;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let config =
        pb::ConsumerConfig { max_attempts: Some(1), max_in_flight: EVENTS as u32, ..consumer("fragile", &["work.>"]) };
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
    let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
    let mut published = HashSet::new();
    for i in 0..EVENTS {
        published.insert(client.publish(event("work.item", format!("{i}"))).await.unwrap().into_inner().event_id);
    }
    // Every event fails once: all dead-lettered, all kept for redrive.
    let mut c = attach(endpoint.clone(), "fragile", 0).await.unwrap();
    for d in c.deliveries(EVENTS).await {
        let event_id = d.event.unwrap().id;
        c.send(consume_request::Kind::Term(pb::Term { event_id, reason: "bug".into() })).await;
    }
    let get = |mut admin: pb::admin_client::AdminClient<tonic::transport::Channel>| async move {
        admin.get_consumer(pb::GetConsumerRequest { name: "fragile".into() }).await.unwrap().into_inner()
    };
    eventually("every event dead-lettered and kept", || {
        let admin = admin.clone();
        async move { get(admin).await.redrivable as usize == EVENTS }
    })
    .await;
    drop(c);

    // Redrive in small batches, concurrently; kill -9 once some have been answered.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<u64>();
    for _ in 0..2 {
        let mut admin = admin.clone();
        let done_tx = done_tx.clone();
        tokio::spawn(async move {
            loop {
                let req = pb::RedriveRequest { consumer: "fragile".into(), event_ids: vec![], limit: 25 };
                match admin.redrive_dead_letters(req).await {
                    Ok(r) if r.get_ref().redriven > 0 => {
                        let _ = done_tx.send(r.into_inner().redriven);
                    }
                    _ => return,
                }
            }
        });
    }
    drop(done_tx);
    let mut answered = 0;
    while answered < 100 {
        answered += within(done_rx.recv()).await.expect("redrives answered before the kill");
    }
    kill_9(&mut child).await;
    while let Some(n) = within(done_rx.recv()).await {
        answered += n;
    }

    let (_child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let info = get(admin.clone()).await;
    assert_eq!(info.pending + info.redrivable, EVENTS as u64, "each dead letter is kept or back, once: {info:?}");
    assert!(info.pending >= answered, "{} back < {answered} answered as redriven", info.pending);
    assert!(info.redrivable > 0, "the kill landed after the whole redrive: nothing tested ({info:?})");
    let rest = admin
        .redrive_dead_letters(pb::RedriveRequest { consumer: "fragile".into(), event_ids: vec![], limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((rest.redriven, rest.remaining), (info.redrivable, 0));
    let again = admin
        .redrive_dead_letters(pb::RedriveRequest { consumer: "fragile".into(), event_ids: vec![], limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.redriven, 0, "nothing is redriven twice");
    let mut c = attach(endpoint, "fragile", 0).await.unwrap();
    let delivered = ids(&c.deliveries(EVENTS).await);
    let unique: HashSet<String> = delivered.iter().cloned().collect();
    assert_eq!(unique.len(), EVENTS, "no event delivered twice");
    assert_eq!(unique, published, "every event back, none lost");
    assert!(delivered.iter().all(|id| published.contains(id)));
    let info = get(admin.clone()).await;
    assert_eq!((info.pending, info.in_flight, info.redrivable), (0, EVENTS as u64, 0), "{info:?}");
}

/// A paused consumer stays paused across a restart (kill -9), keeps capturing,
/// and delivers once resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("held", &["work.>"])) }).await.unwrap();
    let paused = admin.pause_consumer(pb::PauseConsumerRequest { name: "held".into() }).await.unwrap().into_inner();
    assert!(paused.paused);
    kill_9(&mut child).await;

    let (_child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
    client.publish(event("work.item", "kept")).await.unwrap();
    let mut c = attach(endpoint, "held", 0).await.unwrap();
    assert!(c.info.paused, "still paused after the restart");
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "held".into() }).await.unwrap().into_inner();
    assert_eq!((info.paused, info.pending, info.in_flight), (true, 1, 0), "captured, not delivered");
    let resumed = admin.resume_consumer(pb::ResumeConsumerRequest { name: "held".into() }).await.unwrap();
    assert!(!resumed.into_inner().paused);
    let got = c.deliveries(1).await;
    assert_eq!(got[0].event.as_ref().unwrap().payload, "kept");
}

/// Below `durable.min_free_disk_bytes` of free disk, the embedded
/// store refuses captures (RESOURCE_EXHAUSTED / 507) and the instance is not ready;
/// publishes no consumer captures still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_full_disk_refuses_captures_and_turns_readiness_off() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    // More free space than any disk has: the watermark is crossed from the start.
    let server = start_with(|s| {
        s.durable.data_dir = data_dir;
        s.durable.min_free_disk_bytes = u64::MAX / 2;
    })
    .await;
    let http = reqwest::Client::new();
    let ready = http.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert!(body["reason"].as_str().unwrap().contains("disk is nearly full"), "{body}");
    // gRPC health says the same, for the server and for each service.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    for service in ["", "eventbus.v1.EventBus"] {
        let check = tonic_health::pb::HealthCheckRequest { service: service.into() };
        let status = health.check(check).await.unwrap().into_inner().status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::NotServing as i32, "{service:?}");
    }
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("disk", &["kept.>"])) }).await.unwrap();
    let refused = server.client().await.publish(event("kept.one", "x")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("min_free_disk_bytes"), "{}", refused.message());
    let rest = http
        .post(server.url("/admin/eventbus/publish"))
        .header("content-type", "application/json")
        .body(r#"{"channel":"kept.two","payload":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), reqwest::StatusCode::INSUFFICIENT_STORAGE);
    // Nothing to store: not refused.
    server.client().await.publish(event("other.one", "x")).await.unwrap();
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "disk".into() }).await.unwrap().into_inner();
    assert_eq!(info.pending, 0, "nothing was captured");
    server.stop().await;
}

/// Publishers killed mid-stream strand nothing: every event the broker stored for a
/// durable consumer reaches it while the broker runs. The real binary, on a data
/// directory; eight PublishStream clients, each on a runtime of its own that is torn
/// down at a random moment while it streams (its sockets close at once, as a killed
/// process's do); a consumer acking everything. Then a kill -9 and a restart: an event
/// stored but never handed out would be delivered now, unlike one whose ack was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_killed_mid_stream_strand_no_durable_event() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    const PUBLISHERS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr, http) = daemon_addrs(dir.path(), &[]).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let config = pb::ConsumerConfig { max_in_flight: 10_000, ..consumer("inbox", &["load.>"]) };
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
    let mut c = attach(endpoint.clone(), "inbox", 0).await.unwrap();

    let mut received = HashSet::new();
    for p in 0..PUBLISHERS {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let answered = Arc::new(AtomicU64::new(0));
        let (endpoint, counter) = (endpoint.clone(), Arc::clone(&answered));
        runtime.spawn(async move {
            let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
            let (tx, rx) = mpsc::channel(256);
            tokio::spawn(async move {
                for i in 0.. {
                    if tx.send(event("load.burst", format!("p{p}-{i}"))).await.is_err() {
                        return;
                    }
                }
            });
            let mut answers = client.publish_stream(ReceiverStream::new(rx)).await.unwrap().into_inner();
            while let Ok(Some(_)) = answers.message().await {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Kill it at a random moment once it streams, acking deliveries meanwhile.
        let extra =
            u64::from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
                % 2_000;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while answered.load(Ordering::Relaxed) < 1 + extra {
            assert!(tokio::time::Instant::now() < deadline, "publisher {p} is not answered");
            let got = c.deliveries(1).await;
            received.extend(ids(&got));
            c.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&got) })).await;
        }
        runtime.shutdown_background();
    }

    // The broker has let go of every torn-down connection (only the admin's and the
    // consumer's are left), so no more of their publishes is on its way in; a last
    // publish, queued behind whatever they left to commit, is answered only once all of
    // it is in the consumer's state.
    let open_grpc = || async {
        let metrics = reqwest::get(format!("http://{http}/metrics")).await.unwrap().text().await.unwrap();
        let line = metrics.lines().find(|l| l.contains("connections_open{listener=\"grpc\"}")).map(str::to_owned);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).unwrap_or(u64::MAX)
    };
    eventually("the torn-down connections closed", || async { open_grpc().await <= 2 }).await;
    let mut last = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
    last.publish(event("load.last", "last")).await.unwrap();
    drop(last);

    // Everything stored is handed out and acked while the broker runs.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let info = admin.get_consumer(pb::GetConsumerRequest { name: "inbox".into() }).await.unwrap().into_inner();
        if info.pending == 0 && info.in_flight == 0 {
            assert_eq!(info.acked, received.len() as u64, "each stored event delivered once: {info:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "events left unacked: {info:?}");
        // Take what is delivered meanwhile; the bound is a polling interval.
        match tokio::time::timeout(std::time::Duration::from_millis(50), c.responses.message()).await {
            Ok(Ok(Some(pb::ConsumeResponse { kind: Some(pb::consume_response::Kind::Deliveries(d)) }))) => {
                let got = ids(&d.deliveries);
                received.extend(got.iter().cloned());
                c.send(consume_request::Kind::Ack(pb::Ack { event_ids: got })).await;
            }
            Ok(other) => panic!("expected deliveries, got {other:?}"),
            Err(_) => {}
        }
    }
    kill_9(&mut child).await;

    let (_child, addr) = daemon(dir.path()).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "inbox".into() }).await.unwrap().into_inner();
    // Acks are stored behind their answer, so the last few may come back (at least
    // once); an event that had never been handed out must not.
    let mut c = attach(endpoint, "inbox", 0).await.unwrap();
    let back = ids(&c.deliveries((info.pending + info.in_flight) as usize).await);
    let stranded: Vec<&String> = back.iter().filter(|id| !received.contains(*id)).collect();
    assert!(
        stranded.is_empty(),
        "{} events stored but never handed out before the restart: {stranded:?}",
        stranded.len()
    );
}

/// A data directory as the previous release left it (its redb store, written here by
/// that store's engine: acked, dead-lettered, nacked and in-flight events, a pause) is
/// migrated when the binary (built with `--features migrate-redb`) first starts on it,
/// and everything carries on.
#[cfg(feature = "migrate-redb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_migrates_a_redb_data_directory() {
    use eventbus_core::durable::{
        CaptureRequest, ClientOptions, ConsumerConfig as Config, DurableBackend, DurableOptions, Retention,
    };
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    {
        let retention = Retention { max_entries: 1_000, max_age_ms: 86_400_000 };
        let store = eventbus_durable::RedbStore::open(dir.path(), eventbus_durable::Fsync::Always, retention).unwrap();
        let options = DurableOptions {
            dedup_window: std::time::Duration::from_secs(120),
            dead_letter_encoder: Arc::new(|_| (bytes::Bytes::new(), String::new())),
            on_ack: None,
            min_free_disk_bytes: 0,
            max_captures_per_publish: 0,
            supervisor: eventbus_core::Supervisor::new(),
        };
        let engine = eventbus_durable::Durable::start(Arc::new(store), options).unwrap();
        let config = Config { max_attempts: 5, ..Config::new("inbox", vec!["orders.>".into()]) };
        engine.create_consumer(config).await.unwrap();
        let events: Vec<Arc<eventbus_core::Event>> = (0..5)
            .map(|i| {
                Arc::new(eventbus_core::Event::from_parts(
                    format!("e{i}"),
                    "orders.created".into(),
                    std::time::SystemTime::now(),
                    String::new(),
                    bytes::Bytes::from(format!("o{i}")),
                    Default::default(),
                    String::new(),
                ))
            })
            .collect();
        let requests: Vec<CaptureRequest> =
            events.iter().map(|e| CaptureRequest { event: e, ordering_key: None, idempotency_key: None }).collect();
        assert!(DurableBackend::capture_many(&engine, &requests).await.iter().all(Result::is_ok));
        let mut a = engine.attach("inbox", ClientOptions { max_in_flight: 5, max_batch: 5 }, None).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 5 {
            got.extend(within(a.deliveries.recv()).await.unwrap());
        }
        let ids: Vec<String> = got.iter().map(|d| d.event.id.to_string()).collect();
        a.client.ack(&ids[..1]);
        a.client.term(&ids[1], "poison");
        a.client.nack(&ids[2], "later", Some(std::time::Duration::from_secs(3600)));
        engine.flush().await.unwrap();
        engine.set_paused("inbox", true).await.unwrap();
        engine.flush().await.unwrap();
    }
    // The old engine's writer and sync threads release the file once they have drained.
    let retention = eventbus_core::durable::Retention { max_entries: 1_000, max_age_ms: 86_400_000 };
    let reopen = || eventbus_durable::RedbStore::open(dir.path(), eventbus_durable::Fsync::Always, retention);
    eventually("the old store to be closed", || std::future::ready(reopen().is_ok())).await;

    let (_child, addr) = daemon(dir.path()).await;
    assert!(dir.path().join("store").is_dir() && dir.path().join("eventbus.redb.migrated").exists());
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "inbox".into() }).await.unwrap().into_inner();
    assert_eq!((info.pending + info.in_flight, info.acked, info.dead_lettered), (3, 1, 1), "{info:?}");
    assert!(info.paused, "still paused");
    assert_eq!(info.redrivable, 1, "the dead letter can be redriven");
    let log = admin
        .list_event_log(pb::ListEventLogRequest { consumer: "inbox".into(), limit: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(log.entries.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["e0", "e1"]);
    admin.resume_consumer(pb::ResumeConsumerRequest { name: "inbox".into() }).await.unwrap();
    let mut c = attach(endpoint, "inbox", 0).await.unwrap();
    let got = c.deliveries(2).await;
    let mut payloads: Vec<(String, u32)> = got
        .iter()
        .map(|d| (String::from_utf8_lossy(&d.event.as_ref().unwrap().payload).into_owned(), d.attempt))
        .collect();
    payloads.sort();
    assert_eq!(
        payloads,
        [("o3".to_owned(), 2), ("o4".to_owned(), 2)],
        "in flight when the old store closed: attempt + 1; o2 waits out its nack delay"
    );
}
