//! Tenants on one broker, played by low-privilege principals against a real server:
//! what one principal does must neither suppress another's events nor reveal them.

use crate::common;

use common::auth::*;
use common::*;
use eventbus_proto::pb;

const ALICE: &str = "ebt_alice_0123456789abcdef";
const BOB: &str = "ebt_bob_0123456789abcdef";

fn tenants() -> String {
    format!(
        "{}{}{}",
        base_principals(),
        entry("alice", ALICE, "{ publish: { allow: ['orders.>'] }, subscribe: { allow: ['orders.>'] } }"),
        entry("bob", BOB, "{ publish: { allow: ['billing.>'] }, subscribe: { allow: ['billing.>'] } }"),
    )
}

fn keyed(channel: &str, payload: &str, key: &str) -> pb::PublishRequest {
    pb::PublishRequest { idempotency_key: key.into(), ..event(channel, payload.to_owned()) }
}

/// Idempotency keys are scoped by principal: Bob's publish with the key Alice used is
/// his own event (stored, delivered, not a duplicate), and neither learns the other's
/// event id; each principal's own repeats are still duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_of_one_principal_never_suppress_anothers_events() {
    let files = Files::new(&tenants());
    let server = files.start().await;
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    let all = common::consume::consumer("all", &[">"]);
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(all) }).await.unwrap();
    let mut alice = bus_client_with(&server, ALICE).await;
    let mut bob = bus_client_with(&server, BOB).await;
    let mut bobs_subscriber = subscribe_on_authed(&mut bob.clone(), sub(&["billing.>"])).await.unwrap();

    let first = alice.publish(keyed("orders.x", "alice's", "K")).await.unwrap().into_inner();
    assert!(!first.duplicate);
    let second = bob.publish(keyed("billing.y", "bob's", "K")).await.unwrap().into_inner();
    assert!(!second.duplicate, "Bob's event suppressed by Alice's key");
    assert_ne!(second.event_id, first.event_id, "Bob learned Alice's event id");
    let got = bobs_subscriber.take(1).await.remove(0);
    assert_eq!((got.id.as_str(), got.payload.as_ref()), (second.event_id.as_str(), &b"bob's"[..]));

    // The other order: Bob first, then Alice with his key.
    let bobs = bob.publish(keyed("billing.y", "bob's again", "K2")).await.unwrap().into_inner();
    let alices = alice.publish(keyed("orders.x", "alice's again", "K2")).await.unwrap().into_inner();
    assert!(!alices.duplicate && alices.event_id != bobs.event_id, "{alices:?} / {bobs:?}");

    // Within one principal, a repeat is a duplicate of its own event.
    let again = alice.publish(keyed("orders.z", "repeat", "K")).await.unwrap().into_inner();
    assert!(again.duplicate);
    assert_eq!(again.event_id, first.event_id);
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "all".into() }).await.unwrap().into_inner();
    assert_eq!(info.pending + info.in_flight, 4, "each principal's events stored once: {info:?}");
    server.stop().await;
}

/// Group names are scoped by principal: Bob joining "workers" on Alice's channels forms
/// a group of his own and takes none of the events Alice's group shares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_cannot_join_anothers_group_and_take_its_events() {
    let both = "{ publish: { allow: ['orders.>'] }, subscribe: { allow: ['orders.>'] } }";
    let principals = format!("{}{}{}", base_principals(), entry("alice", ALICE, both), entry("bob", BOB, both));
    let files = Files::new(&principals);
    let server = files.start().await;
    let mut alice = bus_client_with(&server, ALICE).await;
    let bob = bus_client_with(&server, BOB).await;
    let group = |g: &str| pb::SubscribeRequest { group: g.into(), ..sub(&["orders.>"]) };
    let mut alices = subscribe_on_authed(&mut alice.clone(), group("workers")).await.unwrap();
    let mut intruder = subscribe_on_authed(&mut bob.clone(), group("workers")).await.unwrap();
    for i in 0..4 {
        alice.publish(event("orders.created", format!("{i}"))).await.unwrap();
    }
    let got: Vec<String> =
        alices.take(4).await.iter().map(|e| String::from_utf8(e.payload.to_vec()).unwrap()).collect();
    assert_eq!(got, ["0", "1", "2", "3"], "Alice's group lost events to Bob");
    assert_eq!(intruder.take(4).await.len(), 4, "Bob's own group gets its own copies");
    // Bob's group and Alice's are two groups, each showing the name it was given.
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    let subs = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner().subscriptions;
    let owners: Vec<(&str, &str)> = subs.iter().map(|s| (s.group.as_str(), s.owner.as_str())).collect();
    assert!(owners.contains(&("workers", "alice")) && owners.contains(&("workers", "bob")), "{owners:?}");
    drop(bob);
    server.stop().await;
}

