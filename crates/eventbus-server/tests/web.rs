//! The browser's routes against a real server: Server-Sent Events (events, heartbeats,
//! Last-Event-ID with and without history, a slow reader bounded like any subscription),
//! JSON publish, session tokens (the only credential a URL may carry), whoami, CORS,
//! and gRPC-Web with a real gRPC-Web client.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use common::auth::{ADMIN_TOKEN, Files, NOBODY_TOKEN, base_principals, entry};
use common::sse::{EventStream, Sse};
use common::*;
use eventbus_proto::pb;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn post(server: &TestServer, path: &str, body: Value, token: Option<&str>) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new().post(server.url(path)).json(&body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let response = req.send().await.unwrap();
    (response.status(), response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_a_browser_as_server_sent_events() {
    let server = start_with(|s| s.server.http.sse_heartbeat_ms = 1_000).await;
    let mut stream = EventStream::open(&server.url("/v1/subscribe?channel=orders.>&channel=audit"), &[]).await.unwrap();
    let started = stream.next_event().await;
    assert_eq!(started.event, "started");
    assert!(started.json()["subscription_id"].as_str().is_some_and(|id| !id.is_empty()));

    let (status, published) =
        post(&server, "/v1/publish", json!({"channel": "orders.created", "payload": {"id": 7}}), None).await;
    assert_eq!(status, StatusCode::OK, "{published}");
    post(&server, "/v1/publish", json!({"channel": "audit", "payload": "plain words", "metadata": {"k": "v"}}), None)
        .await;
    post(&server, "/v1/publish", json!({"channel": "orders.raw", "payload_base64": "AAEC/w=="}), None).await;

    let json_event = stream.next_event().await;
    assert_eq!(
        (json_event.event.as_str(), json_event.id.as_str()),
        ("message", published["event_id"].as_str().unwrap())
    );
    let e = json_event.json();
    assert_eq!(e["channel"], "orders.created");
    assert_eq!(e["content_type"], "application/json");
    assert_eq!(e["payload"], "{\"id\":7}", "a textual payload comes as text");
    let text = stream.next_event().await.json();
    assert_eq!((text["payload"].as_str(), text["metadata"]["k"].as_str()), (Some("plain words"), Some("v")));
    assert_eq!(text["content_type"], "text/plain; charset=utf-8");
    let binary = stream.next_event().await.json();
    assert_eq!((binary["payload_base64"].as_str(), binary.get("payload")), (Some("AAEC/w=="), None));

    // Idle: a heartbeat comment keeps proxies from closing the stream.
    assert_eq!(stream.next().await.unwrap(), Sse { event: ":".into(), id: String::new(), data: "keepalive".into() });
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_by_name() {
    let server = start().await;
    for (query, says) in [
        ("", "at least one channel"),
        ("?channel=a..b", "a..b"),
        ("?channel=a&overflow=sometimes", "overflow"),
        ("?channel=a&colour=red", "unknown parameter"),
        ("?channel=a&last_event_id=nope", "not an event id"),
    ] {
        let (status, body) = EventStream::open(&server.url(&format!("/v1/subscribe{query}")), &[]).await.err().unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body.contains(says), "{query}: {body}");
    }
    let (status, body) =
        post(&server, "/v1/publish", json!({"channel": "a", "payload": 1, "payload_base64": "AA=="}), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("not both"), "{body}");
    let (status, body) = post(&server, "/v1/publish", json!({"channel": "a", "colour": 1}), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("colour"), "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_from_history_or_reports_a_gap() {
    let keep = |channels: &str, size| eventbus_server::config::HistoryRuleSetting {
        channels: channels.into(),
        size,
        max_bytes: 1 << 20,
        ttl_ms: 0,
    };
    let server = start_with(|s| s.eventbus.history = vec![keep("orders.>", 100), keep("small.>", 5)]).await;
    let url = server.url("/v1/subscribe?channel=orders.>");
    let mut first = EventStream::open(&url, &[]).await.unwrap();
    first.next_event().await;
    post(&server, "/v1/publish", json!({"channel": "orders.a", "payload": 1}), None).await;
    let seen = first.next_event().await;
    drop(first);
    for n in 2..=4 {
        post(&server, "/v1/publish", json!({"channel": "orders.a", "payload": n}), None).await;
    }
    // What a reconnecting EventSource sends.
    let mut again = EventStream::open(&url, &[("last-event-id", &seen.id)]).await.unwrap();
    let started = again.next_event().await;
    assert_eq!(started.json()["recovered"], true);
    let mut payloads = Vec::new();
    while payloads.last().map(String::as_str) != Some("4") {
        let e = again.next_event().await;
        assert_eq!(e.event, "message");
        assert_ne!(e.id, seen.id, "the last event received is not sent again");
        payloads.push(e.json()["payload"].as_str().unwrap().to_owned());
    }
    assert_eq!(payloads, ["2", "3", "4"], "nothing missed, nothing twice");

    // A channel without history: the stream says what it cannot give back.
    let mut other =
        EventStream::open(&server.url("/v1/subscribe?channel=audit"), &[("last-event-id", &seen.id)]).await.unwrap();
    assert_eq!(other.next_event().await.event, "started");
    let gap = other.next_event().await;
    assert_eq!(gap.event, "gap");
    assert!(gap.json()["reason"].as_str().unwrap().contains("history"));

    // A history that kept less than was missed: the newest it keeps, after a gap.
    let url = server.url("/v1/subscribe?channel=small.>");
    let mut first = EventStream::open(&url, &[]).await.unwrap();
    first.next_event().await;
    post(&server, "/v1/publish", json!({"channel": "small.a", "payload": 0}), None).await;
    let seen = first.next_event().await;
    drop(first);
    for n in 1..=15 {
        post(&server, "/v1/publish", json!({"channel": "small.a", "payload": n}), None).await;
    }
    let mut again = EventStream::open(&url, &[("last-event-id", &seen.id)]).await.unwrap();
    let started = again.next_event().await;
    assert_eq!((started.event.as_str(), &started.json()["recovered"]), ("started", &json!(false)));
    let gap = again.next_event().await;
    assert_eq!(gap.event, "gap", "a resume that could not be given what it missed says so");
    assert!(gap.json()["reason"].as_str().unwrap().contains("no longer holds"), "{gap:?}");
    let mut payloads = Vec::new();
    for _ in 11..=15 {
        payloads.push(again.next_event().await.json()["payload"].as_str().unwrap().to_owned());
    }
    assert_eq!(payloads, ["11", "12", "13", "14", "15"], "the newest kept");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_close_ends_the_stream_with_an_end_event() {
    let server = start().await;
    let mut stream = EventStream::open(&server.url("/v1/subscribe?channel=orders.>"), &[]).await.unwrap();
    let started = stream.next_event().await;
    let id = started.json()["subscription_id"].as_str().unwrap().to_owned();
    let closed =
        reqwest::Client::new().delete(server.url(&format!("/admin/eventbus/subscriptions/{id}"))).send().await.unwrap();
    assert_eq!(closed.status(), StatusCode::NO_CONTENT);
    let end = stream.next_event().await;
    assert_eq!(end.event, "end");
    assert_eq!(end.json()["code"], "Ok");
    assert!(end.json()["reason"].as_str().unwrap().contains("operator"), "{end:?}");
    assert_eq!(stream.next().await, None, "nothing follows the end");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_that_does_not_read_is_bounded_like_any_subscriber() {
    let server = start().await;
    let url = server.url("/v1/subscribe?channel=flood&queue_capacity=8&overflow=drop_oldest&name=slow-tab");
    let mut stream = EventStream::open(&url, &[]).await.unwrap();
    stream.next_event().await;
    let payload = "x".repeat(200_000);
    let mut client = server.client().await;
    for _ in 0..100 {
        client.publish(event("flood", payload.clone())).await.unwrap();
    }
    eventually("drops counted on the unread subscription", || async {
        let list: Value =
            reqwest::get(server.url("/admin/eventbus/subscriptions")).await.unwrap().json().await.unwrap();
        let sub = list["subscriptions"].as_array().unwrap().iter().find(|s| s["name"] == "slow-tab").cloned();
        sub.is_some_and(|s| s["dropped"].as_u64().unwrap() > 0 && s["pending"].as_u64().unwrap() <= 8)
    })
    .await;
    drop(stream);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_are_the_only_credential_a_url_carries() {
    let reader = "{ subscribe: { allow: ['orders.>'] } }";
    let files = Files::new(&(base_principals() + &entry("reader", "ebt_reader_0123456789abcdef", reader)));
    let server = files.start().await;
    let get = |path: &str, token: Option<&str>| {
        let mut req = reqwest::Client::new().get(server.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        async move {
            let r = req.send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    assert_eq!(get("/v1/whoami", None).await.0, StatusCode::UNAUTHORIZED);
    let (status, me) = get("/v1/whoami", Some("ebt_reader_0123456789abcdef")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (me["auth"].as_bool(), me["principal"].as_str(), me["admin"].as_bool()),
        (Some(true), Some("reader"), Some(false))
    );

    let (status, minted) =
        post(&server, "/v1/tokens", json!({"ttl_ms": 60_000}), Some("ebt_reader_0123456789abcdef")).await;
    assert_eq!(status, StatusCode::OK, "{minted}");
    let session = minted["token"].as_str().unwrap().to_owned();
    assert!(session.starts_with("ebs_"), "{session}");
    // The session token carries the reader's rights, no more.
    let ok = EventStream::open(&server.url(&format!("/v1/subscribe?channel=orders.>&token={session}")), &[]).await;
    let mut ok = ok.unwrap();
    assert_eq!(ok.next_event().await.event, "started");
    let (status, body) = EventStream::open(&server.url(&format!("/v1/subscribe?channel=audit&token={session}")), &[])
        .await
        .err()
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = post(&server, "/v1/tokens", json!({}), Some(&session)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a session token cannot renew itself: {body}");
    // A long-lived token in a URL is refused, whatever it may do.
    let (status, body) =
        EventStream::open(&server.url(&format!("/v1/subscribe?channel=orders.>&token={ADMIN_TOKEN}")), &[])
            .await
            .err()
            .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("only a session token"), "{body}");
    let (status, _) = EventStream::open(&server.url("/v1/subscribe?channel=orders.>&token=ebs_forged.jwt.x"), &[])
        .await
        .err()
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Rights apply to publishing too.
    let (status, _) =
        post(&server, "/v1/publish", json!({"channel": "orders.a", "payload": 1}), Some(NOBODY_TOKEN)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) =
        post(&server, "/v1/publish", json!({"channel": "orders.a", "payload": 1}), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_origins_need_allowed_origins() {
    let server = start_with(|s| s.server.http.allowed_origins = vec!["https://app.example".into()]).await;
    let client = reqwest::Client::new();
    let publish = |origin: &'static str| {
        client
            .post(server.url("/v1/publish"))
            .header("origin", origin)
            .json(&json!({"channel": "a", "payload": 1}))
            .send()
    };
    let refused = publish("https://evil.example").await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let allowed = publish("https://app.example").await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(allowed.headers()["access-control-allow-origin"], "https://app.example");
    // gRPC-Web on the gRPC port: a preflight from the allowed origin is answered.
    let preflight = client
        .request(reqwest::Method::OPTIONS, format!("http://{}/eventbus.v1.EventBus/Publish", server.addr))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,x-grpc-web")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.headers()["access-control-allow-origin"], "https://app.example");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_web_client_publishes_and_subscribes() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let server = start().await;
    let http = Client::builder(TokioExecutor::new()).build_http();
    let web = tonic_web::GrpcWebClientLayer::new();
    let origin: tonic::codegen::http::Uri = format!("http://{}", server.addr).parse().unwrap();
    let service = tower_layer::Layer::layer(&web, http);
    let mut client = pb::event_bus_client::EventBusClient::with_origin(service, origin);
    let mut stream = client.subscribe(sub(&["web.>"])).await.unwrap().into_inner();
    let started = within(stream.message()).await.unwrap().unwrap();
    assert!(matches!(started.kind, Some(pb::subscribe_response::Kind::Started(_))));
    let published = client.publish(event("web.hello", "from a gRPC-Web client")).await.unwrap().into_inner();
    let batch = within(stream.message()).await.unwrap().unwrap();
    let Some(pb::subscribe_response::Kind::Events(batch)) = batch.kind else { panic!("{batch:?}") };
    assert_eq!(batch.events[0].id, published.event_id);
    assert_eq!(&batch.events[0].payload[..], b"from a gRPC-Web client");
    server.stop().await;
}
