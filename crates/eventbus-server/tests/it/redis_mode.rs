//! Redis mode (docs/redis.md) against a real `redis-server` each test starts on a free port.
//! See `common::redis_server` for what happens without `redis-server`.

use crate::common;

use std::process::{Command, Stdio};

use common::consume::{attach, consumer, ids};
use common::redis_server::*;
use common::*;
use eventbus_proto::pb;
use eventbus_server::config::Mode;
use tonic::Code;

fn payload(e: &pb::Event) -> String {
    String::from_utf8(e.payload.to_vec()).unwrap()
}

#[tokio::test]
async fn two_instances_share_one_fan_out() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    let mut on_a = a.subscribe(sub(&["orders.>"])).await;
    // Overlapping exact channel and pattern: still one copy each.
    let mut on_b = b.subscribe(sub(&["orders.created", "orders.*", "*.created"])).await;

    for (server, name) in [(&a, "A"), (&b, "B")] {
        let reqs: Vec<pb::PublishRequest> = (0..25).map(|i| event("orders.created", format!("{name}-{i}"))).collect();
        let mut client = server.client().await;
        let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
        while let Some(resp) = within(responses.message()).await.unwrap() {
            assert!(resp.delivered_count >= 2, "Redis reached both instances: {resp:?}");
        }
    }
    for s in [&mut on_a, &mut on_b] {
        let got: Vec<String> = s.take(50).await.iter().map(payload).collect();
        for name in ["A", "B"] {
            let mine: Vec<&String> = got.iter().filter(|p| p.starts_with(name)).collect();
            let want: Vec<String> = (0..25).map(|i| format!("{name}-{i}")).collect();
            assert_eq!(mine, want.iter().collect::<Vec<_>>(), "each event once, in per-publisher order");
        }
    }
    // Nothing else arrives: a last event is the next thing both see.
    a.client().await.publish(event("orders.created", "last")).await.unwrap();
    assert_eq!(payload(&on_a.take(1).await[0]), "last");
    assert_eq!(payload(&on_b.take(1).await[0]), "last");

    // Patterns are re-checked with token rules: `orders.*` must not get orders.eu.created.
    b.client().await.publish(event("orders.eu.created", "deep")).await.unwrap();
    b.client().await.publish(event("orders.created", "shallow")).await.unwrap();
    // (Both may arrive in one batch.)
    assert_eq!(on_a.take(2).await.iter().map(payload).collect::<Vec<_>>(), ["deep", "shallow"]);
    assert_eq!(payload(&on_b.take(1).await[0]), "shallow", "orders.eu.created matches none of B's filters");

    let mut admin = a.admin().await;
    let stats = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.mode, "redis");
}

#[tokio::test]
async fn redis_subscriptions_follow_local_demand() {
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker(&redis).await;
    assert_eq!(redis.pubsub().await, (vec![], 0));
    let s1 = a.subscribe(sub(&["jobs.run", "jobs.>"])).await;
    let s2 = a.subscribe(sub(&["jobs.run", "jobs.>"])).await;
    assert_eq!(redis.pubsub().await, (vec!["socle:eventbus:jobs.run".to_owned()], 1), "shared, not per subscriber");
    drop(s1);
    let mut admin = a.admin().await;
    eventually("the first subscription to go", || {
        let mut admin = admin.clone();
        async move { subscription_ids(&mut admin).await.len() == 1 }
    })
    .await;
    assert_eq!(redis.pubsub().await.1, 1, "still needed by the second subscriber");
    drop(s2);
    eventually("Redis subscriptions to be released", || async { redis.pubsub().await == (vec![], 0) }).await;
    assert!(subscription_ids(&mut admin).await.is_empty());
}

