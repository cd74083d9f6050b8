//! docs/security.md: authentication, the rights table, owners, limits and reload, on
//! a real server with real clients. TLS is in `tls.rs`.

use crate::common;

use common::auth::*;
use common::*;
use eventbus_proto::pb::{self, admin_client::AdminClient, consume_request, event_bus_client::EventBusClient};
use tonic::Code;

/// The credentials of the table's rows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cred {
    None,
    BadToken,
    ExpiredJwt,
    WrongAudience,
    WithoutRight,
    WithRight,
}

impl Cred {
    fn header(self) -> Option<String> {
        let exp = now() + 3600;
        let token = match self {
            Self::None => return None,
            Self::BadToken => "ebt_not_a_known_token".to_owned(),
            Self::ExpiredJwt => jwt(serde_json::json!({ "sub": "admin", "aud": AUDIENCE, "exp": now() - 3600 })),
            Self::WrongAudience => jwt(serde_json::json!({ "sub": "admin", "aud": "someone-else", "exp": exp })),
            Self::WithoutRight => NOBODY_TOKEN.to_owned(),
            Self::WithRight => ADMIN_TOKEN.to_owned(),
        };
        Some(format!("Bearer {token}"))
    }
}

async fn bus_client(server: &TestServer, cred: Cred) -> EventBusClient<Authed> {
    EventBusClient::with_interceptor(server.channel().await, with_header(cred.header()))
}

async fn admin_client(server: &TestServer, cred: Cred) -> AdminClient<Authed> {
    AdminClient::with_interceptor(server.channel().await, with_header(cred.header()))
}

