//! Flow control: overflow policies with a slow consumer, and the shutdown drain (docs/concepts.md).
//!
//! A slow consumer is a real client that stops reading its stream (see
//! `common::slow_subscriber`); 32 KiB events fill its HTTP/2 window after a couple.

use crate::common;

use common::*;
use eventbus_proto::pb::{self, event_bus_client::EventBusClient};

use tonic::Code;

const BIG: usize = 32 * 1024;

fn payload(i: u32) -> Vec<u8> {
    let mut p = vec![0u8; BIG];
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

fn index(e: &pb::Event) -> u32 {
    u32::from_be_bytes([e.payload[0], e.payload[1], e.payload[2], e.payload[3]])
}

async fn subscription(server: &TestServer, id: &str) -> Option<pb::SubscriptionInfo> {
    let mut admin = server.admin().await;
    let list = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner();
    list.subscriptions.into_iter().find(|s| s.id == id)
}

/// Publishes numbered events until one is refused by a full queue; returns how many
/// were published, the refused one included.
async fn publish_until_refused(client: &mut EventBusClient<tonic::transport::Channel>) -> u32 {
    for i in 0..500 {
        let resp = client.publish(event("flow.x", payload(i))).await.unwrap().into_inner();
        if resp.failed_count > 0 {
            assert_eq!(resp.failed_count, 1);
            return i + 1;
        }
    }
    panic!("the slow consumer's queue never filled");
}

#[tokio::test]
async fn drop_newest_waits_drops_and_never_stalls_others() {
    let server = start_with(|s| s.eventbus.offer_timeout_ms = 20).await;
    let mut slow = slow_subscriber(&server, "flow.>", pb::OverflowPolicy::DropNewest, 4).await;
    let mut fast = server.subscribe(sub(&["flow.>"])).await;
    let mut client = server.client().await;

    let sent = publish_until_refused(&mut client).await;
    // Lagging now: refused at once until the queue drains below half.
    let resp = client.publish(event("flow.x", payload(sent))).await.unwrap().into_inner();
    assert_eq!((resp.delivered_count, resp.failed_count), (1, 1), "fast took it, slow refused it");
    let fast_got: Vec<u32> = fast.take(sent as usize + 1).await.iter().map(index).collect();
    assert_eq!(fast_got, (0..=sent).collect::<Vec<_>>(), "the fast subscriber got everything, in order");

    let info = subscription(&server, &slow.id).await.unwrap();
    assert_eq!(info.dropped, 2);
    let mut admin = server.admin().await;
    let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.total_failed, stats.total_dropped), (2, 2));

    // The slow consumer gets every event it accepted, in order, and then new ones again.
    let accepted = sent - 1;
    let slow_got: Vec<u32> = slow.take(accepted as usize).await.iter().map(index).collect();
    assert_eq!(slow_got, (0..accepted).collect::<Vec<_>>());
    let resp = client.publish(event("flow.x", payload(999))).await.unwrap().into_inner();
    assert_eq!((resp.delivered_count, resp.failed_count), (2, 0), "drained: no longer lagging");
    assert_eq!(index(&slow.take(1).await[0]), 999);
    server.stop().await;
}

#[tokio::test]
async fn drop_oldest_keeps_the_newest() {
    let server = start().await;
    let mut slow = slow_subscriber(&server, "flow.>", pb::OverflowPolicy::DropOldest, 4).await;
    let mut client = server.client().await;
    let n = 60;
    for i in 0..n {
        let resp = client.publish(event("flow.x", payload(i))).await.unwrap().into_inner();
        assert_eq!((resp.delivered_count, resp.failed_count), (1, 0), "drop_oldest always accepts");
    }
    let dropped = subscription(&server, &slow.id).await.unwrap().dropped as u32;
    assert!(dropped > 0, "the queue overflowed");
    let got: Vec<u32> = slow.take((n - dropped) as usize).await.iter().map(index).collect();
    assert!(got.windows(2).all(|w| w[0] < w[1]), "still in order: {got:?}");
    assert_eq!(got.last(), Some(&(n - 1)), "the newest survives");
    let mut admin = server.admin().await;
    let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.total_failed, stats.total_dropped), (0, u64::from(dropped)));
    server.stop().await;
}

