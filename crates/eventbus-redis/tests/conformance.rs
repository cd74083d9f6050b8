//! The durable conformance suite (`eventbus_testkit::conformance`) on the Redis Streams
//! engine: every check on a private `redis-server` as a test of its own, and every check
//! in turn on one Redis Cluster of 3 masters and 3 replicas (a cluster per check would
//! cost minutes), each under a key prefix of its own.

use std::time::Duration;

use eventbus_core::durable::DurableBackend;
use eventbus_redis::{Envelope, RedisDurable, RedisDurableSettings, RedisOptions};
use eventbus_testkit::conformance::{self, Harness, RETENTION, options};
use eventbus_testkit::redis::{RedisCluster, RedisProc};
use tokio_util::sync::CancellationToken;

/// The engine's settings, its keys under `prefix`.
fn settings(prefix: &str) -> RedisDurableSettings {
    RedisDurableSettings {
        prefix: prefix.into(),
        instance_id: "conformance-1".into(),
        retention: RETENTION,
        envelope: Envelope::Binary,
        min_replicas_acked: 0,
        replica_ack_timeout: Duration::from_secs(1),
        history: Default::default(),
    }
}

/// The engine on a private redis-server; None when there is none to start.
async fn on_redis() -> Option<Harness> {
    let redis = RedisProc::start().await?;
    let client = redis::Client::open(redis.url()).expect("redis url");
    let (options, sink, letters) = options();
    let stop = CancellationToken::new();
    let engine = RedisDurable::start(client, settings("conformance"), options, stop.clone()).expect("redis engine");
    engine.set_dead_letter_sink(sink);
    Some(Harness::new(Box::new(engine), letters, vec![Box::new(redis), Box::new(stop.drop_guard())]))
}

/// The engine on `cluster`, its keys under a prefix of its own.
fn on_cluster(cluster: &RedisCluster, prefix: &str) -> Harness {
    let redis = RedisOptions {
        url: None,
        host: "127.0.0.1".into(),
        port: 6379,
        username: None,
        password: None,
        database: 0,
        prefix: format!("conformance-{prefix}"),
        envelope: Envelope::Binary,
        tls_ca_file: None,
        cluster_nodes: cluster.seeds(),
        shard_tokens: 1,
        health_check_interval: Duration::from_secs(1),
        health_check_timeout: Duration::from_millis(500),
        history: Default::default(),
        min_replicas_acked: 0,
        replica_ack_timeout: Duration::from_secs(1),
    };
    let (options, sink, letters) = options();
    let stop = CancellationToken::new();
    let engine = RedisDurable::start_cluster(&redis, settings(&redis.prefix), options, stop.clone())
        .expect("redis cluster engine");
    engine.set_dead_letter_sink(sink);
    Harness::new(Box::new(engine), letters, vec![Box::new(stop.drop_guard())])
}

eventbus_testkit::durable_conformance!(on_redis());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_check_passes() {
    let Some(cluster) = RedisCluster::start().await else { return };
    conformance::every_check(|check| {
        let harness = on_cluster(&cluster, check);
        async move { harness }
    })
    .await;
}
