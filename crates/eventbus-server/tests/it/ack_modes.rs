//! `PublishStream` ack modes on a real server with real clients: EACH answers every
//! event and stops at a refusal; EACH_IN_PLACE answers every event, refusals in place; CUMULATIVE answers running totals per chunk read and
//! NONE nothing but refusals, both answering a refused event on its own with its
//! position and ending with the stream's totals.

use crate::common;

use common::auth::{Files, base_principals, bus_client_with, entry};
use common::consume::{attach, consumer, ids};
use common::*;
use eventbus_proto::pb::{self, consume_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

/// Opens a PublishStream in `mode` (through the first request's `ack`, or the metadata
/// when `metadata` is given) and returns its sender and responses.
async fn open<C>(
    client: &mut pb::event_bus_client::EventBusClient<C>,
    metadata: Option<&'static str>,
) -> (mpsc::Sender<pb::PublishRequest>, Streaming<pb::PublishResponse>)
where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<tonic::codegen::StdError>,
    C::ResponseBody: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    <C::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let (tx, rx) = mpsc::channel(1024);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(mode) = metadata {
        request.metadata_mut().insert("eventbus-ack", mode.parse().unwrap());
    }
    let responses = within(client.publish_stream(request)).await.unwrap().into_inner();
    (tx, responses)
}

/// Every response until the stream ends, and its final status.
async fn drain(
    responses: &mut Streaming<pb::PublishResponse>,
) -> (Vec<pb::PublishResponse>, Result<(), tonic::Status>) {
    let mut out = Vec::new();
    loop {
        match within(responses.message()).await {
            Ok(Some(r)) => out.push(r),
            Ok(None) => return (out, Ok(())),
            Err(status) => return (out, Err(status)),
        }
    }
}

/// `(position, code)` of each refusal among `responses`.
fn refusals(responses: &[pb::PublishResponse]) -> Vec<(u64, Code)> {
    responses.iter().filter_map(|r| r.error.as_ref().map(|e| (r.position, Code::from_i32(e.code)))).collect()
}

fn totals(responses: &[pb::PublishResponse]) -> Vec<&pb::PublishAck> {
    responses.iter().filter_map(|r| r.ack.as_ref()).collect()
}

