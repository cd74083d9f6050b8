//! `eventbus bench durable`: durable publish throughput and latency (every publish
//! waits for its capture to be committed), then consume throughput with batched acks
//! (until the broker has applied every ack).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventbus_bench::durable::{DurableArgs, DurableReport, latency_histogram};
use eventbus_proto::pb::{self, consume_request, consume_response};
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::connect;

pub(crate) async fn run(server: &str, json: bool, a: &DurableArgs) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("bench-{nanos}");
    let channel = format!("bench.durable.{nanos}");
    let mut admin = connect::admin(server).await?;
    let config = pb::ConsumerConfig {
        name: name.clone(),
        channels: vec![channel.clone()],
        max_in_flight: 10_000,
        ..Default::default()
    };
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(config) }).await.context("create consumer")?;

    // Phase 1: publish, every call awaited (OK = committed).
    let hist = Arc::new(Mutex::new(latency_histogram()));
    let payload = bytes::Bytes::from(vec![0xAB; a.payload]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let n = a.publishers.max(1) as u64;
    for i in 0..n {
        let share = a.count / n + u64::from(i < a.count % n);
        let mut client = connect::event_bus(server).await?;
        let (channel, payload, hist) = (channel.clone(), payload.clone(), Arc::clone(&hist));
        tasks.push(tokio::spawn(async move {
            let mut local = latency_histogram();
            for _ in 0..share {
                let t = Instant::now();
                let req =
                    pb::PublishRequest { channel: channel.clone(), payload: payload.clone(), ..Default::default() };
                client.publish(req).await?;
                local.saturating_record(t.elapsed().as_nanos() as u64);
            }
            hist.lock().await.add(&local)?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let publish_secs = start.elapsed().as_secs_f64();
    // Phase 2: consume everything, acking each batch.
    let mut client = connect::event_bus(server).await?;
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

    let latency = hist.lock().await.clone();
    let report = DurableReport { system: "eventbus", args: a, publish_secs, latency, consumed, consume_secs };
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
    Ok(())
}
