//! Bounded cardinality (docs/operations.md "Cardinality"): whatever the subscriptions, the
//! channel table and every metric label stay within their caps.

use crate::common;

use common::consume::consumer;
use common::*;
use eventbus_proto::pb;
use eventbus_proto::pb::event_bus_client::EventBusClient;

async fn scrape(server: &TestServer) -> String {
    reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap()
}

fn series<'a>(metrics: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}{{");
    metrics.lines().filter(|l| l.starts_with(&prefix)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_all_subscriber_does_not_lift_the_channel_table_cap() {
    let server = start_with(|s| s.eventbus.max_tracked_channels = 100).await;
    let _all =
        server.subscribe(pb::SubscribeRequest { overflow: pb::OverflowPolicy::DropOldest as i32, ..sub(&[">"]) }).await;
    let mut client = server.client().await;
    let reqs: Vec<pb::PublishRequest> = (0..1000).map(|i| event(&format!("flood.c{i}"), "x")).collect();
    let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut answered = 0;
    while let Some(resp) = within(responses.message()).await.unwrap() {
        assert_eq!(resp.delivered_count, 1);
        answered += 1;
    }
    assert_eq!(answered, 1000);
    let mut admin = server.admin().await;
    let listed = admin.list_channels(pb::ListChannelsRequest {}).await.unwrap().into_inner().channels;
    assert!(listed.len() <= 100, "{} channels tracked", listed.len());
    let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert!(stats.active_channels <= 100, "{} channels tracked", stats.active_channels);
    assert_eq!(stats.total_published, 1000, "every publish is counted, tracked or not");
    let metrics = scrape(&server).await;
    let evicted = metrics.lines().find_map(|l| l.strip_prefix("socle_eventbus_channels_evicted_total "));
    let evicted: u64 = evicted.expect("channels_evicted_total").parse().unwrap();
    assert!(evicted >= 900, "what is not tracked is counted: {evicted}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_subscription_series_are_capped() {
    // The default cap, eventbus.metrics.max_subscription_labels: 100.
    let server = start().await;
    let mut client = server.client().await;
    let mut subs = Vec::new();
    for i in 0..150 {
        subs.push(subscribe_on(&mut client, sub(&[&format!("s.{i}")])).await);
    }
    // One subscription is backed up (it never reads, on a connection with small
    // windows): the fullest queues are the ones labelled.
    let stalled_channel = server.small_window_channel().await;
    let backed_up = subscribe_on(&mut EventBusClient::new(stalled_channel), sub(&["s.37"])).await;
    for _ in 0..8 {
        client.publish(event("s.37", vec![0u8; 256 * 1024])).await.unwrap();
    }
    let own = format!("socle_eventbus_queue_size{{subscription=\"{}\"}}", backed_up.id);
    eventually("the backed-up subscription's own series", || async {
        scrape(&server).await.lines().any(|l| l.starts_with(&own) && !l.ends_with(" 0"))
    })
    .await;
    let metrics = scrape(&server).await;
    assert!(metrics.contains("socle_eventbus_subscriptions_active 151"), "{metrics}");
    for name in ["socle_eventbus_queue_size", "socle_eventbus_queue_capacity", "socle_eventbus_queue_bytes"] {
        let lines = series(&metrics, name);
        assert_eq!(lines.len(), 101, "100 subscriptions and _other: {lines:?}");
        assert!(lines.iter().any(|l| l.contains("subscription=\"_other\"")), "{lines:?}");
    }
    let capacity = series(&metrics, "socle_eventbus_queue_capacity");
    let other = capacity.iter().find(|l| l.contains("_other")).unwrap();
    assert!(other.ends_with(" 510000"), "the rest are summed: 51 × 10,000: {other}");
    drop(backed_up);
    drop(subs);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_series_are_capped() {
    let server = start_with(|s| s.eventbus.metrics.max_consumer_labels = 2).await;
    let mut admin = server.admin().await;
    for name in ["c1", "c2", "c3", "c4", "c5"] {
        let config = Some(consumer(name, &["orders.>"]));
        admin.create_consumer(pb::CreateConsumerRequest { config }).await.unwrap();
    }
    server.client().await.publish(event("orders.x", "x")).await.unwrap();
    let metrics = scrape(&server).await;
    let pending = series(&metrics, "socle_eventbus_consumer_pending");
    assert_eq!(pending.len(), 3, "c1, c2 and _other: {pending:?}");
    let other = pending.iter().find(|l| l.contains("consumer=\"_other\"")).unwrap();
    assert!(other.ends_with(" 3"), "c3..c5 summed, one pending event each: {other}");
    assert!(pending.iter().any(|l| l.contains("consumer=\"c1\"")), "{pending:?}");
    server.stop().await;
}
