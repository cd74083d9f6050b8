//! `eventbus consumer create|list|info|delete`, `eventbus consume`, `eventbus log`
//! (`consumer pending|redrive|pause|resume` are in `consumer_ops`).

use std::io::Write as _;

use eventbus_client::{Client, ConsumeMessage, pb};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::{AckMode, ConsumeArgs, ConsumerCommand, CreateArgs, LogArgs};
use crate::consumer_ops;
use crate::output::{self, table, time};

/// `Backoff.kind` as the REST routes and the configuration spell it.
fn backoff_kind_name(kind: i32) -> &'static str {
    match pb::BackoffKind::try_from(kind) {
        Ok(pb::BackoffKind::Exponential) => "exponential",
        Ok(pb::BackoffKind::Linear) => "linear",
        Err(_) => "unknown",
    }
}

/// `PushConfig.envelope` as the REST routes and the configuration spell it.
fn push_envelope_name(envelope: i32) -> &'static str {
    match pb::PushEnvelope::try_from(envelope) {
        Ok(pb::PushEnvelope::Raw) => "raw",
        Ok(pb::PushEnvelope::Json) => "json",
        Err(_) => "unknown",
    }
}

/// A push endpoint as the broker shows it: header values and the secret come back
/// redacted, so only the header names and whether a secret is set are news.
fn push_json(p: &pb::PushConfig) -> serde_json::Value {
    let headers: std::collections::BTreeMap<&String, &String> = p.headers.iter().collect();
    json!({
        "url": p.url, "envelope": push_envelope_name(p.envelope), "batch": p.batch,
        "max_concurrency": p.max_concurrency, "timeout_ms": p.timeout_ms, "headers": headers,
        "secret_set": !p.secret.is_empty(),
    })
}

/// Where dead letters go, as every view shows it: the consumer's own channel, else the
/// default, `dlq.` + each event's channel.
fn dead_letter_channel(configured: &str) -> &str {
    if configured.is_empty() { eventbus_core::durable::DEFAULT_DEAD_LETTER_SHOWN } else { configured }
}

fn info_json(i: &pb::ConsumerInfo) -> serde_json::Value {
    let c = i.config.clone().unwrap_or_default();
    let b = c.backoff.unwrap_or_default();
    json!({
        "name": c.name, "channels": c.channels, "ack_deadline_ms": c.ack_deadline_ms,
        "max_attempts": c.max_attempts, "max_in_flight": c.max_in_flight,
        "backoff": {"initial_ms": b.initial_ms, "multiplier": b.multiplier, "max_ms": b.max_ms,
                    "kind": backoff_kind_name(b.kind)},
        "dead_letter_channel": dead_letter_channel(&c.dead_letter_channel), "exclusive": c.exclusive,
        "paused": i.paused,
        "pending": i.pending, "in_flight": i.in_flight, "clients": i.clients,
        "acked": i.acked, "dead_lettered": i.dead_lettered, "redelivered": i.redelivered,
        "redrivable": i.redrivable, "redriven": i.redriven, "dropped": i.dropped,
        "max_pending": c.max_pending, "push": c.push.as_ref().map(push_json),
    })
}

pub(crate) fn print_info(json: bool, i: &pb::ConsumerInfo) {
    if json {
        println!("{}", info_json(i));
        return;
    }
    let v = info_json(i);
    if let Some(map) = v.as_object() {
        for (k, v) in map {
            if k == "push" && v.is_null() {
                continue;
            }
            println!("{k:<20} {v}");
        }
    }
}

