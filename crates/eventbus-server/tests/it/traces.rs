//! Tracing: one trace from a publisher's span through eventbusd's spans (sent to a test
//! OTLP receiver) to the Rust worker's handler spans (kept in memory by the
//! application's SDK), and the sampling rules.

use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use eventbus_client::{Client, ClientOptions, ConsumerBuilder, Delivery, Outcome, Worker};
use eventbus_proto::pb;
use eventbus_testkit::otlp::{CollectedSpan, Collector};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing::instrument::WithSubscriber as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::common::*;

/// An application's tracing: `tracing` spans through tracing-opentelemetry to an SDK
/// that keeps them in memory.
struct App {
    exporter: InMemorySpanExporter,
    dispatch: tracing::Dispatch,
}

impl App {
    fn new() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("app"));
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
        Self { exporter, dispatch }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.exporter.get_finished_spans().unwrap()
    }

    fn named(&self, name: &str) -> Vec<SpanData> {
        self.spans().into_iter().filter(|s| s.name == name).collect()
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

/// The broker's spans named `name` in `spans`.
fn broker<'a>(spans: &'a [CollectedSpan], name: &str) -> Vec<&'a CollectedSpan> {
    spans.iter().filter(|s| s.service == "eventbusd" && s.name == name).collect()
}

