//! `eventbus bench durable`: durable publish throughput and latency (every publish
//! waits for its capture to be committed), then consume throughput with batched acks
//! (until the broker has applied every ack).
//!
//! `eventbus bench worker`: the same publish phase, then consumed by an
//! `eventbus_client::Worker` with a no-op handler, to compare with `durable`'s raw loop.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventbus_bench::PublishMode;
use eventbus_bench::durable::{DurableArgs, DurableReport, Histogram, STREAM_WINDOW, latency_histogram};
use eventbus_client::{Client, ConsumeMessage, Delivery, Outcome, Worker, pb};
use tokio_util::sync::CancellationToken;

/// Bound on a consume phase that stops making progress.
pub(crate) const STALL: Duration = Duration::from_secs(10);

/// `eventbus bench worker`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    durable: DurableArgs,
    /// Handlers the worker runs at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Events the worker holds at once (its max_in_flight).
    #[arg(long, default_value_t = 10_000)]
    queue_capacity: u32,
}

/// A fresh consumer on a fresh channel, filled with `a.count` events.
struct Filled {
    name: String,
    publish_secs: f64,
    latency: Histogram<u64>,
}

async fn fill(client: &Client, a: &DurableArgs) -> anyhow::Result<Filled> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("bench-{nanos}");
    let channel = format!("bench.durable.{nanos}");
    let config = pb::ConsumerConfig {
        name: name.clone(),
        channels: vec![channel.clone()],
        max_in_flight: 10_000,
        ..Default::default()
    };
    client.create_consumer(config).await.context("create consumer")?;
    let (publish_secs, latency) = publish(client, a, channel).await?;
    Ok(Filled { name, publish_secs, latency })
}

/// Publishes `a.count` events of `a.payload` bytes to `channel` from `a.publishers`
/// connections in `a.mode`; the seconds it took and each publish's latency.
pub(crate) async fn publish(
    client: &Client,
    a: &DurableArgs,
    channel: String,
) -> anyhow::Result<(f64, Histogram<u64>)> {
    let req = pb::PublishRequest { channel, payload: bytes::Bytes::from(vec![0xAB; a.payload]), ..Default::default() };
    let mut clients = Vec::new();
    // `client`: the publishers are tasks sharing one client (and its publish stream).
    let shared = match a.mode {
        PublishMode::Client => Some(client.new_connection().await?),
        _ => None,
    };
    for _ in 0..a.publishers.max(1) {
        clients.push(match &shared {
            Some(shared) => shared.clone(),
            None => client.new_connection().await?,
        });
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
            PublishMode::Client => tokio::spawn(publish_calls(client, req, share)),
            PublishMode::Batch => tokio::spawn(publish_batches(client, req, share)),
        });
    }
    let mut latency = latency_histogram();
    for t in tasks {
        latency.add(&t.await??)?;
    }
    Ok((start.elapsed().as_secs_f64(), latency))
}