pub(crate) async fn consumer(client: &Client, json: bool, cmd: ConsumerCommand) -> anyhow::Result<()> {
    match cmd {
        ConsumerCommand::Create(a) => {
            print_info(json, &client.create_consumer(config(a)?).await?);
        }
        ConsumerCommand::Info { name } => {
            print_info(json, &client.consumer(name).await?);
        }
        ConsumerCommand::List => {
            let consumers = client.consumers().await?;
            if json {
                println!("{}", serde_json::Value::Array(consumers.iter().map(info_json).collect()));
            } else {
                let rows: Vec<Vec<String>> = consumers
                    .iter()
                    .map(|i| {
                        let c = i.config.clone().unwrap_or_default();
                        let kind = backoff_kind_name(c.backoff.unwrap_or_default().kind);
                        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
                        vec![
                            c.name,
                            c.channels.join(","),
                            i.pending.to_string(),
                            i.in_flight.to_string(),
                            i.clients.to_string(),
                            i.acked.to_string(),
                            i.dead_lettered.to_string(),
                            i.redrivable.to_string(),
                            i.redriven.to_string(),
                            yes_no(i.paused),
                            yes_no(c.exclusive),
                            kind.to_owned(),
                            c.push.map_or_else(|| "-".to_owned(), |p| p.url),
                        ]
                    })
                    .collect();
                let header = [
                    "NAME",
                    "CHANNELS",
                    "PENDING",
                    "IN FLIGHT",
                    "CLIENTS",
                    "ACKED",
                    "DEAD LETTERED",
                    "REDRIVABLE",
                    "REDRIVEN",
                    "PAUSED",
                    "EXCLUSIVE",
                    "BACKOFF",
                    "PUSH",
                ];
                print!("{}", table(&header, &rows));
            }
        }
        ConsumerCommand::Delete { name } => {
            client.delete_consumer(name.clone()).await?;
            println!("deleted {name}");
        }
        ConsumerCommand::Pending(a) => consumer_ops::pending(client, json, a).await?,
        ConsumerCommand::Redrive(a) => consumer_ops::redrive(client, json, a).await?,
        ConsumerCommand::Pause { name } => consumer_ops::print_paused(json, &client.pause(name).await?),
        ConsumerCommand::Resume { name } => consumer_ops::print_paused(json, &client.resume(name).await?),
    }
    Ok(())
}

fn config(a: CreateArgs) -> anyhow::Result<pb::ConsumerConfig> {
    let push = a.push_url.as_ref().map(|url| push_config(url.clone(), &a)).transpose()?;
    Ok(pb::ConsumerConfig {
        name: a.name,
        channels: a.channels,
        ack_deadline_ms: a.ack_deadline_ms,
        max_attempts: a.max_attempts,
        backoff: Some(pb::Backoff {
            initial_ms: a.backoff_initial_ms,
            multiplier: a.backoff_multiplier,
            max_ms: a.backoff_max_ms,
            kind: pb::BackoffKind::from(a.backoff_kind).into(),
        }),
        max_in_flight: a.max_in_flight,
        dead_letter_channel: a.dead_letter_channel.unwrap_or_default(),
        exclusive: a.exclusive,
        max_pending: a.max_pending,
        push,
    })
}

/// The `--push-*` options; what is not given is 0, the broker's default.
fn push_config(url: String, a: &CreateArgs) -> anyhow::Result<pb::PushConfig> {
    let mut headers = std::collections::HashMap::new();
    for (name, value) in &a.push_headers {
        if headers.keys().any(|k: &String| k.eq_ignore_ascii_case(name)) {
            anyhow::bail!("--push-header {name:?} is given twice");
        }
        headers.insert(name.clone(), value.clone());
    }
    Ok(pb::PushConfig {
        url,
        headers,
        timeout_ms: a.push_timeout_ms.unwrap_or_default(),
        max_concurrency: a.push_max_concurrency.unwrap_or_default(),
        batch: a.push_batch.unwrap_or_default(),
        envelope: a.push_envelope.map(pb::PushEnvelope::from).unwrap_or_default().into(),
        secret: a.push_secret.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
    })
}

/// A manual-mode command.
#[derive(Debug, PartialEq)]
pub(crate) enum Manual {
    Ack(String),
    Nack { id: String, reason: String },
    Term { id: String, reason: String },
    Release(String),
}

/// Parses a manual-mode command line: `ack ID`, `nack ID [reason]`, `term ID [reason]`,
/// `release ID`.
pub(crate) fn parse_command(line: &str) -> Result<Manual, String> {
    let mut words = line.trim().splitn(3, ' ');
    let (verb, id) = (words.next().unwrap_or_default(), words.next().unwrap_or_default().to_owned());
    let reason = words.next().unwrap_or_default().to_owned();
    if id.is_empty() {
        return Err(format!("expected `ack|nack|term|release EVENT_ID [reason]`, got {line:?}"));
    }
    match verb {
        "ack" => Ok(Manual::Ack(id)),
        "nack" => Ok(Manual::Nack { id, reason }),
        "term" => Ok(Manual::Term { id, reason }),
        "release" => Ok(Manual::Release(id)),
        other => Err(format!("unknown command {other:?}: use ack, nack, term or release")),
    }
}