#[tokio::test]
async fn foreign_publish_reaches_subscribers_as_raw_payload() {
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker(&redis).await;
    let mut s = a.subscribe(sub(&["orders.*"])).await;
    let mut conn = redis.conn().await;
    let n: i64 = redis::cmd("PUBLISH")
        .arg("socle:eventbus:orders.created")
        .arg(r#"{"id":1}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let e = s.take(1).await.remove(0);
    assert_eq!(e.channel, "orders.created");
    assert_eq!(payload(&e), r#"{"id":1}"#);
    assert_eq!(e.source, "redis");
    assert!(!e.id.is_empty() && e.timestamp.is_some());
}

/// With `eventbus.redis.envelope: json`, a service with nothing but a Redis client reads
/// the events an instance publishes; an instance left on the binary envelope reads them
/// too (a fleet switches one instance at a time).
#[tokio::test]
async fn the_json_envelope_is_readable_by_a_plain_redis_subscriber_and_by_binary_instances() {
    use futures::StreamExt as _;
    let Some(redis) = RedisProc::start().await else { return };
    let json =
        broker_with(&redis, |s| s.eventbus.redis.envelope = eventbus_server::config::EnvelopeSetting::Json).await;
    let binary = broker(&redis).await;
    let mut plain = redis::Client::open(redis.url()).unwrap().get_async_pubsub().await.unwrap();
    plain.subscribe("socle:eventbus:orders.created").await.unwrap();
    let mut on_binary = binary.subscribe(sub(&["orders.*"])).await;

    let mut text = event("orders.created", r#"{"id":1}"#);
    text.content_type = "application/json".into();
    text.metadata.insert("tenant".into(), "acme".into());
    let mut bytes = event("orders.created", "");
    bytes.payload = vec![0xFF, 0x00, 0x80].into();
    let mut client = json.client().await;
    let text_id = client.publish(text).await.unwrap().into_inner().event_id;
    let bytes_id = client.publish(bytes).await.unwrap().into_inner().event_id;

    let mut messages = plain.on_message();
    let mut read = Vec::new();
    for _ in 0..2 {
        let msg = within(messages.next()).await.expect("a message on the plain subscriber");
        let bytes = msg.get_payload_bytes();
        read.push(
            serde_json::from_slice::<serde_json::Value>(bytes)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(bytes))),
        );
    }
    let first = &read[0];
    assert_eq!(first["eventbus"], 1);
    assert_eq!(first["id"], text_id.as_str());
    assert_eq!(first["channel"], "orders.created");
    assert_eq!(first["payload"], r#"{"id":1}"#);
    assert_eq!(first["content_type"], "application/json");
    assert_eq!(first["metadata"], serde_json::json!({"tenant": "acme"}));
    assert!(first["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{first}");
    assert_eq!((read[1]["id"].as_str(), read[1]["payload_base64"].as_str()), (Some(bytes_id.as_str()), Some("/wCA")));

    let got = on_binary.take(2).await;
    assert_eq!((got[0].id.as_str(), payload(&got[0]).as_str()), (text_id.as_str(), r#"{"id":1}"#));
    assert_eq!(
        (got[0].content_type.as_str(), got[0].metadata.get("tenant").map(String::as_str)),
        ("application/json", Some("acme"))
    );
    assert_eq!((got[1].id.as_str(), got[1].payload.as_ref()), (bytes_id.as_str(), &[0xFF, 0x00, 0x80][..]));
}

#[tokio::test]
async fn redis_outage_ends_streams_and_fails_publishes_then_recovers() {
    let Some(mut redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    let mut s = a.subscribe(sub(&["live.>"])).await;
    b.client().await.publish(event("live.x", "before")).await.unwrap();
    assert_eq!(payload(&s.take(1).await[0]), "before");

    redis.kill();
    wait_ready(&a, false).await;
    // Events published through b meanwhile could not reach a: its stream says so.
    assert!(s.until_interrupted().await.is_empty());
    let err = b.client().await.publish(event("live.x", "lost")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().to_lowercase().contains("redis"), "{}", err.message());
    let metrics = reqwest::get(a.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("socle_eventbus_redis_connected 0"), "{metrics}");

    redis.spawn().await;
    wait_ready(&a, true).await;
    wait_ready(&b, true).await;
    let mut s = a.subscribe(sub(&["live.>"])).await;
    b.client().await.publish(event("live.x", "after")).await.unwrap();
    assert_eq!(payload(&s.take(1).await[0]), "after", "a stream opened again gets new events");
    let metrics = reqwest::get(a.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("socle_eventbus_redis_connected 1"), "{metrics}");
    assert!(metrics.contains("socle_eventbus_redis_reconnects_total 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_turns_readiness_off_and_fails_publishes_fast() {
    let Some(redis) = RedisProc::start().await else { return };
    let a = broker(&redis).await;
    let mut client = a.client().await;
    let mut s = a.subscribe(sub(&["hung.*"])).await;
    client.publish(event("hung.x", "before")).await.unwrap();
    assert_eq!(payload(&s.take(1).await[0]), "before");

    // Stopped, not dead: its sockets stay open and nothing answers.
    redis.signal("STOP");
    let stopped = std::time::Instant::now();
    wait_ready(&a, false).await;
    assert!(stopped.elapsed() < std::time::Duration::from_secs(5), "noticed after {:?}", stopped.elapsed());
    let body = reqwest::get(a.url("/readyz")).await.unwrap().text().await.unwrap();
    assert!(body.contains("not answering"), "{body}");
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = client.publish(event("hung.x", "during")).await.unwrap_err();
        // Fast: not after a command timeout (a correctness property, so a loose bound).
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "took {:?}", started.elapsed());
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err.message().contains("redis") && err.message().contains("not answering"), "{}", err.message());
    }
    let metrics = reqwest::get(a.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("socle_eventbus_redis_connected 0"), "{metrics}");
    // Events may be missed while Redis is away: the stream says so.
    assert!(s.until_interrupted().await.is_empty());
    // Subscribing meanwhile works; such a stream ends too once Redis answers again.
    let mut late = a.subscribe(sub(&["late.*"])).await;

    redis.signal("CONT");
    wait_ready(&a, true).await;
    assert!(late.until_interrupted().await.is_empty());
    let mut s = a.subscribe(sub(&["hung.*", "late.*"])).await;
    client.publish(event("hung.x", "after")).await.unwrap();
    assert_eq!(payload(&s.take(1).await[0]), "after");
    client.publish(event("late.x", "late")).await.unwrap();
    assert_eq!(payload(&s.take(1).await[0]), "late");
}

#[tokio::test]
async fn starts_while_redis_is_down_and_connects_when_it_comes_up() {
    let Some(mut redis) = RedisProc::reserve() else {
        RedisProc::start().await; // prints the notice, or fails when Redis is required
        return;
    };
    let port = redis.port;
    let a = start_with(|s| {
        s.eventbus.mode = Mode::Redis;
        s.eventbus.redis.url = format!("redis://127.0.0.1:{port}/0");
    })
    .await;
    assert!(!ready(&a).await, "not ready without Redis");
    let mut health = tonic_health::pb::health_client::HealthClient::new(a.channel().await);
    let check = || tonic_health::pb::HealthCheckRequest { service: String::new() };
    let status = health.check(check()).await.unwrap().into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::NotServing as i32);
    let err = a.client().await.publish(event("x", "y")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // Subscribing works meanwhile; the stream ends once connected (events published
    // elsewhere before could not reach it), and one opened then is served.
    let mut early = a.subscribe(sub(&["late.*"])).await;

    redis.spawn().await;
    wait_ready(&a, true).await;
    assert!(early.until_interrupted().await.is_empty());
    let mut s = a.subscribe(sub(&["late.*"])).await;
    let status = health.check(check()).await.unwrap().into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    let resp = a.client().await.publish(event("late.x", "hello")).await.unwrap().into_inner();
    assert_eq!(resp.delivered_count, 1);
    assert_eq!(payload(&s.take(1).await[0]), "hello");
}

/// Runs a command that must succeed (certificate generation).
fn sh(dir: &std::path::Path, program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).current_dir(dir).stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(status.is_ok_and(|s| s.success()), "{program} {args:?} failed");
}

#[tokio::test]
async fn rediss_with_a_private_ca() {
    let Some(mut redis) = RedisProc::reserve() else {
        RedisProc::start().await; // prints the notice, or fails when Redis is required
        return;
    };
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    sh(
        dir,
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=eventbus test CA",
        ],
    );
    sh(
        dir,
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    sh(
        dir,
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.cnf",
        ],
    );
    let path = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    let tls_port = redis.port;
    redis.port = 0; // plain TCP off
    redis.extra = vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ];
    redis.spawn().await;

    let ca = path("ca.crt");
    let server = start_with(|s| {
        s.eventbus.mode = Mode::Redis;
        s.eventbus.redis.url = format!("rediss://127.0.0.1:{tls_port}/");
        s.eventbus.redis.tls_ca_file = ca;
    })
    .await;
    wait_ready(&server, true).await;
    let mut sub = server.subscribe(sub(&["tls.*"])).await;
    let resp = server.client().await.publish(event("tls.hello", "over TLS")).await.unwrap().into_inner();
    assert_eq!(resp.delivered_count, 1);
    assert_eq!(payload(&sub.take(1).await[0]), "over TLS");
}

#[tokio::test]
async fn an_acl_user_logs_in_and_a_refused_password_stops_start_up() {
    let Some(redis) = RedisProc::start_acl("eventbus", "s3cret").await else { return };
    let server = broker_with(&redis, |s| {
        s.eventbus.redis.username = "eventbus".into();
        s.eventbus.redis.password = "s3cret".into();
    })
    .await;
    let mut s = server.subscribe(sub(&["acl.*"])).await;
    let resp = server.client().await.publish(event("acl.x", "as eventbus")).await.unwrap().into_inner();
    assert_eq!(resp.delivered_count, 1);
    assert_eq!(payload(&s.take(1).await[0]), "as eventbus");
    let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut redis.conn().await).await.unwrap();
    assert!(clients.lines().filter(|l| l.contains(" user=eventbus ")).count() >= 3, "the broker's own: {clients}");

    let dir = tempfile::tempdir().unwrap();
    let daemon = |password: &str| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_eventbusd"));
        cmd.args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--mode", "redis"])
            .env("EVENTBUS__EVENTBUS__REDIS__HOST", "127.0.0.1")
            .env("EVENTBUS__EVENTBUS__REDIS__PORT", redis.port.to_string())
            .env("EVENTBUS__EVENTBUS__REDIS__USERNAME", "eventbus")
            .env("EVENTBUS__EVENTBUS__REDIS__PASSWORD", password)
            .env_remove("RUST_LOG")
            .current_dir(dir.path())
            .kill_on_drop(true);
        cmd
    };
    let out = within(daemon("wrong-one").output()).await.unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("eventbusd: Redis at 127.0.0.1:{}/0 refused the credentials", redis.port))
            && stderr.contains("eventbus.redis.username")
            && !stderr.contains("wrong-one"),
        "{stderr}"
    );

    // Username without a password: a configuration error, before any connection.
    let mut cmd = daemon("");
    cmd.env_remove("EVENTBUS__EVENTBUS__REDIS__PASSWORD");
    let out = within(cmd.output()).await.unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("eventbus.redis.username") && stderr.contains("needs eventbus.redis.password"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_members_on_two_instances_gets_each_event_once() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    a_group_spans_the_instances(&a, &b).await;
}

