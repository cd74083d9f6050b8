//! Redis Cluster mode (docs/redis.md "Redis Cluster") against a real local cluster each test
//! starts: 3 masters and 3 replicas on free loopback ports.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::consume::{Consumer, attach, consumer};
use common::redis_cluster::*;
use common::*;
use eventbus_proto::pb;
use eventbus_proto::pb::{consume_request, consume_response};

fn payload(e: &pb::Event) -> String {
    String::from_utf8(e.payload.to_vec()).unwrap()
}

/// The payloads `sub` receives, `n` of them, counted.
async fn counted(sub: &mut Subscriber, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for e in sub.take(n).await {
        *seen.entry(format!("{}/{}", e.channel, payload(&e))).or_insert(0) += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_pattern_and_full_wildcard_subscriptions_get_every_event_once_from_every_shard() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    let mut all_on_a = a.subscribe(sub(&[">"])).await;
    let mut created_on_b = b.subscribe(sub(&["*.created"])).await;
    let mut t3_on_b = b.subscribe(sub(&["t3.*", "t3.created"])).await;
    let mut exact_on_a = a.subscribe(sub(&["t7.updated"])).await;

    // 24 first tokens: their channels land on every shard.
    let channels: Vec<String> =
        (0..24).flat_map(|i| [format!("t{i}.created"), format!("t{i}.updated"), format!("t{i}.eu.created")]).collect();
    for (server, name) in [(&a, "A"), (&b, "B")] {
        let mut client = server.client().await;
        for channel in &channels {
            let answer = client.publish(event(channel, name)).await.unwrap().into_inner();
            assert!(answer.delivered_count >= 1, "{channel}: {answer:?}");
        }
    }
    let everything = counted(&mut all_on_a, 2 * channels.len()).await;
    assert_eq!(everything.len(), 2 * channels.len(), "every event of every shard");
    assert!(everything.values().all(|&n| n == 1), "once each: {everything:?}");

    let created = counted(&mut created_on_b, 2 * 24).await;
    assert!(created.keys().all(|k| k.split('/').next().unwrap().ends_with(".created")));
    assert!(created.keys().all(|k| !k.contains(".eu.")), "token rules: *.created is two tokens");
    assert!(created.values().all(|&n| n == 1), "{created:?}");

    // Overlapping filters of one subscription: one copy.
    let t3 = counted(&mut t3_on_b, 2 * 2).await;
    assert_eq!(
        t3.keys().cloned().collect::<Vec<_>>(),
        ["t3.created/A", "t3.created/B", "t3.updated/A", "t3.updated/B"]
    );
    let t7 = counted(&mut exact_on_a, 2).await;
    assert_eq!(t7.keys().cloned().collect::<Vec<_>>(), ["t7.updated/A", "t7.updated/B"]);

    // Nothing more is on its way: a last event is the next thing each sees.
    a.client().await.publish(event("t3.created", "last")).await.unwrap();
    assert_eq!(payload(&created_on_b.take(1).await[0]), "last");
    assert_eq!(payload(&t3_on_b.take(1).await[0]), "last");
    assert_eq!(payload(&all_on_a.take(1).await[0]), "last");

    let stats = a.admin().await.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.mode, "redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_first_tokens_spread_the_publishes_over_the_masters() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let broker = cluster_broker(&cluster, |_| {}).await;
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3);
    let mut before = Vec::new();
    for m in &masters {
        before.push(m.calls("spublish").await);
    }
    let mut client = broker.client().await;
    let per_token = 10;
    for i in 0..64 {
        for j in 0..per_token {
            client.publish(event(&format!("tenant{i}.events"), format!("{j}"))).await.unwrap();
        }
    }
    let mut shares = Vec::new();
    for (m, before) in masters.iter().zip(before) {
        shares.push((m.calls("spublish").await - before) as f64 / f64::from(64 * per_token));
    }
    assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "every SPUBLISH went to a master: {shares:?}");
    for share in &shares {
        assert!((share - 1.0 / 3.0).abs() <= 0.10, "each master carries 33% ± 10%: {shares:?}");
    }
    eprintln!("SPUBLISH share per master with 64 first tokens: {shares:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_master_is_killed_the_instances_follow_its_replica_without_restart() {
    let Some(mut cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    let mut all_on_b = b.subscribe(sub(&[">"])).await;
    let channels: Vec<String> = (0..24).map(|i| format!("t{i}.created")).collect();
    for channel in &channels {
        publish_eventually(&a, channel, "before").await;
    }
    assert!(counted(&mut all_on_b, channels.len()).await.values().all(|&n| n == 1));

    let victim = cluster.masters().await[0].port;
    let replicas = cluster.kill_master_now(victim).await;
    // While the dead master's slots have none, their publishes fail UNAVAILABLE and the
    // other shards keep serving.
    let mut client = a.client().await;
    let mut served = 0;
    for channel in &channels {
        match client.publish(event(channel, "meanwhile")).await {
            Ok(_) => served += 1,
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        }
    }
    assert!(served > 0, "the live shards kept serving");
    cluster.wait_promoted(replicas).await;

    // Every shard serves again, through the promoted replica, with no restart. An
    // instance whose shard subscription was interrupted ends its streams (they may
    // have missed events): the subscriber subscribes again. Each channel is published
    // to until its event arrives (a publish refused while its slot had no master is
    // retried too).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut interrupted = false;
    let mut missing: std::collections::BTreeSet<&String> = channels.iter().collect();
    while !missing.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no event after the failover on {missing:?}");
        for channel in &missing {
            publish_eventually(&a, channel, "after").await;
        }
        let wait = std::time::Duration::from_millis(200);
        while let Ok(message) = tokio::time::timeout(wait, all_on_b.stream.message()).await {
            let batch = match message {
                Ok(Some(pb::SubscribeResponse { kind: Some(pb::subscribe_response::Kind::Events(batch)) })) => batch,
                Err(status) if common::is_interrupted(&status) => {
                    interrupted = true;
                    all_on_b = b.subscribe(sub(&[">"])).await;
                    break;
                }
                other => panic!("expected events, got {other:?}"),
            };
            // "meanwhile" events the live shards carried arrive first.
            for e in batch.events.into_iter().filter(|e| payload(e) != "meanwhile") {
                assert_eq!(payload(&e), "after", "{e:?}");
                missing.remove(&e.channel);
            }
        }
    }
    let metrics = reqwest::get(b.url("/metrics")).await.unwrap().text().await.unwrap();
    let gaps = metrics
        .lines()
        .find_map(|l| l.strip_prefix("socle_eventbus_redis_subscription_gaps_total "))
        .map(|v| v.parse::<f64>().unwrap())
        .unwrap();
    assert!(gaps >= 1.0, "the interrupted subscription is counted: {gaps}");
    assert!(interrupted, "and the stream on b that may have missed events was ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_members_on_two_instances_gets_each_event_once() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    common::redis_server::a_group_spans_the_instances(&a, &b).await;
}

/// Waits for the daemon's `started` line; returns its gRPC and HTTP addresses and keeps
/// reading its output (a full pipe would stall it).
async fn started(child: &mut tokio::process::Child) -> (String, String) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let field = |line: &str, key: &str| {
        let start = line.find(&format!("{key}=")).unwrap() + key.len() + 1;
        line[start..].split_whitespace().next().unwrap().trim_matches('"').to_owned()
    };
    let addresses = within(async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("eventbusd started") {
                return (field(&line, "grpc_addr"), field(&line, "http_addr"));
            }
        }
        panic!("eventbusd exited before starting");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addresses
}

