//! The `eventbus` binary end to end, against a real server started in-process.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use eventbus_server::{Server, Settings};
use tokio::io::Lines;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio_util::sync::CancellationToken;

/// A broker started with a configuration file in which the channels under `hist.` keep
/// their latest 1,000 events.
async fn broker_with_history() -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eventbusd.yaml");
    std::fs::write(&path, "eventbus:\n  history:\n    - channels: \"hist.>\"\n      size: 1000\n").unwrap();
    let overrides = eventbus_server::config::Overrides { config_file: Some(path), ..Default::default() };
    serve(Settings::load(&overrides, &Default::default()).unwrap()).await
}

/// A running `eventbus subscribe`, with the rest of its stderr.
struct Subscriber {
    child: Child,
    stderr: Lines<BufReader<ChildStderr>>,
}

/// Spawns `eventbus subscribe` and waits for its `subscribed` line on stderr.
async fn subscriber(broker: &Broker, args: &[&str]) -> Subscriber {
    let mut cmd = eventbus(broker, args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(DEADLINE, stderr.next_line()).await.expect("timed out").unwrap();
    let line = line.expect("subscriber exited early");
    assert!(line.starts_with("subscribed "), "{line}");
    Subscriber { child, stderr }
}

/// Waits for a command to succeed; returns its stdout.
async fn finish(child: Child) -> String {
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output()).await.expect("timed out").unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

impl Subscriber {
    /// Waits for the subscriber to exit successfully; returns stdout and the rest of stderr.
    async fn finish(mut self) -> (String, String) {
        let mut rest = String::new();
        while let Some(line) = tokio::time::timeout(DEADLINE, self.stderr.next_line()).await.unwrap().unwrap() {
            rest.push_str(&line);
            rest.push('\n');
        }
        (finish(self.child).await, rest)
    }
}

#[tokio::test]
async fn publish_reaches_a_subscriber_which_exits_after_count() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["subscribe", "orders.>", "--count", "2"]).await;
    let out = run(eventbus(&broker, &["publish", "orders.created", r#"{"id":1}"#, "-m", "tenant=acme"])).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("published ") && out.stdout.contains("delivered to 1 subscription"),
        "{}",
        out.stdout
    );
    assert!(run(eventbus(&broker, &["publish", "orders.eu.shipped", "second"])).await.ok);
    let (printed, _) = sub.finish().await;
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    assert!(
        lines[0].contains("orders.created") && lines[0].contains(r#"{"id":1}"#) && lines[0].ends_with("tenant=acme")
    );
    assert!(lines[1].contains("orders.eu.shipped") && lines[1].contains("second"));
}

#[tokio::test]
async fn json_output_parses() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["--json", "subscribe", "j.*", "--count", "1"]).await;
    let out = run(eventbus(&broker, &["--json", "publish", "j.x", "payload", "--content-type", "text/plain"])).await;
    let published: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(published["delivered_count"], 1);
    let event: serde_json::Value = serde_json::from_str(sub.finish().await.0.trim()).unwrap();
    assert_eq!(event["id"], published["event_id"]);
    assert_eq!((event["payload"].as_str(), event["content_type"].as_str()), (Some("payload"), Some("text/plain")));

    let stats: serde_json::Value =
        serde_json::from_str(&run(eventbus(&broker, &["--json", "stats"])).await.stdout).unwrap();
    assert_eq!(stats["total_published"], 1);
    let channels: serde_json::Value =
        serde_json::from_str(&run(eventbus(&broker, &["--json", "channels"])).await.stdout).unwrap();
    assert_eq!(channels[0]["channel"], "j.x");
}

