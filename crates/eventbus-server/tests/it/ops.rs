//! The operations surface (docs/operations.md): Prometheus metrics, admin REST, probes, gRPC
//! health and reflection — real server, real HTTP and gRPC clients.

use crate::common;

use std::collections::HashSet;

use common::*;
use eventbus_proto::pb;
use prometheus_parse::{Scrape, Value};
use reqwest::StatusCode;
use serde_json::{Value as Json, json};
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

/// Fetches and parses the whole exposition; a malformed line fails the test.
async fn scrape(server: &TestServer) -> Scrape {
    let resp = within(reqwest::get(server.url("/metrics"))).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = resp.text().await.unwrap();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("malformed sample line {line:?}"));
        assert!(value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value), "{line}");
        assert!(!name.is_empty());
    }
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("valid Prometheus text format")
}

/// A counter or gauge sample (0 when absent, as Prometheus treats a new series).
fn sample(scrape: &Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => panic!("{name} is not a counter or gauge"),
        })
        .sum()
}

fn histogram_count(scrape: &Scrape, name: &str) -> f64 {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .map(|s| match &s.value {
            Value::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            _ => panic!("{name} is not a histogram"),
        })
        .unwrap_or(0.0)
}

const P: &str = "socle_eventbus";

#[tokio::test]
async fn metrics_move_exactly_with_traffic() {
    let server = start().await;
    let mut reader = server.subscribe(sub(&["m.a"])).await;
    let before = scrape(&server).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        client.publish(event("m.a", &b"1"[..])).await.unwrap();
    }
    for _ in 0..2 {
        client.publish(event("m.b", &b"2"[..])).await.unwrap();
    }
    reader.take(3).await;
    let after = scrape(&server).await;
    let delta = |name: &str, channel: &str| {
        let n = format!("{P}_{name}");
        sample(&after, &n, Some(("channel", channel))) - sample(&before, &n, Some(("channel", channel)))
    };
    assert_eq!(delta("published_total", "m.a"), 3.0);
    assert_eq!(delta("published_total", "m.b"), 2.0);
    assert_eq!(delta("delivered_total", "m.a"), 3.0);
    assert_eq!(delta("delivered_total", "m.b"), 0.0);
    assert_eq!(delta("failed_total", "m.a") + delta("dropped_total", "m.a"), 0.0);
    assert_eq!(sample(&after, &format!("{P}_subscriptions_active"), None), 1.0);
    let publishes = |s: &Scrape| histogram_count(s, &format!("{P}_publish_duration_seconds"));
    assert_eq!(publishes(&after) - publishes(&before), 5.0);
    assert_eq!(histogram_count(&after, &format!("{P}_delivery_latency_seconds")), 3.0);
    assert!(sample(&after, "process_resident_memory_bytes", None) > 0.0, "process metrics are exported");
    server.stop().await;
}

#[tokio::test]
async fn queue_gauges_and_drops_show_a_stuck_consumer() {
    let server = start_with(|s| s.eventbus.offer_timeout_ms = 20).await;
    let slow = slow_subscriber(&server, "q.>", pb::OverflowPolicy::DropNewest, 4).await;
    let mut client = server.client().await;
    let mut refused = false;
    for _ in 0..500 {
        let resp = client.publish(event("q.x", vec![0u8; 32 * 1024])).await.unwrap().into_inner();
        if resp.failed_count == 1 {
            refused = true;
            break;
        }
    }
    assert!(refused, "the queue never filled");
    let m = scrape(&server).await;
    let by_sub = Some(("subscription", slow.id.as_str()));
    assert_eq!(sample(&m, &format!("{P}_queue_size"), by_sub), 4.0, "paused consumer: queue full");
    assert_eq!(sample(&m, &format!("{P}_queue_capacity"), by_sub), 4.0);
    assert_eq!(sample(&m, &format!("{P}_dropped_total"), Some(("channel", "q.x"))), 1.0);
    assert_eq!(sample(&m, &format!("{P}_failed_total"), Some(("channel", "q.x"))), 1.0);
    drop(slow);
    server.stop().await;
}

