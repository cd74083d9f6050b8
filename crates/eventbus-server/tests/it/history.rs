//! History and recovery: positions on delivered events, `since` on subscribe (no gap and
//! no copy at the seam, under concurrent publishing), epochs across restarts, bounds,
//! the admin view; in_memory and redis mode (an instance restarted under publishing).

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::redis_server::{RedisProc, broker_with};
use common::*;
use eventbus_core::history::{HistoryLimits, HistoryRule, HistoryRules};
use eventbus_proto::pb::{self, subscribe_response::Kind};
use eventbus_server::Settings;
use tonic::Streaming;

fn rules(rules: &[(&str, usize, usize)]) -> HistoryRules {
    HistoryRules::new(
        rules
            .iter()
            .map(|(channels, size, max_bytes)| HistoryRule {
                channels: eventbus_core::Pattern::parse(channels).unwrap(),
                limits: HistoryLimits { size: *size, max_bytes: *max_bytes, ttl: None },
            })
            .collect(),
    )
}

fn keep(settings: &mut Settings, size: usize) {
    settings.eventbus.history = vec![eventbus_server::config::HistoryRuleSetting {
        channels: "hist.>".into(),
        size,
        max_bytes: 16 << 20,
        ttl_ms: 0,
    }];
}

/// A subscription and its `started` message.
struct Opened {
    started: pb::SubscriptionStarted,
    stream: Streaming<pb::SubscribeResponse>,
}

async fn open(server: &TestServer, req: pb::SubscribeRequest) -> Result<Opened, tonic::Status> {
    let mut stream = within(server.client().await.subscribe(req)).await?.into_inner();
    match within(stream.message()).await? {
        Some(pb::SubscribeResponse { kind: Some(Kind::Started(started)) }) => Ok(Opened { started, stream }),
        other => panic!("first message must be started, got {other:?}"),
    }
}

impl Opened {
    /// Exactly `n` events (nothing else is published meanwhile).
    async fn take(&mut self, n: usize) -> Vec<pb::Event> {
        let out = self.at_least(n).await;
        assert_eq!(out.len(), n, "more events than expected");
        out
    }

    /// `n` events or a few more (the last batch read is taken whole).
    async fn at_least(&mut self, n: usize) -> Vec<pb::Event> {
        let mut out = Vec::new();
        while out.len() < n {
            match within(self.stream.message()).await {
                Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) })) => out.extend(batch.events),
                other => panic!("expected events after {} of {n}, got {other:?}", out.len()),
            }
        }
        out
    }
}

/// Reads until `received` holds `last` events (numbered 1..=last); past the deadline,
/// fails naming the numbers that never came.
async fn rest(sub: &mut Opened, received: &mut Vec<pb::Event>, last: u64) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while (received.len() as u64) < last {
        match tokio::time::timeout_at(deadline, sub.stream.message()).await {
            Ok(Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) }))) => received.extend(batch.events),
            other => {
                let got: std::collections::BTreeSet<u64> = numbers(received).into_iter().collect();
                let missing: Vec<u64> = (1..=last).filter(|n| !got.contains(n)).collect();
                panic!("{} of {last} events, missing {missing:?}; then {other:?}", received.len());
            }
        }
    }
}

fn since(positions: &HashMap<String, pb::EventPosition>) -> pb::SubscribeSince {
    pb::SubscribeSince { positions: positions.clone(), timestamp: None }
}

/// The last position of each channel in `events`.
fn last_positions(events: &[pb::Event]) -> HashMap<String, pb::EventPosition> {
    events.iter().map(|e| (e.channel.clone(), e.position.clone().expect("a position"))).collect()
}

fn numbers(events: &[pb::Event]) -> Vec<u64> {
    events.iter().map(|e| String::from_utf8_lossy(&e.payload).parse().unwrap()).collect()
}

async fn publish_numbered(
    client: &mut pb::event_bus_client::EventBusClient<tonic::transport::Channel>,
    ch: &str,
    n: u64,
) {
    client.publish(event(ch, n.to_string())).await.unwrap();
}

