//! Publish/subscribe semantics of docs/concepts.md against the real server and a real client.

use crate::common;

use std::collections::HashSet;

use common::*;
use eventbus_proto::pb;
use tonic::Code;

#[tokio::test]
async fn fan_out_to_every_subscriber_in_order() {
    let server = start().await;
    let mut subs = Vec::new();
    for _ in 0..5 {
        subs.push(server.subscribe(sub(&["orders.created"])).await);
    }
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for i in 0..200u32 {
        let resp = client.publish(event("orders.created", i.to_be_bytes().to_vec())).await.unwrap().into_inner();
        assert_eq!((resp.delivered_count, resp.failed_count), (5, 0));
        ids.push(resp.event_id);
    }
    for s in &mut subs {
        let got = s.take(200).await;
        let got_ids: Vec<&str> = got.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(got_ids, ids.iter().map(String::as_str).collect::<Vec<_>>(), "every event, in publish order");
        assert_eq!(got[7].payload.as_ref(), 7u32.to_be_bytes());
        assert_eq!(got[0].channel, "orders.created");
        assert!(got[0].timestamp.is_some());
    }
    server.stop().await;
}

#[tokio::test]
async fn event_envelope_carries_metadata_source_and_content_type() {
    let server = start().await;
    let mut s = server.subscribe(sub(&["a.b"])).await;
    let mut client = server.client().await;
    let mut req = event("a.b", &b"{\"id\":1}"[..]);
    req.metadata.insert("trace".into(), "t-1".into());
    req.content_type = "application/json".into();
    req.source = "billing".into();
    client.publish(req).await.unwrap();
    client.publish(event("a.b", &b"x"[..])).await.unwrap();
    let got = s.take(2).await;
    assert_eq!(got[0].metadata.get("trace").map(String::as_str), Some("t-1"));
    assert_eq!(got[0].content_type, "application/json");
    assert_eq!(got[0].source, "billing");
    assert!(got[1].source.starts_with("127.0.0.1:"), "source defaults to the peer address: {}", got[1].source);
    server.stop().await;
}

#[tokio::test]
async fn wildcards_match_by_token_and_overlaps_deliver_once() {
    let server = start().await;
    let mut star = server.subscribe(sub(&["orders.*"])).await;
    let mut rest = server.subscribe(sub(&["orders.>"])).await;
    let mut suffix = server.subscribe(sub(&["*.created"])).await;
    let mut both = server.subscribe(sub(&["orders.*", "orders.>", "orders.created"])).await;
    let mut client = server.client().await;
    for ch in ["orders.created", "orders.eu.created", "users.created", "orders"] {
        client.publish(event(ch, ch.as_bytes().to_vec())).await.unwrap();
    }
    let channels = |evs: Vec<pb::Event>| evs.into_iter().map(|e| e.channel).collect::<Vec<_>>();
    assert_eq!(channels(star.take(1).await), ["orders.created"]);
    assert_eq!(channels(rest.take(2).await), ["orders.created", "orders.eu.created"]);
    assert_eq!(channels(suffix.take(2).await), ["orders.created", "users.created"]);
    assert_eq!(channels(both.take(2).await), ["orders.created", "orders.eu.created"], "once each");

    // Nothing else is pending: a marker published last is the next thing each sees.
    client.publish(event("orders.marker", &b""[..])).await.unwrap();
    assert_eq!(channels(star.take(1).await), ["orders.marker"]);
    assert_eq!(channels(both.take(1).await), ["orders.marker"]);
    server.stop().await;
}

#[tokio::test]
async fn groups_split_work_and_each_group_gets_a_copy() {
    let server = start().await;
    let grouped = |g: &str| pb::SubscribeRequest { group: g.into(), ..sub(&["jobs.>"]) };
    let mut workers = vec![
        server.subscribe(grouped("workers")).await,
        server.subscribe(grouped("workers")).await,
        server.subscribe(grouped("workers")).await,
    ];
    let mut audit = server.subscribe(grouped("audit")).await;
    let mut client = server.client().await;
    let n = 90;
    let mut published = HashSet::new();
    for i in 0..n {
        let resp = client.publish(event("jobs.run", format!("{i}"))).await.unwrap().into_inner();
        assert_eq!(resp.delivered_count, 2, "one copy per group");
        published.insert(resp.event_id);
    }
    // Members with room share round-robin: 30 each here.
    let mut seen = HashSet::new();
    for w in &mut workers {
        for e in w.take(n / 3).await {
            assert!(seen.insert(e.id), "an event went to two members of one group");
        }
    }
    assert_eq!(seen, published, "every event reached exactly one worker");
    let audited: HashSet<String> = audit.take(n).await.into_iter().map(|e| e.id).collect();
    assert_eq!(audited, published, "the other group got its own copy of each");
    server.stop().await;
}

