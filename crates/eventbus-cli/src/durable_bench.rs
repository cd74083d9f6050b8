//! `eventbus bench durable`: durable publish throughput and latency (every publish
//! waits for its capture to be committed), then consume throughput with batched acks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventbus_proto::pb::{self, consume_request, consume_response};
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::connect;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DurableArgs {
    /// Concurrent publishers (each its own connection, each publish awaited).
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    /// Events to publish (and then consume).
    #[arg(long, default_value_t = 20_000)]
    count: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    payload: usize,
    /// Deliveries per message when consuming.
    #[arg(long, default_value_t = 256)]
    max_batch: u32,
}

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
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?));
    let payload = bytes::Bytes::from(vec![0xAB; a.payload]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let n = a.publishers.max(1) as u64;
    for i in 0..n {
        let share = a.count / n + u64::from(i < a.count % n);
        let mut client = connect::event_bus(server).await?;
        let (channel, payload, hist) = (channel.clone(), payload.clone(), Arc::clone(&hist));
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
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
    let h = hist.lock().await.clone();
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;

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
    let consume_secs = start.elapsed().as_secs_f64();
    drop(tx);
    admin.delete_consumer(pb::DeleteConsumerRequest { name }).await?;

    let report = json!({
        "system": "eventbus", "workload": "durable",
        "params": {"publishers": a.publishers, "count": a.count, "payload": a.payload, "max_batch": a.max_batch},
        "published_per_sec": (a.count as f64 / publish_secs).round(),
        "publish_latency_us": {"p50": us(0.5), "p90": us(0.9), "p99": us(0.99), "max": h.max() as f64 / 1000.0},
        "consumed_per_sec": (consumed as f64 / consume_secs).round(),
    });
    if json {
        println!("{report}");
    } else {
        println!(
            "eventbus durable (publishers={} count={} payload={} max_batch={})",
            a.publishers, a.count, a.payload, a.max_batch
        );
        println!(
            "  durable publish  {:>10.0}/s   latency µs p50 {:.0}  p90 {:.0}  p99 {:.0}  max {:.0}",
            a.count as f64 / publish_secs,
            us(0.5),
            us(0.9),
            us(0.99),
            h.max() as f64 / 1000.0
        );
        println!("  consume + ack    {:>10.0}/s", consumed as f64 / consume_secs);
    }
    Ok(())
}