/// The real binary, configured by environment as a container is: the seed nodes as one
/// comma-separated variable.
fn daemon(nodes: &str, dir: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_eventbusd"));
    cmd.args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--mode", "redis"])
        .env("REDIS_CLUSTER_NODES", nodes)
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_not_a_cluster_stops_start_up_naming_the_setting() {
    let Some(redis) = common::redis_server::RedisProc::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = within(daemon(&format!("127.0.0.1:{}", redis.port), dir.path()).output()).await.unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("eventbus.redis.cluster_nodes") && stderr.contains("refused"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_on_a_cluster_configured_by_environment() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut child = daemon(&cluster.seeds().join(","), dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (grpc, http) = started(&mut child).await;
    // Ready once connected to the cluster (publishes are refused before).
    eventually("readiness", || async {
        reqwest::get(format!("http://{http}/readyz")).await.is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
    })
    .await;
    let connect = || async {
        within(eventbus_proto::pb::event_bus_client::EventBusClient::connect(format!("http://{grpc}"))).await.unwrap()
    };
    let mut all = subscribe_on(&mut connect().await, sub(&[">"])).await;
    let mut client = connect().await;
    for i in 0..24 {
        client.publish(event(&format!("t{i}.created"), "x")).await.unwrap();
    }
    assert_eq!(counted(&mut all, 24).await.len(), 24);

    // A durable consumer, its keys in their own slot, served by the binary.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap();
    let mut admin = pb::admin_client::AdminClient::new(endpoint.connect().await.unwrap());
    let req = pb::CreateConsumerRequest { config: Some(consumer("billing", &["invoices.>"])) };
    within(admin.create_consumer(req)).await.unwrap();
    for i in 0..5 {
        client.publish(event("invoices.due", format!("i{i}"))).await.unwrap();
    }
    let mut billing = attach(endpoint, "billing", 10).await.unwrap();
    let got: Vec<String> = billing.deliveries(5).await.iter().map(|d| payload(d.event.as_ref().unwrap())).collect();
    assert_eq!(got, ["i0", "i1", "i2", "i3", "i4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_follow_a_live_slot_migration() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    // A first token in slots 0..127 (bucket 0): its shard channel lives there too.
    let mut conn = cluster.nodes[0].conn().await;
    let mut token = String::new();
    for i in 0.. {
        let candidate = format!("k{i}");
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&candidate).query_async(&mut conn).await.unwrap();
        if slot < 128 {
            token = candidate;
            break;
        }
    }
    let channel = format!("{token}.moved");
    let mut on_b = b.subscribe(sub(&[&channel])).await;
    let mut client = a.client().await;
    client.publish(event(&channel, "before")).await.unwrap();
    assert_eq!(payload(&on_b.take(1).await[0]), "before");

    // Slots 0..127 move from the master that owns them to another one.
    let masters = cluster.masters().await;
    let mut ids = Vec::new();
    for m in &masters {
        let id: String = redis::cmd("CLUSTER").arg("MYID").query_async(&mut m.conn().await).await.unwrap();
        let slots: Vec<Vec<redis::Value>> =
            redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut m.conn().await).await.unwrap();
        let owns_zero = slots.iter().any(|r| {
            matches!((&r[0], &r[2]), (redis::Value::Int(0), redis::Value::Array(node)) if matches!(&node[1], redis::Value::Int(p) if *p == i64::from(m.port)))
        });
        ids.push((id, owns_zero, m.port));
    }
    let from = ids.iter().find(|(_, owns, _)| *owns).unwrap().clone();
    let to = ids.iter().find(|(_, owns, _)| !*owns).unwrap().clone();
    let cli = common::redis_server::which_redis().unwrap().with_file_name("redis-cli");
    let out = tokio::process::Command::new(cli)
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", from.2)])
        .args(["--cluster-from", &from.0, "--cluster-to", &to.0, "--cluster-slots", "128", "--cluster-yes"])
        .output();
    let out = within(out).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cluster.wait_ok().await;
    let owner_of_zero = || async {
        let slots: Vec<Vec<redis::Value>> =
            redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut cluster.nodes[0].conn().await).await.unwrap();
        slots.iter().find_map(|r| match (&r[0], &r[2]) {
            (redis::Value::Int(0), redis::Value::Array(node)) => match &node[1] {
                redis::Value::Int(port) => Some(*port),
                _ => None,
            },
            _ => None,
        })
    };
    assert_eq!(owner_of_zero().await, Some(i64::from(to.2)), "slot 0 moved");

    // The subscription follows the slot to its new master (its stream ended if it was
    // interrupted meanwhile, and is opened again): publish until it hears.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "the subscription never followed the migration");
        client.publish(event(&channel, "after")).await.unwrap();
        match tokio::time::timeout(std::time::Duration::from_millis(200), on_b.stream.message()).await {
            Ok(Ok(Some(pb::SubscribeResponse { kind: Some(pb::subscribe_response::Kind::Events(batch)) }))) => {
                assert!(batch.events.iter().all(|e| payload(e) == "after"));
                break;
            }
            Ok(Err(status)) if common::is_interrupted(&status) => on_b = b.subscribe(sub(&[&channel])).await,
            Ok(other) => panic!("expected events, got {other:?}"),
            Err(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_producer_spublishes_the_json_envelope_on_the_documented_shard_channel() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let broker = cluster_broker(&cluster, |_| {}).await;
    let mut sub_t1 = broker.subscribe(sub(&["t1.*"])).await;
    // The documented rule: bucket = CLUSTER KEYSLOT <first token> / 128.
    let mut any = cluster.nodes[0].conn().await;
    let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg("t1").query_async(&mut any).await.unwrap();
    let channel = eventbus_redis::cluster::shard_channels("socle:eventbus")[usize::from(slot / 128)].clone();
    let spublish = |message: String| {
        let channel = channel.clone();
        let nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
        async move {
            // Like `redis-cli -c`: the node that does not answer MOVED owns the channel.
            for url in nodes {
                let mut conn = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
                match redis::cmd("SPUBLISH").arg(&channel).arg(&message).query_async::<i64>(&mut conn).await {
                    Ok(receivers) => return receivers,
                    Err(err) if err.redirect_node().is_some() => continue,
                    Err(err) => panic!("{err}"),
                }
            }
            panic!("no node owns {channel}")
        }
    };
    // A payload without an envelope names no channel: dropped, not delivered.
    assert_eq!(spublish("raw bytes".into()).await, 1, "the instance subscribes to the shard channel");
    let json = r#"{"eventbus":1,"id":"ext-1","channel":"t1.created","timestamp":"2026-11-26T00:00:00Z","payload":"from redis-cli"}"#;
    assert_eq!(spublish(json.into()).await, 1);
    let got = sub_t1.take(1).await;
    let metrics = reqwest::get(broker.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "socle_eventbus_redis_unroutable_total 1"), "the bare payload is counted");
    assert_eq!(
        (got[0].id.as_str(), got[0].channel.as_str(), payload(&got[0]).as_str()),
        ("ext-1", "t1.created", "from redis-cli")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_keeps_each_channels_order_on_a_cluster() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    let mut on_b = b.subscribe(sub(&["ord.*", "t5.*"])).await;
    // Two channels on different shards, interleaved, sent as one stream: the
    // publishes of a chunk go out together, each channel's still in order.
    let reqs: Vec<pb::PublishRequest> =
        (0..1000).map(|i| event(if i % 2 == 0 { "ord.x" } else { "t5.x" }, format!("{i}"))).collect();
    let mut answers = a.client().await.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut answered = 0;
    while let Some(answer) = within(answers.message()).await.unwrap() {
        assert!(answer.delivered_count >= 1, "{answer:?}");
        answered += 1;
    }
    assert_eq!(answered, 1000);
    let got = on_b.take(1000).await;
    for channel in ["ord.x", "t5.x"] {
        let seq: Vec<u32> = got.iter().filter(|e| e.channel == channel).map(|e| payload(e).parse().unwrap()).collect();
        assert_eq!(seq.len(), 500, "{channel}");
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{channel} in publish order: {seq:?}");
    }
}

/// Publishers that publish numbered events on `channel.<publisher>` as fast as they are
/// answered, until stopped, and keep the payloads answered OK.
struct Publishers {
    answered: Arc<parking_lot::Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Publishers {
    fn start(server: &TestServer, channel: &str, n: usize) -> Self {
        let answered = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks = (0..n)
            .map(|p| {
                let (answered, stop, endpoint) = (Arc::clone(&answered), stop.clone(), server.endpoint());
                let channel = format!("{channel}.{p}");
                tokio::spawn(async move {
                    let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
                    for i in 0.. {
                        if stop.is_cancelled() {
                            return;
                        }
                        let payload = format!("{p}-{i}");
                        match client.publish(event(&channel, payload.clone())).await {
                            Ok(_) => answered.lock().push(payload),
                            Err(status) => {
                                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Self { answered, stop, tasks }
    }

    fn count(&self) -> usize {
        self.answered.lock().len()
    }

    /// Waits until `n` more publishes than now were answered OK.
    async fn until_more(&self, n: usize) {
        let target = self.count() + n;
        eventually("publishes to be answered OK", || async move { self.count() >= target }).await;
    }

    async fn finish(self) -> Vec<String> {
        self.stop.cancel();
        for task in self.tasks {
            within(task).await.unwrap();
        }
        Arc::try_unwrap(self.answered).unwrap().into_inner()
    }
}

/// Takes deliveries from `consumer`, acking each, until every payload of `expected`
/// came or nothing more comes for a while; returns how often each payload came.
async fn drain_consumer(consumer: &mut Consumer, expected: &[String]) -> BTreeMap<String, usize> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DEADLINE * 4;
    while expected.iter().any(|p| !seen.contains_key(p)) && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(3), consumer.responses.message()).await {
            Ok(Ok(Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(batch)) }))) => {
                let ids = batch.deliveries.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect();
                for d in &batch.deliveries {
                    *seen.entry(payload(d.event.as_ref().unwrap())).or_insert(0) += 1;
                }
                consumer.send(consume_request::Kind::Ack(pb::Ack { event_ids: ids })).await;
            }
            Ok(other) => panic!("expected deliveries, got {other:?}"),
            // Quiet: whatever has not come by now is lost.
            Err(_) => break,
        }
    }
    seen
}

/// A consumer name whose keys are in one of slots 0..128 (where a reshard of 128 slots
/// from their master starts).
async fn name_in_first_slots(cluster: &RedisCluster, stem: &str) -> String {
    for i in 0.. {
        let name = format!("{stem}{i}");
        if cluster.slot_of(&name).await < 128 {
            return name;
        }
    }
    unreachable!()
}

/// kill -9 of the master holding a durable consumer's keys under 4 publishers; the
/// consumer then takes everything. Returns (answered OK, lost, delivered twice).
/// Channel `ledger` (no consumer; on the same master) keeps a history.
async fn durable_publishes_across_a_master_kill(min_replicas_acked: u32) -> Option<(usize, usize, usize)> {
    let mut cluster = RedisCluster::start().await?;
    let server = cluster_broker(&cluster, |s| {
        s.eventbus.redis.min_replicas_acked = min_replicas_acked;
        s.eventbus.history = vec![eventbus_server::config::HistoryRuleSetting {
            channels: "ledger".into(),
            size: 100,
            max_bytes: 1 << 20,
            ttl_ms: 0,
        }];
    })
    .await;
    let name = "ledger";
    let req = pb::CreateConsumerRequest { config: Some(consumer(name, &["ledger.>"])) };
    within(server.admin().await.create_consumer(req)).await.unwrap();
    let master = cluster.owner_of(cluster.slot_of(name).await).await;
    let shard = eventbus_redis::cluster::shard_channels("socle:eventbus")
        [usize::from(cluster.slot_of(name).await / 128)]
    .clone();
    assert_eq!(cluster.owner_of(cluster.slot_of(&shard).await).await, master, "channel ledger is on that master");
    within(server.client().await.publish(event("ledger", "kept"))).await.unwrap();

    let publishers = Publishers::start(&server, "ledger", 4);
    publishers.until_more(200).await;
    cluster.kill_master(master).await;
    if min_replicas_acked == 0 {
        publishers.until_more(200).await;
    } else {
        // The promoted replica has no replica of its own: no capture can be confirmed,
        // nor an event kept in a history.
        let mut client = server.client().await;
        let err = client.publish(event("ledger.x", "alone")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        // (Once the instance publishes to the promoted master: right after the
        // failover a publish may fail on its way there.)
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let err = client.publish(event("ledger", "kept alone")).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
            if err.message().contains("min_replicas_acked") {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{err:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let answered = publishers.finish().await;

    let mut consumer = attach(server.endpoint(), name, 1000).await.unwrap();
    let seen = drain_consumer(&mut consumer, &answered).await;
    let lost = answered.iter().filter(|p| !seen.contains_key(*p)).count();
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "min_replicas_acked {min_replicas_acked}: {} publishes answered OK, {lost} of them lost, {twice} delivered more than once",
        answered.len()
    );
    Some((answered.len(), lost, twice))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_acked_a_master_kill_loses_no_durable_publish_answered_ok() {
    let Some((answered, lost, _)) = durable_publishes_across_a_master_kill(1).await else { return };
    assert!(answered >= 200);
    assert_eq!(lost, 0, "publishes answered OK were lost with the master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_min_replicas_acked_a_master_kill_may_lose_what_the_replica_had_not_yet() {
    // Asynchronous replication: what the master acknowledged in its last moments may
    // not have reached the replica. The count is reported, not asserted (it is
    // usually 0 on loopback, where the replica is microseconds behind).
    let Some((answered, lost, _)) = durable_publishes_across_a_master_kill(0).await else { return };
    assert!(answered >= 400);
    assert!(lost < answered, "the consumer received nothing after the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_consumer_loses_nothing_while_its_slot_migrates() {
    let Some(cluster) = RedisCluster::start().await else { return };
    // Created and consumed through one instance, published through another.
    let server = cluster_broker(&cluster, |_| {}).await;
    let other = cluster_broker(&cluster, |_| {}).await;
    let name = name_in_first_slots(&cluster, "moving").await;
    let req = pb::CreateConsumerRequest { config: Some(consumer(&name, &["moving.>"])) };
    within(server.admin().await.create_consumer(req)).await.unwrap();
    let mut attached = attach(server.endpoint(), &name, 1000).await.unwrap();

    let publishers = Publishers::start(&other, "moving", 4);
    publishers.until_more(100).await;
    let from = cluster.owner_of(cluster.slot_of(&name).await).await;
    let to = cluster.masters().await.into_iter().map(|m| m.port).find(|p| *p != from).unwrap();
    let id = |port: u16| {
        let node = cluster.nodes.iter().find(|n| n.port == port).unwrap();
        async move { redis::cmd("CLUSTER").arg("MYID").query_async::<String>(&mut node.conn().await).await.unwrap() }
    };
    let (from_id, to_id) = (id(from).await, id(to).await);
    let cli = common::redis_server::which_redis().unwrap().with_file_name("redis-cli");
    let out = tokio::process::Command::new(cli)
        .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
        .args(["--cluster-from", &from_id, "--cluster-to", &to_id, "--cluster-slots", "128", "--cluster-yes"])
        .output();
    let out = within(out).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cluster.wait_ok().await;
    assert_eq!(cluster.owner_of(cluster.slot_of(&name).await).await, to, "the consumer's slot moved");
    publishers.until_more(100).await;
    let answered = publishers.finish().await;

    let seen = drain_consumer(&mut attached, &answered).await;
    let lost: Vec<&String> = answered.iter().filter(|p| !seen.contains_key(*p)).collect();
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "slot migration: {} publishes answered OK, {} lost, {twice} delivered more than once",
        answered.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "{} publishes answered OK never came: {:?}", lost.len(), &lost[..lost.len().min(5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_a_publish_that_reached_some_shards_completes_it_and_duplicates_nothing() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let server = cluster_broker(&cluster, |s| s.eventbus.redis.replica_ack_timeout_ms = 200).await;
    // Two consumers of one channel, their keys on two masters.
    let left = "left0".to_owned();
    let left_master = cluster.owner_of(cluster.slot_of(&left).await).await;
    let mut right = String::new();
    for i in 0.. {
        right = format!("right{i}");
        if cluster.owner_of(cluster.slot_of(&right).await).await != left_master {
            break;
        }
    }
    let mut admin = server.admin().await;
    for name in [&left, &right] {
        let req = pb::CreateConsumerRequest { config: Some(consumer(name, &["pay.*"])) };
        within(admin.create_consumer(req)).await.unwrap();
    }
    let publish = pb::PublishRequest { idempotency_key: "pay-17".into(), ..event("pay.in", "17") };

    // The right consumer's master refuses writes: the publish reaches the left one only.
    let right_master = cluster.owner_of(cluster.slot_of(&right).await).await;
    let node = cluster.nodes.iter().find(|n| n.port == right_master).unwrap();
    let refuse = |n: u32| {
        let node = &node;
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("min-replicas-to-write")
                .arg(n)
                .query_async(&mut node.conn().await)
                .await
                .unwrap();
        }
    };
    refuse(5).await;
    let err = server.client().await.publish(publish.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    refuse(0).await;
    for (name, holds) in [(&left, 1), (&right, 0)] {
        let info = within(admin.get_consumer(pb::GetConsumerRequest { name: name.clone() })).await.unwrap();
        assert_eq!(info.into_inner().pending, holds, "{name} after the partial failure");
    }

    // The retry: answered as the first publish, stored for the right consumer only.
    let answer = within(server.client().await.publish(publish)).await.unwrap().into_inner();
    assert!(answer.duplicate, "{answer:?}");
    for name in [&left, &right] {
        let mut attached = attach(server.endpoint(), name, 10).await.unwrap();
        let got = attached.deliveries(1).await;
        assert_eq!(got[0].event.as_ref().unwrap().id, answer.event_id, "{name}");
        let info = within(admin.get_consumer(pb::GetConsumerRequest { name: name.clone() })).await.unwrap();
        let info = info.into_inner();
        assert_eq!(info.pending + info.in_flight, 1, "{name} holds the event once: {info:?}");
    }
}

/// A consumer name whose keys, and whose first token's shard channel, are on a master
/// `pred` accepts (by its port).
async fn name_on(cluster: &RedisCluster, stem: &str, pred: impl Fn(u16) -> bool) -> String {
    let shards = eventbus_redis::cluster::shard_channels("socle:eventbus");
    for i in 0.. {
        let name = format!("{stem}{i}");
        let slot = cluster.slot_of(&name).await;
        let shard = cluster.slot_of(&shards[usize::from(slot / 128)]).await;
        if pred(cluster.owner_of(slot).await) && pred(cluster.owner_of(shard).await) {
            return name;
        }
    }
    unreachable!()
}

/// Lists, creates, pauses, redrives and deletes consumers through `server`, each at
/// the first try; `fresh` is created and deleted, `existing` paused and redriven. (The
/// list first: it starts with a transaction on the definitions' slot, where the others
/// start with a script.)
async fn admin_calls_succeed(server: &TestServer, fresh: &str, existing: &str, when: &str) {
    let mut admin = server.admin().await;
    let listed = within(admin.list_consumers(pb::ListConsumersRequest::default())).await;
    listed.unwrap_or_else(|e| panic!("list {when}: {e:?}"));
    let create = pb::CreateConsumerRequest { config: Some(consumer(fresh, &[&format!("{fresh}.>")])) };
    within(admin.create_consumer(create)).await.unwrap_or_else(|e| panic!("create {when}: {e:?}"));
    let known = within(admin.get_consumer(pb::GetConsumerRequest { name: fresh.to_owned() })).await;
    known.unwrap_or_else(|e| panic!("get {when}: {e:?}"));
    let paused = within(admin.pause_consumer(pb::PauseConsumerRequest { name: existing.to_owned() })).await;
    assert!(paused.unwrap_or_else(|e| panic!("pause {when}: {e:?}")).into_inner().paused);
    let resumed = within(admin.resume_consumer(pb::ResumeConsumerRequest { name: existing.to_owned() })).await;
    assert!(!resumed.unwrap_or_else(|e| panic!("resume {when}: {e:?}")).into_inner().paused);
    let redrive = pb::RedriveRequest { consumer: existing.to_owned(), ..Default::default() };
    within(admin.redrive_dead_letters(redrive)).await.unwrap_or_else(|e| panic!("redrive {when}: {e:?}"));
    let delete = pb::DeleteConsumerRequest { name: fresh.to_owned() };
    within(admin.delete_consumer(delete)).await.unwrap_or_else(|e| panic!("delete {when}: {e:?}"));
    let listed = within(admin.list_consumers(pb::ListConsumersRequest::default())).await;
    let listed = listed.unwrap_or_else(|e| panic!("list {when}: {e:?}")).into_inner();
    assert!(listed.consumers.iter().all(|c| c.config.as_ref().unwrap().name != fresh), "{fresh} deleted {when}");
}

/// The slot of the consumer definitions (`{durable}`) moves to another master, whose
/// master is then killed (-9) under publishers whose consumers live on a third one.
/// Those publishes go on while the slot has no master, with the definitions each
/// instance holds, and so do the deliveries to an attached client; after the move, and again once a replica took over, an instance that
/// has not touched the slot since (its slot map is stale) lists, creates, pauses,
/// redrives and deletes consumers at the first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_definitions_slot_moving_or_failing_over_stops_no_publish_and_no_admin_call() {
    let Some(mut cluster) = RedisCluster::start().await else { return };
    let a = cluster_broker(&cluster, |_| {}).await;
    let b = cluster_broker(&cluster, |_| {}).await;
    let definitions_slot = cluster.slot_of("socle:eventbus:{durable}:version").await;
    let first = cluster.owner_of(definitions_slot).await;
    let others: Vec<u16> = cluster.masters().await.iter().map(|m| m.port).filter(|p| *p != first).collect();
    let (moved_to, elsewhere) = (others[0], others[1]);
    let near = name_on(&cluster, "near", |m| m == moved_to).await;
    let far = name_on(&cluster, "far", |m| m == elsewhere).await;
    let mut admin_a = a.admin().await;
    for name in [&near, &far] {
        let req = pb::CreateConsumerRequest { config: Some(consumer(name, &[&format!("{name}.>")])) };
        within(admin_a.create_consumer(req)).await.unwrap();
    }
    // b knows both (and has read the definitions' slot) before the slot moves.
    let listed = within(b.admin().await.list_consumers(pb::ListConsumersRequest::default())).await.unwrap();
    assert_eq!(listed.into_inner().consumers.len(), 2);

    // b's first call after the move starts with a transaction its stale map sends to
    // the old owner, which answers MOVED.
    cluster.move_slot(definitions_slot, moved_to).await;
    admin_calls_succeed(&b, "fresh", &near, "after the slot moved").await;

    // kill -9 of the definitions' (and `near`'s) master under publishers to `far`,
    // whose client stays attached.
    let mut attached = attach(a.endpoint(), &far, 1000).await.unwrap();
    let publishers = Publishers::start(&a, &far, 2);
    publishers.until_more(50).await;
    let replicas = cluster.kill_master_now(moved_to).await;
    let mut client = a.client().await;
    for i in 0..3 {
        let answer = within(client.publish(event(&format!("{far}.x"), format!("outage-{i}")))).await;
        assert!(answer.is_ok(), "a publish while the definitions' slot has no master: {answer:?}");
    }
    cluster.wait_promoted(replicas).await;
    publishers.until_more(50).await;
    let mut answered = publishers.finish().await;
    answered.extend((0..3).map(|i| format!("outage-{i}")));
    let seen = drain_consumer(&mut attached, &answered).await;
    let lost: Vec<&String> = answered.iter().filter(|p| !seen.contains_key(*p)).collect();
    assert!(lost.is_empty(), "{} publishes answered OK never came: {:?}", lost.len(), &lost[..lost.len().min(5)]);
    admin_calls_succeed(&b, "fresher", &near, "after a master was killed").await;
}

/// A durable publish on a cluster is stored and sent to subscribers together: each
/// event reaches the consumer and a subscriber once, each channel's in publish order,
/// its answer counts both, and the retry of one with an idempotency key (a duplicate)
/// reaches no subscriber again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_publish_reaches_its_consumer_and_subscribers_once_in_order() {
    let Some(cluster) = RedisCluster::start().await else { return };
    let server = cluster_broker(&cluster, |_| {}).await;
    let req = pb::CreateConsumerRequest { config: Some(consumer("once0", &["once.*"])) };
    within(server.admin().await.create_consumer(req)).await.unwrap();
    let mut subscriber = server.subscribe(sub(&["once.>"])).await;
    let mut client = server.client().await;
    let channel = |n: u32| if n.is_multiple_of(2) { "once.even" } else { "once.odd" };
    let events = (1..=20).map(|n| event(channel(n), n.to_string())).collect();
    let results = within(client.publish_batch(pb::PublishBatchRequest { events })).await.unwrap().into_inner();
    let counted = |r: &pb::PublishResponse| r.error.is_none() && r.delivered_count == 1 && r.captured_count == 1;
    assert!(results.results.iter().all(counted), "{results:?}");
    let keyed = pb::PublishRequest { idempotency_key: "once-21".into(), ..event(channel(21), "21") };
    let first = within(client.publish(keyed.clone())).await.unwrap().into_inner();
    let retry = within(client.publish(keyed)).await.unwrap().into_inner();
    assert!(retry.duplicate && retry.event_id == first.event_id, "{retry:?}");
    within(client.publish(event(channel(22), "22"))).await.unwrap();

    let got = subscriber.take(22).await;
    for parity in ["once.even", "once.odd"] {
        let mine: Vec<u32> = got.iter().filter(|e| e.channel == parity).map(|e| payload(e).parse().unwrap()).collect();
        let expected: Vec<u32> = (1..=22).filter(|&n| channel(n) == parity).collect();
        assert_eq!(mine, expected, "{parity}: each once, in publish order");
    }
    let mut attached = attach(server.endpoint(), "once0", 32).await.unwrap();
    let mut stored: Vec<u32> =
        attached.deliveries(22).await.iter().map(|d| payload(d.event.as_ref().unwrap()).parse().unwrap()).collect();
    stored.sort_unstable();
    assert_eq!(stored, (1..=22).collect::<Vec<_>>());
    server.stop().await;
}