#[tokio::test]
async fn admin_unsubscribe_ends_the_stream_with_ok() {
    let server = start().await;
    let mut s = server.subscribe(sub(&["a"])).await;
    let mut admin = server.admin().await;
    admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: s.id.clone() }).await.unwrap();
    let (events, status) = s.until_end().await;
    assert!(events.is_empty());
    assert!(status.is_none(), "ended with OK, got {status:?}");
    assert!(subscription_ids(&mut admin).await.is_empty());
    let err = admin.unsubscribe(pb::UnsubscribeRequest { subscription_id: s.id.clone() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains(&s.id), "{}", err.message());
    server.stop().await;
}

#[tokio::test]
async fn client_cancel_frees_the_subscription() {
    let server = start().await;
    let mut admin = server.admin().await;
    let s = server.subscribe(sub(&["a"])).await;
    assert_eq!(subscription_ids(&mut admin).await, vec![s.id.clone()]);
    drop(s);
    eventually("the cancelled subscription to disappear", || {
        let mut admin = admin.clone();
        async move { subscription_ids(&mut admin).await.is_empty() }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_thousand_subscribe_cancel_cycles_leave_nothing_behind() {
    let server = start().await;
    let mut client = server.client().await;
    for i in 0..1000 {
        let s = subscribe_on(&mut client, sub(&[&format!("cycle.{}", i % 7), "cycle.>"])).await;
        drop(s);
    }
    let mut admin = server.admin().await;
    eventually("all cancelled subscriptions to be freed", || {
        let mut admin = admin.clone();
        async move {
            let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
            stats.active_subscriptions == 0
        }
    })
    .await;
    assert!(subscription_ids(&mut admin).await.is_empty());
    // The router forgot them too: a publish matches nobody.
    let resp = client.publish(event("cycle.1", &b""[..])).await.unwrap().into_inner();
    assert_eq!((resp.delivered_count, resp.failed_count), (0, 0));
    server.stop().await;
}

#[tokio::test]
async fn stats_and_channel_stats_are_exact() {
    let server = start().await;
    let mut a = server.subscribe(pb::SubscribeRequest { name: "reader-a".into(), ..sub(&["s.one"]) }).await;
    let _b = server.subscribe(sub(&["s.*"])).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        client.publish(event("s.one", &b"1"[..])).await.unwrap();
    }
    for _ in 0..2 {
        client.publish(event("s.two", &b"2"[..])).await.unwrap();
    }
    client.publish(event("nobody.here", &b"3"[..])).await.unwrap();
    a.take(3).await;

    let mut admin = server.admin().await;
    let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 6);
    assert_eq!(stats.total_delivered, 3 * 2 + 2);
    assert_eq!((stats.total_failed, stats.total_dropped), (0, 0));
    assert_eq!(stats.active_subscriptions, 2);
    assert_eq!(stats.active_channels, 3);
    assert_eq!(stats.mode, "in_memory");
    assert!(!stats.instance_id.is_empty() && stats.started_at.is_some());

    let channels = admin.list_channels(pb::ListChannelsRequest {}).await.unwrap().into_inner().channels;
    let summary: Vec<(&str, u64, u64, u64)> = channels
        .iter()
        .map(|c| (c.channel.as_str(), c.published_count, c.delivered_count, c.subscriber_count))
        .collect();
    assert_eq!(summary, vec![("nobody.here", 1, 0, 0), ("s.one", 3, 6, 2), ("s.two", 2, 2, 1)]);
    assert!(channels.iter().all(|c| c.last_published_at.is_some()));

    let subs = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner().subscriptions;
    let reader = subs.iter().find(|s| s.id == a.id).expect("listed");
    assert_eq!(reader.name, "reader-a");
    assert_eq!(reader.channels, ["s.one"]);
    assert_eq!((reader.delivered, reader.pending, reader.dropped), (3, 0, 0));
    assert_eq!(reader.capacity, 10_000);
    assert_eq!(reader.overflow, pb::OverflowPolicy::DropNewest as i32);
    assert!(reader.peer.starts_with("127.0.0.1:") && reader.created_at.is_some());
    let other = subs.iter().find(|s| s.id != a.id).expect("listed");
    // Not read by its client: the events are queued or already written to the stream.
    assert_eq!(other.pending + other.delivered, 5);
    server.stop().await;
}

#[tokio::test]
async fn publish_stream_answers_each_request_in_order() {
    let server = start().await;
    let mut s = server.subscribe(sub(&["ps.>"])).await;
    let mut client = server.client().await;
    let reqs: Vec<pb::PublishRequest> = (0..50).map(|i| event("ps.x", format!("{i}"))).collect();
    let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut ids = Vec::new();
    while let Some(resp) = within(responses.message()).await.unwrap() {
        assert_eq!(resp.delivered_count, 1);
        ids.push(resp.event_id);
    }
    assert_eq!(ids.len(), 50);
    let got = s.take(50).await;
    let payloads: Vec<String> = got.iter().map(|e| String::from_utf8(e.payload.to_vec()).unwrap()).collect();
    assert_eq!(payloads, (0..50).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(got.into_iter().map(|e| e.id).collect::<Vec<_>>(), ids);

    // An invalid request ends the stream with its status; earlier ones stay published.
    let reqs = vec![event("ps.ok", &b""[..]), event("ps.*", &b""[..]), event("ps.never", &b""[..])];
    let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    assert!(within(responses.message()).await.unwrap().is_some());
    let err = within(responses.message()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("ps.*"), "{}", err.message());
    assert_eq!(s.take(1).await[0].channel, "ps.ok");
    server.stop().await;
}

/// A `PublishStream`'s requests are read in a task of their own, ahead of the
/// publishing: on the multi-threaded runtime, thousands of publishes sent while the
/// answers are read keep their order end to end, and a publisher that leaves
/// mid-stream leaves no task behind (the reader's own cases: `grpc/publish_stream.rs` unit tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_streams_read_ahead_in_order_and_leave_no_task_behind() {
    const COUNT: usize = 5_000;
    let server = start().await;
    let mut s = server.subscribe(sub(&["ra.>"])).await;
    let mut client = server.client().await;
    let metrics = tokio::runtime::Handle::current().metrics();

    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut responses =
        client.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let sender = tokio::spawn(async move {
        for i in 0..COUNT {
            tx.send(event("ra.x", format!("{i}"))).await.unwrap();
        }
    });
    let mut ids = Vec::with_capacity(COUNT);
    while let Some(resp) = within(responses.message()).await.unwrap() {
        ids.push(resp.event_id);
    }
    within(sender).await.unwrap();
    assert_eq!(ids.len(), COUNT, "every publish answered, then the stream ends with OK");
    let got = s.take(COUNT).await;
    assert_eq!(got.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ids, "answers and deliveries in send order");
    assert!(got.iter().enumerate().all(|(i, e)| e.payload == i.to_string().as_bytes()));

    // A publisher that leaves half-way: its tasks, and the daemon's for its stream, end.
    let idle = metrics.num_alive_tasks();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut responses =
        client.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for i in 0..10 {
        tx.send(event("ra.y", format!("{i}"))).await.unwrap();
        assert!(within(responses.message()).await.unwrap().is_some());
    }
    assert!(metrics.num_alive_tasks() > idle, "the open stream runs tasks of its own");
    drop((responses, tx));
    eventually("the abandoned stream's tasks to end", || async { metrics.num_alive_tasks() <= idle }).await;
    let delivered = s.take(10).await;
    assert!(delivered.iter().all(|e| e.channel == "ra.y"), "the answered publishes were delivered");
    server.stop().await;
}

#[tokio::test]
async fn bad_input_gets_the_spec_status_and_names_the_problem() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let client = server.client().await;
    let publish_err = |req: pb::PublishRequest| {
        let mut client = client.clone();
        async move { client.publish(req).await.unwrap_err() }
    };
    for (channel, needle) in [
        ("orders.*", "wildcards"),
        ("orders.>", "wildcards"),
        ("a..b", "token 2 is empty"),
        ("", "empty"),
        ("a b", "' '"),
        ("$sys.x", "reserved"),
    ] {
        let err = publish_err(event(channel, &b""[..])).await;
        assert_eq!(err.code(), Code::InvalidArgument, "{channel}");
        assert!(err.message().contains(channel) && err.message().contains(needle), "{channel}: {}", err.message());
    }
    let long = ["a"; 17].join(".");
    let err = publish_err(event(&long, &b""[..])).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("17 tokens"), "{}", err.message());
    let err = publish_err(event(&"x".repeat(300), &b""[..])).await;
    assert!(err.message().contains("300 bytes"), "{}", err.message());

    let err = publish_err(event("big", vec![0u8; 1025])).await;
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("1024"), "names the limit: {}", err.message());

    let mut req = event("m", &b""[..]);
    req.metadata = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
    let err = publish_err(req).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("65 entries"), "{}", err.message());
    let mut req = event("m", &b""[..]);
    req.metadata.insert("k".repeat(129), String::new());
    assert_eq!(publish_err(req).await.code(), Code::InvalidArgument);
    let mut req = event("m", &b""[..]);
    req.metadata.insert("k".into(), "v".repeat(4097));
    let err = publish_err(req).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("4097"), "{}", err.message());

    let subscribe_err = |req: pb::SubscribeRequest| {
        let mut client = client.clone();
        async move { client.subscribe(req).await.unwrap_err() }
    };
    let err = subscribe_err(sub(&[])).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("at least one channel"), "{}", err.message());
    let many: Vec<String> = (0..65).map(|i| format!("c{i}")).collect();
    let err = subscribe_err(pb::SubscribeRequest { channels: many, ..Default::default() }).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("65"), "{}", err.message());
    for pattern in ["ord*.x", "a.>.b", "a..b"] {
        let err = subscribe_err(sub(&["ok", pattern])).await;
        assert_eq!(err.code(), Code::InvalidArgument, "{pattern}");
        assert!(err.message().contains(pattern), "{}", err.message());
    }
    let err = subscribe_err(pb::SubscribeRequest { queue_capacity: 1_000_001, ..sub(&["a"]) }).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("max_queue_capacity"), "{}", err.message());
    let err = subscribe_err(pb::SubscribeRequest { overflow: 42, ..sub(&["a"]) }).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    server.stop().await;
}

