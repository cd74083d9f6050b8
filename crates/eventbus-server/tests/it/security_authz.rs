//! What a low-privilege principal may create and what it costs the others, played
//! against a real server with authentication on: dead-letter channels, and the bounds on
//! consumers and captures per principal.

use crate::common;

use common::auth::*;
use common::consume::{attach_as, consumer};
use common::*;
use eventbus_proto::pb::{self, consume_request};
use prost::Message;
use tonic::Code;

const ORDERS: &str = "ebt_orders_0123456789abcdef";

fn orders_service(extra: &str) -> String {
    let rights = format!(
        "{{ publish: {{ allow: ['orders.*'] }}, subscribe: {{ allow: ['orders.>'] }}, \
         consumers: {{ allow: ['os-*'] }}, manage_consumers: ['os-*']{extra} }}"
    );
    format!("{}{}", base_principals(), entry("orders-svc", ORDERS, &rights))
}

/// CreateConsumer for a consumer of `orders.>`.
fn create(name: &str) -> pb::CreateConsumerRequest {
    pb::CreateConsumerRequest { config: Some(consumer(name, &["orders.>"])) }
}

/// `POST /admin/eventbus/consumers` with `body`, as `token`.
async fn rest_create(server: &TestServer, token: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url("/admin/eventbus/consumers"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

fn with_dead_letters(name: &str, dead_letter_channel: &str) -> pb::ConsumerConfig {
    pb::ConsumerConfig { dead_letter_channel: dead_letter_channel.into(), ..consumer(name, &["orders.>"]) }
}

/// A consumer's dead-letter channel is a channel its creator publishes to: naming one
/// it may not publish on is refused (by CreateConsumer, REST and Consume's
/// create_if_missing alike); the broker's default `dlq.<channel>` needs no right, and a
/// dead letter names the owner on whose behalf it is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_channel_needs_the_publish_right_on_it() {
    let files = Files::new(&orders_service(""));
    let server = files.start().await;
    let mut attacker = admin_client_with(&server, ORDERS).await;
    let injected = with_dead_letters("os-inject", "billing.injected");
    let refused = attacker.create_consumer(pb::CreateConsumerRequest { config: Some(injected.clone()) }).await;
    let status = refused.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("billing.injected"), "{}", status.message());
    let attach = pb::Attach { consumer: "os-inject".into(), create_if_missing: Some(injected), ..Default::default() };
    let refused = attach_as(server.endpoint(), attach, Some(ORDERS)).await.err().unwrap();
    assert_eq!(refused.code(), Code::PermissionDenied);
    let body = r#"{"name":"os-rest","channels":["orders.>"],"dead_letter_channel":"billing.injected"}"#;
    let rest = rest_create(&server, ORDERS, body).await;
    assert_eq!(rest.status(), reqwest::StatusCode::FORBIDDEN);
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    let listed = admin.list_consumers(pb::ListConsumersRequest {}).await.unwrap().into_inner().consumers;
    assert!(listed.is_empty(), "nothing created: {listed:?}");

    // A channel it publishes to is fine; so is the default.
    let own = with_dead_letters("os-own", "orders.dead");
    attacker.create_consumer(pb::CreateConsumerRequest { config: Some(own) }).await.unwrap();
    let config = pb::ConsumerConfig { max_attempts: Some(1), ..consumer("os-default", &["orders.>"]) };
    attacker.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.unwrap();
    let mut watcher =
        subscribe_on_authed(&mut bus_client_with(&server, ADMIN_TOKEN).await, sub(&["dlq.>"])).await.unwrap();
    bus_client_with(&server, ORDERS).await.publish(event("orders.x", &b"mine"[..])).await.unwrap();
    let attach = pb::Attach { consumer: "os-default".into(), ..Default::default() };
    let mut c = attach_as(server.endpoint(), attach, Some(ORDERS)).await.unwrap();
    let got = c.deliveries(1).await;
    let event_id = got[0].event.as_ref().unwrap().id.clone();
    c.send(consume_request::Kind::Term(pb::Term { event_id, reason: "no".into() })).await;
    let dead = watcher.take(1).await.remove(0);
    assert_eq!(dead.channel, "dlq.orders.x");
    let letter = pb::DeadLetter::decode(dead.payload).unwrap();
    assert_eq!((letter.consumer.as_str(), letter.owner.as_str()), ("os-default", "orders-svc"));
    server.stop().await;
}

/// A principal owns at most `max_consumers` consumers (else `auth.default_max_consumers`),
/// the broker at most `durable.max_consumers`: past either, creation is refused
/// RESOURCE_EXHAUSTED and counted, by every way of creating one; the other principals
/// are unaffected, and declaring an existing consumer again takes no room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_are_bounded_per_principal_and_per_broker() {
    let files = Files::new(&orders_service(", max_consumers: 2"));
    let server = files.start_with(|s| s.durable.max_consumers = 4).await;
    let mut attacker = admin_client_with(&server, ORDERS).await;
    attacker.create_consumer(create("os-1")).await.unwrap();
    attacker.create_consumer(create("os-2")).await.unwrap();
    attacker.create_consumer(create("os-2")).await.expect("an identical definition takes no room");
    let refused = attacker.create_consumer(create("os-3")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_consumers"), "{}", refused.message());
    let attach = pb::Attach {
        consumer: "os-3".into(),
        create_if_missing: Some(consumer("os-3", &["orders.>"])),
        ..Default::default()
    };
    assert_eq!(attach_as(server.endpoint(), attach, Some(ORDERS)).await.err().unwrap().code(), Code::ResourceExhausted);
    let rest = rest_create(&server, ORDERS, r#"{"name":"os-rest","channels":["orders.>"]}"#).await;
    assert_eq!(rest.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);

    // Another principal has room of its own, up to the broker's bound.
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    admin.create_consumer(create("a-1")).await.unwrap();
    admin.create_consumer(create("a-2")).await.unwrap();
    let refused = admin.create_consumer(create("a-3")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("durable.max_consumers"), "{}", refused.message());
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.contains("permission_denied_total{operation=\"limit\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );
    server.stop().await;
}

/// Without `max_consumers` of its own, a principal has `auth.default_max_consumers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_without_a_bound_gets_the_default_one() {
    let files = Files::new(&orders_service(""));
    let server = files.start_with(|s| s.auth.default_max_consumers = 1).await;
    let mut attacker = admin_client_with(&server, ORDERS).await;
    attacker.create_consumer(create("os-1")).await.unwrap();
    assert_eq!(attacker.create_consumer(create("os-2")).await.unwrap_err().code(), Code::ResourceExhausted);
    server.stop().await;
}