/// Forty events, seven of them refused by the bus, at known positions.
fn mixed() -> (Vec<pb::PublishRequest>, Vec<(u64, Code)>) {
    let mut events = Vec::new();
    let mut refused = Vec::new();
    for i in 0..40u64 {
        let bad = match i {
            3 | 17 => Some((event("m.*", "wildcard"), Code::InvalidArgument)),
            4 | 30 => Some((event("m.big", vec![0u8; 2048]), Code::ResourceExhausted)),
            5 => Some((event("$sys.x", "reserved"), Code::InvalidArgument)),
            38 | 39 => Some((event("", "no channel"), Code::InvalidArgument)),
            _ => None,
        };
        match bad {
            Some((e, code)) => {
                events.push(e);
                refused.push((i, code));
            }
            None => events.push(event("m.ok", i.to_string())),
        }
    }
    (events, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cumulative_and_none_answer_refusals_in_place_and_end_with_totals() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut sub = server.subscribe(sub(&["m.>"])).await;
    let mut client = server.client().await;
    let (events, refused) = mixed();
    let accepted: Vec<String> =
        (0..40u64).filter(|i| !refused.iter().any(|(at, _)| at == i)).map(|i| i.to_string()).collect();

    for (mode, by_metadata) in [(pb::AckMode::Cumulative, false), (pb::AckMode::None, false), (pb::AckMode::None, true)]
    {
        let (tx, mut responses) = open(&mut client, by_metadata.then_some("none")).await;
        for (i, mut e) in events.clone().into_iter().enumerate() {
            if i == 0 && !by_metadata {
                e.ack = mode as i32;
            }
            tx.send(e).await.unwrap();
        }
        drop(tx);
        let (answers, end) = drain(&mut responses).await;
        assert!(end.is_ok(), "{mode:?}: {end:?}");
        assert_eq!(refusals(&answers), refused, "{mode:?}: each refusal at its position, in order");
        let wildcard = answers.iter().find(|r| r.position == 3).and_then(|r| r.error.as_ref()).unwrap();
        assert!(wildcard.message.contains("m.*"), "the refusal names the problem: {}", wildcard.message);

        let all = totals(&answers);
        let last = *all.last().unwrap();
        assert!(last.end, "{mode:?}: the stream ends with its totals");
        assert_eq!(answers.last().and_then(|r| r.ack.as_ref()), Some(last), "{mode:?}: the totals come last");
        assert_eq!((last.count, last.refused), (33, 7), "{mode:?}");
        assert_eq!((last.delivered, last.failed, last.captured, last.duplicates), (33, 0, 0, 0), "{mode:?}");
        assert!(all.windows(2).all(|w| w[0].count <= w[1].count && w[0].refused <= w[1].refused));
        match mode {
            // One per chunk read, and the end; a chunk is at most the 40 events.
            pb::AckMode::Cumulative => assert!(all.len() >= 2 && !all[..all.len() - 1].iter().any(|t| t.end)),
            _ => assert_eq!(all.len(), 1, "NONE: nothing but refusals and the end"),
        }
        assert!(answers.iter().all(|r| r.event_id.is_empty()), "{mode:?}: no per-event answer");

        let delivered = sub.take(33).await;
        assert_eq!(payloads(&delivered), accepted, "{mode:?}: the accepted events, in order");
        assert_eq!(last.last_event_id, delivered[32].id, "{mode:?}");
    }
    // The refusals a publisher may not look at are counted for the operator.
    let scrape = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let refused = |code: &str| {
        let line = format!("socle_eventbus_publish_refused_total{{code=\"{code}\"}} ");
        scrape.lines().find_map(|l| l.strip_prefix(line.as_str())).map(str::to_owned)
    };
    assert_eq!(refused("invalid_argument").as_deref(), Some("15"), "{scrape}");
    assert_eq!(refused("resource_exhausted").as_deref(), Some("6"), "{scrape}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_is_unchanged_and_ends_at_the_first_refusal() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut sub = server.subscribe(sub(&["m.>"])).await;
    let mut client = server.client().await;
    let (events, _) = mixed();
    for (explicit, metadata) in [(false, None), (true, None), (false, Some("each"))] {
        let (tx, mut responses) = open(&mut client, metadata).await;
        for (i, mut e) in events.clone().into_iter().enumerate() {
            if i == 0 && explicit {
                e.ack = pb::AckMode::Each as i32;
            }
            if tx.send(e).await.is_err() {
                break; // The stream ended at the refusal.
            }
        }
        drop(tx);
        let (answers, end) = drain(&mut responses).await;
        // Positions 0..3 answered one by one, then the wildcard at position 3 ends it.
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert!(answers.iter().all(|r| !r.event_id.is_empty() && r.ack.is_none() && r.error.is_none()));
        let status = end.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("m.*"), "{}", status.message());
        assert_eq!(payloads(&sub.take(3).await), ["0", "1", "2"]);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_in_place_answers_every_event_in_order_refusals_included() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut sub = server.subscribe(sub(&["m.>"])).await;
    let mut client = server.client().await;
    let (events, refused) = mixed();
    for (explicit, metadata) in [(true, None), (false, Some("each_in_place"))] {
        let (tx, mut responses) = open(&mut client, metadata).await;
        for (i, mut e) in events.clone().into_iter().enumerate() {
            if i == 0 && explicit {
                e.ack = pb::AckMode::EachInPlace as i32;
            }
            tx.send(e).await.unwrap();
        }
        drop(tx);
        let (answers, end) = drain(&mut responses).await;
        end.unwrap();
        assert_eq!(answers.len(), events.len(), "one answer per event, no totals: {answers:?}");
        assert_eq!(refusals(&answers), refused);
        for (i, answer) in answers.iter().enumerate() {
            let is_refused = refused.iter().any(|(at, _)| *at == i as u64);
            assert_eq!(answer.event_id.is_empty(), is_refused, "answer {i}: {answer:?}");
            assert!(answer.ack.is_none());
        }
        let accepted: Vec<String> = (0..events.len() as u64)
            .filter(|i| !refused.iter().any(|(at, _)| at == i))
            .map(|i| i.to_string())
            .collect();
        assert_eq!(payloads(&sub.take(accepted.len()).await), accepted);
    }
    server.stop().await;
}

/// On the embedded store the chunks of an EACH_IN_PLACE stream are published while
/// earlier ones commit: the answers and a consumer's deliveries keep the stream's order
/// (one ordering key), a refusal among them included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_in_place_chunks_in_flight_together_keep_the_streams_order() {
    const EVENTS: usize = 3_000;
    let server = start().await;
    let mut admin = server.admin().await;
    let create = pb::CreateConsumerRequest { config: Some(consumer("pipeline", &["p.>"])) };
    admin.create_consumer(create).await.unwrap();
    let mut client = server.client().await;
    let (tx, mut responses) = open(&mut client, Some("each_in_place")).await;
    let sender = tokio::spawn(async move {
        for i in 0..EVENTS {
            let channel = if i == 1_500 { "p..refused".to_owned() } else { "p.orders".to_owned() };
            let e = pb::PublishRequest { channel, ordering_key: "k".into(), ..event("", i.to_string()) };
            tx.send(e).await.unwrap();
        }
    });
    let mut answers = Vec::with_capacity(EVENTS);
    while answers.len() < EVENTS {
        answers.push(within(responses.message()).await.unwrap().expect("an answer per event"));
    }
    within(sender).await.unwrap();
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.event_id.is_empty(), i == 1_500, "answer {i}: {answer:?}");
    }
    // One key: each event is delivered once the one before it is acked.
    let mut consumer = attach(server.endpoint(), "pipeline", 10_000).await.unwrap();
    let mut delivered = Vec::with_capacity(EVENTS);
    while delivered.len() < EVENTS - 1 {
        let batch = consumer.deliveries(1).await;
        consumer.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids(&batch) })).await;
        delivered.extend(batch);
    }
    let payloads: Vec<String> =
        delivered.iter().map(|d| String::from_utf8(d.event.as_ref().unwrap().payload.to_vec()).unwrap()).collect();
    let expected: Vec<String> = (0..EVENTS).filter(|i| *i != 1_500).map(|i| i.to_string()).collect();
    assert_eq!(payloads, expected, "delivered in the stream's order");
    let sent: Vec<&str> = answers.iter().filter(|a| !a.event_id.is_empty()).map(|a| a.event_id.as_str()).collect();
    assert_eq!(ids(&delivered), sent, "each answer names its own event");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_that_is_not_one_or_disagrees_is_refused() {
    let server = start().await;
    let mut client = server.client().await;

    // Unknown metadata value: refused before anything is read.
    let (_tx, rx) = mpsc::channel::<pb::PublishRequest>(1);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("eventbus-ack", "sometimes".parse().unwrap());
    let status = match within(client.publish_stream(request)).await {
        Err(status) => status,
        Ok(response) => drain(&mut response.into_inner()).await.1.unwrap_err(),
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("sometimes"), "{}", status.message());

    // The first request and the metadata disagree; an unknown mode number.
    for (metadata, ack) in [(Some("none"), pb::AckMode::Each as i32), (None, 42)] {
        let (tx, mut responses) = open(&mut client, metadata).await;
        tx.send(pb::PublishRequest { ack, ..event("x.y", "z") }).await.unwrap();
        let (answers, end) = drain(&mut responses).await;
        assert!(answers.is_empty(), "{answers:?}");
        let status = end.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("ack mode"), "{}", status.message());
    }
    let stats = server.admin().await.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.total_published, 0, "nothing was published");
    server.stop().await;
}

