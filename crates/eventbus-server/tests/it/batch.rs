//! docs/concepts.md "Publishing in batches": `PublishBatch` on a real server with real clients.
//! Each event of a batch is answered in its slot; a refused one does not stop the
//! others; only what concerns the whole call fails it. Rights per event are in
//! `security.rs`.

use crate::common;

use common::consume::{attach, consumer, ids};
use common::*;
use eventbus_proto::pb;
use tonic::Code;

fn batch(events: Vec<pb::PublishRequest>) -> pb::PublishBatchRequest {
    pb::PublishBatchRequest { events }
}

/// The code of each result (`Ok` for a published event).
fn codes(results: &[pb::PublishResponse]) -> Vec<Code> {
    results.iter().map(|r| r.error.as_ref().map_or(Code::Ok, |e| Code::from_i32(e.code))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_answered_per_event_and_delivered_in_order() {
    let server = start().await;
    let mut sub = server.subscribe(sub(&["b.>"])).await;
    let mut client = server.client().await;
    let events: Vec<_> = (0..200).map(|i| event(if i % 2 == 0 { "b.even" } else { "b.odd" }, format!("{i}"))).collect();
    let results = within(client.publish_batch(batch(events))).await.unwrap().into_inner().results;

    assert_eq!(results.len(), 200);
    assert!(codes(&results).iter().all(|c| *c == Code::Ok), "{results:?}");
    assert!(results.iter().all(|r| r.delivered_count == 1 && r.failed_count == 0 && !r.duplicate));
    let delivered = sub.take(200).await;
    let expected: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    assert_eq!(payloads(&delivered), expected);
    // results[i] answers events[i]: the ids match the deliveries, in order.
    let answered: Vec<&str> = results.iter().map(|r| r.event_id.as_str()).collect();
    let received: Vec<&str> = delivered.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(answered, received);

    // Every event is counted as published, as with the other publish calls.
    let stats = server.admin().await.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_gets_its_error_and_the_others_are_published() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut sub = server.subscribe(sub(&["r.>"])).await;
    let mut client = server.client().await;
    let mut too_many_metadata = event("r.meta", "meta");
    too_many_metadata.metadata = (0..65).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let events = vec![
        event("r.1", "first"),
        event("r.*", "wildcard"),
        event("r.big", vec![0u8; 1025]),
        too_many_metadata,
        event("$sys.x", "reserved"),
        event("r.2", "last"),
    ];
    let results = within(client.publish_batch(batch(events))).await.unwrap().into_inner().results;

    assert_eq!(
        codes(&results),
        [
            Code::Ok,
            Code::InvalidArgument,
            Code::ResourceExhausted,
            Code::InvalidArgument,
            Code::InvalidArgument,
            Code::Ok
        ]
    );
    let message = |i: usize| results[i].error.as_ref().unwrap().message.clone();
    assert!(message(1).contains("r.*"), "{}", message(1));
    assert!(message(2).contains("max_payload_bytes = 1024"), "{}", message(2));
    // A refused event has nothing else set.
    assert!(results[1].event_id.is_empty() && results[1].duration.is_none());
    assert!(!results[5].event_id.is_empty() && results[5].error.is_none());
    assert_eq!(payloads(&sub.take(2).await), ["first", "last"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_limit_is_refused_whole_naming_the_limit() {
    let server = start_with(|s| s.eventbus.max_publish_batch = 10).await;
    let mut sub = server.subscribe(sub(&["o.>"])).await;
    let mut client = server.client().await;

    let eleven = (0..11).map(|i| event("o.x", format!("{i}"))).collect();
    let status = within(client.publish_batch(batch(eleven))).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("max_publish_batch = 10"), "{}", status.message());

    // At the limit it passes; nothing of the refused batch was published before it.
    let ten = (0..10).map(|i| event("o.y", format!("ok-{i}"))).collect();
    let results = within(client.publish_batch(batch(ten))).await.unwrap().into_inner().results;
    assert_eq!(results.len(), 10);
    let expected: Vec<String> = (0..10).map(|i| format!("ok-{i}")).collect();
    assert_eq!(payloads(&sub.take(10).await), expected);

    // An empty batch is answered with no results.
    let empty = within(client.publish_batch(batch(Vec::new()))).await.unwrap().into_inner();
    assert!(empty.results.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_read_limit_is_resource_exhausted_naming_the_payload_limit() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut client = server.client().await.max_encoding_message_size(usize::MAX);
    // Each payload is within the limit; together they are over what the broker reads
    // in one message (max_payload_bytes + 1 MiB).
    let events = (0..1100).map(|_| event("big.x", vec![0u8; 1000])).collect();
    let status = within(client.publish_batch(batch(events))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("max_payload_bytes = 1024"), "{}", status.message());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_captured_durably_with_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_string_lossy().into_owned();
    let server = start_with(move |s| s.durable.data_dir = data_dir).await;
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("batch", &["d.>"])) }).await.unwrap();

    let mut keyed = event("d.1", "one");
    keyed.ordering_key = "order-7".into();
    let mut once = event("d.2", "two");
    once.idempotency_key = "k-2".into();
    let events = vec![keyed, once.clone(), event("d.*", "bad"), once, event("d.3", "three")];
    let mut client = server.client().await;
    let results = within(client.publish_batch(batch(events))).await.unwrap().into_inner().results;
    assert_eq!(codes(&results), [Code::Ok, Code::Ok, Code::InvalidArgument, Code::Ok, Code::Ok]);
    // The repeated idempotency key, within the batch, is answered as a duplicate of the first.
    assert!(results[3].duplicate && !results[1].duplicate);
    assert_eq!(results[3].event_id, results[1].event_id);

    // Answered OK means captured (committed to the store) before the answer: the
    // consumer holds the three events, in publish order.
    let info = admin.get_consumer(pb::GetConsumerRequest { name: "batch".into() }).await.unwrap().into_inner();
    assert_eq!(info.pending, 3);
    let mut c = attach(server.endpoint(), "batch", 0).await.unwrap();
    let deliveries = c.deliveries(3).await;
    let expected: Vec<String> = [0, 1, 4].iter().map(|&i| results[i].event_id.clone()).collect();
    assert_eq!(ids(&deliveries), expected);
    assert_eq!(deliveries[0].event.as_ref().unwrap().channel, "d.1");
    drop(c);
    server.stop().await;
}
