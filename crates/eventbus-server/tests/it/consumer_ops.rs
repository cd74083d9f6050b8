//! docs/consumer-operations.md over REST (embedded engine): `GET …/{name}/pending`,
//! `POST …/{name}/redrive`, `…/pause`, `…/resume` — their JSON, their codes, and that
//! they agree with the gRPC calls. Both engines' semantics are in `conformance.rs`.

use crate::common;

use common::consume::*;
use common::*;
use eventbus_proto::pb::{self, consume_request};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A REST client for one server.
struct Rest<'a> {
    server: &'a TestServer,
    http: reqwest::Client,
}

impl Rest<'_> {
    fn new(server: &TestServer) -> Rest<'_> {
        Rest { server, http: reqwest::Client::new() }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let resp = within(self.http.get(self.server.url(path)).send()).await.unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    async fn post(&self, path: &str, body: &str) -> (StatusCode, Value) {
        let request = self.http.post(self.server.url(path)).header("content-type", "application/json");
        let resp = within(request.body(body.to_owned()).send()).await.unwrap();
        (resp.status(), resp.json().await.unwrap())
    }

    /// `GET …/pending` that must succeed.
    async fn pending(&self, name: &str, query: &str) -> Value {
        let (status, body) = self.get(&format!("/admin/eventbus/consumers/{name}/pending{query}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn metrics(&self) -> String {
        within(self.http.get(self.server.url("/metrics")).send()).await.unwrap().text().await.unwrap()
    }
}

fn keyed(channel: &str, payload: &str, key: &str) -> pb::PublishRequest {
    pb::PublishRequest { ordering_key: key.into(), ..event(channel, payload.to_owned()) }
}

/// `(event id, state, attempt)` of each entry of a pending page.
fn states(page: &Value) -> Vec<(String, String, u64)> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let id = e["event"]["id"].as_str().unwrap().to_owned();
            (id, e["state"].as_str().unwrap().to_owned(), e["attempt"].as_u64().unwrap())
        })
        .collect()
}

fn row(id: &str, state: &str, attempt: u64) -> (String, String, u64) {
    (id.to_owned(), state.to_owned(), attempt)
}