/// A request over the read limit ends a NONE stream, after the totals up to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_request_ends_the_stream_after_the_totals() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 1024).await;
    let mut client = server.client().await;
    let (tx, mut responses) = open(&mut client, Some("none")).await;
    tx.send(event("u.ok", "1")).await.unwrap();
    tx.send(event("u.ok", vec![0u8; 2 << 20])).await.unwrap();
    let _ = tx.send(event("u.ok", "never")).await;
    let (answers, end) = drain(&mut responses).await;
    let status = end.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let all = totals(&answers);
    assert_eq!(all.len(), 1, "{answers:?}");
    assert!(!all[0].end && all[0].count <= 1 && all[0].refused == 0, "{:?}", all[0]);
    server.stop().await;
}

/// A publisher that leaves mid-stream in NONE mode: what the broker read is published
/// and counted, nothing else, in order, and the broker goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_disconnects_mid_stream_loses_only_what_was_not_read() {
    let server = start().await;
    let mut sub = server.subscribe(sub(&["gone.>"])).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    // The count once the subscriber's setup has settled (its connection's short-lived
    // tasks ended): counted while one of them lived, it would let the wait below end
    // while the abandoned stream still publishes what it read.
    let idle = settled_task_count(&metrics).await;
    // Everything made from here on (the publisher's connection and an admin one, their
    // tasks on both sides, their streams' and calls') is gone once the count is back to
    // `idle`.
    let mut client = server.client().await;
    let stats = server.admin().await;
    let (tx, responses) = open(&mut client, Some("none")).await;
    for i in 0..2_000 {
        tx.send(event("gone.x", i.to_string())).await.unwrap();
    }
    // Some of them reached the broker; then the publisher vanishes without closing.
    eventually("a first event published", || {
        let mut stats = stats.clone();
        async move { stats.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner().total_published > 0 }
    })
    .await;
    drop((tx, responses, client, stats));
    eventually("the abandoned stream's tasks to end", || async { metrics.num_alive_tasks() <= idle }).await;

    // The broker serves the next publisher as before; its event comes after everything
    // the first one got published, which is a prefix of what it sent, in order.
    let mut client = server.client().await;
    let (tx, mut responses) = open(&mut client, Some("cumulative")).await;
    tx.send(event("gone.y", "after")).await.unwrap();
    drop(tx);
    let (answers, end) = drain(&mut responses).await;
    assert!(end.is_ok() && totals(&answers).last().is_some_and(|t| t.end && t.count == 1), "{answers:?}");
    let mut received: Vec<pb::Event> = Vec::new();
    while !received.iter().any(|e| e.channel == "gone.y") {
        match within(sub.stream.message()).await {
            Ok(Some(pb::SubscribeResponse { kind: Some(pb::subscribe_response::Kind::Events(batch)) })) => {
                received.extend(batch.events)
            }
            other => panic!("expected events, got {other:?}"),
        }
    }
    assert_eq!(received.pop().map(|e| e.channel), Some("gone.y".to_owned()), "the next publisher's event comes last");
    let expected: Vec<String> = (0..received.len()).map(|i| i.to_string()).collect();
    assert_eq!(payloads(&received), expected, "a prefix of the stream, in order, nothing skipped");
    let mut admin = server.admin().await;
    let published = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner().total_published;
    assert_eq!(published as usize, received.len() + 1, "every published event was delivered, and only those");
    assert!((2..=2_001).contains(&published), "{published}");
    server.stop().await;
}

