//! Push consumers against a principal of the red team, with authentication on: a
//! principal that may manage `red-*` but does not own `red-1` learns none of its push
//! credentials from a refused re-creation, and a push consumer stops pushing once its
//! owner is removed or loses the right to its channels.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::auth::*;
use common::consume::{attach_as, consumer};
use common::*;
use eventbus_proto::pb;
use tonic::Code;

const ALICE: &str = "ebt_alice_0123456789abcdef";
const MALLORY: &str = "ebt_mallory_0123456789abcdef";
/// The owner's credentials for its endpoint: none may come out.
const SECRETS: [&str; 3] = ["Bearer owner-bearer-7f3a", "owner-api-key-51c2", "owner-signing-secret-9d0e"];

fn red_member(name: &str, token: &str, subscribe: &str) -> String {
    let rights = format!(
        "{{ publish: {{ allow: ['red.>'] }}, subscribe: {{ allow: ['{subscribe}'] }}, consumers: {{ allow: ['red-*'] }}, \
         manage_consumers: ['red-*'] }}"
    );
    entry(name, token, &rights)
}

fn principals(alice: Option<&str>) -> String {
    let alice = alice.map(|subscribe| red_member("alice", ALICE, subscribe)).unwrap_or_default();
    format!("{}{alice}{}", base_principals(), red_member("mallory", MALLORY, "red.>"))
}

fn hooked(url: &str, headers: &[(&str, &str)], secret: &str) -> pb::ConsumerConfig {
    let headers: HashMap<String, String> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let push = pb::PushConfig { url: url.into(), headers, secret: secret.into(), ..Default::default() };
    pb::ConsumerConfig {
        backoff: Some(pb::Backoff { initial_ms: 50, multiplier: 1.0, max_ms: 50, ..Default::default() }),
        push: Some(push),
        ..consumer("red-1", &["red.>"])
    }
}

fn owners_definition(url: &str) -> pb::ConsumerConfig {
    hooked(url, &[("authorization", SECRETS[0]), ("x-api-key", SECRETS[1])], SECRETS[2])
}

fn assert_no_secret(path: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{path} shows {secret:?}: {text}");
    }
}

/// Every answer to a re-creation with another definition (CreateConsumer, REST) says
/// it exists and shows the definitions redacted; so does Consume's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_re_creation_never_shows_the_owners_push_credentials() {
    let files = Files::new(&principals(Some("red.>")));
    let server = files.start().await;
    let url = "http://127.0.0.1:9/hook";
    let request = pb::CreateConsumerRequest { config: Some(owners_definition(url)) };
    admin_client_with(&server, ALICE).await.create_consumer(request).await.unwrap();

    let other = hooked("http://127.0.0.1:9/other", &[("authorization", "Bearer mallory")], "mallory-secret");
    let mut mallory = admin_client_with(&server, MALLORY).await;
    let refused = mallory.create_consumer(pb::CreateConsumerRequest { config: Some(other.clone()) }).await.unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert!(refused.message().contains("(redacted)"), "the definitions are shown, redacted: {}", refused.message());
    assert_no_secret("CreateConsumer", &format!("{refused:?}"));
    // The same definition with a guessed credential is told apart from nothing.
    let guess = hooked(url, &[("authorization", SECRETS[0]), ("x-api-key", "guess")], SECRETS[2]);
    let refused = mallory.create_consumer(pb::CreateConsumerRequest { config: Some(guess) }).await.unwrap_err();
    assert!(!refused.message().contains("push"), "no oracle on credentials: {}", refused.message());

    let attach = pb::Attach {
        consumer: "red-1".into(),
        max_in_flight: 1,
        create_if_missing: Some(other.clone()),
        ..Default::default()
    };
    // Attaching to a consumer that exists ignores the definition sent along, and the
    // one it answers with is redacted.
    let attached = attach_as(server.endpoint(), attach, Some(MALLORY)).await.unwrap();
    assert_eq!(attached.info.config.as_ref().unwrap().push.as_ref().unwrap().url, url);
    assert_no_secret("Consume", &format!("{:?}", attached.info));

    let body = serde_json::json!({
        "name": "red-1", "channels": ["red.>"],
        "push": {"url": "http://127.0.0.1:9/other", "headers": {"authorization": "Bearer mallory"}, "secret": "m"}
    });
    let rest = reqwest::Client::new()
        .post(server.url("/admin/eventbus/consumers"))
        .bearer_auth(MALLORY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), reqwest::StatusCode::CONFLICT);
    let text = rest.text().await.unwrap();
    assert!(text.contains("(redacted)"), "{text}");
    assert_no_secret("REST", &text);
    server.stop().await;
}