async fn traced_server(collector: &Collector, ratio: f64) -> TestServer {
    let endpoint = collector.endpoint();
    start_with(move |s| {
        s.telemetry.otlp.endpoint = endpoint;
        s.telemetry.otlp.export_interval_ms = 20;
        s.telemetry.sampling.ratio = ratio;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_publisher_through_the_broker_to_the_worker() {
    let collector = Collector::start().await;
    let server = traced_server(&collector, 1.0).await;
    let app = App::new();
    let client = Client::connect(ClientOptions::new(format!("http://{}", server.addr))).await.unwrap();
    let consumer =
        ConsumerBuilder::new("traced", ["traced.>"]).backoff(Duration::from_millis(10), Duration::from_millis(10));
    client.create_consumer(consumer).await.unwrap();

    async {
        let checkout = tracing::info_span!("checkout");
        client.publish("traced.order", "42").into_future().instrument(checkout).await.unwrap();
        // Fails its first attempt, acks the second; each opens a span of its own.
        let attempts = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let worker = Worker::new(client.clone(), "traced");
        let handler = move |d: Delivery| {
            let (attempts, stop) = (Arc::clone(&attempts), stop.clone());
            async move {
                tracing::info_span!("charge").in_scope(|| ());
                if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Outcome::retry_after(Duration::from_millis(10), "card declined");
                }
                assert_eq!(d.attempt, 2);
                stop.cancel();
                Outcome::Ack
            }
        };
        within(worker.run(handler, shutdown)).await.unwrap();
    }
    .with_subscriber(app.dispatch.clone())
    .await;

    // The application's side: checkout → send → process (twice) → charge.
    let [checkout] = &app.named("checkout")[..] else { panic!("{:?}", app.spans()) };
    let [send] = &app.named("send traced.order")[..] else { panic!("{:?}", app.spans()) };
    let trace_id = send.span_context.trace_id();
    assert_eq!(send.parent_span_id, checkout.span_context.span_id());
    assert_eq!(send.span_kind, SpanKind::Producer);
    assert_eq!(attribute(send, "messaging.destination.name").as_deref(), Some("traced.order"));
    let processes = app.named("process traced.order");
    assert_eq!(processes.len(), 2, "{processes:?}");
    for (process, (attempt, outcome)) in processes.iter().zip([("1", "retry"), ("2", "ack")]) {
        assert_eq!(process.span_context.trace_id(), trace_id);
        assert_eq!(process.parent_span_id, send.span_context.span_id(), "the handler's parent is the publisher's");
        assert_eq!(process.span_kind, SpanKind::Consumer);
        assert_eq!(attribute(process, "messaging.eventbus.attempt").as_deref(), Some(attempt));
        assert_eq!(attribute(process, "messaging.eventbus.outcome").as_deref(), Some(outcome));
        assert_eq!(attribute(process, "messaging.consumer.group.name").as_deref(), Some("traced"));
    }
    let charges = app.named("charge");
    let process_ids: Vec<_> = processes.iter().map(|p| p.span_context.span_id()).collect();
    assert!(charges.len() == 2 && charges.iter().all(|c| process_ids.contains(&c.parent_span_id)), "{charges:?}");

    // The broker's side, as the OTLP receiver got it: publish and commit under send,
    // a delivery per attempt.
    let trace = trace_id.to_string();
    let send_id = send.span_context.span_id().to_string();
    let spans = collector
        .wait_for("the broker's spans", |spans| {
            let ours: Vec<_> = spans.iter().filter(|s| s.trace_id == trace).cloned().collect();
            broker(&ours, "deliver traced.order").len() == 2 && !broker(&ours, "commit traced.order").is_empty()
        })
        .await;
    let spans: Vec<CollectedSpan> = spans.into_iter().filter(|s| s.trace_id == trace).collect();
    let [publish] = &broker(&spans, "publish traced.order")[..] else { panic!("{spans:#?}") };
    assert_eq!(publish.parent_span_id, send_id, "the broker's publish is a child of the publisher's send");
    assert_eq!(publish.kind, 2, "server");
    assert_eq!(publish.attribute("eventbus.captured"), Some("1"));
    assert_eq!(publish.attribute("messaging.destination.name"), Some("traced.order"));
    let [commit] = &broker(&spans, "commit traced.order")[..] else { panic!("{spans:#?}") };
    assert_eq!(commit.parent_span_id, publish.span_id);
    assert!(publish.start_unix_nanos <= commit.start_unix_nanos && commit.end_unix_nanos <= publish.end_unix_nanos);
    let mut attempts: Vec<_> = broker(&spans, "deliver traced.order")
        .into_iter()
        .map(|d| {
            assert_eq!(d.parent_span_id, send_id);
            assert_eq!(d.attribute("messaging.consumer.group.name"), Some("traced"));
            d.attribute("eventbus.attempt").unwrap_or_default().to_owned()
        })
        .collect();
    attempts.sort();
    assert_eq!(attempts, ["1", "2"]);
    server.stop().await;
}

/// A raw publish with `metadata`, and the event as a subscriber received it.
async fn publish_raw(server: &TestServer, channel: &str, metadata: &[(&str, &str)]) -> pb::Event {
    let mut subscriber =
        server.subscribe(pb::SubscribeRequest { channels: vec![channel.into()], ..Default::default() }).await;
    let metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let req = pb::PublishRequest { channel: channel.into(), payload: "x".into(), metadata, ..Default::default() };
    server.client().await.publish(req).await.unwrap();
    subscriber.take(1).await.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_follows_the_publishers_sampling_and_its_ratio_for_the_rest() {
    const SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let collector = Collector::start().await;
    let server = traced_server(&collector, 1.0).await;
    publish_raw(&server, "sampled.no", &[("traceparent", UNSAMPLED)]).await;
    publish_raw(&server, "sampled.yes", &[("traceparent", SAMPLED)]).await;
    // No context: the broker starts the trace, and the event carries it on.
    let started = publish_raw(&server, "sampled.root", &[]).await;
    let spans = collector
        .wait_for("the broker's spans", |s| {
            !broker(s, "deliver sampled.yes").is_empty() && !broker(s, "deliver sampled.root").is_empty()
        })
        .await;
    assert!(spans.iter().all(|s| s.trace_id != "0af7651916cd43dd8448eb211c80319c"), "unsampled: {spans:#?}");
    let [root] = &broker(&spans, "publish sampled.root")[..] else { panic!("{spans:#?}") };
    assert_eq!(root.parent_span_id, "");
    assert_eq!(started.metadata["traceparent"], format!("00-{}-{}-01", root.trace_id, root.span_id));
    let [deliver] = &broker(&spans, "deliver sampled.root")[..] else { panic!("{spans:#?}") };
    assert_eq!((&deliver.trace_id, &deliver.parent_span_id), (&root.trace_id, &root.span_id));
    server.stop().await;

    // Ratio 0: only publishers' sampled traces are followed; events without a context
    // stay without one.
    let collector = Collector::start().await;
    let server = traced_server(&collector, 0.0).await;
    let plain = publish_raw(&server, "ratio.root", &[]).await;
    assert!(!plain.metadata.contains_key("traceparent"), "{:?}", plain.metadata);
    publish_raw(&server, "ratio.yes", &[("traceparent", SAMPLED)]).await;
    let spans = collector.wait_for("the sampled trace", |s| !broker(s, "deliver ratio.yes").is_empty()).await;
    assert!(broker(&spans, "publish ratio.root").is_empty(), "{spans:#?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_endpoint_the_broker_makes_no_spans_and_keeps_contexts() {
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let server = start().await;
    let plain = publish_raw(&server, "off.root", &[]).await;
    assert!(!plain.metadata.contains_key("traceparent"), "{:?}", plain.metadata);
    let traced = publish_raw(&server, "off.traced", &[("traceparent", PARENT)]).await;
    assert_eq!(traced.metadata["traceparent"], PARENT);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_request_and_a_redrive_are_spans_of_their_traces() {
    use crate::push::{Endpoint, Reply, create, push_consumer, push_to};
    const PUBLISHER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const OPERATOR: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let server = crate::push::start_with(move |s| {
        s.telemetry.otlp.endpoint = endpoint;
        s.telemetry.otlp.export_interval_ms = 20;
    })
    .await;
    // Refused for good (404): dead-lettered at once, then redriven and accepted.
    let refusals = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&refusals);
    let hook = Endpoint::start(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Status(404, "no such order"),
        _ => Reply::Status(204, ""),
    })
    .await;
    create(&server, push_consumer("hooked", &["hooked.>"], push_to(&hook.url))).await;
    let mut req = tonic::Request::new(pb::PublishRequest {
        channel: "hooked.order".into(),
        payload: "1".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("traceparent", PUBLISHER.parse().unwrap());
    server.client().await.publish(req).await.unwrap();
    let mut admin = server.admin().await;
    eventually("the dead letter", || {
        let mut admin = admin.clone();
        async move {
            let req = pb::GetConsumerRequest { name: "hooked".into() };
            admin.get_consumer(req).await.unwrap().into_inner().redrivable == 1
        }
    })
    .await;
    let mut redrive = tonic::Request::new(pb::RedriveRequest { consumer: "hooked".into(), ..Default::default() });
    redrive.metadata_mut().insert("traceparent", OPERATOR.parse().unwrap());
    admin.redrive_dead_letters(redrive).await.unwrap();
    hook.wait_for(2).await;

    let publisher_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let spans = collector
        .wait_for("both push requests", |s| {
            s.iter().filter(|s| s.name == "push hooked.order" && s.trace_id == publisher_trace).count() == 2
        })
        .await;
    let mut pushes: Vec<_> = broker(&spans, "push hooked.order");
    pushes.sort_by_key(|p| p.start_unix_nanos);
    let codes: Vec<_> = pushes.iter().map(|p| (p.attribute("http.response.status_code"), p.error)).collect();
    assert_eq!(codes, [(Some("404"), true), (Some("204"), false)], "{pushes:#?}");
    assert!(pushes.iter().all(|p| p.parent_span_id == "00f067aa0ba902b7" && p.kind == 3), "{pushes:#?}");
    assert_eq!(pushes[0].attribute("messaging.consumer.group.name"), Some("hooked"));
    let [redriven] = &broker(&spans, "redrive hooked")[..] else { panic!("{spans:#?}") };
    assert_eq!(
        (redriven.trace_id.as_str(), redriven.parent_span_id.as_str()),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    );
    assert_eq!(redriven.attribute("eventbus.redriven"), Some("1"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_redis_the_other_instances_delivery_joins_the_trace() {
    use crate::common::redis_server::{RedisProc, broker_with};
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let Some(redis) = RedisProc::start().await else { return };
    let collector = Collector::start().await;
    let traced = |s: &mut eventbus_server::Settings| {
        s.telemetry.otlp.endpoint = collector.endpoint();
        s.telemetry.otlp.export_interval_ms = 20;
    };
    let a = broker_with(&redis, traced).await;
    let b = broker_with(&redis, traced).await;
    let mut subscriber =
        b.subscribe(pb::SubscribeRequest { channels: vec!["far.>".into()], ..Default::default() }).await;
    let mut req = tonic::Request::new(pb::PublishRequest {
        channel: "far.away".into(),
        payload: "1".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("traceparent", PARENT.parse().unwrap());
    a.client().await.publish(req).await.unwrap();
    let event = subscriber.take(1).await.remove(0);
    assert_eq!(event.metadata["traceparent"], PARENT);
    let spans = collector
        .wait_for("the publish, and the delivery on the other instance", |s| {
            !broker(s, "deliver far.away").is_empty() && !broker(s, "publish far.away").is_empty()
        })
        .await;
    let [publish] = &broker(&spans, "publish far.away")[..] else { panic!("{spans:#?}") };
    let [deliver] = &broker(&spans, "deliver far.away")[..] else { panic!("{spans:#?}") };
    for span in [publish, deliver] {
        assert_eq!(
            (span.trace_id.as_str(), span.parent_span_id.as_str()),
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
        );
    }
    a.stop().await;
    b.stop().await;
}

/// The real binary, with spans waiting for a long export interval: SIGTERM sends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_sends_its_last_spans_when_it_stops() {
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("EVENTBUS__TELEMETRY__OTLP__ENDPOINT", collector.endpoint()),
        ("EVENTBUS__TELEMETRY__OTLP__EXPORT_INTERVAL_MS", "600000".to_owned()),
    ];
    let (mut child, grpc) = crate::common::consume::daemon_with(dir.path(), &env).await;
    let mut client = within(pb::event_bus_client::EventBusClient::connect(format!("http://{grpc}"))).await.unwrap();
    let mut req = tonic::Request::new(pb::PublishRequest {
        channel: "last.one".into(),
        payload: "1".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("traceparent", PARENT.parse().unwrap());
    client.publish(req).await.unwrap();
    assert!(broker(&collector.spans(), "publish last.one").is_empty(), "sent before the interval");
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = within(child.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    let spans = collector.spans();
    let [publish] = &broker(&spans, "publish last.one")[..] else { panic!("{spans:#?}") };
    assert_eq!(publish.parent_span_id, "00f067aa0ba902b7");
}

/// A publish stream's context, sent once with the call, is every event's; each event
/// gets its own `publish` span, in each ack mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_of_a_traced_publish_stream_has_its_publish_span() {
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let collector = Collector::start().await;
    let server = traced_server(&collector, 1.0).await;
    let mut subscriber =
        server.subscribe(pb::SubscribeRequest { channels: vec!["stream.>".into()], ..Default::default() }).await;
    let modes = [("each", "stream.each"), ("each_in_place", "stream.in_place"), ("none", "stream.none")];
    for (mode, channel) in modes {
        let events: Vec<pb::PublishRequest> = (0..3)
            .map(|i| pb::PublishRequest {
                channel: channel.into(),
                payload: format!("{i}").into(),
                ..Default::default()
            })
            .collect();
        let mut request = tonic::Request::new(tokio_stream::iter(events));
        request.metadata_mut().insert("traceparent", PARENT.parse().unwrap());
        request.metadata_mut().insert("eventbus-ack", mode.parse().unwrap());
        let mut answers = server.client().await.publish_stream(request).await.unwrap().into_inner();
        while within(answers.message()).await.unwrap().is_some() {}
    }
    for event in subscriber.take(9).await {
        assert_eq!(event.metadata["traceparent"], PARENT, "{event:?}");
    }
    let spans = collector
        .wait_for("nine publish spans", |s| s.iter().filter(|s| s.name.starts_with("publish stream.")).count() == 9)
        .await;
    for (_, channel) in modes {
        let publishes = broker(&spans, &format!("publish {channel}"));
        assert_eq!(publishes.len(), 3, "{spans:#?}");
        assert!(publishes.iter().all(|p| p.parent_span_id == "00f067aa0ba902b7" && !p.error), "{publishes:#?}");
    }
    server.stop().await;
}

/// The Rust client's publish stream hands on the caller's context; a batch gives each
/// event a `send` span of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_clients_streams_and_batches_carry_their_contexts() {
    let server = start().await;
    let app = App::new();
    let client = Client::connect(ClientOptions::new(format!("http://{}", server.addr))).await.unwrap();
    let mut subscriber =
        server.subscribe(pb::SubscribeRequest { channels: vec!["carried.>".into()], ..Default::default() }).await;
    async {
        let caller = tracing::info_span!("caller");
        async {
            let (sender, mut answers) = client.publish_stream(16).await.unwrap();
            sender.send(eventbus_client::Message::new("carried.stream", "s")).await.unwrap();
            within(answers.next()).await.unwrap().unwrap();
            let batch = (0..2).map(|i| eventbus_client::Message::new("carried.batch", format!("{i}")));
            client.publish_batch(batch).await.unwrap();
        }
        .instrument(caller)
        .await;
    }
    .with_subscriber(app.dispatch.clone())
    .await;
    let [caller] = &app.named("caller")[..] else { panic!("{:?}", app.spans()) };
    let sends = app.named("send carried.batch");
    let mut expected: Vec<String> = sends.iter().map(|s| s.span_context.span_id().to_string()).collect();
    expected.sort();
    let mut batch = Vec::new();
    for event in subscriber.take(3).await {
        let parent = event.metadata["traceparent"].split('-').nth(2).unwrap().to_owned();
        match event.channel.as_str() {
            "carried.stream" => assert_eq!(parent, caller.span_context.span_id().to_string(), "the caller's context"),
            _ => batch.push(parent),
        }
    }
    batch.sort();
    assert_eq!(batch, expected, "each event of a batch under its own send span");
    server.stop().await;
}
