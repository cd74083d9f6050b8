//! `eventbus bench push`: the broker as the worker. A push consumer whose endpoint is
//! a no-op HTTP server in this process (127.0.0.1, HTTP/1.1, 204 to every POST) is
//! filled while paused, by `bench durable`'s publish phase, then resumed: the clock
//! runs from the resume until the endpoint has received every event, then until the
//! broker has applied every ack (what `bench worker` times).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use eventbus_bench::PublishMode;
use eventbus_bench::durable::{DurableArgs, Histogram};
use eventbus_client::{Client, pb};
use serde_json::json;
use tokio::sync::Notify;

use crate::durable_bench::{STALL, publish, until_acked};

/// `eventbus bench push`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PushArgs {
    /// Events to publish, then have pushed.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Requests the broker keeps open to the endpoint (the consumer's push.max_concurrency).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Events per request (push.batch); above 1 the JSON envelope is used, else the raw one.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Concurrent publishers (each its own connection), as in `bench durable`.
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    payload: usize,
    /// How the events are published, as in `bench durable` (not timed with the pushes).
    #[arg(long, value_enum, default_value_t = PublishMode::Unary)]
    mode: PublishMode,
}

impl PushArgs {
    fn json_envelope(&self) -> bool {
        self.batch > 1
    }

    fn envelope_name(&self) -> &'static str {
        if self.json_envelope() { "json" } else { "raw" }
    }
}

/// The no-op endpoint: what it has received.
#[derive(Debug)]
struct Endpoint {
    /// Bodies are the JSON envelope (count their deliveries), else one event each.
    json: bool,
    /// Events after which [`Endpoint::reached`] is notified.
    target: u64,
    events: AtomicU64,
    requests: AtomicU64,
    /// JSON bodies without a `deliveries` array (answered 400).
    unreadable: AtomicU64,
    reached: Notify,
}

impl Endpoint {
    fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Resolves once `target` events have arrived; fails when none arrives for
    /// [`STALL`] or a body cannot be read.
    async fn until_received(&self) -> anyhow::Result<()> {
        let mut seen = 0;
        loop {
            anyhow::ensure!(
                self.unreadable.load(Ordering::Relaxed) == 0,
                "the bench's endpoint received a body without a JSON `deliveries` array"
            );
            let events = self.events();
            if events >= self.target {
                return Ok(());
            }
            if tokio::time::timeout(STALL, self.reached.notified()).await.is_err() {
                let events = self.events();
                anyhow::ensure!(
                    events > 0,
                    "no event reached the bench's endpoint within {} s: the broker must be on this host \
                     and may push to 127.0.0.1 (loopback is refused by default: push.allow_networks: [127.0.0.0/8])",
                    STALL.as_secs()
                );
                anyhow::ensure!(
                    events > seen,
                    "pushes stalled: the endpoint received {events} of {} events, none in the last {} s",
                    self.target,
                    STALL.as_secs()
                );
                seen = events;
            }
        }
    }
}

/// Answers 204 to every POST, counting its events.
async fn receive(State(endpoint): State<Arc<Endpoint>>, body: bytes::Bytes) -> StatusCode {
    let events = if endpoint.json {
        match deliveries(&body) {
            Some(n) => n,
            None => {
                endpoint.unreadable.fetch_add(1, Ordering::Relaxed);
                endpoint.reached.notify_one();
                return StatusCode::BAD_REQUEST;
            }
        }
    } else {
        1
    };
    endpoint.requests.fetch_add(1, Ordering::Relaxed);
    let before = endpoint.events.fetch_add(events, Ordering::Relaxed);
    if before < endpoint.target && before + events >= endpoint.target {
        endpoint.reached.notify_one();
    }
    StatusCode::NO_CONTENT
}

/// The number of deliveries of a JSON envelope.
fn deliveries(body: &[u8]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(value.get("deliveries")?.as_array()?.len() as u64)
}

/// What one run measured.
struct Measured {
    publish_secs: f64,
    latency: Histogram<u64>,
    /// From the resume until the endpoint had every event.
    received_secs: f64,
    /// From the resume until the broker had applied every ack.
    acked_secs: f64,
    redelivered: u64,
}

