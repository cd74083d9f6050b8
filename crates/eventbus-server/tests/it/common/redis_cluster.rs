//! Brokers in redis mode on a private Redis Cluster (eventbus_testkit::redis).

use std::time::Duration;

use eventbus_server::config::{Mode, Settings};

pub use eventbus_testkit::redis::RedisCluster;

use super::*;

/// A broker in redis mode on `cluster`.
pub async fn cluster_broker(cluster: &RedisCluster, tweak: impl FnOnce(&mut Settings)) -> TestServer {
    let seeds = cluster.seeds();
    let server = start_with(|s| {
        s.eventbus.mode = Mode::Redis;
        s.eventbus.redis.cluster_nodes = seeds;
        s.eventbus.offer_timeout_ms = 20;
        tweak(s);
    })
    .await;
    super::redis_server::wait_ready(&server, true).await;
    server
}

/// Publishes until one publish is accepted (a slot just failed over takes a moment).
pub async fn publish_eventually(server: &TestServer, channel: &str, payload: &str) {
    let mut client = server.client().await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match client.publish(event(channel, payload.to_owned())).await {
            Ok(_) => return,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                assert!(tokio::time::Instant::now() < deadline, "publishing to {channel} never succeeded: {status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