/// The whole life of a stuck consumer over REST: paused, it keeps capturing and
/// delivers nothing (every event `ready`, the second of a key `blocked_by_ordering_key`);
/// resumed, pending shows what is in flight, delayed by a nack, and blocked; a `term`ed
/// event is redriven once with its attempts reset, logged `redriven`, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pause_resume_and_redrive_over_rest() {
    let server = start().await;
    let rest = Rest::new(&server);
    let (status, created) = rest
        .post("/admin/eventbus/consumers", r#"{"name":"ops","channels":["ops.>"],"backoff":{"kind":"linear"}}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!((created["paused"].as_bool(), created["exclusive"].as_bool()), (Some(false), Some(false)));
    assert_eq!(created["backoff"]["kind"], "linear");
    assert_eq!((created["redrivable"].as_u64(), created["redriven"].as_u64()), (Some(0), Some(0)));

    // Paused: the answer is the consumer's state, stored before the answer.
    let (status, paused) = rest.post("/admin/eventbus/consumers/ops/pause", "").await;
    assert_eq!(
        (status, paused["paused"].as_bool(), paused["name"].as_str()),
        (StatusCode::OK, Some(true), Some("ops"))
    );
    assert!(rest.metrics().await.contains(r#"socle_eventbus_consumer_paused{consumer="ops"} 1"#));
    let mut publisher = server.client().await;
    let mut published = Vec::new();
    for req in [keyed("ops.a", "a1", "k"), keyed("ops.a", "a2", "k"), event("ops.b", "b"), event("ops.c", "c")] {
        published.push(publisher.publish(req).await.unwrap().into_inner().event_id);
    }
    let (a1, a2, b, c) = (&published[0], &published[1], &published[2], &published[3]);
    let mut client = attach(server.endpoint(), "ops", 10).await.unwrap();
    assert_eq!((client.info.paused, client.info.pending, client.info.in_flight), (true, 4, 0), "nothing handed out");
    let page = rest.pending("ops", "").await;
    assert_eq!(
        states(&page),
        [row(a1, "ready", 0), row(a2, "blocked_by_ordering_key", 0), row(b, "ready", 0), row(c, "ready", 0)]
    );
    assert!(page["entries"].as_array().unwrap().iter().all(|e| e["next_delivery"].is_null()));
    assert_eq!(page["next_page_token"], "");

    // Resumed: the attached client gets the three it may hold; a2 waits behind a1.
    let (status, resumed) = rest.post("/admin/eventbus/consumers/ops/resume", "").await;
    assert_eq!((status, resumed["paused"].as_bool()), (StatusCode::OK, Some(false)));
    let got = client.deliveries(3).await;
    let mut got_ids = ids(&got);
    got_ids.sort();
    let mut expected = vec![a1.clone(), b.clone(), c.clone()];
    expected.sort();
    assert_eq!(got_ids, expected);
    let nack = pb::Nack { event_id: b.clone(), reason: "later".into(), delay_ms: 3_600_000 };
    client.send(consume_request::Kind::Nack(nack)).await;
    client.send(consume_request::Kind::Term(pb::Term { event_id: c.clone(), reason: "poison".into() })).await;
    eventually("the nack and the term", || async {
        let v = rest.get("/admin/eventbus/consumers/ops").await.1;
        v["dead_lettered"] == 1 && v["redrivable"] == 1 && v["in_flight"] == 1
    })
    .await;
    let page = rest.pending("ops", "").await;
    assert_eq!(states(&page), [row(a1, "in_flight", 1), row(a2, "blocked_by_ordering_key", 0), row(b, "delayed", 1)]);
    let entries = page["entries"].as_array().unwrap();
    assert!(entries[0]["next_delivery"].is_string(), "an event in flight shows its ack deadline");
    assert!(entries[2]["next_delivery"].as_str().unwrap() > entries[0]["next_delivery"].as_str().unwrap());
    assert_eq!(entries[2]["failures"][0]["reason"], "later");
    assert!(entries[2]["failures"][0]["at"].is_string());

    // Paging: a token continues after the last entry shown; the last page has none.
    let first = rest.pending("ops", "?limit=2").await;
    assert_eq!(states(&first).len(), 2);
    let token = first["next_page_token"].as_str().unwrap();
    assert!(!token.is_empty());
    let second = rest.pending("ops", &format!("?limit=2&page_token={token}")).await;
    assert_eq!((states(&second), second["next_page_token"].as_str()), (vec![row(b, "delayed", 1)], Some("")));

    // Redrive: the dead letter comes back with its attempts reset, once.
    let (status, done) =
        rest.post("/admin/eventbus/consumers/ops/redrive", &json!({"event_ids": [c]}).to_string()).await;
    assert_eq!((status, done), (StatusCode::OK, json!({"redriven": 1, "remaining": 0})));
    let again = client.deliveries(1).await;
    assert_eq!((ids(&again), again[0].attempt), (vec![c.clone()], 1), "attempts reset");
    let (_, twice) = rest.post("/admin/eventbus/consumers/ops/redrive", &json!({"event_ids": [c]}).to_string()).await;
    assert_eq!(twice, json!({"redriven": 0, "remaining": 0}), "each dead letter is redriven once");
    let (status, none) = rest.post("/admin/eventbus/consumers/ops/redrive", "").await;
    assert_eq!((status, none), (StatusCode::OK, json!({"redriven": 0, "remaining": 0})), "no body: the oldest");
    let (_, log) = rest.get("/admin/eventbus/consumers/ops/log?status=redriven").await;
    let logged: Vec<&str> =
        log["entries"].as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap()).collect();
    assert_eq!(logged, [c.as_str()]);
    assert_eq!(log["entries"][0]["status"], "redriven");
    let (_, info) = rest.get("/admin/eventbus/consumers/ops").await;
    assert_eq!((info["redriven"].as_u64(), info["redrivable"].as_u64()), (Some(1), Some(0)));
    let metrics = rest.metrics().await;
    for line in [
        r#"socle_eventbus_consumer_redriven_total{consumer="ops"} 1"#,
        r#"socle_eventbus_consumer_paused{consumer="ops"} 0"#,
    ] {
        assert!(metrics.contains(line), "missing {line}");
    }
    drop(client);
    server.stop().await;
}

/// Refusals: 404 for an unknown consumer on every route, 400 for a bad query, page
/// token or body (naming what is wrong), the `{"error": …}` shape of every error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_refuse_unknown_consumers_and_bad_input() {
    let server = start().await;
    let rest = Rest::new(&server);
    for (method, path) in [
        ("GET", "/admin/eventbus/consumers/ghost/pending"),
        ("POST", "/admin/eventbus/consumers/ghost/redrive"),
        ("POST", "/admin/eventbus/consumers/ghost/pause"),
        ("POST", "/admin/eventbus/consumers/ghost/resume"),
    ] {
        let (status, body) = if method == "GET" { rest.get(path).await } else { rest.post(path, "").await };
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("ghost"), "{method} {path}: {body}");
    }
    rest.post("/admin/eventbus/consumers", r#"{"name":"ops","channels":["ops.>"]}"#).await;
    for query in ["?page_token=not-a-token", "?limit=many", "?colour=red"] {
        let (status, body) = rest.get(&format!("/admin/eventbus/consumers/ops/pending{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body["error"].is_string(), "{query}: {body}");
    }
    let (_, body) = rest.get("/admin/eventbus/consumers/ops/pending?page_token=not-a-token").await;
    assert!(body["error"].as_str().unwrap().contains("not-a-token"), "{body}");
    for bad in ["not json", r#"{"event_ids":"e1"}"#, r#"{"limit":-1}"#, r#"{"ids":["e1"]}"#] {
        let (status, body) = rest.post("/admin/eventbus/consumers/ops/redrive", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body["error"].as_str().unwrap().starts_with("invalid JSON body"), "{bad}: {body}");
    }
    for good in ["", "  \n", "{}", r#"{"limit":5}"#, r#"{"event_ids":["not-dead"]}"#] {
        let (status, body) = rest.post("/admin/eventbus/consumers/ops/redrive", good).await;
        assert_eq!((status, body), (StatusCode::OK, json!({"redriven": 0, "remaining": 0})), "{good:?}");
    }
    let resp = within(reqwest::get(server.url("/admin/eventbus/consumers/ops/pause"))).await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "pause is a POST");
    server.stop().await;
}

/// A `PendingEntry` as `GET …/pending` must render it (a JSON payload as its value).
fn pending_as_rest(e: &pb::PendingEntry) -> Value {
    let ev = e.event.as_ref().unwrap();
    let state = match pb::PendingState::try_from(e.state).unwrap() {
        pb::PendingState::Ready => "ready",
        pb::PendingState::Delayed => "delayed",
        pb::PendingState::InFlight => "in_flight",
        pb::PendingState::BlockedByOrderingKey => "blocked_by_ordering_key",
        pb::PendingState::Unspecified => panic!("no state"),
    };
    let failures: Vec<_> =
        e.failures.iter().map(|f| json!({"at": f.at.unwrap().to_string(), "reason": f.reason})).collect();
    json!({
        "event": {
            "id": ev.id, "channel": ev.channel, "timestamp": ev.timestamp.unwrap().to_string(), "source": ev.source,
            "content_type": ev.content_type, "metadata": ev.metadata,
            "payload": serde_json::from_slice::<Value>(&ev.payload).unwrap(),
        },
        "attempt": e.attempt,
        "next_delivery": e.next_delivery.map(|t| t.to_string()),
        "failures": failures,
        "state": state,
    })
}

/// One wire edge: `ListPending`, `RedriveDeadLetters`, `PauseConsumer` and
/// `ResumeConsumer` answer the same over gRPC and REST, refusals included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_rest_agree_on_pending_redrive_and_pause() {
    let server = start().await;
    let rest = Rest::new(&server);
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("agree", &["agree.>"])) }).await.unwrap();
    let (status, published) =
        rest.post("/admin/eventbus/publish", r#"{"channel":"agree.one","payload":{"n":1},"metadata":{"k":"v"}}"#).await;
    assert_eq!(status, StatusCode::OK);
    rest.post("/admin/eventbus/publish", r#"{"channel":"agree.two","payload":[2]}"#).await;
    let mut c = attach(server.endpoint(), "agree", 1).await.unwrap();
    let first = c.deliveries(1).await;
    assert_eq!(ids(&first), [published["event_id"].as_str().unwrap()]);
    let nack = pb::Nack { event_id: ids(&first)[0].clone(), reason: "not yet".into(), delay_ms: 3_600_000 };
    c.send(consume_request::Kind::Nack(nack)).await;
    let second = c.deliveries(1).await;

    let grpc = admin
        .list_pending(pb::ListPendingRequest { consumer: "agree".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc.entries.len(), 2);
    assert_eq!(grpc.entries[0].state, pb::PendingState::Delayed as i32);
    let entries: Vec<_> = grpc.entries.iter().map(pending_as_rest).collect();
    assert_eq!(rest.pending("agree", "").await, json!({"entries": entries, "next_page_token": ""}));

    // Pause and resume answer the consumer as GetConsumer does.
    let paused = admin.pause_consumer(pb::PauseConsumerRequest { name: "agree".into() }).await.unwrap().into_inner();
    assert!(paused.paused);
    let (_, rest_info) = rest.get("/admin/eventbus/consumers/agree").await;
    assert_eq!(rest_info["paused"], true);
    let (_, rest_paused) = rest.post("/admin/eventbus/consumers/agree/pause", "").await;
    assert_eq!(rest_paused, rest_info, "pausing twice changes nothing");
    let resumed = admin.resume_consumer(pb::ResumeConsumerRequest { name: "agree".into() }).await.unwrap().into_inner();
    assert!(!resumed.paused);

    // Redrive: the same counts on both.
    c.send(consume_request::Kind::Term(pb::Term { event_id: ids(&second)[0].clone(), reason: "bad".into() })).await;
    eventually("the dead letter", || async { rest.get("/admin/eventbus/consumers/agree").await.1["redrivable"] == 1 })
        .await;
    let (_, rest_none) = rest.post("/admin/eventbus/consumers/agree/redrive", r#"{"event_ids":["nope"]}"#).await;
    let grpc_none = admin
        .redrive_dead_letters(pb::RedriveRequest { consumer: "agree".into(), event_ids: vec!["nope".into()], limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest_none, json!({"redriven": grpc_none.redriven, "remaining": grpc_none.remaining}));
    assert_eq!((grpc_none.redriven, grpc_none.remaining), (0, 1));
    let grpc_done = admin
        .redrive_dead_letters(pb::RedriveRequest { consumer: "agree".into(), limit: 1, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((grpc_done.redriven, grpc_done.remaining), (1, 0));

    // Refusals: the same code class and message.
    let grpc_err = admin
        .list_pending(pb::ListPendingRequest { consumer: "ghost".into(), ..Default::default() })
        .await
        .unwrap_err();
    let (status, rest_err) = rest.get("/admin/eventbus/consumers/ghost/pending").await;
    assert_eq!((grpc_err.code(), status), (tonic::Code::NotFound, StatusCode::NOT_FOUND));
    assert_eq!(rest_err["error"], grpc_err.message());
    let grpc_err = admin
        .list_pending(pb::ListPendingRequest { consumer: "agree".into(), page_token: "x".into(), ..Default::default() })
        .await
        .unwrap_err();
    let (status, rest_err) = rest.get("/admin/eventbus/consumers/agree/pending?page_token=x").await;
    assert_eq!((grpc_err.code(), status), (tonic::Code::InvalidArgument, StatusCode::BAD_REQUEST));
    assert_eq!(rest_err["error"], grpc_err.message());
    drop(c);
    server.stop().await;
}

/// The paused state is stored: a daemon started again on the same data is still
/// paused, and resuming it there delivers what was captured meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_string_lossy().into_owned();
    let server = start_with({
        let dir = dir.clone();
        move |s| s.durable.data_dir = dir
    })
    .await;
    let rest = Rest::new(&server);
    rest.post("/admin/eventbus/consumers", r#"{"name":"held","channels":["held.>"]}"#).await;
    assert_eq!(rest.post("/admin/eventbus/consumers/held/pause", "").await.0, StatusCode::OK);
    server.client().await.publish(event("held.one", "1")).await.unwrap();
    server.stop().await;

    // A copy: in-process, the stopped server's connection tasks may hold the store
    // open a little longer; a real process would have exited.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(data.path(), copy.path());
    let dir = copy.path().to_string_lossy().into_owned();
    let server = start_with(move |s| s.durable.data_dir = dir).await;
    let rest = Rest::new(&server);
    let (_, info) = rest.get("/admin/eventbus/consumers/held").await;
    assert_eq!((info["paused"].as_bool(), info["pending"].as_u64()), (Some(true), Some(1)), "{info}");
    let mut c = attach(server.endpoint(), "held", 0).await.unwrap();
    assert!(c.info.paused);
    rest.post("/admin/eventbus/consumers/held/resume", "").await;
    assert_eq!(c.deliveries(1).await[0].attempt, 1);
    drop(c);
    server.stop().await;
}

/// A TCP proxy to the server that can go silent: once `vanish` is cancelled it forwards
/// nothing more yet keeps both sockets open — a client whose host died without a FIN.
struct Proxy {
    addr: std::net::SocketAddr,
    vanish: tokio_util::sync::CancellationToken,
}

async fn proxy(to: std::net::SocketAddr) -> Proxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let vanish = tokio_util::sync::CancellationToken::new();
    let silent = vanish.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let outbound = tokio::net::TcpStream::connect(to).await.unwrap();
            let silent = silent.clone();
            tokio::spawn(async move {
                let (mut ri, mut wi) = inbound.into_split();
                let (mut ro, mut wo) = outbound.into_split();
                tokio::select! {
                    _ = silent.cancelled() => {}
                    _ = async { tokio::join!(tokio::io::copy(&mut ri, &mut wo), tokio::io::copy(&mut ro, &mut wi)) } => {}
                }
                // Silent, the sockets held open until the test's runtime ends.
                std::future::pending::<()>().await;
                drop((ri, wi, ro, wo));
            });
        }
    });
    Proxy { addr, vanish }
}

/// docs/consumer-operations.md "Exclusive consumers", failover over the wire: the oldest attached client
/// receives everything. When its client vanishes without closing, HTTP/2 keepalive
/// (interval + timeout: 0.2 s + 0.2 s here) finds it and detaches it, and the next client
/// receives, starting with the events the vanished one held (after the backoff of their
/// failed attempt). When that one closes its stream, the next takes over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_failover_on_a_vanished_and_on_a_closed_client() {
    let server = start_with(|s| {
        s.server.keepalive_interval_ms = 200;
        s.server.keepalive_timeout_ms = 200;
    })
    .await;
    let rest = Rest::new(&server);
    let body = r#"{"name":"runner","channels":["jobs"],"exclusive":true,"backoff":{"initial_ms":50,"max_ms":50}}"#;
    let (status, created) = rest.post("/admin/eventbus/consumers", body).await;
    assert_eq!((status, created["exclusive"].as_bool()), (StatusCode::CREATED, Some(true)));
    let clients = || async { rest.get("/admin/eventbus/consumers/runner").await.1["clients"].as_u64().unwrap() };
    let relay = proxy(server.addr).await;
    let via_proxy = tonic::transport::Endpoint::from_shared(format!("http://{}", relay.addr)).unwrap();
    let mut first = attach(via_proxy, "runner", 0).await.unwrap();
    let mut second = attach(server.endpoint(), "runner", 0).await.unwrap();
    let mut third = attach(server.endpoint(), "runner", 0).await.unwrap();
    eventually("three clients", || async { clients().await == 3 }).await;
    let mut publisher = server.client().await;
    publisher.publish(event("jobs", "0")).await.unwrap();
    let got = first.deliveries(1).await;
    assert_eq!((got[0].attempt, &got[0].event.as_ref().unwrap().payload[..]), (1, &b"0"[..]), "the oldest receives");

    let vanished = tokio::time::Instant::now();
    relay.vanish.cancel();
    eventually("the vanished client to be detached", || async { clients().await == 2 }).await;
    let detected = vanished.elapsed();
    // 0.4 s of keepalive, plus room for a loaded machine; far below the ack deadline (30 s).
    assert!(detected < std::time::Duration::from_secs(5), "detected after {detected:?}");
    let taken = second.deliveries(1).await;
    assert_eq!((ids(&taken), taken[0].attempt), (ids(&got), 2), "released by the vanished client, redelivered");
    let (_, log) = rest.get("/admin/eventbus/consumers/runner/pending").await;
    assert_eq!(log["entries"][0]["failures"][0]["reason"], "consumer disconnected");

    // A clean close: the next one receives at once, and gets what the closed one held.
    drop(second);
    eventually("the closed client to be detached", || async { clients().await == 1 }).await;
    publisher.publish(event("jobs", "1")).await.unwrap();
    let mut rest_of_it: Vec<(Vec<u8>, u32)> =
        third.deliveries(2).await.iter().map(|d| (d.event.as_ref().unwrap().payload.to_vec(), d.attempt)).collect();
    rest_of_it.sort();
    assert_eq!(rest_of_it, [(b"0".to_vec(), 3), (b"1".to_vec(), 1)]);
    drop((first, third));
    server.stop().await;
}
