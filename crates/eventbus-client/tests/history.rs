//! Recovery from history: a subscription that is lost subscribes again from where its
//! reader was, and on channels that keep a history nothing is missed or repeated; what
//! history cannot give back (a restarted `in_memory` broker) is reported as a gap.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use common::*;
use eventbus_client::{Client, SubscribeOptions, Subscription, SubscriptionItem, pb};
use tokio::task::JoinHandle;

/// The configuration file of every broker here: channels under `hist.` keep their
/// latest 1,000 events.
const HISTORY: &str = "eventbus:\n  history:\n    - channels: \"hist.>\"\n      size: 1000\n";

/// Events published by each test: at most 1,000 per channel, so history holds them all.
const TOTAL: u64 = 1_200;

async fn broker() -> Broker {
    Broker::start_with(settings_from_file(HISTORY)).await
}

/// Even sequence numbers go to `hist.a`, odd ones to `hist.b`.
fn channel_of(seq: u64) -> &'static str {
    if seq.is_multiple_of(2) { "hist.a" } else { "hist.b" }
}

/// Publishes the sequence numbers `first..TOTAL` in order, `batch` per call, without pause.
fn publisher(client: Client, first: u64, batch: u64) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next = first;
        while next < TOTAL {
            let end = TOTAL.min(next + batch);
            let events = (next..end).map(|seq| event(channel_of(seq), seq.to_string()));
            for answer in client.publish_batch(events).await.unwrap() {
                answer.unwrap();
            }
            next = end;
        }
    })
}

/// What subscriptions yielded, in order.
#[derive(Debug, Default)]
struct Received {
    /// Per event: its sequence number, channel and offset.
    events: Vec<(u64, String, u64)>,
    /// `recovered` of each `Started`.
    starts: Vec<bool>,
    gaps: Vec<String>,
}

