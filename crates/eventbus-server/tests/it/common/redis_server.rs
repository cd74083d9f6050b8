//! Brokers in redis mode on a private `redis-server` (eventbus_testkit::redis).

use eventbus_server::config::{Mode, Settings};
use reqwest::StatusCode;

pub use eventbus_testkit::redis::{RedisProc, RedisProxy, blocked_client, which_redis};

use super::*;

pub async fn broker(redis: &RedisProc) -> TestServer {
    broker_with(redis, |_| {}).await
}

/// [`broker`] with its settings adjusted first.
pub async fn broker_with(redis: &RedisProc, tweak: impl FnOnce(&mut Settings)) -> TestServer {
    let port = redis.port;
    let server = start_with(|s| {
        s.eventbus.mode = Mode::Redis;
        s.eventbus.redis.host = "127.0.0.1".into();
        s.eventbus.redis.port = port;
        s.eventbus.offer_timeout_ms = 20;
        tweak(s);
    })
    .await;
    wait_ready(&server, true).await;
    server
}

pub async fn ready(server: &TestServer) -> bool {
    reqwest::get(server.url("/readyz")).await.map(|r| r.status() == StatusCode::OK).unwrap_or(false)
}

pub async fn wait_ready(server: &TestServer, want: bool) {
    let what = if want { "readiness" } else { "unreadiness" };
    eventually(what, || async { ready(server).await == want }).await;
}

/// Forwards every event the subscribers receive, tagged with the subscriber's index,
/// to one channel (read it with [`drain_events`]).
pub fn merge(subs: Vec<Subscriber>) -> tokio::sync::mpsc::UnboundedReceiver<(usize, pb::Event)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, mut sub) in subs.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(msg)) = sub.stream.message().await {
                if let Some(eventbus_proto::pb::subscribe_response::Kind::Events(batch)) = msg.kind {
                    for e in batch.events {
                        if tx.send((i, e)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    rx
}

/// Reads merged events until at least `n` arrived and then nothing more for `quiet`
/// (so a duplicate on its way is caught), failing past [`DEADLINE`].
pub async fn drain_events(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, pb::Event)>,
    n: usize,
    quiet: Duration,
) -> Vec<(usize, pb::Event)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let wait = if out.len() >= n { quiet } else { deadline.saturating_duration_since(tokio::time::Instant::now()) };
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(event)) => out.push(event),
            Ok(None) => panic!("the subscribers ended"),
            Err(_) if out.len() >= n => return out,
            Err(_) => panic!("timed out: {} of {n} events arrived", out.len()),
        }
    }
}

/// Members on two instances sharing one group: once the instances know each other's
/// members (probes delivered exactly once ten times in a row), every event reaches
/// exactly one member, and both instances deliver some.
pub async fn a_group_spans_the_instances(a: &TestServer, b: &TestServer) {
    let group =
        || pb::SubscribeRequest { channels: vec!["jobs.*".into()], group: "workers".into(), ..Default::default() };
    // Two members here, one there.
    let subs = vec![a.subscribe(group()).await, a.subscribe(group()).await, b.subscribe(group()).await];
    let mut rx = merge(subs);
    let quiet = Duration::from_millis(150);
    let mut client = a.client().await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut streak = 0;
    let mut probe = 0;
    while streak < 10 {
        assert!(tokio::time::Instant::now() < deadline, "the instances never agreed on the group's members");
        probe += 1;
        client.publish(event("jobs.probe", format!("probe-{probe}"))).await.unwrap();
        let got = drain_events(&mut rx, 1, quiet).await;
        streak = if got.len() == 1 { streak + 1 } else { 0 };
    }
    let mut b_client = b.client().await;
    for i in 0..200 {
        let client = if i % 2 == 0 { &mut client } else { &mut b_client };
        client.publish(event("jobs.run", format!("job-{i}"))).await.unwrap();
    }
    let got = drain_events(&mut rx, 200, quiet).await;
    let mut seen = std::collections::BTreeMap::new();
    for (_, e) in &got {
        *seen.entry(String::from_utf8(e.payload.to_vec()).unwrap()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 200, "every event reached the group");
    assert!(seen.values().all(|&n| n == 1), "once each across the instances: {seen:?}");
    let on_b = got.iter().filter(|(i, _)| *i == 2).count();
    assert!(on_b > 0 && on_b < 200, "both instances deliver: {on_b} of 200 on the second");
}
