//! Memory bounded in bytes (docs/concepts.md "Memory bounds"): a subscriber that never reads
//! holds at most its `max_queue_bytes`, all subscribers together at most
//! `eventbus.max_queued_bytes`, and one stalled subscriber cannot take the whole budget.

use crate::common;

use common::*;
use eventbus_proto::pb;
use eventbus_proto::pb::event_bus_client::EventBusClient;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

async fn scrape(server: &TestServer) -> String {
    reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap()
}

fn value(metrics: &str, series: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A subscriber that never reads, on its own connection with the smallest HTTP/2
/// windows, so its queue in the broker fills.
async fn stalled(server: &TestServer, req: pb::SubscribeRequest) -> Subscriber {
    let channel = server.small_window_channel().await;
    subscribe_on(&mut EventBusClient::new(channel), req).await
}

async fn info(server: &TestServer, id: &str) -> pb::SubscriptionInfo {
    let mut admin = server.admin().await;
    let list = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner();
    list.subscriptions.into_iter().find(|s| s.id == id).unwrap()
}

async fn publish_big(server: &TestServer, channel: &str, n: usize, size: usize) {
    let mut client = server.client().await;
    let reqs: Vec<pb::PublishRequest> = (0..n).map(|_| event(channel, vec![7u8; size])).collect();
    let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    while within(responses.message()).await.unwrap().is_some() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_holds_at_most_its_max_queue_bytes() {
    let server = start().await;
    let req = pb::SubscribeRequest {
        max_queue_bytes: MIB,
        overflow: pb::OverflowPolicy::DropOldest as i32,
        ..sub(&["big.>"])
    };
    let s = stalled(&server, req).await;
    // 64 × 256 KiB = 16 MiB published; the queue's capacity (10,000 events) is no bound.
    publish_big(&server, "big.x", 64, 256 * KIB as usize).await;
    let held = info(&server, &s.id).await;
    assert_eq!(held.max_queue_bytes, MIB);
    assert!(held.queued_bytes <= MIB, "{} bytes queued", held.queued_bytes);
    assert!(held.pending <= 4, "{} events queued", held.pending);
    assert!(held.dropped >= 50, "the rest are dropped and counted: {}", held.dropped);
    let metrics = scrape(&server).await;
    assert!(value(&metrics, "socle_eventbus_dropped_by_reason_total{reason=\"queue_bytes\"}") >= 50);
    assert!(value(&metrics, "socle_eventbus_queued_bytes ") <= MIB);
    let own = format!("socle_eventbus_queue_bytes{{subscription=\"{}\"}}", s.id);
    assert_eq!(value(&metrics, &own), held.queued_bytes);

    // Over the budget is refused.
    let mut client = server.client().await;
    let req = pb::SubscribeRequest { max_queue_bytes: u64::MAX, ..sub(&["x"]) };
    let err = client.subscribe(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("max_queue_bytes"), "{}", err.message());
    drop(s);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_budget_bounds_all_queues_and_leaves_room_for_readers() {
    let server = start_with(|s| {
        s.eventbus.max_queued_bytes = 8 * MIB as usize;
        s.eventbus.default_queue_bytes = 8 * MIB as usize;
        s.eventbus.overflow = eventbus_server::config::OverflowSetting::DropNewest;
        s.eventbus.offer_timeout_ms = 10;
    })
    .await;
    let first = stalled(&server, sub(&["a.>"])).await;
    let second = stalled(&server, sub(&["b.>"])).await;
    let mut reader = server.subscribe(sub(&["c.>"])).await;

    publish_big(&server, "a.x", 64, 256 * KIB as usize).await;
    let a = info(&server, &first.id).await;
    assert!(a.queued_bytes <= 4 * MIB, "one stalled subscriber holds at most half: {}", a.queued_bytes);
    publish_big(&server, "b.x", 64, 256 * KIB as usize).await;
    let b = info(&server, &second.id).await;
    let metrics = scrape(&server).await;
    let total = value(&metrics, "socle_eventbus_queued_bytes ");
    assert!(total <= 8 * MIB, "{total} bytes queued");
    assert!(value(&metrics, "socle_eventbus_dropped_by_reason_total{reason=\"memory_budget\"}") > 0);
    assert_eq!(value(&metrics, "socle_eventbus_max_queued_bytes "), 8 * MIB);
    assert!(b.queued_bytes > 0, "the second stalled subscriber got a share too");

    // A subscriber that reads still gets every event.
    let mut client = server.client().await;
    for i in 0..20 {
        let resp = client.publish(event("c.x", vec![i as u8; 256 * KIB as usize])).await.unwrap().into_inner();
        assert_eq!((resp.delivered_count, resp.failed_count), (1, 0), "event {i}");
        assert_eq!(reader.take(1).await[0].payload[0], i as u8);
    }
    drop((first, second));
    server.stop().await;
}
