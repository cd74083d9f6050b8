//! The durable workload against NATS JetStream with file storage: publishes awaited
//! until JetStream acknowledges them (stored; in `stream` mode up to a window of them
//! unacknowledged per publisher), then a pull consumer acking each message.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer::pull, stream};
use bytes::Bytes;
use eventbus_bench::PublishMode;
use eventbus_bench::durable::{DurableArgs, DurableReport, STREAM_WINDOW, latency_histogram};
use futures::StreamExt;

pub(crate) async fn run(url: &str, json: bool, a: &DurableArgs) -> anyhow::Result<()> {
    let client = async_nats::connect(url).await.with_context(|| format!("cannot connect to {url}"))?;
    let js = jetstream::new(client);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let (name, subject) = (format!("BENCH{nanos}"), format!("bench.durable.{nanos}"));
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;

    let payload = Bytes::from(vec![0xAB; a.payload]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let n = a.publishers.max(1) as u64;
    // `client`: the publishers are tasks sharing one connection, as a service's handlers.
    let shared = match a.mode {
        PublishMode::Client => Some(async_nats::connect(url).await?),
        _ => None,
    };
    for i in 0..n {
        let share = a.count / n + u64::from(i < a.count % n);
        let client = match &shared {
            Some(client) => client.clone(),
            None => async_nats::connect(url).await?,
        };
        let js = jetstream::new(client);
        let (subject, payload) = (subject.clone(), payload.clone());
        let window = match a.mode {
            PublishMode::Unary | PublishMode::Client => 1,
            PublishMode::Stream | PublishMode::Batch => STREAM_WINDOW,
        };
        tasks.push(tokio::spawn(async move {
            let mut h = latency_histogram();
            let mut unacked = VecDeque::with_capacity(window);
            for _ in 0..share {
                unacked.push_back((Instant::now(), js.publish(subject.clone(), payload.clone()).await?));
                if unacked.len() == window
                    && let Some((t, ack)) = unacked.pop_front()
                {
                    ack.await?;
                    h.saturating_record(t.elapsed().as_nanos() as u64);
                }
            }
            while let Some((t, ack)) = unacked.pop_front() {
                ack.await?;
                h.saturating_record(t.elapsed().as_nanos() as u64);
            }
            anyhow::Ok(h)
        }));
    }
    let mut hist = latency_histogram();
    for t in tasks {
        hist.add(&t.await??)?;
    }
    let publish_secs = start.elapsed().as_secs_f64();

    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let start = Instant::now();
    let mut consumed = 0u64;
    while consumed < a.count {
        let mut batch =
            consumer.fetch().max_messages(a.max_batch as usize).expires(Duration::from_secs(5)).messages().await?;
        while let Some(msg) = batch.next().await {
            let msg = msg.map_err(|e| anyhow::anyhow!("{e}"))?;
            msg.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            consumed += 1;
        }
    }
    let consume_secs = start.elapsed().as_secs_f64();
    js.delete_stream(&name).await?;

    let report = DurableReport { system: "jetstream", args: a, publish_secs, latency: hist, consumed, consume_secs };
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
    Ok(())
}