#[tokio::test]
async fn disconnect_ends_a_slow_consumer_with_resource_exhausted() {
    let server = start().await;
    let mut slow = slow_subscriber(&server, "flow.>", pb::OverflowPolicy::Disconnect, 4).await;
    let mut fast = server.subscribe(sub(&["flow.>"])).await;
    let mut client = server.client().await;
    let sent = publish_until_refused(&mut client).await;
    assert!(subscription(&server, &slow.id).await.is_none(), "removed at once");
    let resp = client.publish(event("flow.x", payload(sent))).await.unwrap().into_inner();
    assert_eq!((resp.delivered_count, resp.failed_count), (1, 0), "no longer a match");
    assert_eq!(fast.take(sent as usize + 1).await.len(), sent as usize + 1);

    let (events, status) = slow.until_end().await;
    let status = status.expect("ended with an error");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("slow consumer"), "{}", status.message());
    assert!((events.len() as u32) < sent);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_flushes_queued_events_then_ends_streams_unavailable() {
    let server = start().await;
    let mut slow = slow_subscriber(&server, "flow.>", pb::OverflowPolicy::DropNewest, 1000).await;
    let mut client = server.client().await;
    for i in 0..20 {
        client.publish(event("flow.x", payload(i))).await.unwrap();
    }
    assert!(subscription(&server, &slow.id).await.unwrap().pending > 0, "events wait in the queue");
    server.shutdown.cancel();

    // While the drain runs, new work is refused.
    eventually("publish to be refused", || {
        let mut client = client.clone();
        async move { matches!(client.publish(event("flow.x", payload(0))).await, Err(s) if s.code() == Code::Unavailable) }
    })
    .await;
    let err = client.subscribe(sub(&["flow.>"])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("shutting down"), "{}", err.message());

    let (events, status) = slow.until_end().await;
    assert_eq!(events.iter().map(index).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>(), "all flushed");
    let status = status.expect("ended with a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "shutting down");
    within(server.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_timeout_ends_streams_that_do_not_drain() {
    let server = start_with(|s| s.server.shutdown_timeout_ms = 200).await;
    let mut stuck = slow_subscriber(&server, "flow.>", pb::OverflowPolicy::DropNewest, 1000).await;
    let mut client = server.client().await;
    for i in 0..20 {
        client.publish(event("flow.x", payload(i))).await.unwrap();
    }
    server.shutdown.cancel();
    within(server.task).await.unwrap().unwrap();
    // What was still queued at the deadline is gone; the stream ends UNAVAILABLE.
    let (events, status) = stuck.until_end().await;
    assert!(events.len() < 20, "queued events past the deadline were discarded");
    assert_eq!(status.map(|s| s.code()), Some(Code::Unavailable));
}

/// DEAD_LETTER overflow: a full queue's refused events go to `dlq.overflow.<channel>`
/// with the subscription named in their metadata, counted; a dead-letter subscription
/// that overflows in turn only drops (never recursive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_dead_letter_queue_sends_its_overflow_to_the_dead_letter_channel() {
    let server = start().await;
    let full = pb::SubscribeRequest {
        queue_capacity: 1,
        overflow: pb::OverflowPolicy::DeadLetter as i32,
        name: "stalled".into(),
        max_batch: 1,
        ..sub(&["work.jobs"])
    };
    let stalled = server.subscribe(full).await;
    let mut watcher = server.subscribe(sub(&["dlq.overflow.>"])).await;
    let mut client = server.client().await;
    let refused = publish_until_refused_n(&mut client, "work.jobs", 3).await;
    let letters = watcher.take(refused).await;
    for letter in &letters {
        assert_eq!(letter.channel, "dlq.overflow.work.jobs");
        assert_eq!(letter.metadata.get("eventbus-subscription-id"), Some(&stalled.id));
        assert_eq!(letter.metadata.get("eventbus-subscription-name").map(String::as_str), Some("stalled"));
        assert_eq!(letter.metadata.get("eventbus-channel").map(String::as_str), Some("work.jobs"));
    }
    let overflow = |outcome: &'static str| {
        let url = server.url("/metrics");
        async move {
            let metrics = reqwest::get(url).await.unwrap().text().await.unwrap();
            let needle = format!("overflow_dead_letters_total{{outcome=\"{outcome}\"}}");
            let line = metrics.lines().find(|l| l.contains(&needle)).map(str::to_owned);
            line.and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok()).unwrap_or(usize::MAX)
        }
    };
    assert_eq!(overflow("published").await, refused);

    // A stalled DEAD_LETTER subscription on dead-letter channels only drops: an
    // overflow never feeds itself.
    let stalled_dlq = pb::SubscribeRequest {
        queue_capacity: 1,
        overflow: pb::OverflowPolicy::DeadLetter as i32,
        max_batch: 1,
        ..sub(&["dlq.direct"])
    };
    let stalled_dlq = server.subscribe(stalled_dlq).await;
    let skipped = publish_until_refused_n(&mut client, "dlq.direct", 3).await;
    assert_eq!(overflow("skipped").await, skipped);
    assert_eq!(overflow("published").await, refused, "nothing published for a dead-letter channel's overflow");
    // The stalled streams go first: the shutdown would wait for them to read.
    drop((stalled, stalled_dlq, watcher));
    server.stop().await;
}

/// Publishes numbered events on `channel` until `n` were refused by a full queue (the
/// stalled stream's HTTP/2 window fills first); returns `n`.
async fn publish_until_refused_n(
    client: &mut EventBusClient<tonic::transport::Channel>,
    channel: &str,
    n: usize,
) -> usize {
    let mut refused = 0;
    for i in 0..2_000 {
        let answer = client.publish(event(channel, payload(i))).await.unwrap().into_inner();
        refused += answer.failed_count as usize;
        if refused >= n {
            return refused;
        }
    }
    panic!("the stalled queue never refused {n} events");
}
