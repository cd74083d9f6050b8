//! Hot-path micro-benchmarks: routing one publish among many subscriptions, trie match
//! cost as patterns grow (flat: a trie, not a scan), and one event through one queue.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use eventbus_core::trie::Trie;
use eventbus_core::{Bus, BusConfig, Overflow, Pattern, PublishInput, SubscribeOptions};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn publish(channel: &str) -> PublishInput {
    PublishInput { channel: channel.to_owned(), payload: bytes::Bytes::from_static(&[0xAB; 128]), ..Default::default() }
}

/// One publish routed among 10,000 exact subscriptions and 1,000 patterns, reaching one
/// exact subscription and one pattern. Queues hold one event and drop the oldest, so
/// the measure is routing and enqueueing, never waiting.
fn route_among_many(c: &mut Criterion) {
    let rt = runtime();
    let bus = Bus::new(BusConfig { max_channel_labels: Some(1000), ..BusConfig::default() });
    let sub = |channel: String| SubscribeOptions {
        channels: vec![channel],
        queue_capacity: 1,
        overflow: Some(Overflow::DropOldest),
        ..Default::default()
    };
    let mut handles = Vec::new();
    rt.block_on(async {
        for i in 0..10_000 {
            handles.push(bus.subscribe(sub(format!("orders.{i}"))).await.expect("subscribe"));
        }
        for i in 0..1_000 {
            handles.push(bus.subscribe(sub(format!("region{i}.*.created"))).await.expect("subscribe"));
        }
        handles.push(bus.subscribe(sub("orders.*".to_owned())).await.expect("subscribe"));
    });
    c.bench_function("publish_10k_exact_1k_patterns", |b| {
        b.to_async(&rt).iter(|| async { black_box(bus.publish(publish("orders.5000")).await.expect("publish")) })
    });
}

/// Matching one channel as the number of (non-matching) patterns grows.
fn match_cost_vs_patterns(c: &mut Criterion) {
    let mut group = c.benchmark_group("trie_match");
    for n in [10usize, 100, 1_000, 10_000] {
        let mut trie = Trie::default();
        for i in 0..n {
            let filter = match i % 3 {
                0 => format!("svc{i}.*.created"),
                1 => format!("svc{i}.>"),
                _ => format!("svc{i}.orders.created"),
            };
            trie.insert(&Pattern::parse(&filter).expect("pattern"), i);
        }
        trie.insert(&Pattern::parse("orders.*").expect("pattern"), usize::MAX);
        let mut out = Vec::with_capacity(4);
        group.bench_with_input(BenchmarkId::from_parameter(n), &trie, |b, trie| {
            b.iter(|| {
                out.clear();
                trie.collect(black_box("orders.created"), &mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();
}

/// One event published to, and taken from, one subscription.
fn enqueue_dequeue(c: &mut Criterion) {
    let rt = runtime();
    let bus = Bus::new(BusConfig::default());
    let mut handle = rt
        .block_on(bus.subscribe(SubscribeOptions { channels: vec!["q.one".into()], ..Default::default() }))
        .expect("subscribe");
    let mut out = Vec::with_capacity(1);
    c.bench_function("enqueue_dequeue_one", |b| {
        b.iter(|| {
            rt.block_on(async {
                bus.publish(publish("q.one")).await.expect("publish");
                out.clear();
                handle.next_batch(&mut out).await.expect("event");
            });
            black_box(out.len())
        })
    });
}

criterion_group!(benches, route_among_many, match_cost_vs_patterns, enqueue_dequeue);
criterion_main!(benches);
