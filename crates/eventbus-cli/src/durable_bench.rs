//! `eventbus bench durable`: durable publish throughput and latency (every publish
//! waits for its capture to be committed), then consume throughput with batched acks
//! (until the broker has applied every ack).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventbus_bench::PublishMode;
use eventbus_bench::client::{AuthChannel, Connector};
use eventbus_bench::durable::{DurableArgs, DurableReport, Histogram, STREAM_WINDOW, latency_histogram};
use eventbus_proto::pb::{self, consume_request, consume_response, event_bus_client::EventBusClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub(crate) async fn run(server: &Connector, json: bool, a: &DurableArgs) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("bench-{nanos}");
    let channel = format!("bench.durable.{nanos}");
    let mut admin = server.admin().await?;
    let config = pb::ConsumerConfig {
        name: name.clone(),
        channels: vec![channel.clone()],
        max_in_flight: 10_000,
        ..Default::default()
    };
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.context("create consumer")?;

    // Phase 1: publish, every publish answered (OK = committed).
    let req = pb::PublishRequest {
        channel: channel.clone(),
        payload: bytes::Bytes::from(vec![0xAB; a.payload]),
        ..Default::default()
    };
    let mut clients = Vec::new();
    for _ in 0..a.publishers.max(1) {
        clients.push(server.event_bus().await?);
    }
    let start = Instant::now();
    let n = clients.len() as u64;
    let mut tasks = Vec::new();
    for (i, client) in (0..n).zip(clients) {
        let share = a.count / n + u64::from(i < a.count % n);
        let req = req.clone();
        tasks.push(match a.mode {
            PublishMode::Unary => tokio::spawn(publish_unary(client, req, share)),
            PublishMode::Stream => tokio::spawn(publish_stream(client, req, share)),
        });
    }
    let mut latency = latency_histogram();
    for t in tasks {
        latency.add(&t.await??)?;
    }
    let publish_secs = start.elapsed().as_secs_f64();
    // Phase 2: consume everything, acking each batch.
    let mut client = server.event_bus().await?;
    let (tx, rx) = mpsc::channel(1024);
    let attach = pb::Attach { consumer: name.clone(), max_batch: a.max_batch, ..Default::default() };
    tx.send(pb::ConsumeRequest { kind: Some(consume_request::Kind::Attach(attach)) }).await?;
    let start = Instant::now();
    let mut responses = client.consume(ReceiverStream::new(rx)).await?.into_inner();
    let mut consumed = 0u64;
    while consumed < a.count {
        let msg =
            tokio::time::timeout(Duration::from_secs(10), responses.message()).await.context("consume stalled")??;
        match msg.and_then(|m| m.kind) {
            Some(consume_response::Kind::Deliveries(d)) => {
                consumed += d.deliveries.len() as u64;
                let ids = d.deliveries.into_iter().filter_map(|d| d.event.map(|e| e.id)).collect();
                tx.send(pb::ConsumeRequest { kind: Some(consume_request::Kind::Ack(pb::Ack { event_ids: ids })) })
                    .await?;
            }
            Some(consume_response::Kind::Attached(_)) => {}
            None => anyhow::bail!("the consume stream ended after {consumed} events"),
        }
    }
    // Acks are applied after they are sent (redis mode: one script per batch), so the
    // clock stops once the broker counts every one of them, not at the last delivery.
    let waiting = Instant::now();
    loop {
        let info = admin.get_consumer(pb::GetConsumerRequest { name: name.clone() }).await?.into_inner();
        if info.acked >= a.count {
            break;
        }
        anyhow::ensure!(
            waiting.elapsed() < Duration::from_secs(10),
            "acks stalled: {} of {} applied after 10 s",
            info.acked,
            a.count
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let consume_secs = start.elapsed().as_secs_f64();
    drop(tx);
    admin.delete_consumer(pb::DeleteConsumerRequest { name }).await?;

    let report = DurableReport { system: "eventbus", args: a, publish_secs, latency, consumed, consume_secs };
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
    Ok(())
}

/// `share` unary publishes, one at a time; latency is each call's.
async fn publish_unary(
    mut client: EventBusClient<AuthChannel>,
    req: pb::PublishRequest,
    share: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut latency = latency_histogram();
    for _ in 0..share {
        let t = Instant::now();
        client.publish(req.clone()).await?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
    }
    Ok(latency)
}

/// `share` publishes on one `PublishStream`, up to [`STREAM_WINDOW`] unanswered (the
/// broker answers a stream in order); latency is from sending to the answer.
async fn publish_stream(
    mut client: EventBusClient<AuthChannel>,
    req: pb::PublishRequest,
    share: u64,
) -> anyhow::Result<Histogram<u64>> {
    let (tx, rx) = mpsc::channel(STREAM_WINDOW);
    let mut answers = client.publish_stream(ReceiverStream::new(rx)).await?.into_inner();
    let mut latency = latency_histogram();
    let mut sent_at = VecDeque::with_capacity(STREAM_WINDOW);
    let (mut sent, mut answered) = (0, 0);
    while answered < share {
        if sent < share && sent_at.len() < STREAM_WINDOW {
            sent_at.push_back(Instant::now());
            tx.send(req.clone()).await.context("the publish stream ended")?;
            sent += 1;
            continue;
        }
        answers.message().await?.context("the publish stream ended before every publish was answered")?;
        let t = sent_at.pop_front().context("an answer without a publish")?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
        answered += 1;
    }
    Ok(latency)
}