/// Acks are applied after they are sent (redis mode: one script per batch), so the
/// clock stops once the broker counts every one of them, not at the last delivery.
pub(crate) async fn until_acked(client: &Client, name: &str, count: u64) -> anyhow::Result<()> {
    let waiting = Instant::now();
    loop {
        let info = client.consumer(name).await?;
        if info.acked >= count {
            return Ok(());
        }
        anyhow::ensure!(
            waiting.elapsed() < STALL,
            "acks stalled: {} of {count} applied after {} s",
            info.acked,
            STALL.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn print(json: bool, report: &DurableReport<'_>) {
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
}

pub(crate) async fn run(client: &Client, json: bool, a: &DurableArgs) -> anyhow::Result<()> {
    let Filled { name, publish_secs, latency } = fill(client, a).await?;
    // Consume everything, acking each batch.
    let consumer = client.new_connection().await?;
    let attach = pb::Attach { consumer: name.clone(), max_batch: a.max_batch, ..Default::default() };
    let start = Instant::now();
    let mut stream = consumer.consume(attach).await?;
    let acks = stream.sender();
    let mut consumed = 0u64;
    while consumed < a.count {
        match tokio::time::timeout(STALL, stream.next()).await.context("consume stalled")?? {
            Some(ConsumeMessage::Deliveries(d)) => {
                consumed += d.len() as u64;
                acks.ack(d.into_iter().filter_map(|d| d.event.map(|e| e.id)).collect()).await?;
            }
            Some(_) => {}
            None => anyhow::bail!("the consume stream ended after {consumed} events"),
        }
    }
    until_acked(client, &name, a.count).await?;
    let consume_secs = start.elapsed().as_secs_f64();
    drop((acks, stream));
    client.delete_consumer(name).await?;
    print(json, &DurableReport { system: "eventbus", args: a, publish_secs, latency, consumed, consume_secs });
    Ok(())
}

pub(crate) async fn run_worker(client: &Client, json: bool, w: &WorkerArgs) -> anyhow::Result<()> {
    let a = &w.durable;
    let Filled { name, publish_secs, latency } = fill(client, a).await?;
    let worker = Worker::new(client.new_connection().await?, name.clone())
        .concurrency(w.concurrency)
        .queue_capacity(w.queue_capacity)
        .max_batch(a.max_batch);
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let running = {
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        tokio::spawn(async move { worker.run(|_: Delivery| async { Outcome::Ack }, shutdown).await })
    };
    let done = until_acked(client, &name, a.count).await;
    let consume_secs = start.elapsed().as_secs_f64();
    shutdown.cancel();
    running.await??;
    done?;
    client.delete_consumer(name).await?;
    let consumed = worker.stats().processed;
    let report = DurableReport { system: "eventbus-worker", args: a, publish_secs, latency, consumed, consume_secs };
    print(json, &report);
    Ok(())
}

/// `share` unary publishes, one at a time; latency is each call's.
async fn publish_unary(client: Client, req: pb::PublishRequest, share: u64) -> anyhow::Result<Histogram<u64>> {
    let mut latency = latency_histogram();
    for _ in 0..share {
        let t = Instant::now();
        client.publish_unary(req.clone()).await?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
    }
    Ok(latency)
}

/// `share` calls of the client's `publish()`, one at a time (concurrent tasks share its
/// stream); latency is each call's.
async fn publish_calls(client: Client, req: pb::PublishRequest, share: u64) -> anyhow::Result<Histogram<u64>> {
    let mut latency = latency_histogram();
    for _ in 0..share {
        let t = Instant::now();
        client.publish_request(req.clone()).await?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
    }
    Ok(latency)
}

/// `share` publishes in `PublishBatch` calls of [`STREAM_WINDOW`] events, each call
/// awaited (its captures share one commit); each event's latency is its call's.
async fn publish_batches(client: Client, req: pb::PublishRequest, share: u64) -> anyhow::Result<Histogram<u64>> {
    let mut latency = latency_histogram();
    let mut left = share;
    while left > 0 {
        let n = left.min(STREAM_WINDOW as u64);
        let events: Vec<_> = (0..n).map(|_| req.clone()).collect();
        let t = Instant::now();
        for answer in client.publish_batch(events).await? {
            answer.context("an event of a batch was refused")?;
        }
        let took = t.elapsed().as_nanos() as u64;
        latency.saturating_record_n(took, n);
        left -= n;
    }
    Ok(latency)
}

/// `share` publishes on one `PublishStream`, up to [`STREAM_WINDOW`] unanswered (the
/// broker answers a stream in order); latency is from sending to the answer.
async fn publish_stream(client: Client, req: pb::PublishRequest, share: u64) -> anyhow::Result<Histogram<u64>> {
    let (tx, mut answers) = client.publish_stream(STREAM_WINDOW).await?;
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
        answers.next().await?.context("the publish stream ended before every publish was answered")?;
        let t = sent_at.pop_front().context("an answer without a publish")?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
        answered += 1;
    }
    Ok(latency)
}