/// A consumer's read connection that dies without a word (no FIN) is found by the
/// read's response timeout: the client's stream ends `UNAVAILABLE`, and attached again
/// it gets what was published meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_connection_that_dies_silently_is_found_and_its_events_still_come() {
    let Some(redis) = RedisProc::start().await else { return };
    let proxy = RedisProxy::start(&redis).await;
    let a = broker_with(&redis, |s| s.eventbus.redis.port = proxy.port).await;
    let create = pb::CreateConsumerRequest { config: Some(consumer("quiet", &["quiet.>"])) };
    within(a.admin().await.create_consumer(create)).await.unwrap();
    let mut attached = attach(a.endpoint(), "quiet", 0).await.unwrap();
    proxy.silence(blocked_client(&redis, "xreadgroup").await);
    within(a.client().await.publish(event("quiet.x", "meanwhile"))).await.unwrap();

    // A read blocks 10 s at most, and is answered within 5 s more.
    let end = tokio::time::timeout(std::time::Duration::from_secs(30), attached.responses.message()).await;
    let end = end.expect("the silent read connection was never noticed");
    assert_eq!(end.err().map(|s| s.code()), Some(Code::Unavailable), "the client is told to reconnect");
    let mut attached = attach(a.endpoint(), "quiet", 0).await.unwrap();
    let got = attached.deliveries(1).await;
    assert_eq!(payload(got[0].event.as_ref().unwrap()), "meanwhile");
}