impl Received {
    /// Reads `sub` until `until` events were received in all.
    async fn read(&mut self, sub: &mut Subscription, until: u64) {
        within(async {
            while (self.events.len() as u64) < until {
                match sub.next().await.expect("subscription open").unwrap() {
                    SubscriptionItem::Started { recovered, .. } => self.starts.push(recovered),
                    SubscriptionItem::Gap { reason } => self.gaps.push(reason),
                    SubscriptionItem::Events(events) => {
                        for e in events {
                            let seq = std::str::from_utf8(&e.payload).unwrap().parse().unwrap();
                            let position = e.position.expect("a channel with history gives positions");
                            self.events.push((seq, e.channel, position.offset));
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        })
        .await;
    }

    /// Each channel received its sequence numbers once each, in publish order, at
    /// consecutive offsets.
    fn assert_each_once_in_order(&self) {
        for channel in ["hist.a", "hist.b"] {
            let got: Vec<(u64, u64)> =
                self.events.iter().filter(|(_, c, _)| c == channel).map(|(seq, _, offset)| (*seq, *offset)).collect();
            let expected: Vec<(u64, u64)> = (0..TOTAL).filter(|seq| channel_of(*seq) == channel).zip(1..).collect();
            assert_eq!(got.len(), expected.len(), "{channel}: every event once");
            assert_eq!(got, expected, "{channel}: in order, none missing, none repeated");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_lost_while_events_flow_resumes_from_history_missing_and_repeating_nothing() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(lost_in_bursts(SubscribeOptions::new(["hist.>"]))).await.unwrap();
    let publishing = publisher(broker.client().await, 0, 50);
    let mut got = Received::default();
    got.read(&mut sub, TOTAL).await;
    within(publishing).await.unwrap();

    assert!(!got.starts[0], "nothing asked at first");
    assert!(got.starts.len() > 1, "the subscription was lost and made again: {got:?}");
    assert!(got.starts[1..].iter().all(|recovered| *recovered), "each time all recovered: {:?}", got.starts);
    assert!(got.gaps.is_empty(), "no gap: {:?}", got.gaps);
    got.assert_each_once_in_order();
}

/// A queue of one event that disconnects its subscriber when full: every burst of
/// publishes loses the subscription, which the client makes again by itself.
fn lost_in_bursts(options: SubscribeOptions) -> SubscribeOptions {
    options.max_queue_bytes(1).overflow(pb::OverflowPolicy::Disconnect).backoff(FAST)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_asked_for_the_past_resumes_after_what_it_received_not_from_that_past() {
    let broker = broker().await;
    let client = broker.client().await;
    // The past hour, from before this broker began: history cannot vouch for it, so
    // asking for it again when subscribing again would report a gap for nothing.
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let since = pb::SubscribeSince { timestamp: Some(hour_ago.into()), ..Default::default() };
    let mut sub = client.subscribe(lost_in_bursts(SubscribeOptions::new(["hist.>"]).since(since))).await.unwrap();
    client.publish_request(event(channel_of(0), "0")).await.unwrap();
    let mut got = Received::default();
    got.read(&mut sub, 1).await;
    let publishing = publisher(broker.client().await, 1, 50);
    got.read(&mut sub, TOTAL).await;
    within(publishing).await.unwrap();

    assert!(got.starts.len() > 1, "the subscription was lost and made again: {got:?}");
    assert!(got.starts[1..].iter().all(|recovered| *recovered), "each time all recovered: {:?}", got.starts);
    assert!(got.gaps.is_empty(), "no gap: {:?}", got.gaps);
    got.assert_each_once_in_order();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_subscription_takes_over_where_another_left_while_events_flow() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut first = client.subscribe(SubscribeOptions::new(["hist.>"])).await.unwrap();
    let publishing = publisher(broker.client().await, 0, 10);
    let mut got = Received::default();
    got.read(&mut first, TOTAL / 4).await;
    let since = first.since().expect("where the first subscription's reader is");
    assert_eq!(since.positions, first.positions());
    assert_eq!(since.positions.len(), 2, "one position per channel: {since:?}");
    drop(first);

    // Events are published while nobody listens: the next subscription recovers them.
    let left_at = since.positions["hist.a"].offset;
    eventually("more events on hist.a", || async {
        let request = pb::GetChannelHistoryRequest { channel: "hist.a".into(), limit: 1, ..Default::default() };
        client.channel_history(request).await.unwrap().history.unwrap().last_offset > left_at + 10
    })
    .await;
    let mut second = client.subscribe(SubscribeOptions::new(["hist.>"]).since(since)).await.unwrap();
    got.read(&mut second, TOTAL).await;
    within(publishing).await.unwrap();

    assert_eq!(got.starts, [false, true], "the second recovered everything after the first");
    assert!(got.gaps.is_empty());
    got.assert_each_once_in_order();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_in_memory_broker_lost_its_history_so_the_subscriber_reports_a_gap() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["hist.>"]).backoff(FAST)).await.unwrap();
    publish_n(&client, "hist.a", 3).await;
    let mut got = Received::default();
    got.read(&mut sub, 3).await;
    let before = sub.positions()["hist.a"].clone();
    assert_eq!(before.offset, 3);

    let addr = broker.addr;
    broker.stop().await;
    let mut settings = settings_from_file(HISTORY);
    settings.server.grpc_addr = addr;
    let broker = Broker::start_with(settings).await;
    // Published before or after the subscriber is back: live or recovered, it arrives.
    let publisher = broker.client().await;
    publisher.publish_request(event("hist.a", "after 1")).await.unwrap();
    let (gap, recovered) = within(async {
        let mut gap = None;
        loop {
            match sub.next().await.expect("subscription open").unwrap() {
                SubscriptionItem::Gap { reason } => gap = Some(reason),
                SubscriptionItem::Started { recovered, .. } => return (gap, recovered),
                other => panic!("nothing before the new subscription: {other:?}"),
            }
        }
    })
    .await;
    assert!(gap.is_some_and(|reason| !reason.is_empty()), "the history was lost with the broker: a gap");
    assert!(!recovered);

    publisher.publish_request(event("hist.a", "after 2")).await.unwrap();
    let mut after = Vec::new();
    while after.len() < 2 {
        let item = within(sub.next()).await.expect("subscription open").unwrap();
        let SubscriptionItem::Events(events) = item else { panic!("events only now: {item:?}") };
        after.extend(events);
    }
    let payloads: Vec<&[u8]> = after.iter().map(|e| &e.payload[..]).collect();
    assert_eq!(payloads, [&b"after 1"[..], b"after 2"], "each once, in order");
    let positions: Vec<&pb::EventPosition> = after.iter().map(|e| e.position.as_ref().unwrap()).collect();
    assert!(positions.iter().all(|p| p.epoch != before.epoch), "a new epoch: {positions:?}");
    assert_eq!((positions[0].offset, positions[1].offset), (1, 2));
    assert_eq!(sub.positions()["hist.a"], *positions[1], "the new epoch replaced the old one");
}
