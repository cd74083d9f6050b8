//! Push consumers against a real HTTP endpoint on 127.0.0.1: what a request carries,
//! what each answer does, the concurrency cap, the addresses refused (by default, and
//! the broker's own), the hop limit that ends loops, a broker killed
//! mid-delivery, and two redis-mode instances sharing one push consumer.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::consume::consumer;
use common::redis_server::{RedisProc, broker_with};
use common::*;
use eventbus_proto::pb;
use eventbus_server::Settings;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use prost::Message;
use sha2::Sha256;
use tokio::sync::watch;

/// The endpoints listen on 127.0.0.1, which `push.deny_networks` refuses by default:
/// these brokers opt in, as a local development setup would.
fn loopback_endpoints(s: &mut Settings) {
    s.push.allow_networks = vec!["127.0.0.0/8".into()];
}

async fn start() -> TestServer {
    common::start_with(loopback_endpoints).await
}

pub(crate) async fn start_with(tweak: impl FnOnce(&mut Settings)) -> TestServer {
    common::start_with(|s| {
        loopback_endpoints(s);
        tweak(s);
    })
    .await
}

/// One request the endpoint received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or_default()
    }

    fn attempt(&self) -> u32 {
        self.header("eventbus-attempt").parse().unwrap()
    }
}