/// NONE does not weaken durability: what the totals count as accepted was captured
/// for the durable consumer, and only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_without_answers_are_captured_durably() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_string_lossy().into_owned();
    let server = start_with(move |s| {
        s.durable.data_dir = data_dir;
        s.eventbus.max_payload_bytes = 1024;
    })
    .await;
    let mut admin = server.admin().await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("quiet", &["m.>"])) }).await.unwrap();

    let mut client = server.client().await;
    let (tx, mut responses) = open(&mut client, Some("none")).await;
    let (mut events, refused) = mixed();
    events[10].idempotency_key = "k-10".into();
    events[11] = pb::PublishRequest { idempotency_key: "k-10".into(), ..events[10].clone() };
    for e in events {
        tx.send(e).await.unwrap();
    }
    drop(tx);
    let (answers, end) = drain(&mut responses).await;
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(refusals(&answers), refused);
    let last = *totals(&answers).last().unwrap();
    assert_eq!((last.count, last.duplicates, last.captured, last.refused), (33, 1, 32, 7), "{last:?}");

    let info = admin.get_consumer(pb::GetConsumerRequest { name: "quiet".into() }).await.unwrap().into_inner();
    assert_eq!(info.pending, 32);
    let mut c = attach(server.endpoint(), "quiet", 0).await.unwrap();
    let deliveries = c.deliveries(32).await;
    let got: Vec<String> =
        deliveries.iter().map(|d| String::from_utf8_lossy(&d.event.as_ref().unwrap().payload).into_owned()).collect();
    let expected: Vec<String> =
        (0..40u64).filter(|i| *i != 11 && !refused.iter().any(|(at, _)| at == i)).map(|i| i.to_string()).collect();
    assert_eq!(got, expected, "captured in publish order, the duplicate once");
    assert_eq!(ids(&deliveries).last(), Some(&last.last_event_id));
    drop(c);
    server.stop().await;
}