/// An endpoint that counts the requests it receives and answers 200.
async fn counting_endpoint() -> (String, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&received);
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::SeqCst);
        async { "" }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

async fn red_1(server: &TestServer) -> pb::ConsumerInfo {
    let request = pb::GetConsumerRequest { name: "red-1".into() };
    admin_client_with(server, ADMIN_TOKEN).await.get_consumer(request).await.unwrap().into_inner()
}

async fn publish_red(server: &TestServer) {
    let mut admin = bus_client_with(server, ADMIN_TOKEN).await;
    admin.publish(event("red.alert", "x")).await.unwrap();
}

async fn revoked_gauge(server: &TestServer) -> Option<f64> {
    let text = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("socle_eventbus_push_owner_revoked{consumer=\"red-1\"}")?.trim().parse().ok())
}

/// Once the owner is stopped: no client attached, the gauge at 1, and a new event
/// waits in the consumer, never posted.
async fn assert_stopped(server: &TestServer, received: &AtomicUsize) {
    eventually("the push consumer to stop", || async {
        revoked_gauge(server).await == Some(1.0) && red_1(server).await.clients == 0
    })
    .await;
    let before = received.load(Ordering::SeqCst);
    let pending = red_1(server).await.pending;
    publish_red(server).await;
    eventually("the event to wait in the consumer", || async { red_1(server).await.pending == pending + 1 }).await;
    let info = red_1(server).await;
    assert_eq!((info.clients, info.in_flight), (0, 0), "{info:?}");
    assert_eq!(received.load(Ordering::SeqCst), before, "nothing was posted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_consumer_stops_when_its_owner_loses_the_right_or_is_removed() {
    let (url, received) = counting_endpoint().await;
    let files = Files::new(&principals(Some("red.>")));
    // The endpoint listens on 127.0.0.1, which push consumers may not reach by default.
    let server = files.start_with(|s| s.push.allow_networks = vec!["127.0.0.0/8".into()]).await;
    let request = pb::CreateConsumerRequest { config: Some(hooked(&url, &[], "")) };
    admin_client_with(&server, ALICE).await.create_consumer(request).await.unwrap();
    publish_red(&server).await;
    eventually("the first push", || async { received.load(Ordering::SeqCst) == 1 }).await;
    assert_eq!(revoked_gauge(&server).await, Some(0.0));

    // Alice may no longer subscribe to red.>: the consumer stops, its events wait.
    files.write_principals(&principals(Some("red.public.>")));
    assert!(server.reloader.reload());
    assert_stopped(&server, &received).await;

    // The right given back: what waited is pushed.
    files.write_principals(&principals(Some("red.>")));
    assert!(server.reloader.reload());
    eventually("the waiting events pushed", || async {
        let info = red_1(&server).await;
        received.load(Ordering::SeqCst) == 2 && info.pending == 0 && info.in_flight == 0
    })
    .await;
    assert_eq!(revoked_gauge(&server).await, Some(0.0));

    // Alice removed: stopped again, until an admin deletes the consumer.
    files.write_principals(&principals(None));
    assert!(server.reloader.reload());
    assert_stopped(&server, &received).await;
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    admin.delete_consumer(pb::DeleteConsumerRequest { name: "red-1".into() }).await.unwrap();
    eventually("the gauge to clear", || async { revoked_gauge(&server).await != Some(1.0) }).await;
    server.stop().await;
}