#[tokio::test]
async fn publish_infers_the_content_type_unless_given() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["--json", "subscribe", "ct.*", "--count", "4"]).await;
    for args in [&["ct.json", r#"{"id":1}"#][..], &["ct.text", "hello"], &["ct.given", "{}", "--content-type", "x/y"]] {
        let out = run(eventbus(&broker, &[&["publish"][..], args].concat())).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let mut cmd = eventbus(&broker, &["publish", "ct.lines", "-", "--lines"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"[1, 2]\n").await.unwrap();
    finish(child).await;
    let (stdout, _) = sub.finish().await;
    let types: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["content_type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["application/json", "text/plain", "x/y", "application/json"], "{stdout}");
}

/// The `payload` of each JSON line a command printed.
fn printed_payloads(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["payload"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn lines_from_stdin_are_published_in_order() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["--json", "subscribe", "lines.in", "--count", "3"]).await;
    let mut cmd = eventbus(&broker, &["publish", "lines.in", "-", "--lines"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"one\ntwo\nthree\n").await.unwrap();
    let summary = finish(child).await;
    assert_eq!(summary.trim(), "published 3 events: 3 deliveries, 0 failed");
    let payloads = printed_payloads(&sub.finish().await.0);
    assert_eq!(payloads, ["one", "two", "three"]);
}

#[tokio::test]
async fn lines_in_batches_are_published_in_order_and_a_refused_line_is_reported() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["--json", "subscribe", "batch.in", "--count", "5"]).await;
    let mut cmd = eventbus(&broker, &["publish", "batch.in", "-", "--lines", "--batch", "2"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"one\ntwo\nthree\nfour\nfive\n").await.unwrap();
    let summary = finish(child).await;
    assert_eq!(summary.trim(), "published 5 events: 5 deliveries, 0 failed, 0 refused");
    let (printed, _) = sub.finish().await;
    let payloads = printed_payloads(&printed);
    assert_eq!(payloads, ["one", "two", "three", "four", "five"]);

    // A line over the payload limit is refused in its batch; the others are published.
    let big = "x".repeat(1_100_000);
    let mut cmd = eventbus(&broker, &["--json", "publish", "batch.big", "-", "--lines", "--batch", "10"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(format!("small\n{big}\nlast\n").as_bytes()).await.unwrap();
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output()).await.expect("timed out").unwrap();
    assert!(!out.status.success(), "a refused line fails the command");
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0]["event_id"].is_string() && lines[2]["event_id"].is_string(), "{lines:?}");
    assert_eq!(lines[1]["line"], 2);
    assert_eq!(lines[1]["error"]["code"], 8, "RESOURCE_EXHAUSTED: {lines:?}");
    assert!(String::from_utf8(out.stderr).unwrap().contains("1 of 3 lines were refused"));
}

#[tokio::test]
async fn lines_without_answers_report_refusals_and_the_totals() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["--json", "subscribe", "quiet.in", "--count", "3"]).await;
    let big = "x".repeat(1_100_000);
    let mut cmd = eventbus(&broker, &["publish", "quiet.in", "-", "--lines", "--ack", "none"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(format!("one\n{big}\ntwo\nthree\n").as_bytes()).await.unwrap();
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output()).await.expect("timed out").unwrap();
    assert!(!out.status.success(), "a refused line fails the command");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim(), "published 3 events: 3 deliveries, 0 failed, 1 refused");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 2 refused") && stderr.contains("1 of 4 lines were refused"), "{stderr}");
    let payloads = printed_payloads(&sub.finish().await.0);
    assert_eq!(payloads, ["one", "two", "three"]);

    // Running totals, as JSON: the last line is the stream's.
    let mut cmd = eventbus(&broker, &["--json", "publish", "quiet.json", "-", "--lines", "--ack", "cumulative"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"a\nb\n").await.unwrap();
    let totals: serde_json::Value = serde_json::from_str(finish(child).await.trim()).unwrap();
    assert_eq!((totals["published"].as_u64(), totals["refused"].as_u64()), (Some(2), Some(0)), "{totals}");
    assert!(totals["last_event_id"].as_str().is_some_and(|id| id.len() == 36), "{totals}");

    let out = run(eventbus(&broker, &["publish", "x.y", "-", "--lines", "--ack", "sometimes"])).await;
    assert!(!out.ok && out.stderr.contains("not an ack mode"), "{}", out.stderr);
}

#[tokio::test]
async fn history_shows_what_a_channel_keeps_and_pages_its_events() {
    let broker = broker_with_history().await;
    for payload in ["a", "b", "c"] {
        assert!(run(eventbus(&broker, &["publish", "hist.h", payload])).await.ok);
    }
    let out = run(eventbus(&broker, &["history", "hist.h", "--limit", "2"])).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("hist.h: epoch ") && lines[0].contains("offsets 1..3, 3 events"), "{}", out.stdout);
    assert!(lines[1].ends_with(":1 a") && lines[2].ends_with(":2 b"), "{}", out.stdout);
    assert_eq!(lines[3], "(more: --after 2)");
    let out = run(eventbus(&broker, &["--json", "history", "hist.h", "--after", "2"])).await;
    let page: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((page["history"]["last_offset"].as_u64(), page["more"].as_bool()), (Some(3), Some(false)));
    assert_eq!(page["events"][0]["position"]["offset"], 3);
    let out = run(eventbus(&broker, &["--json", "history", "hist.h", "--since", "1h"])).await;
    let page: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 3);
    let out = run(eventbus(&broker, &["history", "plain"])).await;
    assert!(!out.ok && out.stderr.contains("keeps no history"), "{}", out.stderr);
}

