//! The `Client`: publish, pipelined publish, the reconnecting subscription and its
//! gaps, admin calls, typed errors, and the bearer token against a broker with auth.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;
mod shared_publish;

use common::*;
use eventbus_client::{Client, ClientOptions, Error, SubscribeOptions, SubscriptionItem, pb};

/// The next item that is not `Started`.
async fn next_item(sub: &mut eventbus_client::Subscription) -> SubscriptionItem {
    within(async {
        loop {
            match sub.next().await.expect("subscription open").unwrap() {
                SubscriptionItem::Started { .. } => continue,
                other => return other,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_stream_answers_every_publish_in_order() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["log.*"])).await.unwrap();
    let (tx, mut answers) = client.publish_stream(16).await.unwrap();
    let sender = tokio::spawn(async move {
        for i in 0..100 {
            tx.send(event("log.line", format!("{i}"))).await.unwrap();
        }
    });
    let mut ids = Vec::new();
    while let Some(answer) = within(answers.next()).await.unwrap() {
        ids.push(answer.event_id);
    }
    sender.await.unwrap();
    let mut got = Vec::new();
    while got.len() < 100 {
        let SubscriptionItem::Events(events) = next_item(&mut sub).await else { panic!("no gap expected") };
        got.extend(events.into_iter().map(|e| e.id));
    }
    assert_eq!(got, ids, "one answer per publish, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    assert!(matches!(client.publish_request(event("bad..name", "x")).await, Err(Error::InvalidArgument(_))));
    assert!(matches!(client.consumer("nobody").await, Err(Error::NotFound(_))));
    assert!(matches!(client.unsubscribe("nope").await, Err(Error::NotFound(_))));
    let refused = client.subscribe(SubscribeOptions::new(["a.b"]).queue_capacity(u32::MAX)).await.unwrap_err();
    assert!(matches!(refused, Error::InvalidArgument(_)), "{refused}");
    let err = Client::connect(ClientOptions::new("http://127.0.0.1:1")).await.unwrap_err();
    assert!(
        matches!(err, Error::Connect { .. }) && err.to_string().starts_with("cannot connect to http://127.0.0.1:1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_see_subscriptions_and_unsubscribe_ends_the_stream() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["news.*"]).name("reader")).await.unwrap();
    let Some(Ok(SubscriptionItem::Started { subscription_id, .. })) = sub.next().await else { panic!("started first") };
    let listed = client.subscriptions().await.unwrap();
    assert_eq!((listed.len(), listed[0].id.as_str(), listed[0].name.as_str()), (1, subscription_id.as_str(), "reader"));
    client.publish_request(event("news.today", "hello")).await.unwrap();
    assert_eq!(client.stats().await.unwrap().total_published, 1);
    assert_eq!(client.channels().await.unwrap()[0].channel, "news.today");
    client.unsubscribe(&subscription_id).await.unwrap();
    let SubscriptionItem::Events(events) = next_item(&mut sub).await else { panic!("the event first") };
    assert_eq!(&events[0].payload[..], b"hello");
    assert!(within(sub.next()).await.is_none(), "unsubscribed: the subscription ends");

    client.create_consumer(consumer("audit", "news.>")).await.unwrap();
    assert_eq!(client.consumers().await.unwrap().len(), 1);
    client.delete_consumer("audit").await.unwrap();
    assert!(client.consumers().await.unwrap().is_empty());
}

/// The next deliveries of a raw consume stream (skipping `attached`).
async fn deliveries(stream: &mut eventbus_client::ConsumeStream) -> Vec<pb::Delivery> {
    within(async {
        loop {
            match stream.next().await.unwrap().expect("stream open") {
                eventbus_client::ConsumeMessage::Deliveries(d) => return d,
                _ => continue,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_operations_list_pending_pause_resume_and_redrive() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("ops", "jobs.>")).await.unwrap();
    assert!(client.pause("ops").await.unwrap().paused);
    let ids = publish_n(&client, "jobs.run", 3).await;
    let page = client.pending("ops", 2, "").await.unwrap();
    let listed: Vec<&str> = page.entries.iter().map(|e| e.event.as_ref().unwrap().id.as_str()).collect();
    assert_eq!(listed, [ids[0].as_str(), ids[1].as_str()]);
    assert!(page.entries.iter().all(|e| e.state == pb::PendingState::Ready as i32 && e.attempt == 0));
    let rest = client.pending("ops", 2, page.next_page_token).await.unwrap();
    assert_eq!((rest.entries.len(), rest.next_page_token.as_str()), (1, ""));

    let mut stream = client.consume(pb::Attach { consumer: "ops".into(), ..Default::default() }).await.unwrap();
    assert!(!client.resume("ops").await.unwrap().paused);
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(deliveries(&mut stream).await);
    }
    let tx = stream.sender();
    for d in &got {
        tx.term(d.event.as_ref().unwrap().id.clone(), "poison".into()).await.unwrap();
    }
    eventually("3 dead letters", || async { client.consumer("ops").await.unwrap().redrivable == 3 }).await;
    let one = client.redrive("ops", vec![ids[2].clone()], 0).await.unwrap();
    assert_eq!((one.redriven, one.remaining), (1, 2));
    let back = deliveries(&mut stream).await;
    assert_eq!((back[0].event.as_ref().unwrap().id.as_str(), back[0].attempt), (ids[2].as_str(), 1));
    let rest = client.redrive("ops", Vec::new(), 0).await.unwrap();
    assert_eq!((rest.redriven, rest.remaining), (2, 0));
    assert_eq!(client.consumer("ops").await.unwrap().redriven, 3);

    assert!(matches!(client.pending("ghost", 0, "").await, Err(Error::NotFound(_))));
    assert!(matches!(client.pending("ops", 0, "bogus").await, Err(Error::InvalidArgument(_))));
    assert!(matches!(client.redrive("ghost", Vec::new(), 0).await, Err(Error::NotFound(_))));
    assert!(matches!(client.pause("ghost").await, Err(Error::NotFound(_))));
    assert!(matches!(client.resume("ghost").await, Err(Error::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reports_the_gap_of_a_daemon_restart_and_subscribes_again() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["news.*"]).backoff(FAST)).await.unwrap();
    let Some(Ok(SubscriptionItem::Started { subscription_id: first, recovered: false })) = sub.next().await else {
        panic!("started first, nothing to recover")
    };
    client.publish_request(event("news.today", "before")).await.unwrap();
    assert!(matches!(next_item(&mut sub).await, SubscriptionItem::Events(e) if &e[0].payload[..] == b"before"));

    let addr = broker.addr;
    broker.stop().await;
    let mut s = settings();
    s.server.grpc_addr = addr;
    let _broker = Broker::start_with(s).await;
    // The channel keeps no history: once subscribed again, the gap is reported.
    let SubscriptionItem::Gap { reason } = next_item(&mut sub).await else { panic!("a gap") };
    assert!(!reason.is_empty());
    let again = within(async {
        loop {
            if let SubscriptionItem::Started { subscription_id, recovered } = sub.next().await.unwrap().unwrap() {
                assert!(!recovered, "no channel keeps a history");
                return subscription_id;
            }
        }
    })
    .await;
    assert_ne!(again, first, "a new subscription on the new broker");
    client.publish_request(event("news.today", "after")).await.unwrap();
    assert!(matches!(next_item(&mut sub).await, SubscriptionItem::Events(e) if &e[0].payload[..] == b"after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_authenticates_every_call() {
    const TOKEN: &str = "ebt_billing_0123456789abcdef";
    let permissions = "{ publish: { allow: ['orders.>'] }, subscribe: { allow: ['orders.>'] }, \
                       consumers: { allow: ['*'] }, manage_consumers: ['*'] }";
    let (broker, _dir) = broker_with_principal("billing", TOKEN, permissions).await;

    let client = Client::connect(ClientOptions::new(broker.url()).token(TOKEN)).await.unwrap();
    let mut sub = client.subscribe(SubscribeOptions::new(["orders.*"])).await.unwrap();
    client.publish_request(event("orders.created", "1")).await.unwrap();
    assert!(matches!(next_item(&mut sub).await, SubscriptionItem::Events(_)));
    assert!(matches!(client.publish_request(event("payments.made", "1")).await, Err(Error::PermissionDenied(_))));
    assert!(matches!(client.stats().await, Err(Error::PermissionDenied(_))), "not an admin");

    let anonymous = broker.client().await;
    assert!(matches!(anonymous.publish_request(event("orders.created", "1")).await, Err(Error::Unauthenticated(_))));
    let wrong = Client::connect(ClientOptions::new(broker.url()).token("ebt_wrong")).await.unwrap();
    let err = wrong.subscribe(SubscribeOptions::new(["orders.*"])).await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_the_token_works_its_consumer() {
    const TOKEN: &str = "ebt_worker_0123456789abcdef";
    let permissions = "{ publish: { allow: ['>'] }, subscribe: { allow: ['>'] }, \
                       consumers: { allow: ['billing'] }, manage_consumers: ['billing'] }";
    let (broker, _dir) = broker_with_principal("w", TOKEN, permissions).await;
    let client = Client::connect(ClientOptions::new(broker.url()).token(TOKEN)).await.unwrap();
    client.create_consumer(consumer("billing", "orders.>")).await.unwrap();
    publish_n(&client, "orders.created", 3).await;
    let worker = eventbus_client::Worker::new(client.clone(), "billing");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let (w, s) = (worker.clone(), shutdown.clone());
        async move { w.run(|_: eventbus_client::Delivery| async {}, s).await }
    });
    eventually("3 acked", || async { client.consumer("billing").await.unwrap().acked == 3 }).await;
    shutdown.cancel();
    within(run).await.unwrap().unwrap();

    // A consumer the token may not attach to: the worker stops with the refusal.
    let other = eventbus_client::Worker::new(client.clone(), "shipping");
    let err = within(other.run(|_: eventbus_client::Delivery| async {}, Default::default())).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_) | Error::NotFound(_)), "{err}");
    let _ = pb::Event::default();
}

/// A broker with authentication on and one principal `name`, holding `token` and
/// `permissions` (YAML flow mapping). Keep the directory while the broker runs.
async fn broker_with_principal(name: &str, token: &str, permissions: &str) -> (Broker, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let principals = dir.path().join("principals.yaml");
    let yaml = format!(
        "principals:\n  - name: {name}\n    token_sha256: {}\n    permissions: {permissions}\n",
        eventbus_auth::token_sha256(token)
    );
    std::fs::write(&principals, yaml).unwrap();
    let mut s = settings();
    s.auth.enabled = true;
    s.auth.principals_file = principals.to_string_lossy().into_owned();
    (Broker::start_with(s).await, dir)
}