/// Publishes 1, 2, 3… on `channel` until told to stop; returns the last number.
fn publish_until(
    mut client: pb::event_bus_client::EventBusClient<tonic::transport::Channel>,
    channel: &'static str,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            if client.publish(event(channel, n.to_string())).await.is_err() {
                n -= 1;
                continue;
            }
            sent.store(n, Ordering::Relaxed);
            tokio::task::yield_now().await;
        }
        n
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_carry_positions_and_a_resubscribe_misses_nothing_under_publishing() {
    let server = start_with(|s| keep(s, 100_000)).await;
    let mut first = open(&server, sub(&["hist.seam"])).await.unwrap();
    assert!(!first.started.recovered, "no since: nothing recovered");
    assert!(first.started.started_at.is_some());

    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let publisher = publish_until(server.client().await, "hist.seam", stop.clone(), sent.clone());
    let mut received = first.at_least(50).await;
    let positions = last_positions(&received);
    drop(first);
    // Events go on being published while nobody listens, and while the new
    // subscription starts: the seam is crossed under load.
    eventually("more events published meanwhile", || {
        let sent = sent.clone();
        async move { sent.load(Ordering::Relaxed) >= 200 }
    })
    .await;
    let mut second =
        open(&server, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.seam"]) }).await.unwrap();
    assert!(second.started.recovered, "history held everything asked");
    received.extend(second.at_least(300).await);
    stop.store(true, Ordering::Relaxed);
    let last = within(publisher).await.unwrap();
    rest(&mut second, &mut received, last).await;
    assert_eq!(numbers(&received), (1..=last).collect::<Vec<_>>(), "every event once, in order");
    let offsets: Vec<u64> = received.iter().map(|e| e.position.as_ref().unwrap().offset).collect();
    assert_eq!(offsets, (1..=last).collect::<Vec<_>>(), "offsets count the channel's events");
    let epochs: std::collections::HashSet<_> = received.iter().map(|e| e.position.clone().unwrap().epoch).collect();
    assert_eq!(epochs.len(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_subscription_recovers_several_channels_and_new_ones_from_a_time() {
    let server = start_with(|s| keep(s, 1000)).await;
    pattern_recovery(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pattern_subscription_recovers_several_channels_and_new_ones_from_a_time() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, |s| keep(s, 1000)).await;
    pattern_recovery(&server).await;
    server.stop().await;
}

/// `hist.*` sees `hist.a` and `hist.b`, goes away; meanwhile both get more and
/// `hist.c` gets its first events: recovered by position and, for `hist.c`, by time.
async fn pattern_recovery(server: &TestServer) {
    let mut client = server.client().await;
    let mut first = open(server, sub(&["hist.*"])).await.unwrap();
    for n in 1..=3 {
        publish_numbered(&mut client, "hist.a", n).await;
        publish_numbered(&mut client, "hist.b", n).await;
    }
    let seen = first.take(6).await;
    let positions = last_positions(&seen);
    let at = first.started.started_at;
    drop(first);
    for n in 4..=5 {
        publish_numbered(&mut client, "hist.a", n).await;
        publish_numbered(&mut client, "hist.b", n).await;
        publish_numbered(&mut client, "hist.c", n).await;
    }
    let req = pb::SubscribeRequest { since: Some(pb::SubscribeSince { positions, timestamp: at }), ..sub(&["hist.*"]) };
    let mut second = open(server, req).await.unwrap();
    assert!(second.started.recovered);
    let recovered = second.take(6).await;
    let by_channel = |ch: &str| numbers(&recovered.iter().filter(|e| e.channel == ch).cloned().collect::<Vec<_>>());
    assert_eq!(by_channel("hist.a"), [4, 5]);
    assert_eq!(by_channel("hist.b"), [4, 5]);
    assert_eq!(by_channel("hist.c"), [4, 5], "a channel first seen in the gap is recovered from the time");
    publish_numbered(&mut client, "hist.a", 6).await;
    assert_eq!(numbers(&second.take(1).await), [6], "then live ones");
}

/// At most 64 KiB per channel.
fn small(settings: &mut Settings) {
    settings.eventbus.history = vec![eventbus_server::config::HistoryRuleSetting {
        channels: "hist.>".into(),
        size: 1_000_000,
        max_bytes: 64 * 1024,
        ttl_ms: 0,
    }];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_bounded_and_a_trimmed_position_recovers_incompletely() {
    let server = start_with(small).await;
    flood(&server).await;
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("socle_eventbus_history_trimmed_total{reason=\"bytes\"}"));
    assert!(metrics.contains("socle_eventbus_history_bytes "));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_history_is_bounded_and_a_trimmed_position_recovers_incompletely() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, small).await;
    flood(&server).await;
    server.stop().await;
}

/// A flood of 500 events of 1 KB on a channel bounded to 64 KiB: what is kept stays
/// within the bound, and a subscriber whose position was trimmed hears so.
async fn flood(server: &TestServer) {
    let mut client = server.client().await;
    let mut first = open(server, sub(&["hist.flood"])).await.unwrap();
    publish_numbered(&mut client, "hist.flood", 0).await;
    let positions = last_positions(&first.take(1).await);
    drop(first);
    // Gone on the broker's side too before the flood, or part of it is delivered live.
    eventually("the first subscription to close", || async {
        let mut admin = server.admin().await;
        admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner().subscriptions.is_empty()
    })
    .await;
    let payload = vec![b'x'; 1000];
    for _ in 0..500 {
        client.publish(event("hist.flood", payload.clone())).await.unwrap();
    }
    let mut admin = server.admin().await;
    let page = admin
        .get_channel_history(pb::GetChannelHistoryRequest { channel: "hist.flood".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let history = page.history.unwrap();
    // In memory the bytes are counted as the bound counts them; Redis reports what the
    // stream takes in its memory, so there the bound shows in the events kept.
    let kept = page.events.iter().map(|e| e.payload.len() as u64).sum::<u64>();
    assert!(kept <= 64 * 1024, "{kept} bytes of payload kept");
    assert!(history.bytes > 0);
    assert!(history.events > 10 && history.events < 100, "{} events kept", history.events);
    assert_eq!(history.last_offset, 501);
    assert_eq!(history.first_offset, 501 - history.events + 1);
    assert_eq!(page.events.len(), history.events as usize);

    let mut second =
        open(server, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.flood"]) }).await.unwrap();
    assert!(!second.started.recovered, "the flood trimmed what was asked");
    let recovered = second.take(history.events as usize).await;
    assert_eq!(recovered[0].position.as_ref().unwrap().offset, history.first_offset, "from the oldest kept");

    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("socle_eventbus_history_recoveries_total{outcome=\"incomplete\"} 1"), "{metrics}");
    let recovered = format!("socle_eventbus_history_recovered_total {}", history.events);
    assert!(metrics.contains(&recovered), "{metrics}");
    // The one event delivered live; the recovered ones are not delivery latencies.
    assert!(metrics.contains("socle_eventbus_delivery_latency_seconds_count 1\n"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_restart_changes_the_epoch_and_recovery_says_so() {
    let server = start_with(|s| keep(s, 1000)).await;
    let mut first = open(&server, sub(&["hist.r"])).await.unwrap();
    publish_numbered(&mut server.client().await, "hist.r", 1).await;
    let positions = last_positions(&first.take(1).await);
    drop(first);
    server.stop().await;

    let server = start_with(|s| keep(s, 1000)).await;
    let mut client = server.client().await;
    publish_numbered(&mut client, "hist.r", 2).await;
    let mut second =
        open(&server, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.r"]) }).await.unwrap();
    assert!(!second.started.recovered, "the history of the old epoch is gone");
    let got = second.take(1).await;
    assert_eq!(numbers(&got), [2], "what the new epoch holds is delivered");
    let p = got[0].position.clone().unwrap();
    assert_ne!(p.epoch, positions["hist.r"].epoch);
    assert_eq!(p.offset, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_is_checked_and_channels_without_history_report_incomplete() {
    let server = start_with(|s| keep(s, 10)).await;
    let pos = pb::EventPosition { epoch: "e".into(), offset: 1 };
    let with = |channels: &[&str], group: &str, ch: &str| pb::SubscribeRequest {
        group: group.into(),
        since: Some(since(&HashMap::from([(ch.to_owned(), pos.clone())]))),
        ..sub(channels)
    };
    let err = open(&server, with(&["hist.a"], "", "hist.b")).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"hist.b\" is not a channel this subscription covers"), "{}", err.message());
    let err = open(&server, with(&["hist.a"], "workers", "hist.a")).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("group"), "{}", err.message());

    // A filter partly outside the rules cannot promise anything.
    let at = Some(prost_types::Timestamp::from(std::time::SystemTime::now()));
    let req = pb::SubscribeRequest {
        since: Some(pb::SubscribeSince { positions: HashMap::new(), timestamp: at }),
        ..sub(&["hist.a", "plain"])
    };
    assert!(!open(&server, req).await.unwrap().started.recovered);
    let req = pb::SubscribeRequest {
        since: Some(pb::SubscribeSince { positions: HashMap::new(), timestamp: at }),
        ..sub(&["hist.a"])
    };
    assert!(open(&server, req).await.unwrap().started.recovered);
    // From before this broker started: what it had then is gone, even on channels that
    // have no history yet.
    let hour_ago =
        Some(prost_types::Timestamp::from(std::time::SystemTime::now() - std::time::Duration::from_secs(3600)));
    let req = pb::SubscribeRequest {
        since: Some(pb::SubscribeSince { positions: HashMap::new(), timestamp: hour_ago }),
        ..sub(&["hist.>"])
    };
    assert!(!open(&server, req).await.unwrap().started.recovered);

    let mut admin = server.admin().await;
    let err = admin
        .get_channel_history(pb::GetChannelHistoryRequest { channel: "plain".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("keeps no history"), "{}", err.message());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_since_timestamp_that_protobuf_calls_invalid_is_refused_by_name() {
    let server = start_with(|s| keep(s, 10)).await;
    let mut client = server.client().await;
    publish_numbered(&mut client, "hist.t", 1).await;
    let year_1 = eventbus_proto::time::MIN_SECONDS;
    let year_9999 = eventbus_proto::time::MAX_SECONDS;
    let invalid = [(0, 1_000_000_000), (0, -1), (year_1 - 1, 0), (year_9999 + 1, 0), (i64::MIN, 0), (i64::MAX, 0)];
    let mut admin = server.admin().await;
    for (seconds, nanos) in invalid {
        let at = prost_types::Timestamp { seconds, nanos };
        let req = pb::SubscribeRequest {
            since: Some(pb::SubscribeSince { positions: HashMap::new(), timestamp: Some(at) }),
            ..sub(&["hist.t"])
        };
        let err = open(&server, req).await.err().unwrap();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{seconds}.{nanos}: {}", err.message());
        assert!(err.message().contains("invalid since.timestamp"), "{}", err.message());
        let history = pb::GetChannelHistoryRequest { channel: "hist.t".into(), since: Some(at), ..Default::default() };
        let err = admin.get_channel_history(history).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{seconds}.{nanos}: {}", err.message());
        assert!(err.message().contains("invalid since"), "{}", err.message());
    }
    // The edges themselves are valid times: nothing kept is that old, or that new.
    for (seconds, nanos, recovered, events) in [(year_1, 0, false, 1), (year_9999, 999_999_999, true, 0)] {
        let at = prost_types::Timestamp { seconds, nanos };
        let req = pb::SubscribeRequest {
            since: Some(pb::SubscribeSince { positions: HashMap::new(), timestamp: Some(at) }),
            ..sub(&["hist.t"])
        };
        let mut opened = open(&server, req).await.unwrap();
        assert_eq!(opened.started.recovered, recovered, "{seconds}");
        assert_eq!(opened.take(events).await.len(), events);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_route_pages_a_channel_history() {
    let server = start_with(|s| keep(s, 1000)).await;
    let mut client = server.client().await;
    for n in 1..=5 {
        publish_numbered(&mut client, "hist.page", n).await;
    }
    let http = reqwest::Client::new();
    let get = |q: &str| {
        let url = server.url(&format!("/admin/eventbus/channels/hist.page/history{q}"));
        let http = http.clone();
        async move { http.get(url).send().await.unwrap() }
    };
    let page: serde_json::Value = get("?limit=2").await.json().await.unwrap();
    assert_eq!(page["history"]["last_offset"], 5);
    assert_eq!(page["history"]["events"], 5);
    assert_eq!(page["more"], true);
    let offsets: Vec<u64> =
        page["events"].as_array().unwrap().iter().map(|e| e["position"]["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, [1, 2]);
    let page: serde_json::Value = get("?since=2&limit=10").await.json().await.unwrap();
    let offsets: Vec<u64> =
        page["events"].as_array().unwrap().iter().map(|e| e["position"]["offset"].as_u64().unwrap()).collect();
    assert_eq!((offsets, page["more"].as_bool()), (vec![3, 4, 5], Some(false)));
    let page: serde_json::Value = get("?since=1h").await.json().await.unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 5);
    let bad = get("?since=soon").await;
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);
    let bad = get("?since=%2B10000-01-01T00:00:00Z").await;
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(bad.text().await.unwrap().contains("years 1 to 9999"));
    // `limit` is 1 to 1,000: the edges are answered, one past them refused by name.
    for (limit, status) in [("1", 200), ("1000", 200), ("1001", 400), ("0", 400), ("-1", 400)] {
        let answer = get(&format!("?limit={limit}")).await;
        assert_eq!(answer.status().as_u16(), status, "limit={limit}");
        if status == 400 {
            assert!(answer.text().await.unwrap().contains("limit"), "limit={limit}");
        }
    }
    let mut admin = server.admin().await;
    let history = |limit| pb::GetChannelHistoryRequest { channel: "hist.page".into(), limit, ..Default::default() };
    assert_eq!(admin.get_channel_history(history(1000)).await.unwrap().into_inner().events.len(), 5);
    assert_eq!(admin.get_channel_history(history(0)).await.unwrap().into_inner().events.len(), 5, "0 = the default");
    let err = admin.get_channel_history(history(1001)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("limit 1001"), "{}", err.message());
    assert_eq!(get("").await.status(), reqwest::StatusCode::OK);
    let none = http.get(server.url("/admin/eventbus/channels/plain/history")).send().await.unwrap();
    assert_eq!(none.status(), reqwest::StatusCode::NOT_FOUND);
    server.stop().await;
}

/// Batches of events interleaved over three channels with history, each batch kept
/// by one capture script where it can (a script reads and writes a channel's hash and
/// trims its stream once per batch): every channel's events carry contiguous offsets
/// in publish order, live and recovered, and the size bound holds after the batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_batches_on_several_channels_keep_each_history_in_order_and_bounded() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, |s| keep(s, 50)).await;
    let channels = ["hist.a", "hist.b", "hist.c"];
    let mut live = open(&server, sub(&["hist.>"])).await.unwrap();
    let mut client = server.client().await;
    for batch in 0..4u64 {
        let events = (0..60u64).map(|i| event(channels[(i % 3) as usize], (batch * 20 + i / 3 + 1).to_string()));
        let req = pb::PublishBatchRequest { events: events.collect() };
        let results = within(client.publish_batch(req)).await.unwrap().into_inner().results;
        assert!(results.iter().all(|r| r.error.is_none()), "{results:?}");
    }
    let received = live.take(240).await;
    let mut middle = HashMap::new();
    for channel in channels {
        let mine: Vec<pb::Event> = received.iter().filter(|e| e.channel == channel).cloned().collect();
        assert_eq!(numbers(&mine), (1..=80).collect::<Vec<_>>(), "{channel}: in publish order");
        let offsets: Vec<u64> = mine.iter().map(|e| e.position.as_ref().unwrap().offset).collect();
        assert_eq!(offsets, (1..=80).collect::<Vec<_>>(), "{channel}: contiguous offsets");
        middle.insert(channel.to_owned(), mine[39].position.clone().unwrap());
    }
    let mut admin = server.admin().await;
    for channel in channels {
        let req = pb::GetChannelHistoryRequest { channel: channel.into(), ..Default::default() };
        let history = admin.get_channel_history(req).await.unwrap().into_inner().history.unwrap();
        assert_eq!((history.first_offset, history.last_offset, history.events), (31, 80, 50), "{channel}");
    }
    let mut again =
        open(&server, pb::SubscribeRequest { since: Some(since(&middle)), ..sub(&channels) }).await.unwrap();
    assert!(again.started.recovered, "the history holds offsets 31 to 80");
    let recovered = again.take(120).await;
    for channel in channels {
        let mine: Vec<pb::Event> = recovered.iter().filter(|e| e.channel == channel).cloned().collect();
        assert_eq!(numbers(&mine), (41..=80).collect::<Vec<_>>(), "{channel}: recovered after the position");
        let offsets: Vec<u64> = mine.iter().map(|e| e.position.as_ref().unwrap().offset).collect();
        assert_eq!(offsets, (41..=80).collect::<Vec<_>>(), "{channel}");
    }
    server.stop().await;
}

/// On a cluster a shard's events go in one script that publishes them all, in order,
/// and keeps those of channels with a history: two kept channels and one not, all of
/// one shard, interleaved in a batch, arrive in publish order, the kept ones with
/// contiguous offsets and the other without a position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_publishes_a_shards_kept_and_plain_events_in_one_script_in_order() {
    let Some(cluster) = common::redis_cluster::RedisCluster::start().await else { return };
    let server = common::redis_cluster::cluster_broker(&cluster, |s| {
        keep(s, 1000);
        s.eventbus.history[0].channels = "hist.k.>".into();
    })
    .await;
    let channels = ["hist.k.a", "hist.p", "hist.k.b"];
    let mut live = open(&server, sub(&["hist.>"])).await.unwrap();
    let events = (0..60u64).map(|i| event(channels[(i % 3) as usize], (i + 1).to_string())).collect();
    let req = pb::PublishBatchRequest { events };
    let results = within(server.client().await.publish_batch(req)).await.unwrap().into_inner().results;
    assert!(results.iter().all(|r| r.error.is_none()), "{results:?}");
    let got = live.take(60).await;
    assert_eq!(numbers(&got), (1..=60).collect::<Vec<_>>(), "one shard's events in publish order");
    for channel in channels {
        let positions: Vec<Option<u64>> =
            got.iter().filter(|e| e.channel == channel).map(|e| e.position.as_ref().map(|p| p.offset)).collect();
        let expected: Vec<Option<u64>> = (1..=20).map(|n| channel.starts_with("hist.k").then_some(n)).collect();
        assert_eq!(positions, expected, "{channel}");
    }
    server.stop().await;
}

/// Two redis-mode instances; a subscriber on B; a publisher on A that never stops.
/// B is restarted (same port); the subscriber resumes from its positions on the new
/// B: every event exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_redis_instance_lets_its_subscriber_recover_every_event_once() {
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker_with(&redis, |s| keep(s, 100_000)).await;
    let b = broker_with(&redis, |s| keep(s, 100_000)).await;
    let mut first = open(&b, sub(&["hist.>"])).await.unwrap();

    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let publisher = publish_until(a.client().await, "hist.fleet", stop.clone(), sent.clone());
    let mut received = first.at_least(100).await;
    let positions = last_positions(&received);
    drop(first);
    let (b, _) = restart_while_publishing(&redis, b, &sent).await;
    let mut second =
        open(&b, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.>"]) }).await.unwrap();
    assert!(second.started.recovered, "Redis kept everything");
    received.extend(second.at_least(200).await);
    stop.store(true, Ordering::Relaxed);
    let last = within(publisher).await.unwrap();
    rest(&mut second, &mut received, last).await;
    assert_eq!(numbers(&received), (1..=last).collect::<Vec<_>>(), "every event once, in order");
    a.stop().await;
    b.stop().await;
}

/// Stops redis-mode instance `b`, waits until 100 more events are published while it
/// is away, and starts it again on the same addresses. Returns it, and how many events
/// were published when it stopped.
async fn restart_while_publishing(redis: &RedisProc, b: TestServer, sent: &AtomicU64) -> (TestServer, u64) {
    let (grpc, http) = (b.addr, b.http);
    let before = sent.load(Ordering::Relaxed);
    b.stop().await;
    eventually("publishes while B is away", || async { sent.load(Ordering::Relaxed) >= before + 100 }).await;
    let b = broker_with(redis, |s| {
        keep(s, 100_000);
        s.server.grpc_addr = grpc;
        s.server.http_addr = http;
    })
    .await;
    (b, before)
}

/// Redis flushed: a new epoch, and the subscriber is told it missed events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redis_starts_a_new_epoch() {
    let Some(redis) = RedisProc::start().await else { return };
    let server = broker_with(&redis, |s| {
        keep(s, 1000);
        s.eventbus.redis.envelope = eventbus_server::config::EnvelopeSetting::Json;
    })
    .await;
    let mut client = server.client().await;
    let mut first = open(&server, sub(&["hist.x"])).await.unwrap();
    publish_numbered(&mut client, "hist.x", 1).await;
    publish_numbered(&mut client, "hist.x", 2).await;
    let seen = first.take(2).await;
    assert_eq!(seen[1].position.as_ref().unwrap().offset, 2, "the JSON envelope carries positions too");
    let positions = last_positions(&seen[..1]);
    let mut second =
        open(&server, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.x"]) }).await.unwrap();
    assert!(second.started.recovered);
    assert_eq!(numbers(&second.take(1).await), [2]);
    let _: () = redis::cmd("FLUSHALL").query_async(&mut redis.conn().await).await.unwrap();
    publish_numbered(&mut client, "hist.x", 3).await;
    let mut third =
        open(&server, pb::SubscribeRequest { since: Some(since(&last_positions(&seen))), ..sub(&["hist.x"]) })
            .await
            .unwrap();
    assert!(!third.started.recovered, "the flush lost the history");
    let got = third.take(1).await;
    assert_eq!(numbers(&got), [3]);
    assert_ne!(got[0].position.as_ref().unwrap().epoch, seen[0].position.as_ref().unwrap().epoch);
    drop((first, second));
    server.stop().await;
}

#[test]
fn rules_from_the_configuration_are_the_cores() {
    let mut settings = Settings::default();
    keep(&mut settings, 7);
    assert_eq!(settings.history_rules(), rules(&[("hist.>", 7, 16 << 20)]));
}

/// On a Redis Cluster each channel's history lives on its shard: channels spread over
/// every master are recovered, by position and (for channels first seen in the gap)
/// by time, through another instance than the one that published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_each_channel_history_on_its_shard_and_recovers_them_all() {
    let Some(cluster) = common::redis_cluster::RedisCluster::start().await else { return };
    let two_tokens = |s: &mut Settings| {
        keep(s, 1000);
        s.eventbus.redis.shard_tokens = 2;
    };
    let a = common::redis_cluster::cluster_broker(&cluster, two_tokens).await;
    let b = common::redis_cluster::cluster_broker(&cluster, two_tokens).await;
    let mut first = open(&b, sub(&["hist.>"])).await.unwrap();
    // With two shard tokens, these channels spread over every master.
    let channels: Vec<String> = (0..24).map(|i| format!("hist.t{i}")).collect();
    let mut client = a.client().await;
    for channel in &channels {
        publish_numbered(&mut client, channel, 1).await;
    }
    let seen = first.take(channels.len()).await;
    let positions = last_positions(&seen);
    let at = first.started.started_at;
    drop(first);
    for channel in &channels {
        publish_numbered(&mut client, channel, 2).await;
    }
    publish_numbered(&mut client, "hist.late", 2).await;
    let req = pb::SubscribeRequest { since: Some(pb::SubscribeSince { positions, timestamp: at }), ..sub(&["hist.>"]) };
    let mut second = open(&b, req).await.unwrap();
    assert!(second.started.recovered);
    let recovered = second.take(channels.len() + 1).await;
    assert!(numbers(&recovered).iter().all(|&n| n == 2), "only what was missed");
    let mut got: Vec<&str> = recovered.iter().map(|e| e.channel.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = channels.iter().map(String::as_str).chain(["hist.late"]).collect();
    want.sort_unstable();
    assert_eq!(got, want, "every channel once, from every shard");
    let page = b
        .admin()
        .await
        .get_channel_history(pb::GetChannelHistoryRequest { channel: "hist.t3".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let history = page.history.unwrap();
    assert_eq!((history.first_offset, history.last_offset, history.events), (1, 2, 2));
    a.stop().await;
    b.stop().await;
}

/// The Redis transport on its own (a bus without durable consumers publishes through
/// it): positions given in Redis, history read back, the JSON envelope too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_transport_alone_keeps_history() {
    let Some(redis) = RedisProc::start().await else { return };
    for envelope in [eventbus_server::config::EnvelopeSetting::Binary, eventbus_server::config::EnvelopeSetting::Json] {
        let mut settings = Settings::default();
        settings.eventbus.redis.url = redis.url();
        settings.eventbus.redis.envelope = envelope;
        keep(&mut settings, 2);
        let options = settings.redis_settings();
        let stop = tokio_util::sync::CancellationToken::new();
        let supervisor = eventbus_core::Supervisor::new();
        let bus = eventbus_core::Bus::with_transport(settings.bus_config(), |local| {
            eventbus_redis::RedisTransport::start(options.client().unwrap(), &options, local, stop.clone(), &supervisor)
        });
        let status = bus.transport_status().unwrap();
        eventually("connected to Redis", || {
            let connected = status.borrow().connected;
            async move { connected }
        })
        .await;
        let channel = format!("hist.alone.{envelope:?}");
        let mut handle = bus
            .subscribe(eventbus_core::SubscribeOptions { channels: vec![channel.clone()], ..Default::default() })
            .await
            .unwrap();
        for n in 1..=3 {
            let input = eventbus_core::PublishInput {
                channel: channel.clone(),
                payload: n.to_string().into(),
                ..Default::default()
            };
            bus.publish(input).await.unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 3 {
            within(handle.next_batch(&mut got)).await.unwrap();
        }
        let offsets: Vec<u64> = got.iter().map(|e| e.position.as_ref().unwrap().offset).collect();
        assert_eq!(offsets, [1, 2, 3], "{envelope:?}");
        let start = eventbus_core::history::Start::Oldest;
        let kept = bus.read_history(&channel, &start, eventbus_core::history::Take::First(10)).await.unwrap().unwrap();
        let kept: Vec<u64> = kept.events.iter().map(|e| e.position.as_ref().unwrap().offset).collect();
        assert_eq!(kept, [2, 3], "size 2 keeps the last two");
        let info = bus.history_info(&channel).await.unwrap().unwrap();
        assert_eq!((info.first_offset, info.last_offset, info.events), (2, 3, 2));
        stop.cancel();
    }
}

/// The Rust client end to end: its subscription on instance B of a redis-mode pair
/// outlives B's restart by itself (it resubscribes with its positions), while A keeps
/// publishing: every event once, in order, and no gap reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_recovers_across_an_instance_restart_without_a_gap() {
    use eventbus_client::{Client, ClientOptions};
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker_with(&redis, |s| keep(s, 100_000)).await;
    let b = broker_with(&redis, |s| keep(s, 100_000)).await;
    let grpc = b.addr;
    let client = Client::connect(ClientOptions::new(format!("http://{grpc}"))).await.unwrap();
    let mut subscription = client.subscribe(sub(&["hist.>"])).await.unwrap();
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let publisher = publish_until(a.client().await, "hist.client", stop.clone(), sent.clone());

    let mut seen = Seen::default();
    seen.read(&mut subscription, 100).await;
    let (b, before) = restart_while_publishing(&redis, b, &sent).await;
    seen.read(&mut subscription, before as usize + 200).await;
    stop.store(true, Ordering::Relaxed);
    let last = within(publisher).await.unwrap();
    seen.read(&mut subscription, last as usize).await;
    let Seen { numbers: numbers_seen, starts, gaps } = seen;
    assert_eq!(numbers_seen, (1..=last).collect::<Vec<_>>(), "every event once, in order");
    assert!(gaps.is_empty(), "nothing was lost, so no gap: {gaps:?}");
    assert_eq!(starts, [false, true], "subscribed (nothing to recover), then again after the restart, recovered");
    a.stop().await;
    b.stop().await;
}

/// What a client subscription yielded: event numbers, `recovered` of each `Started`,
/// gaps.
#[derive(Default)]
struct Seen {
    numbers: Vec<u64>,
    starts: Vec<bool>,
    gaps: Vec<String>,
}

impl Seen {
    /// Reads until `until` events were received in all.
    async fn read(&mut self, sub: &mut eventbus_client::Subscription, until: usize) {
        use eventbus_client::SubscriptionItem;
        within(async {
            while self.numbers.len() < until {
                match sub.next().await.expect("open").unwrap() {
                    SubscriptionItem::Started { recovered, .. } => self.starts.push(recovered),
                    SubscriptionItem::Gap { reason } => self.gaps.push(reason),
                    SubscriptionItem::Events(events) => self.numbers.extend(numbers(&events)),
                    other => panic!("unexpected {other:?}"),
                }
            }
        })
        .await;
    }
}

/// `ttl_ms`: an event past its age is gone from the history, in both modes, and a
/// subscriber that wanted it hears so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_their_ttl_leave_the_history() {
    let short = |s: &mut Settings| {
        s.eventbus.history = vec![eventbus_server::config::HistoryRuleSetting {
            channels: "hist.>".into(),
            size: 1000,
            max_bytes: 16 << 20,
            ttl_ms: 200,
        }];
    };
    let redis = RedisProc::start().await;
    let mut servers = vec![start_with(short).await];
    if let Some(redis) = &redis {
        servers.push(broker_with(redis, short).await);
    }
    for server in servers {
        let mut first = open(&server, sub(&["hist.ttl"])).await.unwrap();
        let mut client = server.client().await;
        publish_numbered(&mut client, "hist.ttl", 1).await;
        publish_numbered(&mut client, "hist.ttl", 2).await;
        let positions = last_positions(&first.take(2).await[..1]);
        drop(first);
        let mut admin = server.admin().await;
        eventually("the events to pass their ttl", || {
            let mut admin = admin.clone();
            async move {
                let request = pb::GetChannelHistoryRequest { channel: "hist.ttl".into(), ..Default::default() };
                admin.get_channel_history(request).await.unwrap().into_inner().events.is_empty()
            }
        })
        .await;
        let again =
            open(&server, pb::SubscribeRequest { since: Some(since(&positions)), ..sub(&["hist.ttl"]) }).await.unwrap();
        assert!(!again.started.recovered, "event 2 is past its ttl");
        let info = admin
            .get_channel_history(pb::GetChannelHistoryRequest { channel: "hist.ttl".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.history.unwrap().last_offset, 2);
        server.stop().await;
    }
}

/// A recovery holds at most the subscription's queue capacity: the newest events, and
/// the subscriber hears the rest is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_is_bounded_by_the_queue_and_keeps_the_newest() {
    let redis = RedisProc::start().await;
    let mut servers = vec![start_with(|s| keep(s, 1000)).await];
    if let Some(redis) = &redis {
        servers.push(broker_with(redis, |s| keep(s, 1000)).await);
    }
    for server in servers {
        let mut first = open(&server, sub(&["hist.q.*"])).await.unwrap();
        let mut client = server.client().await;
        publish_numbered(&mut client, "hist.q.a", 0).await;
        let positions = last_positions(&first.take(1).await);
        let at = first.started.started_at;
        drop(first);
        for n in 1..=10 {
            publish_numbered(&mut client, "hist.q.a", n).await;
            publish_numbered(&mut client, "hist.q.b", 100 + n).await;
        }
        let req = pb::SubscribeRequest {
            queue_capacity: 4,
            since: Some(pb::SubscribeSince { positions, timestamp: at }),
            ..sub(&["hist.q.*"])
        };
        let mut second = open(&server, req).await.unwrap();
        assert!(!second.started.recovered, "16 of 20 left out");
        assert_eq!(numbers(&second.take(4).await), [9, 109, 10, 110], "the newest four, in publish order");
        publish_numbered(&mut client, "hist.q.a", 11).await;
        assert_eq!(numbers(&second.take(1).await), [11], "then live");
        server.stop().await;
    }
}
