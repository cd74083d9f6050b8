//! The idiomatic API against a real broker: `client.publish(channel, payload)` and its
//! builder, `Message`s in batches and streams, a subscription read one event at a time
//! (with its batches still there), and `ConsumerBuilder`.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::time::Duration;

use common::*;
use eventbus_client::{ConsumerBuilder, Event, Message, SubscribeOptions, SubscriptionItem, pb};
use futures::{StreamExt, TryStreamExt};

/// The history configuration: channels under `hist.` keep their latest 100 events.
const HISTORY: &str = "eventbus:\n  history:\n    - channels: \"hist.>\"\n      size: 100\n";

async fn next_event(sub: &mut eventbus_client::Subscription) -> Event {
    within(sub.next_event()).await.expect("subscription open").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_sends_every_field_the_builder_sets() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe("api.*").await.unwrap();

    let plain = client.publish("api.plain", "hello").await.unwrap();
    let answer = client
        .publish("api.full", br#"{"id":42}"#.to_vec())
        .content_type("application/json")
        .ordering_key("customer-7")
        .idempotency_key("order-42")
        .source("billing-service")
        .metadata("trace-id", "4bf92f35")
        .metadata_all([("tenant", "acme")])
        .send()
        .await
        .unwrap();
    assert!(!answer.duplicate && answer.delivered_count == 1, "{answer:?}");

    let first = next_event(&mut sub).await;
    assert_eq!(
        (first.id.as_str(), first.channel.as_str(), &first.payload[..]),
        (&*plain.event_id, "api.plain", &b"hello"[..])
    );
    let full = next_event(&mut sub).await;
    assert_eq!(full.id, answer.event_id);
    assert_eq!(&full.payload[..], br#"{"id":42}"#);
    assert_eq!((&*full.content_type, &*full.source), ("application/json", "billing-service"));
    assert_eq!(full.metadata.get("trace-id").map(String::as_str), Some("4bf92f35"));
    assert_eq!(full.metadata.get("tenant").map(String::as_str), Some("acme"));

    // The idempotency key went over: the same key again is a duplicate of the first.
    let again = client.publish("api.full", "other").idempotency_key("order-42").await.unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.event_id, answer.event_id);

    // A refusal is the call's error, typed.
    let refused = client.publish("api..bad", "x").await;
    assert!(matches!(refused, Err(eventbus_client::Error::InvalidArgument(_))), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_go_in_batches_and_publish_streams() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let sub = client.subscribe(["api.batch", "api.stream"]).await.unwrap();

    let batch = (0..3).map(|i| Message::new("api.batch", i.to_string()).metadata("n", i.to_string()));
    let answers = client.publish_batch(batch).await.unwrap();
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 3);
    let (sender, mut stream_answers) = client.publish_stream(8).await.unwrap();
    sender.send(Message::new("api.stream", "s").content_type("text/plain")).await.unwrap();
    sender.close();
    assert!(within(stream_answers.next()).await.unwrap().is_some());
    let published = client.publish_message(Message::new("api.batch", "last")).await.unwrap();

    // The subscription as a Stream of events, with the stream combinators.
    let events: Vec<Event> = within(sub.events().take(5).try_collect()).await.unwrap();
    let got: Vec<(&str, &[u8])> = events.iter().map(|e| (e.channel.as_str(), &e.payload[..])).collect();
    assert_eq!(
        got,
        [
            ("api.batch", &b"0"[..]),
            ("api.batch", b"1"),
            ("api.batch", b"2"),
            ("api.stream", b"s"),
            ("api.batch", b"last")
        ]
    );
    assert_eq!(events[1].metadata.get("n").map(String::as_str), Some("1"));
    assert_eq!(events[3].content_type, "text/plain");
    assert_eq!(events[4].id, published.event_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_one_at_a_time_and_batches_read_the_same_subscription_in_order() {
    let broker = Broker::start_with(settings_from_file(HISTORY)).await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["hist.>"]).name("mixed")).await.unwrap();
    assert!(!sub.subscription_id().is_empty(), "the id is known once subscribed");
    assert_eq!(client.subscriptions().await.unwrap()[0].id, sub.subscription_id());

    // Ten events in one batch: the broker sends them together.
    let answers = client.publish_batch((0..10).map(|i| Message::new("hist.a", i.to_string()))).await.unwrap();
    let ids: Vec<String> = answers.into_iter().map(|a| a.unwrap().event_id).collect();

    let first = next_event(&mut sub).await;
    let second = next_event(&mut sub).await;
    assert_eq!([first.id.as_str(), second.id.as_str()], [ids[0].as_str(), ids[1].as_str()]);
    // Where the reader is: the second event, not what was received with it.
    let since = sub.since().unwrap();
    let position = since.positions.get("hist.a").cloned().unwrap();
    assert_eq!(Some(&position), second.position.as_ref(), "the last event given, not the last received");

    // The same subscription read by items: the rest, in order, as batches.
    let mut rest = Vec::new();
    within(async {
        while rest.len() < 8 {
            match sub.next().await.expect("subscription open").unwrap() {
                SubscriptionItem::Events(events) => rest.extend(events.into_iter().map(|e| e.id)),
                other => panic!("only events expected, got {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(rest, ids[2..], "nothing lost or repeated between the two ways of reading");

    // A new subscription from where the reader was gets what came after it only.
    let mut resumed = client.subscribe(SubscribeOptions::new(["hist.>"]).since(since)).await.unwrap();
    assert_eq!(next_event(&mut resumed).await.id, ids[2], "recovered from just after the second event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_counts_a_gap_and_goes_on_after_a_restart() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let sub = client.subscribe(SubscribeOptions::new(["news.*"]).backoff(FAST)).await.unwrap();
    let mut events = sub.events();
    client.publish("news.today", "before").await.unwrap();
    assert_eq!(&within(events.next()).await.unwrap().unwrap().payload[..], b"before");
    let first_id = events.subscription().subscription_id().to_owned();

    let addr = broker.addr;
    broker.stop().await;
    let mut s = settings();
    s.server.grpc_addr = addr;
    let _broker = Broker::start_with(s).await;
    // Publish until the subscription is back (it may take a reconnection or two).
    let reader = tokio::spawn(async move {
        let event = within(events.next()).await.expect("still open").unwrap();
        (event, events)
    });
    eventually("the subscriber to be back", || async {
        client.publish("news.today", "after").await.is_ok_and(|a| a.delivered_count > 0)
    })
    .await;
    let (event, events) = within(reader).await.unwrap();
    assert_eq!(&event.payload[..], b"after", "the next event after the restart, no error in between");
    let sub = events.into_inner();
    assert_eq!(sub.gaps(), 1, "the restart's loss is counted");
    assert_ne!(sub.subscription_id(), first_id, "a new subscription on the new broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_builder_defines_the_consumer_and_equals_its_raw_form() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let billing = ConsumerBuilder::new("billing", ["orders.>"])
        .ack_deadline(Duration::from_secs(45))
        .max_attempts(7)
        .backoff(Duration::from_millis(250), Duration::from_secs(20))
        .max_in_flight(64)
        .dead_letter_channel("billing.failed")
        .max_pending(5_000);
    let info = client.create_consumer(billing.clone()).await.unwrap();
    let config = info.config.unwrap();
    assert_eq!(config.name, "billing");
    assert_eq!(config.channels, ["orders.>"]);
    assert_eq!((config.ack_deadline_ms, config.max_attempts, config.max_in_flight), (45_000, Some(7), 64));
    let backoff = config.backoff.unwrap();
    assert_eq!((backoff.initial_ms, backoff.max_ms, backoff.kind()), (250, 20_000, pb::BackoffKind::Exponential));
    assert_eq!((config.dead_letter_channel.as_str(), config.max_pending), ("billing.failed", Some(5_000)));

    // The raw form of the same definition is the same consumer (idempotent create).
    client.create_consumer(billing.build()).await.unwrap();
    let other = ConsumerBuilder::new("billing", ["orders.>"]).exclusive();
    assert!(matches!(client.create_consumer(other).await, Err(eventbus_client::Error::AlreadyExists(_))));

    let audit = ConsumerBuilder::new("audit", ["orders.*", "payments.*"])
        .linear_backoff(Duration::from_secs(1), Duration::from_secs(5))
        .exclusive()
        .max_attempts(0);
    let audit = client.create_consumer(audit).await.unwrap().config.unwrap();
    assert_eq!(audit.backoff.unwrap().kind(), pb::BackoffKind::Linear);
    assert!(audit.exclusive && audit.max_attempts == Some(0), "{audit:?}");

    // Published through the new API, captured by both; the ordering key went over: the
    // second event of a key waits behind the first.
    client.publish("orders.created", "first").ordering_key("c-1").await.unwrap();
    client.publish("orders.created", "second").ordering_key("c-1").await.unwrap();
    client.publish("orders.created", "other").await.unwrap();
    eventually("both consumers to capture the events", || async {
        let held = |c: &pb::ConsumerInfo| c.pending + c.in_flight;
        let consumers = client.consumers().await.unwrap();
        consumers.len() == 2 && consumers.iter().all(|c| held(c) == 3)
    })
    .await;
    let pending = client.pending("billing", 0, "").await.unwrap().entries;
    let states: Vec<(&[u8], pb::PendingState)> =
        pending.iter().map(|p| (&p.event.as_ref().unwrap().payload[..], p.state())).collect();
    assert_eq!(
        states,
        [
            (&b"first"[..], pb::PendingState::Ready),
            (b"second", pb::PendingState::BlockedByOrderingKey),
            (b"other", pb::PendingState::Ready)
        ]
    );
}