pub(crate) async fn run(client: &Client, json: bool, p: &PushArgs) -> anyhow::Result<()> {
    let a = DurableArgs { publishers: p.publishers, count: p.count, payload: p.payload, max_batch: 0, mode: p.mode };
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .context("cannot listen on 127.0.0.1 for the bench's HTTP endpoint")?;
    let addr = listener.local_addr().context("the bench's HTTP endpoint has no address")?;
    let endpoint = Arc::new(Endpoint {
        json: p.json_envelope(),
        target: p.count,
        events: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        unreadable: AtomicU64::new(0),
        reached: Notify::new(),
    });

    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("bench-push-{nanos}");
    let channel = format!("bench.push.{nanos}");
    let envelope = if p.json_envelope() { pb::PushEnvelope::Json } else { pb::PushEnvelope::Raw };
    let config = pb::ConsumerConfig {
        name: name.clone(),
        channels: vec![channel.clone()],
        push: Some(pb::PushConfig {
            url: format!("http://{addr}/push"),
            max_concurrency: p.concurrency,
            batch: p.batch,
            envelope: envelope.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    client.create_consumer(config).await.context("create the push consumer")?;

    let app = axum::Router::new()
        .route("/push", axum::routing::post(receive))
        .layer(DefaultBodyLimit::disable())
        .with_state(Arc::clone(&endpoint));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let measured = measure(client, &a, &name, channel, &endpoint).await;
    let deleted = client.delete_consumer(name.clone()).await.with_context(|| format!("delete the consumer {name}"));
    server.abort();
    let m = measured?;
    deleted?;

    let events = endpoint.events();
    let requests = endpoint.requests.load(Ordering::Relaxed);
    let us = |q: f64| m.latency.value_at_quantile(q) as f64 / 1000.0;
    if json {
        let report = json!({
            "system": "eventbus-push", "workload": "push",
            "params": {
                "publishers": a.publishers, "count": a.count, "payload": a.payload, "mode": a.mode.name(),
                "concurrency": p.concurrency, "batch": p.batch, "envelope": p.envelope_name(),
            },
            "published_per_sec": (a.count as f64 / m.publish_secs).round(),
            "publish_latency_us": {"p50": us(0.5), "p90": us(0.9), "p99": us(0.99), "max": m.latency.max() as f64 / 1000.0},
            "received_per_sec": (a.count as f64 / m.received_secs).round(),
            "acked_per_sec": (a.count as f64 / m.acked_secs).round(),
            "received_secs": m.received_secs,
            "acked_secs": m.acked_secs,
            "received_events": events,
            "requests": requests,
            "redelivered": m.redelivered,
        });
        println!("{report}");
    } else {
        print!(
            "eventbus-push (count={} concurrency={} batch={} envelope={} publishers={} payload={} mode={})\n  \
             durable publish  {:>10.0}/s   latency µs p50 {:.0}  p90 {:.0}  p99 {:.0}  max {:.0}\n  \
             pushed           {:>10.0}/s   {events} events in {requests} requests, the last after {:.3} s\n  \
             pushed + acked   {:>10.0}/s   every ack applied after {:.3} s ({} redelivered)\n",
            a.count,
            p.concurrency,
            p.batch,
            p.envelope_name(),
            a.publishers,
            a.payload,
            a.mode.name(),
            a.count as f64 / m.publish_secs,
            us(0.5),
            us(0.9),
            us(0.99),
            m.latency.max() as f64 / 1000.0,
            a.count as f64 / m.received_secs,
            m.received_secs,
            a.count as f64 / m.acked_secs,
            m.acked_secs,
            m.redelivered,
        );
    }
    Ok(())
}

/// Pause, fill, resume, and time the pushes and their acks.
async fn measure(
    client: &Client,
    a: &DurableArgs,
    name: &str,
    channel: String,
    endpoint: &Endpoint,
) -> anyhow::Result<Measured> {
    client.pause(name).await.context("pause the push consumer")?;
    let (publish_secs, latency) = publish(client, a, channel).await?;
    anyhow::ensure!(
        endpoint.events() == 0,
        "the endpoint received {} events while the consumer was paused",
        endpoint.events()
    );
    let start = Instant::now();
    client.resume(name).await.context("resume the push consumer")?;
    endpoint.until_received().await?;
    let received_secs = start.elapsed().as_secs_f64();
    until_acked(client, name, a.count).await?;
    let acked_secs = start.elapsed().as_secs_f64();
    let info = client.consumer(name).await?;
    anyhow::ensure!(
        info.pending == 0 && info.in_flight == 0 && info.dead_lettered == 0,
        "after every ack the consumer still shows {} pending, {} in flight, {} dead-lettered",
        info.pending,
        info.in_flight,
        info.dead_lettered
    );
    Ok(Measured { publish_secs, latency, received_secs, acked_secs, redelivered: info.redelivered })
}