#[tokio::test]
async fn channel_labels_are_capped() {
    let server = start_with(|s| s.eventbus.metrics.max_channel_labels = 1000).await;
    let mut client = server.client().await;
    let reqs: Vec<pb::PublishRequest> = (0..5000).map(|i| event(&format!("flood.{i}"), &b""[..])).collect();
    let mut responses = client.publish_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut n = 0;
    while within(responses.message()).await.unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 5000);
    let m = scrape(&server).await;
    let name = format!("{P}_published_total");
    let labels: HashSet<&str> =
        m.samples.iter().filter(|s| s.metric == name).filter_map(|s| s.labels.get("channel")).collect();
    assert!(labels.len() <= 1001, "{} label values", labels.len());
    assert_eq!(sample(&m, &name, None), 5000.0, "nothing lost by folding");
    assert_eq!(sample(&m, &name, Some(("channel", "_other"))), 4000.0);
    server.stop().await;
}

#[tokio::test]
async fn metrics_can_be_turned_off() {
    let server = start_with(|s| s.eventbus.metrics.enabled = false).await;
    let resp = reqwest::get(server.url("/metrics")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.json::<Json>().await.unwrap()["error"].as_str().unwrap().contains("disabled"));
    assert_eq!(reqwest::get(server.url("/healthz")).await.unwrap().status(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn admin_rest_routes_and_their_errors() {
    let server = start_with(|s| s.eventbus.max_payload_bytes = 64).await;
    let http = reqwest::Client::new();
    let mut reader = server.subscribe(pb::SubscribeRequest { name: "rest".into(), ..sub(&["rest.>"]) }).await;

    // Publish through REST: same validation as gRPC, payload stored as JSON.
    let resp = http
        .post(server.url("/admin/eventbus/publish"))
        .json(&json!({"channel": "rest.created", "payload": {"id": 1}, "metadata": {"k": "v"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Json = resp.json().await.unwrap();
    assert_eq!(body["delivered_count"], 1);
    let got = reader.take(1).await.remove(0);
    assert_eq!(got.id, body["event_id"].as_str().unwrap());
    assert_eq!(got.payload.as_ref(), br#"{"id":1}"#);
    assert_eq!(got.content_type, "application/json");
    assert_eq!(got.metadata["k"], "v");

    let post = |body: &'static str| {
        let http = http.clone();
        let url = server.url("/admin/eventbus/publish");
        async move {
            let resp = http.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
            let status = resp.status();
            (status, resp.json::<Json>().await.unwrap()["error"].as_str().unwrap_or_default().to_owned())
        }
    };
    let (status, error) = post("{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error.contains("invalid JSON"), "{error}");
    let (status, error) = post(r#"{"payload": 1}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error.contains("channel"), "{error}");
    let (status, error) = post(r#"{"channel": "rest.*"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error.contains("rest.*"), "{error}");
    let (status, error) = post(
        r#"{"channel": "rest.big", "payload": "0123456789012345678901234567890123456789012345678901234567890123"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error.contains("64"), "{error}");

    let stats: Json = http.get(server.url("/admin/eventbus/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!((stats["total_published"].as_u64(), stats["active_subscriptions"].as_u64()), (Some(1), Some(1)));
    assert_eq!(stats["mode"], "in_memory");
    let channels: Json = http.get(server.url("/admin/eventbus/channels")).send().await.unwrap().json().await.unwrap();
    assert_eq!(channels["channels"][0]["channel"], "rest.created");
    assert_eq!(channels["channels"][0]["subscriber_count"], 1);
    let subs: Json = http.get(server.url("/admin/eventbus/subscriptions")).send().await.unwrap().json().await.unwrap();
    assert_eq!(subs["subscriptions"][0]["id"], reader.id.as_str());
    assert_eq!(subs["subscriptions"][0]["name"], "rest");
    assert_eq!(subs["subscriptions"][0]["overflow"], "drop_newest");

    // DELETE ends the stream with OK; a second DELETE is a 404.
    let url = server.url(&format!("/admin/eventbus/subscriptions/{}", reader.id));
    assert_eq!(http.delete(&url).send().await.unwrap().status(), StatusCode::NO_CONTENT);
    assert!(reader.until_end().await.1.is_none());
    let resp = http.delete(&url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.json::<Json>().await.unwrap()["error"].as_str().unwrap().contains(&reader.id));

    let resp = http.put(server.url("/admin/eventbus/stats")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let resp = http.get(server.url("/admin/eventbus/publish")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let resp = http.get(server.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.json::<Json>().await.unwrap()["error"].is_string());
    server.stop().await;
}

async fn health_of(server: &TestServer, service: &str) -> ServingStatus {
    let mut health = HealthClient::new(server.channel().await);
    let resp = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
    ServingStatus::try_from(resp.status).unwrap()
}

#[tokio::test]
async fn readiness_and_health_flip_when_shutdown_begins() {
    let server = start().await;
    assert_eq!(reqwest::get(server.url("/readyz")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(health_of(&server, "").await, ServingStatus::Serving);
    assert_eq!(health_of(&server, "eventbus.v1.EventBus").await, ServingStatus::Serving);
    assert_eq!(health_of(&server, "eventbus.v1.Admin").await, ServingStatus::Serving);

    // A consumer with queued events keeps the drain (and the listeners) going.
    let mut slow = slow_subscriber(&server, "r.>", pb::OverflowPolicy::DropNewest, 100).await;
    let mut client = server.client().await;
    for _ in 0..10 {
        client.publish(event("r.x", vec![0u8; 32 * 1024])).await.unwrap();
    }
    server.shutdown.cancel();
    eventually("/readyz to answer 503", || async {
        reqwest::get(server.url("/readyz")).await.unwrap().status() == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert_eq!(reqwest::get(server.url("/healthz")).await.unwrap().status(), StatusCode::OK, "still alive");
    assert_eq!(health_of(&server, "").await, ServingStatus::NotServing);
    let (events, status) = slow.until_end().await;
    assert_eq!(events.len(), 10);
    assert_eq!(status.map(|s| s.code()), Some(Code::Unavailable));
    within(server.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = start().await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let resp = within(responses.message()).await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else { panic!("{resp:?}") };
    let names: HashSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for wanted in ["eventbus.v1.EventBus", "eventbus.v1.Admin", "grpc.health.v1.Health"] {
        assert!(names.contains(wanted), "{wanted} missing from {names:?}");
    }
    server.stop().await;
}

/// `server.reflection: false` hides the schema (docs/configuration.md).
#[tokio::test]
async fn reflection_can_be_turned_off() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let server = start_with(|s| s.server.reflection = false).await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let refused = client.server_reflection_info(tokio_stream::iter([req])).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
    server.stop().await;
}

/// Names of every metric family the server exports (histogram series included).
async fn exported_names(server: &TestServer) -> HashSet<String> {
    let text = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn grafana_dashboard_uses_only_exported_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana/eventbus-dashboard.json");
    let dashboard: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON");
    assert!(dashboard["title"].is_string() && dashboard["panels"].is_array());

    // Every family present: traffic, a subscription, a delivery, a durable consumer.
    let server = start().await;
    let consumer = pb::ConsumerConfig { name: "dash".into(), channels: vec!["d.>".into()], ..Default::default() };
    server.admin().await.create_consumer(pb::CreateConsumerRequest { config: Some(consumer) }).await.unwrap();
    let mut reader = server.subscribe(sub(&["d.x"])).await;
    server.client().await.publish(event("d.x", &b""[..])).await.unwrap();
    reader.take(1).await;
    let exported = exported_names(&server).await;

    // The edge counters have a series only once something was refused or failed, which
    // this server never does. tests/security.rs sees the first two in the exposition;
    // the TLS and accept counters are named in src/metrics.rs (EdgeCounters).
    let counted_once_they_happen = [
        format!("{P}_auth_failures_total"),
        format!("{P}_permission_denied_total"),
        format!("{P}_tls_handshake_failures_total"),
        format!("{P}_accept_errors_total"),
    ];

    let mut used = HashSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(panel["title"].is_string());
        if panel["type"] == "row" {
            continue;
        }
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("socle_eventbus_") || word.starts_with("process_") {
                    assert!(
                        exported.contains(word) || counted_once_they_happen.iter().any(|name| name == word),
                        "panel {} uses {word}, which is not exported",
                        panel["title"]
                    );
                    used.insert(word.to_owned());
                }
            }
        }
    }
    for name in &counted_once_they_happen {
        assert!(used.contains(name), "no panel shows {name}");
    }
    for family in ["published_total", "delivered_total", "dropped_total", "subscriptions_active", "queue_size"] {
        assert!(used.contains(&format!("{P}_{family}")), "no panel shows {family}");
    }
    assert!(used.contains(&format!("{P}_delivery_latency_seconds_bucket")), "no latency quantile panel");
    for family in ["consumer_pending", "consumer_paused", "consumer_redriven_total"] {
        assert!(used.contains(&format!("{P}_{family}")), "no panel shows {family}");
    }
    server.stop().await;
}

#[test]
fn prometheus_config_scrapes_the_metrics_port() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/prometheus.yml");
    let text = std::fs::read_to_string(path).expect("deploy/prometheus.yml");
    let config: serde_norway::Value = serde_norway::from_str(&text).expect("valid YAML");
    let job = &config["scrape_configs"][0];
    assert_eq!(job["job_name"].as_str(), Some("eventbusd"));
    assert_eq!(job["metrics_path"].as_str(), Some("/metrics"));
    let http_port = eventbus_server::Settings::default().server.http_addr.port();
    let targets = job["static_configs"][0]["targets"].as_sequence().expect("a list of targets");
    assert!(!targets.is_empty());
    for target in targets {
        let target = target.as_str().expect("a target is a string");
        assert!(target.ends_with(&format!(":{http_port}")), "{target} is not the metrics port {http_port}");
    }
}

/// A background task that stops while the daemon serves turns liveness,
/// readiness and gRPC health off, with the task named, instead of failing silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_background_task_turns_health_and_readiness_off() {
    let server = start().await;
    assert_eq!(health_of(&server, "").await, ServingStatus::Serving);
    assert_eq!(reqwest::get(server.url("/readyz")).await.unwrap().status(), StatusCode::OK);

    let _task = server.supervisor.spawn("test worker", async { panic!("forced to stop") });

    eventually("gRPC health to turn NOT_SERVING", || async {
        health_of(&server, "").await == ServingStatus::NotServing
            && health_of(&server, "eventbus.v1.EventBus").await == ServingStatus::NotServing
    })
    .await;
    for route in ["/readyz", "/healthz"] {
        let resp = reqwest::get(server.url(route)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{route}");
        let reason = resp.json::<Json>().await.unwrap()["reason"].as_str().unwrap().to_owned();
        assert!(reason.contains("test worker") && reason.contains("forced to stop"), "{route}: {reason}");
    }
    // Still serving calls: only health tells the orchestrator to restart it.
    server.client().await.publish(event("still.up", &b"x"[..])).await.unwrap();
    server.stop().await;
}

/// REST publishes over the default `max_payload_bytes` (1 MiB), just over and far over
/// (past the body limit): 413, a JSON error naming the limit, nothing published.
#[tokio::test]
async fn oversized_rest_publish_is_413_naming_the_limit_at_every_size() {
    let server = start().await;
    let http = reqwest::Client::new();
    // A JSON string of n - 2 characters is stored as n bytes (its quotes included).
    for size in [(1 << 20) + 1, 2 << 20, 8 << 20] {
        let body = json!({"channel": "big.rest", "payload": "a".repeat(size - 2)});
        let resp = within(http.post(server.url("/admin/eventbus/publish")).json(&body).send()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{size} bytes");
        let error: Json = resp.json().await.expect("a JSON body");
        let error = error["error"].as_str().unwrap_or_default();
        assert!(error.contains("max_payload_bytes = 1048576"), "{size} bytes: {error}");
    }
    let stats: Json = http.get(server.url("/admin/eventbus/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["total_published"], 0);
    server.stop().await;
}

/// One wire edge: stats, channels, subscriptions and a publish's answer read
/// the same over gRPC and REST.
#[tokio::test]
async fn grpc_and_rest_agree_on_stats_channels_subscriptions_and_publish() {
    let server = start().await;
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let req = http.get(server.url(path));
        async move { req.send().await.unwrap().json::<Json>().await.unwrap() }
    };
    let mut grouped = server.subscribe(pb::SubscribeRequest { group: "g".into(), ..sub(&["agree.>"]) }).await;
    let _plain = server
        .subscribe(pb::SubscribeRequest {
            name: "plain".into(),
            overflow: pb::OverflowPolicy::DropOldest as i32,
            ..sub(&["agree.*"])
        })
        .await;
    let published: Json = http
        .post(server.url("/admin/eventbus/publish"))
        .json(&json!({"channel": "agree.rest", "payload": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let answer = server.client().await.publish(event("agree.grpc", "2")).await.unwrap().into_inner();
    let keys = |v: &Json| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&published),
        ["captured_count", "delivered_count", "duplicate", "duration_us", "event_id", "failed_count"]
    );
    assert_eq!(
        (&published["delivered_count"], &published["failed_count"], &published["duplicate"]),
        (&json!(answer.delivered_count), &json!(answer.failed_count), &json!(answer.duplicate))
    );
    grouped.take(2).await;
    // Both subscriptions' queues drained to their streams: nothing moves between reads.
    let mut admin = server.admin().await;
    eventually("queues to drain", || {
        let mut admin = admin.clone();
        async move {
            let subs = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner();
            subs.subscriptions.iter().all(|s| s.pending == 0 && s.delivered == 2)
        }
    })
    .await;
    let s = admin.get_stats(pb::GetStatsRequest {}).await.unwrap().into_inner();
    let expected = json!({
        "total_published": s.total_published, "total_delivered": s.total_delivered,
        "total_failed": s.total_failed, "total_dropped": s.total_dropped,
        "active_subscriptions": s.active_subscriptions, "active_channels": s.active_channels,
        "started_at": s.started_at.unwrap().to_string(), "mode": s.mode, "instance_id": s.instance_id,
    });
    assert_eq!(get("/admin/eventbus/stats").await, expected);

    let mut channels = admin.list_channels(pb::ListChannelsRequest {}).await.unwrap().into_inner().channels;
    channels.sort_by(|a, b| a.channel.cmp(&b.channel));
    let expected: Vec<Json> = channels
        .iter()
        .map(|c| {
            json!({
                "channel": c.channel, "published_count": c.published_count, "delivered_count": c.delivered_count,
                "subscriber_count": c.subscriber_count, "last_published_at": c.last_published_at.map(|t| t.to_string()),
            })
        })
        .collect();
    let mut rest = get("/admin/eventbus/channels").await["channels"].as_array().unwrap().clone();
    rest.sort_by_key(|c| c["channel"].as_str().unwrap().to_owned());
    assert_eq!(rest, expected);

    let mut subs = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner().subscriptions;
    subs.sort_by(|a, b| a.id.cmp(&b.id));
    let expected: Vec<Json> = subs
        .iter()
        .map(|s| {
            let overflow = match pb::OverflowPolicy::try_from(s.overflow).unwrap() {
                pb::OverflowPolicy::DropOldest => "drop_oldest",
                pb::OverflowPolicy::Disconnect => "disconnect",
                _ => "drop_newest",
            };
            json!({
                "id": s.id, "channels": s.channels, "group": (!s.group.is_empty()).then_some(&s.group),
                "name": s.name, "pending": s.pending, "capacity": s.capacity, "queued_bytes": s.queued_bytes,
                "max_queue_bytes": s.max_queue_bytes, "delivered": s.delivered,
                "dropped": s.dropped, "overflow": overflow, "peer": s.peer, "owner": s.owner,
                "created_at": s.created_at.unwrap().to_string(),
            })
        })
        .collect();
    let mut rest = get("/admin/eventbus/subscriptions").await["subscriptions"].as_array().unwrap().clone();
    rest.sort_by_key(|s| s["id"].as_str().unwrap().to_owned());
    assert_eq!(rest, expected);
    server.stop().await;
}

/// docs/configuration.md, `server.max_connections`: past the limit a new connection is
/// closed at once and counted; once a connection closes, a new one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_and_counted() {
    let server = start_with(|s| s.server.max_connections = 2).await;
    let mut first = server.client().await;
    let mut second = server.client().await;
    first.publish(event("limit.a", &b"1"[..])).await.unwrap();
    second.publish(event("limit.a", &b"2"[..])).await.unwrap();

    let third = server.endpoint().connect_timeout(std::time::Duration::from_secs(2)).connect().await;
    let refused = match third {
        Err(_) => true,
        Ok(channel) => eventbus_proto::pb::event_bus_client::EventBusClient::new(channel)
            .publish(event("limit.a", &b"3"[..]))
            .await
            .is_err(),
    };
    assert!(refused, "a third connection is not served");
    let text = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let sample = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains("listener=\"grpc\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert!(sample("socle_eventbus_connections_refused_total").is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(sample("socle_eventbus_connections_open"), Some(2.0), "{text}");

    drop(first);
    eventually("a closed connection to free its place", || async {
        match server.endpoint().connect_timeout(std::time::Duration::from_secs(2)).connect().await {
            Ok(channel) => eventbus_proto::pb::event_bus_client::EventBusClient::new(channel)
                .publish(event("limit.a", &b"4"[..]))
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    drop(second);
    server.stop().await;
}