/// Rights and rate are judged per event: a refused one is answered in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_at_the_edge_are_answered_in_place() {
    const TOKEN: &str = "ebt_partial_0123456789abcdef";
    let partial = "{ publish: { allow: ['p.>'], deny: ['p.secret'] }, subscribe: { allow: ['p.>'] } }";
    let files = Files::new(&format!("{}{}", base_principals(), entry("partial", TOKEN, partial)));
    let server = files.start().await;
    let mut client = bus_client_with(&server, TOKEN).await;
    let (tx, mut responses) = open(&mut client, Some("cumulative")).await;
    for channel in ["p.a", "p.secret", "q.other", "p.b", "p.*"] {
        tx.send(event(channel, "x")).await.unwrap();
    }
    drop(tx);
    let (answers, end) = drain(&mut responses).await;
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(
        refusals(&answers),
        [(1, Code::PermissionDenied), (2, Code::PermissionDenied), (4, Code::InvalidArgument)]
    );
    let last = *totals(&answers).last().unwrap();
    assert_eq!((last.count, last.refused, last.end), (2, 3, true));
    server.stop().await;
}

/// Every refused publish is counted for the operator, whatever the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_publishes_are_counted_on_every_call() {
    let server = start().await;
    let mut client = server.client().await;
    assert!(client.publish(event("bad.*", "unary")).await.is_err());
    let batch = pb::PublishBatchRequest { events: vec![event("ok.x", "1"), event("bad.*", "2")] };
    client.publish_batch(batch).await.unwrap();
    let (tx, mut responses) = open(&mut client, None).await;
    tx.send(event("bad.*", "each")).await.unwrap();
    drop(tx);
    assert!(drain(&mut responses).await.1.is_err());
    let rest = reqwest::Client::new()
        .post(server.url("/admin/eventbus/publish"))
        .json(&serde_json::json!({"channel": "bad.*", "payload": "rest"}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), reqwest::StatusCode::BAD_REQUEST);

    let scrape = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let line = "socle_eventbus_publish_refused_total{code=\"invalid_argument\"} 4";
    assert!(scrape.lines().any(|l| l == line), "{scrape}");
    server.stop().await;
}

/// The runtime's live task count once it has held still for a while (a bounded poll).
async fn settled_task_count(metrics: &tokio::runtime::RuntimeMetrics) -> usize {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (mut last, mut same) = (metrics.num_alive_tasks(), 0);
    while same < 20 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let now = metrics.num_alive_tasks();
        (last, same) = if now == last { (now, same + 1) } else { (now, 0) };
    }
    last
}