/// Payload sizes over the default `max_payload_bytes` (1 MiB): just over, and far over
/// (past the gRPC decode limit and the REST body limit).
const OVERSIZED: [usize; 3] = [(1 << 20) + 1, 2 << 20, 8 << 20];

fn assert_names_the_limit(err: &tonic::Status, size: usize) {
    assert_eq!(err.code(), Code::ResourceExhausted, "{size} bytes: {}", err.message());
    assert!(err.message().contains("max_payload_bytes = 1048576"), "{size} bytes: {}", err.message());
}

#[tokio::test]
async fn oversized_unary_publish_is_resource_exhausted_naming_the_limit_at_every_size() {
    let server = start().await;
    let mut s = server.subscribe(sub(&["big.>"])).await;
    let mut client = server.client().await;
    for size in OVERSIZED {
        let err = within(client.publish(event("big.unary", vec![7u8; size]))).await.unwrap_err();
        assert_names_the_limit(&err, size);
    }
    // Nothing got through, and the connection still serves.
    client.publish(event("big.after", &b"ok"[..])).await.unwrap();
    assert_eq!(s.take(1).await[0].channel, "big.after");
    assert_eq!(server.admin().await.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner().total_published, 1);
    server.stop().await;
}

#[tokio::test]
async fn oversized_publish_stream_request_ends_the_stream_resource_exhausted_naming_the_limit() {
    let server = start().await;
    let mut s = server.subscribe(sub(&["big.>"])).await;
    let mut client = server.client().await;
    for size in OVERSIZED {
        let reqs = vec![event("big.before", &b"ok"[..]), event("big.stream", vec![7u8; size])];
        let mut responses = within(client.publish_stream(tokio_stream::iter(reqs))).await.unwrap().into_inner();
        let first = within(responses.message()).await.unwrap().expect("the request before is answered");
        assert_eq!(first.delivered_count, 1);
        let err = within(responses.message()).await.unwrap_err();
        assert_names_the_limit(&err, size);
        assert_eq!(s.take(1).await[0].channel, "big.before", "{size} bytes");
    }
    server.stop().await;
}

/// docs/errors.md: long keys and sources are refused before anything keeps them (a
/// 1 MiB idempotency key used to cost megabytes of memory and disk for the dedup window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_keys_and_source_are_invalid_arguments() {
    let server = start().await;
    let mut client = server.client().await;
    let huge = "k".repeat(1 << 20);
    for (field, req) in [
        ("idempotency_key", pb::PublishRequest { idempotency_key: huge.clone(), ..event("keys.a", &b"x"[..]) }),
        ("ordering_key", pb::PublishRequest { ordering_key: huge.clone(), ..event("keys.a", &b"x"[..]) }),
        ("source", pb::PublishRequest { source: huge.clone(), ..event("keys.a", &b"x"[..]) }),
    ] {
        let status = match client.publish(req).await {
            Ok(answer) => panic!("{field}: accepted: {answer:?}"),
            Err(status) => status,
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().contains(field) && status.message().len() < 200, "{}", status.message());
    }
    server.stop().await;
}