/// A JWT whose `sub` is a static principal's name is another principal (`jwt:<sub>`):
/// it neither owns the static principal's subscriptions nor shares its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_naming_a_static_principal_is_not_that_principal() {
    let rights = "{ subscribe: { allow: ['orders.>'] }, max_subscriptions: 1 }";
    let principals = format!("{}{}", base_principals(), entry("alice", ALICE, rights));
    let files = Files::new(&principals);
    let server = files.start().await;
    let mut alice = bus_client_with(&server, ALICE).await;
    let alices = subscribe_on_authed(&mut alice, sub(&["orders.>"])).await.unwrap();
    let claims = serde_json::json!({
        "sub": "alice", "aud": AUDIENCE, "exp": now() + 600,
        "eventbus": { "subscribe": { "allow": ["orders.>"] }, "max_subscriptions": 1 },
    });
    let token = jwt(claims);
    let mut impostor = bus_client_with(&server, &token).await;
    // Its own subscription count: Alice's one does not use up its limit.
    let own = subscribe_on_authed(&mut impostor, sub(&["orders.>"])).await.unwrap();
    // Not the owner of Alice's subscription.
    let mut impostor_admin = admin_client_with(&server, &token).await;
    let refused = impostor_admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: alices.id.clone() }).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::PermissionDenied);
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    let subs = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner().subscriptions;
    let owner = subs.iter().find(|s| s.id == own.id).map(|s| s.owner.clone());
    assert_eq!(owner.as_deref(), Some("jwt:alice"));
    server.stop().await;
}

/// One principal's subscriptions that never read cannot take the broker's queue budget
/// from the others: past its own share (`max_queued_bytes`, else
/// `auth.default_max_queued_bytes`) its events are dropped and counted
/// (`principal_budget`), and another principal reading late loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_cannot_hold_the_shared_queue_budget() {
    let hog = "{ publish: { allow: ['hog.>'] }, subscribe: { allow: ['hog.>'] } }";
    let victim = "{ publish: { allow: ['victim.>'] }, subscribe: { allow: ['victim.>'] }, max_queued_bytes: 200000 }";
    let principals = format!("{}{}{}", base_principals(), entry("alice", ALICE, hog), entry("bob", BOB, victim));
    let files = Files::new(&principals);
    let server = files
        .start_with(|s| {
            s.eventbus.max_queued_bytes = 256 << 10;
            s.auth.default_max_queued_bytes = 64 << 10;
        })
        .await;
    // The stalled subscribers on connections of their own, as separate processes
    // would be (their unread streams fill their connection's flow-control window).
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(subscribe_on_authed(&mut bus_client_with(&server, ALICE).await, sub(&["hog.>"])).await.unwrap());
    }
    let mut alice = bus_client_with(&server, ALICE).await;
    // More than the client's HTTP/2 windows take in: the rest waits in the queues.
    let chunk = bytes::Bytes::from(vec![b'h'; 16 << 10]);
    for _ in 0..600 {
        alice.publish(event("hog.flood", chunk.clone())).await.unwrap();
    }
    let mut bob = bus_client_with(&server, BOB).await;
    let mut late = subscribe_on_authed(&mut bob.clone(), sub(&["victim.>"])).await.unwrap();
    for i in 0..50 {
        let answer = bob.publish(event("victim.work", format!("{i:0>1024}"))).await.unwrap().into_inner();
        assert_eq!((answer.delivered_count, answer.failed_count), (1, 0), "event {i} lost: {answer:?}");
    }
    assert_eq!(late.take(50).await.len(), 50, "Bob, reading late, lost events to Alice's stalled queues");
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let dropped = metrics.lines().find(|l| l.contains("dropped_by_reason_total{reason=\"principal_budget\"}"));
    let all: Vec<&str> = metrics.lines().filter(|l| l.contains("dropped_by_reason_total{")).collect();
    assert!(dropped.is_some_and(|l| !l.ends_with(" 0")), "{all:?}");
    drop(stalled);
    server.stop().await;
}
