//! Outbox relay throughput and commit → delivery latency, with a broker in-process
//! (store on disk) and the PostgreSQL at `EVENTBUS_TEST_POSTGRES` (default
//! `host=127.0.0.1 port=5432 user=postgres dbname=postgres`), in a scratch schema.
//!
//! `cargo run --release -p eventbus-client --features postgres --example relay_bench`
//! (env `ROWS`, default 50000; `BATCH`, default 500; `CONSUMER=1` adds a durable
//! consumer on the channel, so every event is also stored for it).

use std::time::{Duration, Instant};

use eventbus_client::outbox::{Relay, RelayOptions};
use eventbus_client::tokio_postgres::{self, NoTls};
use eventbus_client::{Client, ClientOptions, SubscribeOptions, SubscriptionItem, pb};
use tokio_util::sync::CancellationToken;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<()> {
    let (rows, batch) = (env("ROWS", 50_000), env("BATCH", 500));
    let data = tempfile::tempdir()?;
    let mut settings = eventbus_server::Settings::default();
    settings.server.grpc_addr = "127.0.0.1:0".parse()?;
    settings.server.http_addr = "127.0.0.1:0".parse()?;
    settings.durable.data_dir = data.path().to_string_lossy().into_owned();
    let server = eventbus_server::Server::bind(settings).await?;
    let url = format!("http://{}", server.grpc_addr());
    let stop_server = CancellationToken::new();
    tokio::spawn(server.run(stop_server.clone()));
    let client = Client::connect(ClientOptions::new(url)).await?;
    if env("CONSUMER", 0) == 1 {
        let config = pb::ConsumerConfig { name: "sink".into(), channels: vec!["bench.>".into()], ..Default::default() };
        client.create_consumer(config).await?;
    }

    let base = std::env::var("EVENTBUS_TEST_POSTGRES")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".into());
    let schema = format!("eventbus_bench_{}", std::process::id());
    let (db, connection) = tokio_postgres::connect(&base, NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(&format!("create schema {schema}; set search_path to {schema};")).await?;
    db.batch_execute(include_str!("../sql/outbox.sql")).await?;
    let mut options = RelayOptions::new(format!("{base} options='-c search_path={schema}'"));
    options.batch = batch;
    let relay = Relay::new(client.clone(), options)?;
    let unpublished = async || -> Result<i64> {
        Ok(db.query_one("select count(*) from eventbus_outbox where published_at is null", &[]).await?.get(0))
    };

    // Throughput: a backlog of `rows` committed rows, then one relay drains it.
    db.execute(
        "insert into eventbus_outbox (channel, payload) \
         select 'bench.backlog', convert_to(repeat('x', 100), 'UTF8') from generate_series(1, $1::bigint)",
        &[&i64::try_from(rows)?],
    )
    .await?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn({
        let (relay, shutdown) = (relay.clone(), shutdown.clone());
        async move { relay.run(shutdown).await }
    });
    while unpublished().await? > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    println!(
        "throughput: {rows} rows in {:.2} s = {:.0} rows/s (batch {batch})",
        elapsed.as_secs_f64(),
        rows as f64 / elapsed.as_secs_f64()
    );

    // Latency: single-row transactions at ~500/s; the payload is the instant just before
    // the commit, read back by a subscriber.
    let epoch = Instant::now();
    let mut sub = client.subscribe(SubscribeOptions::new(["bench.latency"])).await?;
    let n = 2_000;
    let reader = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(n);
        while latencies.len() < n {
            match sub.next().await {
                Some(Ok(SubscriptionItem::Events(events))) => {
                    let now = epoch.elapsed().as_micros();
                    for e in events {
                        let sent: u128 = String::from_utf8_lossy(&e.payload).parse().unwrap_or(now);
                        latencies.push(now.saturating_sub(sent));
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
        latencies
    });
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    for _ in 0..n {
        tick.tick().await;
        let sent = epoch.elapsed().as_micros().to_string();
        db.execute(
            "insert into eventbus_outbox (channel, payload) values ('bench.latency', convert_to($1, 'UTF8'))",
            &[&sent],
        )
        .await?;
    }
    let mut latencies = tokio::time::timeout(Duration::from_secs(60), reader).await??;
    latencies.sort_unstable();
    let pct = |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)));
    println!(
        "latency commit -> delivery over {} events: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        pct(0.50).copied().unwrap_or(0) as f64 / 1000.0,
        pct(0.99).copied().unwrap_or(0) as f64 / 1000.0,
        latencies.last().copied().unwrap_or(0) as f64 / 1000.0,
    );

    shutdown.cancel();
    task.await??;
    db.batch_execute(&format!("drop schema {schema} cascade")).await?;
    stop_server.cancel();
    Ok(())
}