fn code<T>(result: Result<T, tonic::Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Every gRPC call the rights table names.
#[derive(Debug, Clone, Copy)]
enum Rpc {
    Publish,
    PublishStream,
    PublishBatch,
    Subscribe,
    Consume,
    GetStats,
    ListChannels,
    ListSubscriptions,
    Unsubscribe,
    CreateConsumer,
    GetConsumer,
    DeleteConsumer,
    ListEventLog,
    ListPending,
    RedriveDeadLetters,
    PauseConsumer,
    ResumeConsumer,
}

const RPCS: [Rpc; 17] = [
    Rpc::Publish,
    Rpc::PublishStream,
    Rpc::PublishBatch,
    Rpc::Subscribe,
    Rpc::Consume,
    Rpc::GetStats,
    Rpc::ListChannels,
    Rpc::ListSubscriptions,
    Rpc::Unsubscribe,
    Rpc::CreateConsumer,
    Rpc::GetConsumer,
    Rpc::DeleteConsumer,
    Rpc::ListEventLog,
    Rpc::ListPending,
    Rpc::RedriveDeadLetters,
    Rpc::PauseConsumer,
    Rpc::ResumeConsumer,
];

/// What the admin set up for the table: a subscription to close and consumers to read,
/// attach to and delete.
struct Fixture {
    subscription: String,
    _keep: Subscriber,
}

async fn fixture(server: &TestServer) -> Fixture {
    let mut admin = admin_client(server, Cred::WithRight).await;
    admin.create_consumer(create("c-read")).await.unwrap();
    admin.create_consumer(create("c-delete")).await.unwrap();
    let sub = subscribe_on_authed(&mut bus_client(server, Cred::WithRight).await, sub(&["t.>"])).await.unwrap();
    Fixture { subscription: sub.id.clone(), _keep: sub }
}

fn create(name: &str) -> pb::CreateConsumerRequest {
    pb::CreateConsumerRequest { config: Some(common::consume::consumer(name, &["t.>"])) }
}

async fn call(server: &TestServer, fixture: &Fixture, rpc: Rpc, cred: Cred) -> Code {
    let mut bus = bus_client(server, cred).await;
    let mut admin = admin_client(server, cred).await;
    match rpc {
        Rpc::Publish => code(bus.publish(event("t.one", &b"x"[..])).await),
        Rpc::PublishStream => {
            let requests = futures::stream::iter([event("t.one", &b"x"[..])]);
            match bus.publish_stream(requests).await {
                Ok(answers) => code(answers.into_inner().message().await),
                Err(status) => status.code(),
            }
        }
        // Rights are judged per event: the code is the call's, else its one event's.
        Rpc::PublishBatch => match bus
            .publish_batch(pb::PublishBatchRequest { events: vec![event("t.one", "x")] })
            .await
        {
            Ok(answer) => answer.into_inner().results[0].error.as_ref().map_or(Code::Ok, |e| Code::from_i32(e.code)),
            Err(status) => status.code(),
        },
        Rpc::Subscribe => code(subscribe_on_authed(&mut bus, sub(&["t.>"])).await),
        Rpc::Consume => {
            let attach = pb::ConsumeRequest {
                kind: Some(consume_request::Kind::Attach(pb::Attach {
                    consumer: "c-read".into(),
                    ..Default::default()
                })),
            };
            // The request stream stays open while the answer is read.
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(attach).await.unwrap();
            let result = match bus.consume(tokio_stream::wrappers::ReceiverStream::new(rx)).await {
                Ok(stream) => code(within(stream.into_inner().message()).await),
                Err(status) => status.code(),
            };
            drop(tx);
            result
        }
        Rpc::GetStats => code(admin.get_stats(pb::GetStatsRequest {}).await),
        Rpc::ListChannels => code(admin.list_channels(pb::ListChannelsRequest {}).await),
        Rpc::ListSubscriptions => code(admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await),
        Rpc::Unsubscribe => {
            let id = fixture.subscription.clone();
            code(admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: id }).await)
        }
        Rpc::CreateConsumer => code(admin.create_consumer(create("c-new")).await),
        Rpc::GetConsumer => code(admin.get_consumer(pb::GetConsumerRequest { name: "c-read".into() }).await),
        Rpc::DeleteConsumer => code(admin.delete_consumer(pb::DeleteConsumerRequest { name: "c-delete".into() }).await),
        Rpc::ListEventLog => code(
            admin.list_event_log(pb::ListEventLogRequest { consumer: "c-read".into(), ..Default::default() }).await,
        ),
        Rpc::ListPending => {
            code(admin.list_pending(pb::ListPendingRequest { consumer: "c-read".into(), ..Default::default() }).await)
        }
        Rpc::RedriveDeadLetters => code(
            admin.redrive_dead_letters(pb::RedriveRequest { consumer: "c-read".into(), ..Default::default() }).await,
        ),
        Rpc::PauseConsumer => code(admin.pause_consumer(pb::PauseConsumerRequest { name: "c-read".into() }).await),
        Rpc::ResumeConsumer => code(admin.resume_consumer(pb::ResumeConsumerRequest { name: "c-read".into() }).await),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_each_credential_with_its_code() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let fixture = fixture(&server).await;
    let refused = [
        (Cred::None, Code::Unauthenticated),
        (Cred::BadToken, Code::Unauthenticated),
        (Cred::ExpiredJwt, Code::Unauthenticated),
        (Cred::WrongAudience, Code::Unauthenticated),
        (Cred::WithoutRight, Code::PermissionDenied),
    ];
    let mut failures = Vec::new();
    for rpc in RPCS {
        for (cred, expected) in refused {
            let got = call(&server, &fixture, rpc, cred).await;
            if got != expected {
                failures.push(format!("{rpc:?} with {cred:?}: expected {expected:?}, got {got:?}"));
            }
        }
        // With the right last: Unsubscribe and DeleteConsumer consume their fixture.
        let got = call(&server, &fixture, rpc, Cred::WithRight).await;
        if got != Code::Ok {
            failures.push(format!("{rpc:?} with {:?}: expected Ok, got {got:?}", Cred::WithRight));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // ListConsumers is open to every principal but shows only what it may see.
    let srv = &server;
    let visible = |cred| async move {
        let mut admin = admin_client(srv, cred).await;
        admin.list_consumers(pb::ListConsumersRequest {}).await.map(|r| r.into_inner().consumers.len())
    };
    assert_eq!(visible(Cred::None).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(visible(Cred::WithoutRight).await.unwrap(), 0);
    assert!(visible(Cred::WithRight).await.unwrap() >= 2);
    drop(fixture);
    server.stop().await;
}

/// Every REST route: (method, path, body).
const ROUTES: [(&str, &str, &str); 14] = [
    ("GET", "/admin/eventbus/stats", ""),
    ("GET", "/admin/eventbus/channels", ""),
    ("GET", "/admin/eventbus/subscriptions", ""),
    ("POST", "/admin/eventbus/publish", r#"{"channel":"t.rest","payload":1}"#),
    ("GET", "/admin/eventbus/consumers", ""),
    ("POST", "/admin/eventbus/consumers", r#"{"name":"c-rest","channels":["t.>"]}"#),
    ("GET", "/admin/eventbus/consumers/c-read", ""),
    ("GET", "/admin/eventbus/consumers/c-read/log", ""),
    ("GET", "/admin/eventbus/consumers/c-read/pending", ""),
    ("POST", "/admin/eventbus/consumers/c-read/redrive", r#"{"limit":10}"#),
    ("POST", "/admin/eventbus/consumers/c-read/pause", ""),
    ("POST", "/admin/eventbus/consumers/c-read/resume", ""),
    ("DELETE", "/admin/eventbus/consumers/c-delete", ""),
    ("DELETE", "/admin/eventbus/subscriptions/{sub}", ""),
];

async fn rest(server: &TestServer, fixture: &Fixture, route: (&str, &str, &str), cred: Cred) -> reqwest::Response {
    let (method, path, body) = route;
    let path = path.replace("{sub}", &fixture.subscription);
    let client = reqwest::Client::new();
    let mut req = client.request(method.parse().unwrap(), server.url(&path));
    if !body.is_empty() {
        req = req.header("content-type", "application/json").body(body.to_owned());
    }
    if let Some(header) = cred.header() {
        req = req.header("authorization", header);
    }
    within(req.send()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rest_route_answers_each_credential_with_its_code() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let fixture = fixture(&server).await;
    let mut failures = Vec::new();
    for route in ROUTES {
        for cred in [Cred::None, Cred::BadToken, Cred::ExpiredJwt, Cred::WrongAudience] {
            let response = rest(&server, &fixture, route, cred).await;
            let challenge = response.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned());
            if response.status() != 401 || challenge.as_deref() != Some("Bearer") {
                failures.push(format!("{route:?} {cred:?}: {} {challenge:?}", response.status()));
            }
        }
        // ListConsumers answers every principal (filtered); the others refuse.
        let expected_without = if route.1 == "/admin/eventbus/consumers" && route.0 == "GET" { 200 } else { 403 };
        let response = rest(&server, &fixture, route, Cred::WithoutRight).await;
        if response.status() != expected_without {
            failures.push(format!("{route:?} without right: {}", response.status()));
        }
        let response = rest(&server, &fixture, route, Cred::WithRight).await;
        if !response.status().is_success() {
            failures.push(format!("{route:?} with right: {}", response.status()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Probes stay open without auth.protect_metrics.
    for path in ["/metrics", "/healthz", "/readyz"] {
        let status = within(reqwest::get(server.url(path))).await.unwrap().status();
        assert_eq!(status, 200, "{path}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_need_credentials_when_protected_and_health_stays_open() {
    let files = Files::new(&base_principals());
    let principals = files.principals().to_string_lossy().into_owned();
    let server = start_with(move |s| {
        s.auth.enabled = true;
        s.auth.principals_file = principals;
        s.auth.protect_metrics = true;
    })
    .await;
    for path in ["/metrics", "/healthz", "/readyz"] {
        let status = within(reqwest::get(server.url(path))).await.unwrap().status();
        assert_eq!(status, 401, "{path}");
        let response =
            within(reqwest::Client::new().get(server.url(path)).bearer_auth(NOBODY_TOKEN).send()).await.unwrap();
        assert_eq!(response.status(), 200, "{path} with any principal");
    }
    // gRPC health carries no credentials in orchestrators' probes: always open.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let answer = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(answer.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_carries_its_permissions_and_deny_wins_over_allow() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let token = jwt(serde_json::json!({
        "sub": "svc-orders",
        "aud": AUDIENCE,
        "exp": now() + 600,
        "eventbus": {
            "publish": { "allow": ["orders.>"], "deny": ["orders.secret.>"] },
            "subscribe": { "allow": ["orders.>"], "deny": ["orders.secret.>"] }
        }
    }));
    let header = Some(format!("Bearer {token}"));
    let mut bus = EventBusClient::with_interceptor(server.channel().await, with_header(header));
    assert_eq!(code(bus.publish(event("orders.created", &b"x"[..])).await), Code::Ok);
    let denied = bus.publish(event("orders.secret.key", &b"x"[..])).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(denied.message().contains("orders.secret.key"), "{}", denied.message());
    assert!(!denied.message().contains(&token), "the credential is never echoed");
    assert_eq!(code(bus.publish(event("billing.paid", &b"x"[..])).await), Code::PermissionDenied);
    // A bad name is a bad request, whoever sends it: no right is judged on it.
    assert_eq!(code(bus.publish(event("orders..x", &b"x"[..])).await), Code::InvalidArgument);
    assert_eq!(
        subscribe_on_authed(&mut bus, sub(&["orders.>.x"])).await.map(|s| s.id).unwrap_err().code(),
        Code::InvalidArgument
    );

    // orders.> can match orders.secret.x: refused whole. orders.eu.* cannot.
    let overlapping = subscribe_on_authed(&mut bus, sub(&["orders.eu.*", "orders.>"])).await.map(|s| s.id);
    assert_eq!(overlapping.unwrap_err().code(), Code::PermissionDenied);
    let mut narrow = subscribe_on_authed(&mut bus, sub(&["orders.eu.*"])).await.unwrap();
    bus.publish(event("orders.eu.created", &b"1"[..])).await.unwrap();
    assert_eq!(narrow.take(1).await[0].channel, "orders.eu.created");

    // The subscription's owner is the JWT's subject, in the namespace of JWT subjects.
    let mut admin = admin_client(&server, Cred::WithRight).await;
    let list = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner();
    let mine = list.subscriptions.iter().find(|s| s.id == narrow.id).unwrap();
    assert_eq!(mine.owner, "jwt:svc-orders");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_or_an_admin_closes_a_subscription() {
    let subscribe_all = "{ subscribe: { allow: ['>'] } }";
    let principals = format!(
        "{}{}{}",
        base_principals(),
        entry("alice", "ebt_alice", subscribe_all),
        entry("bob", "ebt_bob", subscribe_all)
    );
    let files = Files::new(&principals);
    let server = files.start().await;
    let as_ = |token: &'static str| with_header(Some(format!("Bearer {token}")));
    let mut alice = EventBusClient::with_interceptor(server.channel().await, as_("ebt_alice"));
    let first = subscribe_on_authed(&mut alice, sub(&["a.>"])).await.unwrap();
    let second = subscribe_on_authed(&mut alice, sub(&["a.>"])).await.unwrap();

    let mut bob = AdminClient::with_interceptor(server.channel().await, as_("ebt_bob"));
    let refused = bob.unsubscribe(pb::UnsubscribeRequest { subscription_id: first.id.clone() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let mut alice_admin = AdminClient::with_interceptor(server.channel().await, as_("ebt_alice"));
    alice_admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: first.id.clone() }).await.unwrap();
    let mut admin = admin_client(&server, Cred::WithRight).await;
    admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: second.id.clone() }).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_exactly_the_streams_that_lost_their_right() {
    let both = "{ publish: { allow: ['>'] }, subscribe: { allow: ['x.>', 'y.>'] } }";
    let principals =
        format!("{}{}{}", base_principals(), entry("alice", "ebt_alice", both), entry("bob", "ebt_bob", both));
    let files = Files::new(&principals);
    let server = files.start().await;
    let as_ = |token: &'static str| with_header(Some(format!("Bearer {token}")));
    let mut alice = EventBusClient::with_interceptor(server.channel().await, as_("ebt_alice"));
    let mut bob = EventBusClient::with_interceptor(server.channel().await, as_("ebt_bob"));
    let mut alice_x = subscribe_on_authed(&mut alice, sub(&["x.>"])).await.unwrap();
    let mut alice_y = subscribe_on_authed(&mut alice, sub(&["y.>"])).await.unwrap();
    let mut bob_x = subscribe_on_authed(&mut bob, sub(&["x.>"])).await.unwrap();

    // Alice keeps y.> only. A broken file first: refused, nothing changes.
    files.write_principals("principals: [ this is not yaml");
    assert!(!server.reloader.reload(), "a broken principals file is refused");
    let narrowed = "{ publish: { allow: ['>'] }, subscribe: { allow: ['y.>'] } }";
    files.write_principals(&format!(
        "{}{}{}",
        base_principals(),
        entry("alice", "ebt_alice", narrowed),
        entry("bob", "ebt_bob", both)
    ));
    assert!(server.reloader.reload());

    let (_, ended) = alice_x.until_end().await;
    let ended = ended.expect("alice's x.> stream ends with a status");
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("x.>"), "{}", ended.message());

    alice.publish(event("y.1", &b"1"[..])).await.unwrap();
    alice.publish(event("x.1", &b"1"[..])).await.unwrap();
    assert_eq!(alice_y.take(1).await[0].channel, "y.1");
    assert_eq!(bob_x.take(1).await[0].channel, "x.1");
    // And Alice cannot come back to x.>.
    assert_eq!(
        subscribe_on_authed(&mut alice, sub(&["x.>"])).await.map(|s| s.id).unwrap_err().code(),
        Code::PermissionDenied
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_principal_answer_resource_exhausted() {
    let limited =
        "{ publish: { allow: ['>'] }, subscribe: { allow: ['>'] }, max_subscriptions: 2, max_publish_rate: 5 }";
    let files = Files::new(&format!("{}{}", base_principals(), entry("lim", "ebt_lim", limited)));
    let server = files.start().await;
    let mut bus = EventBusClient::with_interceptor(server.channel().await, with_header(Some("Bearer ebt_lim".into())));

    let first = subscribe_on_authed(&mut bus, sub(&["l.>"])).await.unwrap();
    let _second = subscribe_on_authed(&mut bus, sub(&["l.>"])).await.unwrap();
    let third = subscribe_on_authed(&mut bus, sub(&["l.>"])).await.map(|s| s.id).unwrap_err();
    assert_eq!(third.code(), Code::ResourceExhausted);
    assert!(third.message().contains("max_subscriptions"), "{}", third.message());
    drop(first);
    // The place frees when the server sees the stream go: poll with a deadline.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let _again = loop {
        match subscribe_on_authed(&mut bus, sub(&["l.>"])).await {
            Ok(s) => break s,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted);
                assert!(tokio::time::Instant::now() < deadline, "the closed subscription's place never freed");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    };

    // A burst of 5, then refusals until the bucket refills.
    let mut codes = Vec::new();
    for _ in 0..40 {
        codes.push(code(bus.publish(event("l.1", &b"x"[..])).await));
    }
    assert!(codes[..4].iter().all(|c| *c == Code::Ok), "{codes:?}");
    assert!(codes.contains(&Code::ResourceExhausted), "{codes:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_reason_and_operation() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let mut stranger = bus_client(&server, Cred::BadToken).await;
    assert_eq!(code(stranger.publish(event("t.1", &b"x"[..])).await), Code::Unauthenticated);
    let mut nobody = bus_client(&server, Cred::WithoutRight).await;
    assert_eq!(code(nobody.publish(event("t.1", &b"x"[..])).await), Code::PermissionDenied);

    let text = within(reqwest::get(server.url("/metrics"))).await.unwrap().text().await.unwrap();
    let sample = |name: &str, label: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(sample("socle_eventbus_auth_failures_total", "reason=\"unknown_token\""), Some(1.0), "{text}");
    assert_eq!(sample("socle_eventbus_permission_denied_total", "operation=\"publish\""), Some(1.0), "{text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_record_their_owner_and_need_subscribe_rights_on_their_channels() {
    let manager =
        "{ manage_consumers: ['team-*'], subscribe: { allow: ['team.>'] }, consumers: { allow: ['team-*'] } }";
    let files = Files::new(&format!("{}{}", base_principals(), entry("team", "ebt_team", manager)));
    let server = files.start().await;
    let mut admin = AdminClient::with_interceptor(server.channel().await, with_header(Some("Bearer ebt_team".into())));
    let outside = pb::CreateConsumerRequest { config: Some(common::consume::consumer("team-a", &["billing.>"])) };
    assert_eq!(code(admin.create_consumer(outside).await), Code::PermissionDenied);
    let other_name = pb::CreateConsumerRequest { config: Some(common::consume::consumer("ops-a", &["team.>"])) };
    assert_eq!(code(admin.create_consumer(other_name).await), Code::PermissionDenied);
    let ok = pb::CreateConsumerRequest { config: Some(common::consume::consumer("team-a", &["team.>"])) };
    let info = admin.create_consumer(ok).await.unwrap().into_inner();
    assert_eq!(info.owner, "team");
    let got = admin.get_consumer(pb::GetConsumerRequest { name: "team-a".into() }).await.unwrap().into_inner();
    assert_eq!(got.owner, "team");
    server.stop().await;
}

/// docs/security.md: `ListPending` needs the right to read the consumer (attach or
/// manage); redrive, pause and resume need `manage_consumers`, over gRPC and REST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_pending_needs_the_read_right_and_repairs_the_manage_right() {
    let reader = "{ consumers: { allow: ['team-*'] } }";
    let manager = "{ manage_consumers: ['team-*'] }";
    let principals =
        format!("{}{}{}", base_principals(), entry("reader", "ebt_reader", reader), entry("mgr", "ebt_mgr", manager));
    let files = Files::new(&principals);
    let server = files.start().await;
    let mut admin = admin_client(&server, Cred::WithRight).await;
    admin.create_consumer(create("team-a")).await.unwrap();
    admin.create_consumer(create("ops-a")).await.unwrap();
    for (token, repairs) in [("ebt_reader", Code::PermissionDenied), ("ebt_mgr", Code::Ok)] {
        let header = Some(format!("Bearer {token}"));
        let mut admin = AdminClient::with_interceptor(server.channel().await, with_header(header.clone()));
        let pending = |name: &str| pb::ListPendingRequest { consumer: name.into(), ..Default::default() };
        assert_eq!(code(admin.list_pending(pending("team-a")).await), Code::Ok, "{token}");
        assert_eq!(code(admin.list_pending(pending("ops-a")).await), Code::PermissionDenied, "{token}");
        let redrive = pb::RedriveRequest { consumer: "team-a".into(), ..Default::default() };
        assert_eq!(code(admin.redrive_dead_letters(redrive).await), repairs, "{token}");
        let pause = pb::PauseConsumerRequest { name: "team-a".into() };
        assert_eq!(code(admin.pause_consumer(pause).await), repairs, "{token}");
        let resume = pb::ResumeConsumerRequest { name: "team-a".into() };
        assert_eq!(code(admin.resume_consumer(resume).await), repairs, "{token}");

        let http = reqwest::Client::new();
        let status = |method: &str, path: &str| {
            let req = http.request(method.parse().unwrap(), server.url(path));
            let req = req.header("authorization", header.clone().unwrap());
            async move { within(req.send()).await.unwrap().status() }
        };
        assert_eq!(status("GET", "/admin/eventbus/consumers/team-a/pending").await, 200, "{token}");
        assert_eq!(status("GET", "/admin/eventbus/consumers/ops-a/pending").await, 403, "{token}");
        let expected = if repairs == Code::Ok { 200 } else { 403 };
        for action in ["redrive", "pause", "resume"] {
            let path = format!("/admin/eventbus/consumers/team-a/{action}");
            assert_eq!(status("POST", &path).await, expected, "{token} {action}");
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_publishes_only_where_each_event_has_the_right_and_within_the_rate() {
    let partial = "{ publish: { allow: ['p.>'], deny: ['p.secret'] }, max_publish_rate: 8 }";
    let files = Files::new(&format!("{}{}", base_principals(), entry("part", "ebt_part", partial)));
    let server = files.start().await;
    let mut watcher = subscribe_on_authed(&mut bus_client(&server, Cred::WithRight).await, sub(&[">"])).await.unwrap();
    let mut bus = EventBusClient::with_interceptor(server.channel().await, with_header(Some("Bearer ebt_part".into())));

    let events = vec![event("p.a", "1"), event("p.secret", "2"), event("q.other", "3"), event("p.b", "4")];
    let request = pb::PublishBatchRequest { events };
    let results = within(bus.publish_batch(request)).await.unwrap().into_inner().results;
    let codes: Vec<Code> =
        results.iter().map(|r| r.error.as_ref().map_or(Code::Ok, |e| Code::from_i32(e.code))).collect();
    assert_eq!(codes, [Code::Ok, Code::PermissionDenied, Code::PermissionDenied, Code::Ok]);
    let refused = &results[1].error.as_ref().unwrap().message;
    assert!(refused.contains("p.secret") && !refused.contains("ebt_part"), "{refused}");
    // Only the allowed events were published, in order.
    let seen: Vec<String> = watcher.take(2).await.into_iter().map(|e| e.channel).collect();
    assert_eq!(seen, ["p.a", "p.b"]);

    // A batch costs a token per event, taken all at once or not at all: 9 events never
    // fit a bucket of 8, and nothing of such a batch is published.
    let nine = (0..9).map(|i| event("p.burst", format!("{i}"))).collect();
    let status = within(bus.publish_batch(pb::PublishBatchRequest { events: nine })).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("max_publish_rate"), "{}", status.message());
    let marker = within(bus.publish_batch(pb::PublishBatchRequest { events: vec![event("p.marker", "m")] })).await;
    assert!(marker.unwrap().into_inner().results[0].error.is_none());
    assert_eq!(watcher.take(1).await[0].channel, "p.marker");

    // Each refused event is counted like a refused Publish.
    let text = within(reqwest::get(server.url("/metrics"))).await.unwrap().text().await.unwrap();
    let denied = text
        .lines()
        .find(|l| l.starts_with("socle_eventbus_permission_denied_total") && l.contains("operation=\"publish\""));
    assert_eq!(denied.and_then(|l| l.rsplit(' ').next()), Some("2"), "{text}");
    server.stop().await;
}