/// What the endpoint answers a request.
pub(crate) enum Reply {
    Status(u16, &'static str),
    RetryAfter(u16, &'static str),
    /// Answers 200 after this long.
    Slow(Duration),
}

type Script = Arc<dyn Fn(&Received) -> Reply + Send + Sync>;

/// A real HTTP endpoint: records every request; answers by its script once its gate
/// is open (requests wait at a closed gate).
pub(crate) struct Endpoint {
    pub(crate) url: String,
    received: Arc<Mutex<Vec<Received>>>,
    gate: watch::Sender<bool>,
    open_now: Arc<AtomicUsize>,
    most_open: Arc<AtomicUsize>,
}

impl Endpoint {
    pub(crate) async fn start(script: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Self {
        let script: Script = Arc::new(script);
        let received = Arc::new(Mutex::new(Vec::new()));
        let (gate, _) = watch::channel(true);
        let open_now = Arc::new(AtomicUsize::new(0));
        let most_open = Arc::new(AtomicUsize::new(0));
        let state = (Arc::clone(&received), gate.subscribe(), Arc::clone(&open_now), Arc::clone(&most_open), script);
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let (received, mut gate, open_now, most_open, script) = state.clone();
            async move {
                let request = Received { headers, body, at: Instant::now() };
                received.lock().push(request.clone());
                let open = open_now.fetch_add(1, Ordering::SeqCst) + 1;
                most_open.fetch_max(open, Ordering::SeqCst);
                let _ = gate.wait_for(|open| *open).await;
                let reply = script(&request);
                let response: Response = match reply {
                    Reply::Status(code, body) => (StatusCode::from_u16(code).unwrap(), body).into_response(),
                    Reply::RetryAfter(code, after) => {
                        (StatusCode::from_u16(code).unwrap(), [("retry-after", after)], "busy").into_response()
                    }
                    Reply::Slow(delay) => {
                        tokio::time::sleep(delay).await;
                        StatusCode::OK.into_response()
                    }
                };
                open_now.fetch_sub(1, Ordering::SeqCst);
                response
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, received, gate, open_now, most_open }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().clone()
    }

    fn close_gate(&self) {
        self.gate.send_replace(false);
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Waits until at least `n` requests have arrived.
    pub(crate) async fn wait_for(&self, n: usize) -> Vec<Received> {
        eventually(&format!("{n} push requests"), || async { self.received.lock().len() >= n }).await;
        self.received()
    }
}

pub(crate) fn ok(_: &Received) -> Reply {
    Reply::Status(200, "")
}

/// A push consumer on `channels` sending to `url`, retrying fast.
pub(crate) fn push_consumer(name: &str, channels: &[&str], push: pb::PushConfig) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        backoff: Some(pb::Backoff { initial_ms: 50, multiplier: 1.0, max_ms: 50, ..Default::default() }),
        push: Some(push),
        ..consumer(name, channels)
    }
}

pub(crate) fn push_to(url: &str) -> pb::PushConfig {
    pb::PushConfig { url: url.into(), ..Default::default() }
}

pub(crate) async fn create(server: &TestServer, config: pb::ConsumerConfig) -> pb::ConsumerInfo {
    let request = pb::CreateConsumerRequest { config: Some(config) };
    server.admin().await.create_consumer(request).await.unwrap().into_inner()
}

async fn info(server: &TestServer, name: &str) -> pb::ConsumerInfo {
    let request = pb::GetConsumerRequest { name: name.into() };
    server.admin().await.get_consumer(request).await.unwrap().into_inner()
}

async fn publish(server: &TestServer, req: pb::PublishRequest) -> String {
    server.client().await.publish(req).await.unwrap().into_inner().event_id
}

/// Waits until consumer `name` has acked `n` events and holds nothing.
async fn all_acked(server: &TestServer, name: &str, n: u64) {
    eventually(&format!("{name} to ack {n} events"), || async {
        let i = info(server, name).await;
        i.acked == n && i.pending == 0 && i.in_flight == 0
    })
    .await;
}

/// The value of the sample `series` (name and labels, as rendered) on `/metrics`.
async fn metric(server: &TestServer, series: &str) -> Option<f64> {
    let text = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_push_carries_the_event_and_a_verifiable_signature() {
    let endpoint = Endpoint::start(ok).await;
    let server = start().await;
    let push = pb::PushConfig {
        secret: "s3cret".into(),
        headers: HashMap::from([("authorization".to_owned(), "Bearer hook-token".to_owned())]),
        ..push_to(&endpoint.url)
    };
    let created = create(&server, push_consumer("hook", &["orders.>"], push)).await;
    let shown = created.config.unwrap().push.unwrap();
    assert_eq!(shown.secret, "(redacted)", "credentials are never shown back");
    assert_eq!(shown.headers["authorization"], "(redacted)");

    let id = publish(
        &server,
        pb::PublishRequest {
            content_type: "application/json".into(),
            metadata: HashMap::from([("tenant".to_owned(), "acme".to_owned())]),
            ..event("orders.created", &b"{\"order\":42}"[..])
        },
    )
    .await;
    let got = endpoint.wait_for(1).await.remove(0);
    assert_eq!(&got.body[..], b"{\"order\":42}");
    assert_eq!(got.header("content-type"), "application/json");
    assert_eq!(got.header("eventbus-id"), id);
    assert_eq!(got.header("eventbus-channel"), "orders.created");
    assert_eq!(got.header("eventbus-consumer"), "hook");
    assert_eq!(got.attempt(), 1);
    assert_eq!(got.header("eventbus-meta-tenant"), "acme");
    assert!(got.header("eventbus-timestamp").ends_with('Z'), "{}", got.header("eventbus-timestamp"));
    assert_eq!(got.header("authorization"), "Bearer hook-token");

    // The receiver's check: HMAC-SHA256 over "<t>." + body with the shared secret.
    let signature = got.header("eventbus-signature");
    let (t, v1) = signature.strip_prefix("t=").and_then(|rest| rest.split_once(",v1=")).expect(signature);
    let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(&got.body);
    mac.verify_slice(&hex::decode(v1).unwrap()).expect("the signature verifies");
    let age = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        - t.parse::<u64>().unwrap();
    assert!(age < 60, "signed now, not {age} s ago");

    all_acked(&server, "hook", 1).await;
    assert_eq!(metric(&server, r#"socle_eventbus_push_requests_total{class="2xx",consumer="hook"}"#).await, Some(1.0));
    assert_eq!(endpoint.received().len(), 1, "acked once, sent once");

    // Deleted, it leaves /metrics.
    let delete = pb::DeleteConsumerRequest { name: "hook".into() };
    server.admin().await.delete_consumer(delete).await.unwrap();
    eventually("the deleted push consumer's series to go", || async {
        let text = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
        !text.contains(r#"consumer="hook""#)
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishers_trace_context_travels_with_its_event() {
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const OWN: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let endpoint = Endpoint::start(ok).await;
    let server = start().await;
    create(&server, push_consumer("traced", &["traced.>"], push_to(&endpoint.url))).await;
    let mut subscriber = server.subscribe(sub(&["traced.>"])).await;

    // gRPC: the request's metadata.
    let mut req = tonic::Request::new(event("traced.grpc", "1"));
    req.metadata_mut().insert("traceparent", PARENT.parse().unwrap());
    req.metadata_mut().insert("tracestate", "congo=t61rcWkgMzE".parse().unwrap());
    server.client().await.publish(req).await.unwrap();
    // HTTP: the request's headers.
    let rest = reqwest::Client::new()
        .post(server.url("/admin/eventbus/publish"))
        .header("content-type", "application/json")
        .header("traceparent", PARENT)
        .body(r#"{"channel": "traced.rest", "payload": 2}"#)
        .send()
        .await
        .unwrap();
    assert!(rest.status().is_success(), "{rest:?}");
    // An event that carries a context of its own keeps it.
    let mut req = tonic::Request::new(pb::PublishRequest {
        metadata: HashMap::from([("traceparent".to_owned(), OWN.to_owned())]),
        ..event("traced.own", "3")
    });
    req.metadata_mut().insert("traceparent", PARENT.parse().unwrap());
    server.client().await.publish(req).await.unwrap();

    let expected = HashMap::from([("traced.grpc", PARENT), ("traced.rest", PARENT), ("traced.own", OWN)]);
    for e in subscriber.take(3).await {
        assert_eq!(e.metadata["traceparent"], expected[e.channel.as_str()], "{e:?}");
        if e.channel == "traced.grpc" {
            assert_eq!(e.metadata["tracestate"], "congo=t61rcWkgMzE");
        }
    }
    for got in endpoint.wait_for(3).await {
        assert_eq!(got.header("traceparent"), expected[got.header("eventbus-channel")], "{:?}", got.headers);
        assert_eq!(got.header("eventbus-meta-traceparent"), "", "sent as the W3C header, not as metadata");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_ack_retry_or_dead_letter() {
    // By payload: `flaky` fails once with a 500, `gone` is refused with a 404.
    let endpoint = Endpoint::start(|r| match (&r.body[..], r.attempt()) {
        (b"flaky", 1) => Reply::Status(500, "try later"),
        (b"gone", _) => Reply::Status(404, "no such order\n"),
        _ => Reply::Status(204, ""),
    })
    .await;
    let server = start().await;
    create(&server, push_consumer("answers", &["orders.>"], push_to(&endpoint.url))).await;
    let mut dead = server.subscribe(sub(&["dlq.>"])).await;
    publish(&server, event("orders.a", "flaky")).await;
    let gone = publish(&server, event("orders.b", "gone")).await;
    publish(&server, event("orders.c", "fine")).await;

    let letter = dead.take(1).await.remove(0);
    assert_eq!(letter.channel, "dlq.orders.b");
    let letter = pb::DeadLetter::decode(&letter.payload[..]).unwrap();
    assert_eq!(letter.event.unwrap().id, gone);
    assert_eq!(letter.attempts, 1, "a refusal is not retried");
    assert_eq!(letter.failures[0].reason, "HTTP 404: no such order");

    all_acked(&server, "answers", 2).await;
    let flaky: Vec<u32> =
        endpoint.received().iter().filter(|r| &r.body[..] == b"flaky").map(Received::attempt).collect();
    assert_eq!(flaky, [1, 2], "a 5xx is retried");
    for (class, n) in [("2xx", 2.0), ("4xx", 1.0), ("5xx", 1.0)] {
        let series = format!(r#"socle_eventbus_push_requests_total{{class="{class}",consumer="answers"}}"#);
        assert_eq!(metric(&server, &series).await, Some(n), "{class}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_sets_the_delay_of_the_next_attempt() {
    let endpoint = Endpoint::start(|r| match r.attempt() {
        1 => Reply::RetryAfter(429, "1"),
        _ => Reply::Status(200, ""),
    })
    .await;
    let server = start().await;
    // The backoff alone would wait a minute: only Retry-After brings the retry back
    // within the test's deadline.
    let config = pb::ConsumerConfig {
        backoff: Some(pb::Backoff { initial_ms: 60_000, ..Default::default() }),
        ..push_consumer("polite", &["jobs"], push_to(&endpoint.url))
    };
    create(&server, config).await;
    publish(&server, event("jobs", "x")).await;
    let got = endpoint.wait_for(2).await;
    assert_eq!(got[1].attempt(), 2);
    let waited = got[1].at - got[0].at;
    assert!(waited >= Duration::from_millis(900), "retried after {waited:?}, before Retry-After: 1");
    all_acked(&server, "polite", 1).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_timeout_is_retried() {
    let endpoint = Endpoint::start(|r| match r.attempt() {
        1 => Reply::Slow(Duration::from_secs(5)),
        _ => Reply::Status(200, ""),
    })
    .await;
    let server = start().await;
    let push = pb::PushConfig { timeout_ms: 200, ..push_to(&endpoint.url) };
    create(&server, push_consumer("impatient", &["jobs"], push)).await;
    publish(&server, event("jobs", "x")).await;
    let got = endpoint.wait_for(2).await;
    assert_eq!(got[1].attempt(), 2);
    all_acked(&server, "impatient", 1).await;
    let log = server
        .admin()
        .await
        .list_event_log(pb::ListEventLogRequest { consumer: "impatient".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let reason = &log.entries[0].failures[0].reason;
    assert!(reason.contains("push.timeout_ms (200 ms)"), "{reason}");
    let timeouts = r#"socle_eventbus_push_requests_total{class="timeout",consumer="impatient"}"#;
    assert_eq!(metric(&server, timeouts).await, Some(1.0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_never_holds_more_than_max_concurrency_requests() {
    let endpoint = Endpoint::start(ok).await;
    endpoint.close_gate();
    let server = start().await;
    let push = pb::PushConfig { max_concurrency: 3, ..push_to(&endpoint.url) };
    create(&server, push_consumer("capped", &["jobs"], push)).await;
    for i in 0..12 {
        publish(&server, event("jobs", format!("{i}"))).await;
    }
    endpoint.wait_for(3).await;
    let in_flight = r#"socle_eventbus_push_in_flight{consumer="capped"}"#;
    eventually("3 requests in flight", || async { metric(&server, in_flight).await == Some(3.0) }).await;
    // The engine holds the rest: the consumer shows them pending, not in flight.
    let held = info(&server, "capped").await;
    assert_eq!((held.in_flight, held.pending), (3, 9));
    assert_eq!(endpoint.received().len(), 3, "nothing more is sent while three are open");
    endpoint.open_gate();
    all_acked(&server, "capped", 12).await;
    assert_eq!(endpoint.most_open.load(Ordering::SeqCst), 3);
    assert_eq!(endpoint.open_now.load(Ordering::SeqCst), 0);
    assert_eq!(endpoint.received().len(), 12);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_envelope_batches_the_events_that_wait() {
    let endpoint = Endpoint::start(ok).await;
    endpoint.close_gate();
    let server = start().await;
    let push = pb::PushConfig {
        envelope: pb::PushEnvelope::Json as i32,
        batch: 5,
        max_concurrency: 1,
        ..push_to(&endpoint.url)
    };
    create(&server, push_consumer("batched", &["jobs"], push)).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(publish(&server, event("jobs", format!("{{\"n\":{i}}}"))).await);
    }
    endpoint.wait_for(1).await;
    endpoint.open_gate();
    all_acked(&server, "batched", 10).await;
    let mut seen = Vec::new();
    let requests = endpoint.received();
    for r in &requests {
        assert_eq!(r.header("content-type"), "application/json");
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["consumer"], "batched");
        let deliveries = body["deliveries"].as_array().unwrap();
        assert!((1..=5).contains(&deliveries.len()), "{} events in one request", deliveries.len());
        for d in deliveries {
            assert_eq!(d["attempt"], 1);
            assert_eq!(d["event"]["channel"], "jobs");
            seen.push(d["event"]["id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(seen, ids, "every event once, in order");
    assert!(requests.len() < 10, "events that waited went together: {} requests", requests.len());
    server.stop().await;
}

/// The first failure reason of consumer `name`'s oldest pending event, once it has one.
async fn first_failure(server: &TestServer, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pending = server
            .admin()
            .await
            .list_pending(pb::ListPendingRequest { consumer: name.into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        if let Some(f) = pending.entries.first().and_then(|e| e.failures.first()) {
            return f.reason.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {name}'s failed attempt");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_loopback_unspecified_and_the_hosts_own_addresses_are_never_pushed_to() {
    // Were it reached, its answer would show in the failure reasons.
    let endpoint = Endpoint::start(|_| Reply::Status(404, "secret-of-the-endpoint")).await;
    let server = common::start().await;
    let port = endpoint.url.trim_start_matches("http://127.0.0.1:").trim_end_matches('/').to_owned();
    let mut urls = vec![
        ("literal", endpoint.url.clone()),
        ("named", endpoint.url.replace("127.0.0.1", "localhost")),
        ("other-loopback", endpoint.url.replace("127.0.0.1", "127.1.2.3")),
        ("unspecified", endpoint.url.replace("127.0.0.1", "0.0.0.0")),
        ("zero", endpoint.url.replace("127.0.0.1", "0")),
        ("unspecified-v6", endpoint.url.replace("127.0.0.1", "[::]")),
        ("mapped", endpoint.url.replace("127.0.0.1", "[::ffff:127.0.0.1]")),
        ("metadata", "http://169.254.169.254/latest/meta-data/".to_owned()),
        ("private", "http://10.0.0.1/".to_owned()),
    ];
    // This host's own address (the one it sends from), when it has a route.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    if socket.connect("198.51.100.1:9").is_ok()
        && let Ok(own) = socket.local_addr()
        && !own.ip().is_loopback()
    {
        urls.push(("own", format!("http://{}:{port}/", own.ip())));
    }
    for (name, url) in &urls {
        create(&server, push_consumer(name, &["jobs"], push_to(url))).await;
    }
    publish(&server, event("jobs", "x")).await;
    for (name, url) in &urls {
        let reason = first_failure(&server, name).await;
        assert!(reason.contains("push.deny_networks"), "{name} ({url}): {reason}");
        assert!(!reason.contains("secret-of-the-endpoint"), "{name}: {reason}");
    }
    assert!(endpoint.received().is_empty(), "no request reached a denied address");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_networks_opens_a_denied_range_and_an_explicit_deny_list_holds() {
    let endpoint = Endpoint::start(ok).await;
    let server = start().await;
    create(&server, push_consumer("allowed", &["jobs"], push_to(&endpoint.url))).await;
    publish(&server, event("jobs", "x")).await;
    all_acked(&server, "allowed", 1).await;
    server.stop().await;
    // The example list of docs/push.md, without the exception: nothing gets through.
    let example = ["127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "169.254.0.0/16", "fe80::/10"];
    let server = common::start_with(|s| s.push.deny_networks = example.iter().map(|n| (*n).to_owned()).collect()).await;
    create(&server, push_consumer("zero", &["jobs"], push_to(&endpoint.url.replace("127.0.0.1", "0")))).await;
    publish(&server, event("jobs", "y")).await;
    assert!(first_failure(&server, "zero").await.contains("push.deny_networks"));
    assert_eq!(endpoint.received().len(), 1);
    server.stop().await;
}

/// A URL's query may hold a credential: failure reasons (and logs) leave it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_urls_query_stays_out_of_failure_reasons() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let server = start().await;
    let url = format!("http://{closed}/hook?key=s3cret-in-the-url");
    create(&server, push_consumer("keyed", &["jobs"], push_to(&url))).await;
    publish(&server, event("jobs", "x")).await;
    let reason = first_failure(&server, "keyed").await;
    assert!(reason.contains("cannot reach the endpoint"), "{reason}");
    assert!(!reason.contains("s3cret-in-the-url"), "{reason}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_own_listeners_are_never_pushed_to() {
    let server = start().await;
    let own_http = server.url("/v1/publish");
    let urls = [
        ("http", own_http.clone()),
        ("named", own_http.replace("127.0.0.1", "localhost")),
        ("unspecified", own_http.replace("127.0.0.1", "0.0.0.0")),
        ("grpc", format!("http://{}/eventbus.v1.EventBus/Publish", server.addr)),
    ];
    for (name, url) in &urls {
        create(&server, push_consumer(name, &["jobs"], push_to(url))).await;
    }
    publish(&server, event("jobs", r#"{"channel":"jobs","payload":"again"}"#)).await;
    for (name, url) in &urls {
        let reason = first_failure(&server, name).await;
        assert!(reason.contains("own listeners"), "{name} ({url}): {reason}");
    }
    let stats = server.admin().await.get_stats(pb::GetStatsRequest::default()).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 1, "nothing was published again");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_of_push_consumers_through_two_brokers_ends_at_the_hop_limit() {
    let a = start().await;
    let b = start().await;
    // Each pushes what it gets to the other's /v1/publish: the payload is a publish
    // body whose payload is one too, ten deep.
    create(&a, push_consumer("a-to-b", &["loop"], push_to(&b.url("/v1/publish")))).await;
    create(&b, push_consumer("b-to-a", &["loop"], push_to(&a.url("/v1/publish")))).await;
    let body =
        (0..10).fold(serde_json::json!("end"), |inner, _| serde_json::json!({"channel": "loop", "payload": inner}));
    let first = pb::PublishRequest { content_type: "application/json".into(), ..event("loop", body.to_string()) };
    publish(&a, first).await;
    // a → b (hops 1) → a (2) → b (3) → a (4) → b refuses 5: a dead-letters it.
    eventually("the loop to end", || async {
        let i = info(&a, "a-to-b").await;
        i.dead_lettered == 1 && i.pending == 0 && i.in_flight == 0
    })
    .await;
    let (ab, ba) = (info(&a, "a-to-b").await, info(&b, "b-to-a").await);
    assert_eq!((ab.acked, ba.acked, ba.dead_lettered), (2, 2, 0));
    let log = a
        .admin()
        .await
        .list_event_log(pb::ListEventLogRequest { consumer: "a-to-b".into(), limit: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let dead: Vec<&str> = log.entries.iter().flat_map(|e| e.failures.iter().map(|f| f.reason.as_str())).collect();
    let dead = dead.join("; ");
    assert!(dead.contains("HTTP 508") && dead.contains("eventbus-hops"), "{dead}");
    // The hop count as a publisher sees it, on both HTTP publish routes.
    let http = reqwest::Client::new();
    for (path, hops, status) in [("/v1/publish", "4", 200), ("/v1/publish", "5", 508), ("/v1/publish", "many", 400)] {
        let sent = http.post(a.url(path)).header("eventbus-hops", hops).json(&serde_json::json!({"channel": "other"}));
        assert_eq!(sent.send().await.unwrap().status().as_u16(), status, "{path} with {hops} hops");
    }
    let sent = http
        .post(a.url("/admin/eventbus/publish"))
        .header("eventbus-hops", "9")
        .json(&serde_json::json!({"channel": "other"}));
    assert_eq!(sent.send().await.unwrap().status().as_u16(), 508);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_push_definitions_are_refused_by_name() {
    let server = start().await;
    let mut admin = server.admin().await;
    let cases = [
        (push_to("ftp://example.com/"), "push.url"),
        (pb::PushConfig { batch: 2, ..push_to("http://example.com/") }, "push.envelope: json"),
        (pb::PushConfig { timeout_ms: 31_000, ..push_to("http://example.com/") }, "ack_deadline_ms"),
        (
            pb::PushConfig {
                headers: HashMap::from([("eventbus-id".to_owned(), "x".to_owned())]),
                ..push_to("http://example.com/")
            },
            "push.headers",
        ),
        (pb::PushConfig { envelope: 7, ..push_to("http://example.com/") }, "push.envelope"),
    ];
    for (push, says) in cases {
        let config = push_consumer("bad", &["jobs"], push);
        let err = admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{says}: {err:?}");
        assert!(err.message().contains(says), "{says}: {}", err.message());
    }
    // REST takes the same definition, and shows it back redacted.
    let http = reqwest::Client::new();
    let body = serde_json::json!({
        "name": "rest-hook", "channels": ["jobs"],
        "push": {"url": "https://hooks.example.com/x", "headers": {"authorization": "Bearer t"}, "secret": "s"}
    });
    let created = http.post(server.url("/admin/eventbus/consumers")).json(&body).send().await.unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    let shown: serde_json::Value = created.json().await.unwrap();
    assert_eq!(shown["push"]["url"], "https://hooks.example.com/x");
    assert_eq!(shown["push"]["headers"]["authorization"], "(redacted)");
    assert_eq!(shown["push"]["secret"], "(redacted)");
    assert_eq!(shown["push"]["timeout_ms"], 10_000);
    let bad = serde_json::json!({"name": "x", "channels": ["jobs"], "push": {"url": "http://h/", "retries": 1}});
    let refused = http.post(server.url("/admin/eventbus/consumers")).json(&bad).send().await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(refused.text().await.unwrap().contains("retries"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_delivery_loses_nothing() {
    // The first attempt of every event is held open until the broker is gone.
    let endpoint = Endpoint::start(ok).await;
    endpoint.close_gate();
    let data = tempfile::tempdir().unwrap();
    let loopback = [("EVENTBUS__PUSH__ALLOW_NETWORKS", "127.0.0.0/8".to_owned())];
    let (mut daemon, grpc) = common::consume::daemon_with(data.path(), &loopback).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let mut admin = pb::admin_client::AdminClient::new(channel.clone());
    let push = pb::PushConfig { max_concurrency: 4, ..push_to(&endpoint.url) };
    let config = push_consumer("survivor", &["jobs"], push);
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
    let mut client = pb::event_bus_client::EventBusClient::new(channel);
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(client.publish(event("jobs", format!("{i}"))).await.unwrap().into_inner().event_id);
    }
    endpoint.wait_for(4).await;
    common::consume::kill_9(&mut daemon).await;
    endpoint.open_gate();

    let (_daemon, grpc) = common::consume::daemon_with(data.path(), &loopback).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let mut admin = pb::admin_client::AdminClient::new(channel);
    eventually("every event acked after the restart", || {
        let mut admin = admin.clone();
        async move {
            let i = admin.get_consumer(pb::GetConsumerRequest { name: "survivor".into() }).await.unwrap().into_inner();
            i.acked == 10 && i.pending == 0 && i.in_flight == 0
        }
    })
    .await;
    let received = endpoint.received();
    let mut delivered: Vec<String> = received.iter().map(|r| r.header("eventbus-id").to_owned()).collect();
    delivered.sort();
    delivered.dedup();
    ids.sort();
    assert_eq!(delivered, ids, "every event reached the endpoint");
    // The four held when the broker died come again, as a later attempt.
    assert!(received.iter().filter(|r| r.attempt() >= 2).count() >= 4);
    let log = admin
        .list_event_log(pb::ListEventLogRequest { consumer: "survivor".into(), limit: 100, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(log.entries.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_redis_instances_share_a_push_consumer() {
    let Some(redis) = RedisProc::start().await else { return };
    let endpoint = Endpoint::start(ok).await;
    let a = broker_with(&redis, loopback_endpoints).await;
    let b = broker_with(&redis, loopback_endpoints).await;
    let push = pb::PushConfig { max_concurrency: 4, ..push_to(&endpoint.url) };
    create(&a, push_consumer("shared", &["jobs.>"], push)).await;
    // Both instances push it: B learned of it from Redis.
    eventually("both instances attached", || async { info(&a, "shared").await.clients == 2 }).await;
    let mut ids = Vec::new();
    for i in 0..200 {
        let server = if i % 2 == 0 { &a } else { &b };
        ids.push(publish(server, event("jobs.x", format!("{i}"))).await);
    }
    all_acked(&a, "shared", 200).await;
    let mut delivered: Vec<String> = endpoint.received().iter().map(|r| r.header("eventbus-id").to_owned()).collect();
    delivered.sort();
    ids.sort();
    assert_eq!(delivered, ids, "each event POSTed once");
    let series = r#"socle_eventbus_push_requests_total{class="2xx",consumer="shared"}"#;
    let (from_a, from_b) = (metric(&a, series).await.unwrap_or(0.0), metric(&b, series).await.unwrap_or(0.0));
    assert_eq!(from_a + from_b, 200.0, "A sent {from_a}, B {from_b}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_waits_for_the_answers_of_requests_in_flight() {
    let endpoint = Endpoint::start(|_| Reply::Slow(Duration::from_millis(500))).await;
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap().to_owned();
    let server = start_with(|s| s.durable.data_dir = dir.clone()).await;
    create(&server, push_consumer("patient", &["jobs"], push_to(&endpoint.url))).await;
    publish(&server, event("jobs", "x")).await;
    endpoint.wait_for(1).await;
    server.stop().await;
    // Answered while the broker stopped: acked, and not sent again after the restart.
    // (A copy: in-process, the stopped server's tasks may hold the store open a little
    // longer; a real process would have exited.)
    let copy = tempfile::tempdir().unwrap();
    copy_dir(data.path(), copy.path());
    let dir = copy.path().to_str().unwrap().to_owned();
    let server = start_with(|s| s.durable.data_dir = dir).await;
    let i = info(&server, "patient").await;
    assert_eq!((i.acked, i.pending, i.in_flight), (1, 0, 0));
    assert_eq!(endpoint.received().len(), 1);
    server.stop().await;
}
