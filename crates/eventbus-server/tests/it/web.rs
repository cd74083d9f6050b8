//! The browser's routes against a real server: Server-Sent Events (events, heartbeats,
//! Last-Event-ID with and without history, a slow reader bounded like any subscription),
//! JSON publish, session tokens (the only credential a URL may carry, on subscribe
//! only), whoami, CORS, allowed hosts (DNS rebinding), the gRPC port's content types,
//! and gRPC-Web with a real gRPC-Web client.

use crate::common;

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
    // Only subscribing takes a token in the URL: elsewhere it would just end up in logs.
    let (_, minted) = post(&server, "/v1/tokens", json!({}), Some(ADMIN_TOKEN)).await;
    let admin_session = minted["token"].as_str().unwrap();
    for path in [format!("/v1/publish?token={admin_session}"), format!("/v1/whoami?token={admin_session}")] {
        let req = match path.starts_with("/v1/publish") {
            true => reqwest::Client::new().post(server.url(&path)).json(&json!({"channel": "orders.a"})),
            false => reqwest::Client::new().get(server.url(&path)),
        };
        let refused = req.send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert!(refused.text().await.unwrap().contains("GET /v1/subscribe only"), "{path}");
    }
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

/// A gRPC-Web request of `method` with an empty message, addressed to `host`.
fn grpc_web(server: &TestServer, method: &str, host: &str) -> reqwest::RequestBuilder {
    grpc_http1(server, method, host, "application/grpc-web+proto").header("x-grpc-web", "1")
}

/// An HTTP/1 request of `method` with an empty message and `content_type`, addressed to
/// `host`, as a page's fetch sends it.
fn grpc_http1(server: &TestServer, method: &str, host: &str, content_type: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("http://{}/{method}", server.addr))
        .header("host", host)
        .header("origin", format!("http://{host}"))
        .header("content-type", content_type)
        .body(vec![0u8; 5])
}

/// A page whose DNS name an attacker rebinds to the broker's address calls it with its
/// own name as Host (and Origin): refused on both ports unless the name is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_dns_name_is_refused_on_both_ports() {
    let rebound = "rebind.attacker.example";
    let server = start().await;
    let http = reqwest::Client::new();
    let consumer = common::consume::consumer("jobs", &["jobs"]);
    server.admin().await.create_consumer(pb::CreateConsumerRequest { config: Some(consumer) }).await.unwrap();
    let calls = [
        http.post(server.url("/v1/publish")).json(&json!({"channel": "a", "payload": 1})),
        http.post(server.url("/admin/eventbus/consumers/jobs/pause")),
        http.get(server.url("/admin/eventbus/stats")),
        http.get(server.url("/v1/subscribe?channel=a")),
        http.get(server.url("/metrics")),
    ];
    for call in calls {
        let refused = call.header("host", format!("{rebound}:8080")).header("origin", format!("http://{rebound}:8080"));
        let refused = refused.send().await.unwrap();
        let url = refused.url().to_string();
        assert_eq!(refused.status(), StatusCode::MISDIRECTED_REQUEST, "{url}");
        assert!(refused.text().await.unwrap().contains("server.http.allowed_hosts"), "{url}");
    }
    let refused = grpc_web(&server, "eventbus.v1.Admin/GetStats", rebound).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::MISDIRECTED_REQUEST);
    assert!(refused.text().await.unwrap().contains("server.http.allowed_hosts"));
    // A page's fetch speaks HTTP/1, even with gRPC's own content type.
    let native = grpc_http1(&server, "eventbus.v1.Admin/GetStats", rebound, "application/grpc");
    assert_eq!(native.send().await.unwrap().status(), StatusCode::MISDIRECTED_REQUEST);
    let paused = server.admin().await.get_consumer(pb::GetConsumerRequest { name: "jobs".into() }).await.unwrap();
    assert!(!paused.into_inner().paused, "the refused pause did nothing");
    let stats = server.admin().await.get_stats(pb::GetStatsRequest::default()).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 0, "the refused publish did nothing");
    // The broker's own addresses and localhost pass, as tools and the console reach it.
    let port = server.http.port();
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")] {
        let ok = http.get(server.url("/admin/eventbus/stats")).header("host", &host).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK, "{host}");
    }
    let ok = grpc_web(&server, "eventbus.v1.Admin/GetStats", "localhost").send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    server.stop().await;

    // Listed, a name passes; "*" admits any.
    for listed in [vec![rebound.to_owned()], vec!["*".to_owned()]] {
        let server = start_with(|s| s.server.http.allowed_hosts = listed).await;
        let ok = http.get(server.url("/admin/eventbus/stats")).header("host", rebound).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let ok = grpc_web(&server, "eventbus.v1.Admin/GetStats", rebound).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        server.stop().await;
    }
}

/// The gRPC port runs nothing but gRPC: a cross-site "simple" POST (text/plain, which
/// a page may send anywhere without a preflight) over HTTP/2 is refused unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_refuses_requests_without_a_grpc_content_type() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use prost::Message;

    let server = start().await;
    let publish = pb::PublishRequest { channel: "a".into(), payload: "forged".into(), ..Default::default() };
    let message = publish.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    let h2 = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let req = hyper::Request::post(format!("http://{}/eventbus.v1.EventBus/Publish", server.addr))
            .header("content-type", content_type)
            .header("origin", "https://evil.example")
            .body(String::from_utf8(framed.clone()).unwrap())
            .unwrap();
        let response = within(h2.request(req)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE.as_u16(), "{content_type}");
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 16).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("application/grpc"), "{content_type}");
    }
    let stats = server.admin().await.get_stats(pb::GetStatsRequest::default()).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 0, "nothing was published");
    server.stop().await;
}

/// Server-Sent Events streams count with gRPC subscriptions under a principal's
/// `max_subscriptions`, which defaults to `auth.default_max_subscriptions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_count_under_a_default_max_subscriptions() {
    let reader = "{ subscribe: { allow: ['orders.>'] } }";
    let token = "ebt_reader_0123456789abcdef";
    let files = Files::new(&(base_principals() + &entry("reader", token, reader)));
    let server = files.start_with(|s| s.auth.default_max_subscriptions = 2).await;
    let auth = format!("Bearer {token}");
    let headers = [("authorization", auth.as_str())];
    let mut first = EventStream::open(&server.url("/v1/subscribe?channel=orders.>"), &headers).await.unwrap();
    assert_eq!(first.next_event().await.event, "started");
    let mut client = common::auth::bus_client_with(&server, token).await;
    let _grpc = common::auth::subscribe_on_authed(&mut client, sub(&["orders.>"])).await.unwrap();
    let (status, body) =
        EventStream::open(&server.url("/v1/subscribe?channel=orders.>"), &headers).await.err().unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("max_subscriptions"), "{body}");
    let refused = common::auth::subscribe_on_authed(&mut client, sub(&["orders.>"])).await.err().unwrap();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    // Closing one makes room again.
    drop(first);
    eventually("room for a stream again", || async {
        EventStream::open(&server.url("/v1/subscribe?channel=orders.>"), &headers).await.is_ok()
    })
    .await;
    server.stop().await;
}