pub(crate) async fn consume(client: &Client, json: bool, a: ConsumeArgs) -> anyhow::Result<()> {
    // With --count, never hold more than will be printed.
    let max_in_flight = match (a.count, a.max_in_flight) {
        (Some(n), 0) => u32::try_from(n).unwrap_or(u32::MAX),
        (Some(n), m) => m.min(u32::try_from(n).unwrap_or(u32::MAX)),
        (None, m) => m,
    };
    let attach = pb::Attach { consumer: a.name.clone(), max_in_flight, ..Default::default() };
    let mut stream = client.consume(attach).await?;
    let tx = stream.sender();
    if a.ack == AckMode::Manual {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                let sent = match parse_command(&line) {
                    Ok(Manual::Ack(id)) => tx.ack(vec![id]).await,
                    Ok(Manual::Nack { id, reason }) => tx.nack(id, reason, None).await,
                    Ok(Manual::Term { id, reason }) => tx.term(id, reason).await,
                    Ok(Manual::Release(id)) => tx.release(vec![id], false).await,
                    Err(e) => {
                        eprintln!("{e}");
                        continue;
                    }
                };
                if sent.is_err() {
                    return;
                }
            }
        });
    }
    let mut received = 0u64;
    loop {
        let message = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            m = stream.next() => m?,
        };
        let Some(message) = message else {
            eprintln!("consumer stream closed by the broker");
            return Ok(());
        };
        match message {
            ConsumeMessage::Attached(c) => {
                let pending = c.pending + c.in_flight;
                let plural = if pending == 1 { "" } else { "s" };
                eprintln!("attached to {} ({pending} unfinished event{plural})", a.name);
                if a.ack == AckMode::Manual {
                    eprintln!(
                        "type `ack|nack|term|release EVENT_ID [reason]` per event; Ctrl-C leaves (an event left \
                         unacked is delivered again, its attempt counted: release it first to avoid that)"
                    );
                }
            }
            ConsumeMessage::Deliveries(deliveries) => {
                let mut acks = Vec::new();
                {
                    let mut out = std::io::stdout().lock();
                    for delivery in &deliveries {
                        let Some(event) = &delivery.event else { continue };
                        let line = if json {
                            let mut v = output::event_json(event);
                            v["attempt"] = json!(delivery.attempt);
                            v.to_string()
                        } else {
                            format!("attempt {} {}", delivery.attempt, output::event_line(event))
                        };
                        if writeln!(out, "{line}").is_err() {
                            return Ok(());
                        }
                        acks.push(event.id.clone());
                    }
                    let _ = out.flush();
                }
                received += acks.len() as u64;
                if a.ack == AckMode::Auto {
                    let _ = tx.ack(acks).await;
                }
                if a.count.is_some_and(|n| received >= n) {
                    // Closing our side detaches; the broker then ends its side, which
                    // tells us the acks sent before were received.
                    drop(tx);
                    stream.close(std::time::Duration::from_secs(5)).await;
                    return Ok(());
                }
            }
            _ => {}
        }
    }
}

