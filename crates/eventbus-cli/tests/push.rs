//! `eventbus consumer create --push-*` end to end, against a real server started in-process.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use common::*;
use eventbus_server::Settings;

/// Nothing listens on port 9 (discard): the broker's requests fail and are retried,
/// which does not matter to what `consumer info` shows.
const HOOK: &str = "http://127.0.0.1:9/hook";

#[tokio::test]
async fn a_push_consumer_is_created_and_shown_with_its_credentials_redacted() {
    let broker = broker().await;
    let out = run(eventbus(
        &broker,
        &[
            "consumer",
            "create",
            "hooked",
            "-c",
            "orders.>",
            "--push-url",
            HOOK,
            "--push-header",
            "Authorization: Bearer x",
            "--push-envelope",
            "json",
            "--push-batch",
            "4",
            "--push-secret",
            "s",
        ],
    ))
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains(HOOK) && !out.stdout.contains("Bearer x"), "{}", out.stdout);

    let out = run(eventbus(&broker, &["consumer", "info", "hooked", "--json"])).await;
    assert!(out.ok, "{}", out.stderr);
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let push = &info["push"];
    assert_eq!(push["url"], HOOK, "{info}");
    assert_eq!(push["envelope"], "json", "{info}");
    assert_eq!(push["batch"], 4, "{info}");
    assert_eq!(push["headers"]["Authorization"], "(redacted)", "{info}");
    assert_eq!(push["secret_set"], true, "{info}");
    assert!(push["timeout_ms"].as_u64().is_some_and(|ms| ms > 0), "the broker's default: {info}");
    assert!(push["max_concurrency"].as_u64().is_some_and(|n| n > 0), "the broker's default: {info}");
    assert!(!out.stdout.contains("Bearer x") && !out.stdout.contains("\"s\""), "{}", out.stdout);

    // The same in the list, and as text.
    let out = run(eventbus(&broker, &["--json", "consumer", "list"])).await;
    let list: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(list[0]["push"]["url"], HOOK, "{list}");
    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert!(out.stdout.lines().next().is_some_and(|h| h.contains("PUSH")), "{}", out.stdout);
    assert!(out.stdout.lines().nth(1).is_some_and(|row| row.starts_with("hooked") && row.contains(HOOK)));
    let out = run(eventbus(&broker, &["consumer", "info", "hooked"])).await;
    let line = out.stdout.lines().find(|l| l.starts_with("push ")).unwrap_or_default();
    assert!(line.contains(HOOK) && line.contains("(redacted)"), "{}", out.stdout);

    // A pull consumer has none.
    assert!(run(eventbus(&broker, &["consumer", "create", "pulled", "-c", "orders.>"])).await.ok);
    let out = run(eventbus(&broker, &["consumer", "info", "pulled", "--json"])).await;
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(info["push"].is_null(), "{info}");
}

#[tokio::test]
async fn a_push_url_the_broker_refuses_is_an_error_naming_push_url() {
    let broker = broker().await;
    let out = run(eventbus(&broker, &["consumer", "create", "ftp", "-c", "orders.>", "--push-url", "ftp://x/"])).await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(out.stderr.contains("push.url") && out.stderr.contains("InvalidArgument"), "{}", out.stderr);
    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert_eq!(out.stdout.lines().count(), 1, "nothing was created: {}", out.stdout);
}

#[tokio::test]
async fn push_options_without_push_url_are_refused_before_connecting() {
    let broker = broker().await;
    let out = run(eventbus(&broker, &["consumer", "create", "c", "-c", "orders.>", "--push-batch", "4"])).await;
    assert_eq!(out.code, Some(2), "a usage error: {}", out.stderr);
    assert!(out.stderr.contains("--push-url"), "{}", out.stderr);

    let out = run(eventbus(
        &broker,
        &["consumer", "create", "c", "-c", "a", "--push-url", HOOK, "--push-header", "Bearer x"],
    ))
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--push-header") && !out.stderr.contains("Bearer x"), "{}", out.stderr);

    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert_eq!(out.stdout.lines().count(), 1, "nothing was created: {}", out.stdout);
}

#[tokio::test]
async fn the_push_secret_is_set_and_never_shown() {
    let broker = broker().await;
    let args = ["--json", "consumer", "create", "signed", "-c", "orders.>", "--push-url", HOOK, "--push-secret", "s3"];
    let out = run(eventbus(&broker, &args)).await;
    assert!(out.ok, "{}", out.stderr);
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(info["push"]["secret_set"], true, "{info}");
    assert!(!out.stdout.contains("\"s3\""), "{}", out.stdout);
}

/// Creating a consumer that exists with another definition fails naming what
/// differs, with both push definitions redacted, in text and in JSON.
#[tokio::test]
async fn a_conflicting_definition_is_shown_without_the_push_credentials() {
    let broker = broker().await;
    let owners =
        ["--push-url", HOOK, "--push-header", "Authorization: Bearer owner-bearer", "--push-secret", "owner-s3"];
    let mut args = vec!["consumer", "create", "hooked", "-c", "orders.>"];
    args.extend_from_slice(&owners);
    assert!(run(eventbus(&broker, &args)).await.ok);
    for json in [false, true] {
        let mut args = vec!["consumer", "create", "hooked", "-c", "orders.>", "--push-url", "http://127.0.0.1:9/other"];
        args.extend_from_slice(&["--push-header", "Authorization: Bearer other", "--push-secret", "other-s3"]);
        if json {
            args.insert(0, "--json");
        }
        let out = run(eventbus(&broker, &args)).await;
        assert!(!out.ok, "{}", out.stdout);
        let shown = format!("{}{}", out.stdout, out.stderr);
        assert!(shown.contains("already exists") && shown.contains("(redacted)"), "{shown}");
        assert!(!shown.contains("owner-bearer") && !shown.contains("owner-s3"), "{shown}");
    }
}

/// `bench push` in both envelopes: every event reaches its endpoint and is acked, and
/// the bench removes its consumer.
#[tokio::test]
async fn bench_push_delivers_every_event_and_removes_its_consumer() {
    // The bench's endpoint listens on 127.0.0.1, which push.deny_networks refuses by
    // default: this broker opts in, as cli.md says a bench needs.
    let mut settings = Settings::default();
    settings.push.allow_networks = vec!["127.0.0.0/8".into()];
    let broker = common::serve(settings).await;
    for extra in [&[][..], &["--batch", "10", "--concurrency", "4"][..]] {
        let mut args = vec!["--json", "bench", "push", "--count", "300", "--publishers", "2", "--mode", "stream"];
        args.extend_from_slice(extra);
        let out = run(eventbus(&broker, &args)).await;
        assert!(out.ok, "{extra:?}: {}", out.stderr);
        let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert!(report["received_events"].as_u64().is_some_and(|n| n >= 300), "{report}");
        assert!(report["acked_per_sec"].as_f64().is_some_and(|r| r > 0.0), "{report}");
        let envelope = if extra.is_empty() { "raw" } else { "json" };
        assert_eq!(report["params"]["envelope"], envelope, "{report}");
    }
    let out = run(eventbus(&broker, &["consumer", "list"])).await;
    assert_eq!(out.stdout.lines().count(), 1, "the bench removed its consumers: {}", out.stdout);
}