/// Events a client hands back unstarted go to whichever client has room, on any
/// instance: here the other client on their instance is busy, and a client on another
/// instance takes them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_events_reach_a_client_with_room_on_another_instance() {
    use eventbus_proto::pb::{consume_request, consume_response};
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    let create = pb::CreateConsumerRequest { config: Some(consumer("handed", &["handed.>"])) };
    within(a.admin().await.create_consumer(create)).await.unwrap();
    let mut client = a.client().await;
    // On a: one client holding an event (no room left), one holding two.
    let mut busy = attach(a.endpoint(), "handed", 1).await.unwrap();
    within(client.publish(event("handed.x", "busy"))).await.unwrap();
    assert_eq!(payload(busy.deliveries(1).await[0].event.as_ref().unwrap()), "busy");
    let mut stopping = attach(a.endpoint(), "handed", 2).await.unwrap();
    for p in ["one", "two"] {
        within(client.publish(event("handed.x", p))).await.unwrap();
    }
    let held = stopping.deliveries(2).await;
    let mut elsewhere = attach(b.endpoint(), "handed", 10).await.unwrap();

    stopping.send(consume_request::Kind::Release(pb::Release { event_ids: ids(&held), drain: true })).await;
    assert!(matches!(
        within(stopping.responses.message()).await.unwrap(),
        Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Drained(_)) })
    ));
    let mut got: Vec<String> =
        elsewhere.deliveries(2).await.iter().map(|d| payload(d.event.as_ref().unwrap())).collect();
    got.sort();
    assert_eq!(got, ["one", "two"], "the released events, at once, on the other instance");
    let info = within(a.admin().await.get_consumer(pb::GetConsumerRequest { name: "handed".into() })).await;
    assert_eq!(info.unwrap().into_inner().redelivered, 0, "a release counts no attempt");
}