pub(crate) async fn log(client: &Client, json: bool, a: LogArgs) -> anyhow::Result<()> {
    let status = match a.status.as_deref() {
        None | Some("all") => pb::EventStatus::Unspecified,
        Some("completed") => pb::EventStatus::Completed,
        Some("dead_lettered") => pb::EventStatus::DeadLettered,
        Some("redriven") => pb::EventStatus::Redriven,
        Some(other) => anyhow::bail!("unknown status {other:?}: use completed, dead_lettered, redriven or all"),
    };
    let mut token = String::new();
    let mut rows = Vec::new();
    loop {
        let request = pb::ListEventLogRequest {
            consumer: a.name.clone(),
            status: status.into(),
            limit: a.limit,
            page_token: std::mem::take(&mut token),
        };
        let page = client.event_log(request).await?;
        for e in &page.entries {
            let status = match pb::EventStatus::try_from(e.status) {
                Ok(pb::EventStatus::Completed) => "completed",
                Ok(pb::EventStatus::DeadLettered) => "dead_lettered",
                Ok(pb::EventStatus::Redriven) => "redriven",
                Ok(pb::EventStatus::Unspecified) | Err(_) => "unknown",
            };
            let reasons: Vec<&str> = e.failures.iter().map(|f| f.reason.as_str()).collect();
            if json {
                let v = json!({
                    "event_id": e.event_id, "channel": e.channel, "status": status, "attempts": e.attempts,
                    "first_delivered_at": time(e.first_delivered_at.as_ref()), "finished_at": time(e.finished_at.as_ref()),
                    "failures": reasons,
                });
                println!("{v}");
            } else {
                rows.push(vec![
                    e.event_id.clone(),
                    e.channel.clone(),
                    status.to_owned(),
                    e.attempts.to_string(),
                    time(e.finished_at.as_ref()),
                    reasons.join("; "),
                ]);
            }
        }
        if page.next_page_token.is_empty() || !a.all {
            break;
        }
        token = page.next_page_token;
    }
    if !json {
        print!("{}", table(&["EVENT", "CHANNEL", "STATUS", "ATTEMPTS", "FINISHED", "FAILURES"], &rows));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(args: &[&str]) -> CreateArgs {
        use clap::Parser as _;
        let mut line = vec!["eventbus", "consumer", "create", "c", "-c", "a.>"];
        line.extend_from_slice(args);
        match crate::cli::Cli::try_parse_from(line).map(|c| c.command) {
            Ok(crate::cli::Command::Consumer { command: ConsumerCommand::Create(a) }) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn push_options_fill_the_push_config() {
        assert!(config(create(&[])).unwrap().push.is_none());
        let c = config(create(&[
            "--push-url",
            "https://h/hook",
            "--push-header",
            "Authorization: Bearer x",
            "--push-batch",
            "4",
            "--push-envelope",
            "json",
            "--push-secret",
            "s",
        ]))
        .unwrap();
        let p = c.push.unwrap();
        assert_eq!((p.url.as_str(), p.batch, p.envelope), ("https://h/hook", 4, pb::PushEnvelope::Json as i32));
        assert_eq!((p.timeout_ms, p.max_concurrency, p.secret.as_str()), (0, 0, "s"), "0: the broker's default");
        assert_eq!(p.headers.get("Authorization").map(String::as_str), Some("Bearer x"));
        let twice = create(&["--push-url", "http://h/", "--push-header", "A: 1", "--push-header", "a: 2"]);
        assert!(config(twice).is_err_and(|e| e.to_string().contains("given twice")));
    }

    #[test]
    fn push_is_shown_with_header_names_and_whether_a_secret_is_set() {
        let push = pb::PushConfig {
            url: "http://h/".into(),
            headers: [("Authorization".to_owned(), "(redacted)".to_owned())].into(),
            timeout_ms: 10_000,
            max_concurrency: 16,
            batch: 4,
            envelope: pb::PushEnvelope::Json.into(),
            secret: "(redacted)".into(),
        };
        let info = pb::ConsumerInfo {
            config: Some(pb::ConsumerConfig { push: Some(push), ..Default::default() }),
            ..Default::default()
        };
        let v = info_json(&info);
        assert_eq!(v["push"]["envelope"], "json");
        assert_eq!(v["push"]["headers"]["Authorization"], "(redacted)");
        assert_eq!((v["push"]["secret_set"].as_bool(), v["push"]["batch"].as_u64()), (Some(true), Some(4)));
        assert!(info_json(&pb::ConsumerInfo::default())["push"].is_null());
    }

    #[test]
    fn manual_commands_parse() {
        assert_eq!(parse_command("ack e1"), Ok(Manual::Ack("e1".into())));
        assert!(
            matches!(parse_command("nack e1 out of stock"), Ok(Manual::Nack { reason, .. }) if reason == "out of stock")
        );
        assert!(matches!(parse_command("term e1"), Ok(Manual::Term { id, .. }) if id == "e1"));
        assert_eq!(parse_command("release e1"), Ok(Manual::Release("e1".into())));
        assert!(parse_command("ack").is_err());
        assert!(parse_command("skip e1").is_err());
    }
}