#[tokio::test]
async fn subscribe_since_starts_from_the_past_of_a_channel_with_history() {
    let broker = broker_with_history().await;
    for payload in ["old 1", "old 2", "old 3"] {
        assert!(run(eventbus(&broker, &["publish", "hist.a", payload])).await.ok);
    }
    let mut sub = subscriber(&broker, &["--json", "subscribe", "hist.a", "--since", "1h", "--count", "4"]).await;
    let note = within(sub.stderr.next_line()).await.unwrap().expect("a note on what was recovered");
    assert!(
        note.starts_with("--since: the broker started at ") && note.contains("after the time asked for"),
        "the broker began later, and that is all: {note}"
    );
    assert!(!note.contains("not everything"), "nothing was missed: {note}");
    assert!(run(eventbus(&broker, &["publish", "hist.a", "new"])).await.ok);
    let (stdout, _) = sub.finish().await;
    assert_eq!(printed_payloads(&stdout), ["old 1", "old 2", "old 3", "new"], "the past first, then live");
    let positions: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["position"].clone()).collect();
    let offsets: Vec<u64> = positions.iter().map(|p| p["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, [1, 2, 3, 4]);

    // From the position of the second event, as printed: the events after it.
    let second = format!("{}:2", positions[1]["epoch"].as_str().unwrap());
    let out = run(eventbus(&broker, &["--json", "subscribe", "hist.a", "--since", &second, "--count", "2"])).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(printed_payloads(&out.stdout), ["old 3", "new"]);
    assert!(out.stderr.contains("--since: every event asked for was recovered"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["subscribe", "hist.a", "--since", &second, "--count", "1"])).await;
    assert!(out.stdout.contains(&format!("@{}:3 old 3", positions[1]["epoch"].as_str().unwrap())), "{}", out.stdout);

    let out = run(eventbus(&broker, &["subscribe", "hist.>", "--since", &second])).await;
    assert!(!out.ok && out.stderr.contains("one exact channel"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["subscribe", "hist.a", "--since", "yesterday"])).await;
    assert!(!out.ok && out.stderr.contains("EPOCH:OFFSET"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["subscribe", "hist.a", "--since", "5m", "--group", "g"])).await;
    assert!(!out.ok && out.stderr.contains("--group"), "{}", out.stderr);
}

#[tokio::test]
async fn a_subscriber_lost_on_a_channel_with_history_says_it_recovered_what_it_missed() {
    let broker = broker_with_history().await;
    // A queue of one event that disconnects its subscriber when full: a burst loses it.
    let args = ["--json", "subscribe", "hist.>", "--max-queue-bytes", "1", "--overflow", "disconnect", "--count"];
    let sub = subscriber(&broker, &[&args[..], &["200"]].concat()).await;
    let mut cmd = eventbus(&broker, &["publish", "hist.burst", "-", "--lines", "--batch", "100"]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let lines: String = (0..200).map(|i| format!("{i}\n")).collect();
    child.stdin.take().unwrap().write_all(lines.as_bytes()).await.unwrap();
    finish(child).await;
    let (stdout, stderr) = sub.finish().await;
    let expected: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    assert_eq!(printed_payloads(&stdout), expected, "each once, in order");
    assert!(stderr.contains("subscribed "), "subscribed again: {stderr}");
    assert!(
        stderr.contains("recovered: every event published while the subscription was lost was delivered"),
        "{stderr}"
    );
    assert!(!stderr.contains("gap:"), "{stderr}");
}

#[tokio::test]
async fn admin_commands_show_the_subscription_and_close_it() {
    let broker = broker().await;
    let sub = subscriber(&broker, &["subscribe", "adm.>", "--name", "watcher", "--group", "g1"]).await;
    let out = run(eventbus(&broker, &["subscriptions"])).await;
    let row = out.stdout.lines().nth(1).expect("one subscription row");
    assert!(row.contains("watcher") && row.contains("adm.>") && row.contains("g1") && row.contains("0/10000"), "{row}");
    let id = row.split_whitespace().next().unwrap();

    let out = run(eventbus(&broker, &["unsubscribe", id])).await;
    assert!(out.ok && out.stdout.trim() == format!("unsubscribed {id}"), "{}", out.stderr);
    let (_, stderr) = sub.finish().await;
    assert!(stderr.contains("closed by the broker"), "the stream ended normally: {stderr}");

    let out = run(eventbus(&broker, &["stats"])).await;
    assert!(out.stdout.lines().any(|l| l.starts_with("active_subscriptions") && l.ends_with(" 0")), "{}", out.stdout);
}

#[tokio::test]
async fn errors_are_one_line_and_exit_non_zero() {
    let broker = broker().await;
    let out = run(eventbus(&broker, &["unsubscribe", "no-such-id"])).await;
    assert!(!out.ok);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("no-such-id") && out.stderr.contains("NotFound"), "{}", out.stderr);

    let out = run(eventbus(&broker, &["publish", "orders.*", "x"])).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("orders.*") && out.stderr.contains("InvalidArgument"), "{}", out.stderr);

    let out = run(eventbus(&broker, &["publish", "a", "x", "-m", "novalue"])).await;
    assert!(!out.ok && out.stderr.contains("KEY=VALUE"), "{}", out.stderr);

    // Nothing listens on port 1.
    let mut cmd = Command::new(BIN);
    cmd.args(["--server", "http://127.0.0.1:1", "stats"]);
    let out = run(cmd).await;
    assert!(!out.ok);
    assert!(out.stderr.starts_with("error: cannot connect to http://127.0.0.1:1"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1);
}

#[tokio::test]
async fn bench_reports_throughput_without_loss() {
    let broker = broker().await;
    let out = run(eventbus(
        &broker,
        &["--json", "bench", "fanout", "--publishers", "2", "--subscribers", "3", "--count", "2000", "--payload", "64"],
    ))
    .await;
    assert!(out.ok, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((report["system"].as_str(), report["workload"].as_str()), (Some("eventbus"), Some("fanout")));
    assert_eq!(
        (report["expected"].as_u64(), report["received"].as_u64(), report["loss"].as_u64()),
        (Some(6000), Some(6000), Some(0))
    );
    assert!(report["delivered_per_sec"].as_f64().unwrap() > 0.0);

    let out = run(eventbus(
        &broker,
        &["--json", "bench", "fanout", "--subscribers", "3", "--group", "--count", "900", "--mode", "unary"],
    ))
    .await;
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(report["received"], 900, "a group gets each event once");

    let out = run(eventbus(
        &broker,
        &["--json", "bench", "fanout", "--subscribers", "2", "--count", "1000", "--mode", "batch", "--batch", "64"],
    ))
    .await;
    assert!(out.ok, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((report["received"].as_u64(), report["params"]["batch"].as_u64()), (Some(2000), Some(64)));

    let out = run(eventbus(&broker, &["--json", "bench", "latency", "--rate", "2000", "--duration", "0.5"])).await;
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(report["loss"], 0);
    let p50 = report["latency_us"]["p50"].as_f64().unwrap();
    let max = report["latency_us"]["max"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= max, "{report}");
}

#[tokio::test]
async fn durable_consumer_commands_end_to_end() {
    let broker = broker().await;
    let out = run(eventbus(&broker, &["consumer", "create", "inbox", "-c", "orders.>", "--max-attempts", "3"])).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("max_attempts") && out.stdout.contains('3'), "{}", out.stdout);
    assert!(
        out.stdout.contains(r#"dead_letter_channel  "dlq.<channel>""#),
        "the default, as REST shows it: {}",
        out.stdout
    );
    for i in 0..3 {
        let out = run(eventbus(&broker, &["publish", "orders.created", &format!("o{i}")])).await;
        assert!(out.ok && out.stdout.contains("; stored for 1 durable consumer"), "{}", out.stdout);
    }
    let out = run(eventbus(&broker, &["--json", "publish", "elsewhere", "x"])).await;
    assert!(out.stdout.contains("\"captured_count\":0"), "{}", out.stdout);
    let out = run(eventbus(&broker, &["--json", "consume", "inbox", "--count", "3"])).await;
    assert!(out.ok, "{}", out.stderr);
    let payloads = printed_payloads(&out.stdout);
    assert_eq!(payloads, ["o0", "o1", "o2"], "captured before anyone consumed");

    // Auto-acks land; the log shows them.
    let mut logged = 0;
    for _ in 0..200 {
        let out = run(eventbus(&broker, &["--json", "log", "inbox", "--status", "completed"])).await;
        logged = out.stdout.lines().count();
        if logged == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(logged, 3);
    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert!(out.stdout.lines().nth(1).is_some_and(|row| row.starts_with("inbox")), "{}", out.stdout);
    let out = run(eventbus(&broker, &["consumer", "info", "ghost"])).await;
    assert!(!out.ok && out.stderr.contains("ghost") && out.stderr.contains("NotFound"), "{}", out.stderr);
    assert!(run(eventbus(&broker, &["consumer", "delete", "inbox"])).await.ok);

    let out = run(eventbus(&broker, &["--json", "bench", "durable", "--publishers", "2", "--count", "200"])).await;
    assert!(out.ok, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(report["published_per_sec"].as_f64().unwrap() > 0.0 && report["consumed_per_sec"].as_f64().unwrap() > 0.0);
    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert_eq!(out.stdout.lines().count(), 1, "the bench removed its consumer: {}", out.stdout);
}

/// `eventbus` without a broker (commands that fail before connecting, or never connect).
fn offline(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("EVENTBUS_TOKEN").env_remove("EVENTBUS_SERVER").kill_on_drop(true);
    cmd
}

/// The server's own hash of a token (eventbus-core checks it against a known vector).
fn sha256_hex(text: &str) -> String {
    eventbus_core::token::token_sha256(text)
}

#[tokio::test]
async fn auth_new_token_prints_a_token_and_its_principals_entry() {
    let out = run(offline(&["auth", "new-token", "billing"])).await;
    assert!(out.ok, "{}", out.stderr);
    let (token, entry) = out.stdout.split_once("\n\n").unwrap();
    assert!(token.starts_with("ebt_") && token.len() == 4 + 64, "{token}");
    // Comments aside, the entry is YAML: a list item with the name and the hash.
    let yaml: Vec<&str> = entry.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(yaml[0], r#"- name: "billing""#);
    assert_eq!(yaml[1], format!("  token_sha256: {}", sha256_hex(token)));
    assert!(yaml.contains(&"  permissions:") && entry.contains("admin: false"), "{entry}");
    assert!(!entry.contains(token), "the file never holds the token");

    let out = run(offline(&["--json", "auth", "new-token", "billing"])).await;
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let second = json["token"].as_str().unwrap();
    assert_ne!(second, token, "every token is fresh");
    assert_eq!(json["principal"]["name"], "billing");
    assert_eq!(json["principal"]["token_sha256"].as_str(), Some(sha256_hex(second).as_str()));
    assert_eq!(json["principal"]["permissions"]["admin"], false);
    assert!(json["principal"]["permissions"]["publish"]["allow"].as_array().unwrap().is_empty());

    let out = run(offline(&["auth", "new-token", "two words"])).await;
    assert!(!out.ok && out.stderr.contains("whitespace"), "{}", out.stderr);
}

#[tokio::test]
async fn tls_options_are_checked_before_connecting() {
    let out = run(offline(&["--server", "https://127.0.0.1:1", "--tls-cert", "c.pem", "stats"])).await;
    assert!(!out.ok && out.stderr.contains("--tls-cert needs --tls-key"), "{}", out.stderr);

    let out = run(offline(&["--server", "http://127.0.0.1:1", "--tls-ca", "ca.pem", "stats"])).await;
    assert!(!out.ok && out.stderr.contains("use https://"), "{}", out.stderr);

    let out = run(offline(&["--server", "https://127.0.0.1:1", "--tls-ca", "/no/such/ca.pem", "stats"])).await;
    assert!(!out.ok && out.stderr.contains("/no/such/ca.pem"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
}

#[tokio::test]
async fn a_token_is_never_printed() {
    // A refused token and a failed connection: neither message repeats it.
    let out = run(offline(&["--token", "ebt_not shown", "stats"])).await;
    assert!(!out.ok && out.stderr.contains("--token") && !out.stderr.contains("not shown"), "{}", out.stderr);
    let mut cmd = offline(&["--server", "http://127.0.0.1:1", "stats"]);
    cmd.env("EVENTBUS_TOKEN", "ebt_s3cret");
    let out = run(cmd).await;
    assert!(!out.ok && !out.stderr.contains("s3cret"), "{}", out.stderr);
    let out = run(offline(&["--help"])).await;
    assert!(out.stdout.contains("--token") && out.stdout.contains("EVENTBUS_TOKEN"), "{}", out.stdout);
}

#[tokio::test]
async fn commands_work_with_a_token_on_a_broker_without_auth() {
    let broker = broker().await;
    let out = run(eventbus(&broker, &["--token", "ebt_abc", "stats"])).await;
    assert!(out.ok, "{}", out.stderr);
}

/// docs/consumer-operations.md from the command line: create with `--exclusive` and
/// `--backoff-kind linear`, pause, `pending` (table, JSON, pages), resume, redrive by id
/// and `--all`, `log --status redriven`, and the new columns of `consumer list`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_operations_end_to_end() {
    let broker = broker().await;
    let create = ["--json", "consumer", "create", "pay", "-c", "pay.>", "--exclusive", "--backoff-kind", "linear"];
    let out = run(eventbus(&broker, &create)).await;
    assert!(out.ok, "{}", out.stderr);
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((info["exclusive"].as_bool(), info["backoff"]["kind"].as_str()), (Some(true), Some("linear")));
    assert_eq!((info["paused"].as_bool(), info["redrivable"].as_u64()), (Some(false), Some(0)));

    let out = run(eventbus(&broker, &["consumer", "pause", "pay"])).await;
    assert_eq!(out.stdout.trim(), "paused pay (0 pending, 0 in flight, 0 clients)", "{}", out.stderr);
    for (payload, key) in [("p1", "c7"), ("p2", "c7"), ("p3", "")] {
        let mut args = vec!["publish", "pay.charge", payload];
        if !key.is_empty() {
            args.extend(["--ordering-key", key]);
        }
        assert!(run(eventbus(&broker, &args)).await.ok);
    }
    let out = run(eventbus(&broker, &["consumer", "pending", "pay"])).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("EVENT ID") && lines[0].ends_with("NEXT DELIVERY  LAST FAILURE"), "{}", out.stdout);
    let states: Vec<&str> = lines[1..].iter().map(|l| l.split_whitespace().nth(2).unwrap()).collect();
    assert_eq!(states, ["ready", "blocked_by_ordering_key", "ready"], "{}", out.stdout);
    let ids: Vec<String> = lines[1..].iter().map(|l| l.split_whitespace().next().unwrap().to_owned()).collect();

    let out = run(eventbus(&broker, &["--json", "consumer", "pending", "pay", "--limit", "2"])).await;
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    assert!(out.stderr.contains("--all"), "a hint that more pages exist: {}", out.stderr);
    let out = run(eventbus(&broker, &["--json", "consumer", "pending", "pay", "--limit", "1", "--all"])).await;
    let entries: Vec<serde_json::Value> = out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let listed: Vec<&str> = entries.iter().map(|e| e["event"]["id"].as_str().unwrap()).collect();
    assert_eq!(listed, ids, "every page, in order");
    assert!(out.stderr.is_empty(), "{}", out.stderr);
    assert_eq!((entries[0]["attempt"].as_u64(), entries[0]["event"]["payload"].as_str()), (Some(0), Some("p1")));

    // Resume, then dead-letter all three through the client library.
    let out = run(eventbus(&broker, &["consumer", "resume", "pay"])).await;
    assert!(out.stdout.starts_with("resumed pay"), "{}", out.stdout);
    let client =
        eventbus_client::Client::connect(eventbus_client::ClientOptions::new(broker.url.clone())).await.unwrap();
    let mut stream =
        client.consume(eventbus_client::pb::Attach { consumer: "pay".into(), ..Default::default() }).await.unwrap();
    let mut termed = 0;
    while termed < 3 {
        let message = tokio::time::timeout(DEADLINE, stream.next()).await.expect("timed out").unwrap().unwrap();
        if let eventbus_client::ConsumeMessage::Deliveries(deliveries) = message {
            for d in deliveries {
                stream.sender().term(d.event.unwrap().id, "card declined".into()).await.unwrap();
                termed += 1;
            }
        }
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while client.consumer("pay").await.unwrap().redrivable < 3 {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for 3 dead letters");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let out = run(eventbus(&broker, &["consumer", "redrive", "pay", &ids[1]])).await;
    assert_eq!(out.stdout.trim(), "redriven 1, remaining 2", "{}", out.stderr);
    let out = run(eventbus(&broker, &["consumer", "redrive", "pay", &ids[1]])).await;
    assert_eq!(out.stdout.trim(), "redriven 0, remaining 2", "redriven once");
    assert!(out.stderr.contains("1 of the given event ids"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["--json", "consumer", "redrive", "pay", "--all", "--limit", "1"])).await;
    let answer: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(answer, serde_json::json!({"redriven": 2, "remaining": 0}));
    let out = run(eventbus(&broker, &["--json", "log", "pay", "--status", "redriven"])).await;
    let mut redriven: Vec<String> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .inspect(|v| assert_eq!(v["status"], "redriven"))
        .map(|v| v["event_id"].as_str().unwrap().to_owned())
        .collect();
    redriven.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(redriven, expected);

    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    let header = out.stdout.lines().next().unwrap();
    for column in ["REDRIVABLE", "REDRIVEN", "PAUSED", "EXCLUSIVE", "BACKOFF", "PUSH"] {
        assert!(header.contains(column), "{header}");
    }
    let row = out.stdout.lines().nth(1).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[0], &cells[7..]), ("pay", &["0", "3", "no", "yes", "linear", "-"][..]), "{}", out.stdout);
    let out = run(eventbus(&broker, &["consumer", "info", "pay"])).await;
    assert!(out.stdout.lines().any(|l| l.starts_with("redriven") && l.ends_with(" 3")), "{}", out.stdout);

    let out = run(eventbus(&broker, &["consumer", "redrive", "ghost"])).await;
    assert!(!out.ok && out.stderr.contains("ghost") && out.stderr.contains("NotFound"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    let out = run(eventbus(&broker, &["consumer", "redrive", "pay", "e1", "--all"])).await;
    assert!(!out.ok && out.stderr.contains("cannot be used with"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["consumer", "create", "x", "-c", "x", "--backoff-kind", "cubic"])).await;
    assert!(!out.ok && out.stderr.contains("exponential") && out.stderr.contains("linear"), "{}", out.stderr);
    drop(stream);
}

/// A relay pointed at an address where no database answers stops at once, non-zero,
/// naming the address (a database lost later is retried instead).
#[tokio::test]
async fn a_relay_with_an_unreachable_database_exits_naming_it() {
    let mut cmd = Command::new(BIN);
    cmd.args(["relay", "--database-url", "postgres://postgres@127.0.0.1:1/nowhere", "--metrics-addr", "127.0.0.1:0"])
        .kill_on_drop(true);
    let out = run(cmd).await;
    assert!(!out.ok, "{}", out.stderr);
    assert!(out.stderr.contains("127.0.0.1:1"), "{}", out.stderr);
}

/// A broker serving TLS with a self-signed certificate for 127.0.0.1.
async fn tls_broker(dir: &std::path::Path) -> (Broker, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let mut settings = Settings::default();
    settings.server.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.http_addr = "127.0.0.1:0".parse().unwrap();
    settings.durable.data_dir = String::new();
    settings.server.tls.cert_file = cert_file.display().to_string();
    settings.server.tls.key_file = key_file.display().to_string();
    let server = Server::bind(settings).await.unwrap();
    let url = format!("127.0.0.1:{}", server.grpc_addr().port());
    let shutdown = CancellationToken::new();
    tokio::spawn(server.run(shutdown.clone()));
    (Broker { url, shutdown }, cert_file)
}

#[tokio::test]
async fn connection_errors_at_a_tls_broker_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, ca) = tls_broker(dir.path()).await;
    let addr = broker.url.clone();

    let out = run(offline(&["--server", &format!("http://{addr}"), "stats"])).await;
    assert!(
        !out.ok && out.stderr.contains("hint: if the broker serves TLS on this port, use an https://"),
        "{}",
        out.stderr
    );

    let out = run(offline(&["--server", &format!("https://{addr}"), "stats"])).await;
    assert!(!out.ok && out.stderr.contains("hint:") && out.stderr.contains("--tls-ca"), "{}", out.stderr);

    let ca = ca.display().to_string();
    let out = run(offline(&["--server", &format!("https://{addr}"), "--tls-ca", &ca, "stats"])).await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test]
async fn overflow_policies_are_spelled_as_in_the_configuration_and_the_dashed_way_is_accepted() {
    let broker = broker().await;
    let _a = subscriber(&broker, &["subscribe", "o.a", "--overflow", "dead_letter", "--name", "a"]).await;
    let _b = subscriber(&broker, &["subscribe", "o.b", "--overflow", "drop-oldest", "--name", "b"]).await;
    let out = run(eventbus(&broker, &["--json", "subscriptions"])).await;
    assert!(out.ok, "{}", out.stderr);
    let mut policies: Vec<(String, String)> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .flat_map(|v| match v {
            serde_json::Value::Array(items) => items,
            one => vec![one],
        })
        .map(|s| (s["name"].as_str().unwrap().to_owned(), s["overflow"].as_str().unwrap().to_owned()))
        .collect();
    policies.sort();
    assert_eq!(policies, [("a".to_owned(), "dead_letter".to_owned()), ("b".to_owned(), "drop_oldest".to_owned())]);
}

/// Awaits `fut`, failing the test past [`DEADLINE`].
async fn within<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(DEADLINE, fut).await.expect("timed out")
}

/// A broker on `grpc_addr`, and the task serving it (it ends once `shutdown` drains it).
async fn broker_at(grpc_addr: std::net::SocketAddr) -> (Broker, tokio::task::JoinHandle<()>) {
    let mut settings = Settings::default();
    settings.server.grpc_addr = grpc_addr;
    settings.server.http_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.shutdown_timeout_ms = 100;
    settings.durable.data_dir = String::new();
    let server = Server::bind(settings).await.unwrap();
    let url = format!("http://{}", server.grpc_addr());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { server.run(shutdown).await.unwrap() }
    });
    (Broker { url, shutdown }, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_reports_the_gap_of_a_broker_restart_and_subscribes_again() {
    let (first, serving) = broker_at("127.0.0.1:0".parse().unwrap()).await;
    let addr: std::net::SocketAddr = first.url.trim_start_matches("http://").parse().unwrap();
    let mut sub = subscriber(&first, &["subscribe", "restart.>", "--count", "1"]).await;
    first.shutdown.cancel();
    within(serving).await.unwrap();
    let (second, _serving) = broker_at(addr).await;
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("subscribed ")) {
        let line = within(sub.stderr.next_line()).await.unwrap().expect("the subscriber kept running");
        lines.push(line);
    }
    assert!(lines[0].starts_with("gap: the subscription was lost"), "{lines:?}");
    assert!(run(eventbus(&second, &["publish", "restart.now", "after"])).await.ok);
    let (stdout, _) = sub.finish().await;
    assert!(stdout.contains("restart.now") && stdout.contains("after"), "{stdout}");
}
