//! `eventbus publish`.

use std::io::Read as _;

use anyhow::{Context, bail};
use eventbus_client::{AckMode, Client, PublishAnswer, PublishSender, pb};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::PublishArgs;

/// Requests read ahead of the broker's answers with `--lines`.
const LINES_IN_FLIGHT: usize = 1024;

pub(crate) async fn run(client: &Client, json: bool, args: PublishArgs) -> anyhow::Result<()> {
    let template = pb::PublishRequest {
        channel: args.channel.clone(),
        metadata: args.metadata.iter().cloned().collect(),
        content_type: args.content_type.clone().unwrap_or_default(),
        source: args.source.clone().unwrap_or_default(),
        ordering_key: args.ordering_key.clone().unwrap_or_default(),
        idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
        ..Default::default()
    };
    if args.lines {
        if args.payload.as_deref() != Some("-") {
            bail!("--lines reads standard input: give `-` as the payload");
        }
        return match (args.batch, args.ack) {
            (Some(size), _) => publish_line_batches(client, json, template, size as usize).await,
            (None, AckMode::Each) => publish_lines(client, json, template).await,
            (None, ack) => publish_lines_acked(client, json, template, ack).await,
        };
    }
    let payload = match args.payload.as_deref() {
        None => Vec::new(),
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).context("cannot read standard input")?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let req = with_payload(&template, payload);
    let resp = client.publish_request(req).await?;
    print_published(json, &args.channel, &resp);
    Ok(())
}

/// The request for one payload: the template's fields, and the payload's content type
/// unless `--content-type` gave one.
fn with_payload(template: &pb::PublishRequest, payload: Vec<u8>) -> pb::PublishRequest {
    let content_type = match template.content_type.is_empty() {
        true => infer_content_type(&payload).to_owned(),
        false => template.content_type.clone(),
    };
    pb::PublishRequest { payload: payload.into(), content_type, ..template.clone() }
}

/// What a payload given without `--content-type` is: JSON when it parses as JSON, text
/// when it is UTF-8, otherwise unsaid (the broker and its views treat it as bytes).
fn infer_content_type(payload: &[u8]) -> &'static str {
    if payload.is_empty() {
        ""
    } else if serde_json::from_slice::<&serde_json::value::RawValue>(payload).is_ok() {
        "application/json"
    } else if std::str::from_utf8(payload).is_ok() {
        "text/plain"
    } else {
        ""
    }
}

fn print_published(json: bool, channel: &str, resp: &pb::PublishResponse) {
    if json {
        let duration_us = resp.duration.as_ref().map_or(0, |d| d.seconds * 1_000_000 + i64::from(d.nanos) / 1000);
        let line = json!({
            "event_id": resp.event_id,
            "channel": channel,
            "delivered_count": resp.delivered_count,
            "failed_count": resp.failed_count,
            "duration_us": duration_us,
            "duplicate": resp.duplicate,
            "captured_count": resp.captured_count,
        });
        println!("{line}");
    } else {
        let plural = if resp.delivered_count == 1 { "" } else { "s" };
        let mut line = format!(
            "published {} to {channel}: delivered to {} subscription{plural}",
            resp.event_id, resp.delivered_count
        );
        if resp.failed_count > 0 {
            line.push_str(&format!(", {} failed", resp.failed_count));
        }
        if resp.captured_count > 0 {
            let plural = if resp.captured_count == 1 { "" } else { "s" };
            line.push_str(&format!("; stored for {} durable consumer{plural}", resp.captured_count));
        }
        if resp.duplicate {
            line = format!("duplicate of {} (idempotency key seen before): not delivered again", resp.event_id);
        }
        println!("{line}");
    }
}

/// One event per stdin line over a single PublishStream, read and answered concurrently.
async fn publish_lines(client: &Client, json: bool, template: pb::PublishRequest) -> anyhow::Result<()> {
    let channel = template.channel.clone();
    let (tx, mut responses) = client.publish_stream(LINES_IN_FLIGHT).await?;
    let reader = send_lines(tx, template);
    let (mut events, mut delivered, mut failed) = (0u64, 0u64, 0u64);
    while let Some(resp) = responses.next().await? {
        events += 1;
        delivered += u64::from(resp.delivered_count);
        failed += u64::from(resp.failed_count);
        if json {
            print_published(true, &channel, &resp);
        }
    }
    reader.await.context("stdin reader failed")?.context("cannot read standard input")?;
    if !json {
        println!("published {events} events: {delivered} deliveries, {failed} failed");
    }
    Ok(())
}

/// Sends one event per stdin line on `tx`, then closes it.
fn send_lines(tx: PublishSender, template: pb::PublishRequest) -> tokio::task::JoinHandle<Result<(), std::io::Error>> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let req = with_payload(&template, line.into_bytes());
            if tx.send(req).await.is_err() {
                break; // the stream ended early (an error), reported by the caller
            }
        }
        Ok(())
    })
}

/// One event per stdin line over a single PublishStream in `ack` mode (cumulative or
/// none): refused lines are reported as they are answered (on stderr, or as JSON lines
/// with their `error`) without stopping the others, and make the command fail at the
/// end; the stream's totals are printed last.
async fn publish_lines_acked(
    client: &Client,
    json: bool,
    template: pb::PublishRequest,
    ack: AckMode,
) -> anyhow::Result<()> {
    let channel = template.channel.clone();
    let (tx, mut answers) = client.publish_stream_with(LINES_IN_FLIGHT, ack).await?;
    let reader = send_lines(tx, template);
    let mut last = None;
    while let Some(answer) = answers.next_answer().await? {
        match answer {
            PublishAnswer::Refused { position, error } => report_refused(json, &channel, position + 1, &error),
            PublishAnswer::Totals(totals) => last = Some(totals),
            // Not sent in these modes; counted in the totals all the same.
            PublishAnswer::Published(_) => {}
        }
    }
    reader.await.context("stdin reader failed")?.context("cannot read standard input")?;
    let totals = last.filter(|t| t.end).context("the publish stream ended without its totals")?;
    if json {
        let line = json!({
            "channel": channel,
            "published": totals.count,
            "refused": totals.refused,
            "delivered": totals.delivered,
            "failed": totals.failed,
            "captured": totals.captured,
            "duplicates": totals.duplicates,
            "last_event_id": totals.last_event_id,
        });
        println!("{line}");
    }
    let pb::PublishAck { count: events, delivered, failed, refused, .. } = totals;
    LineTally { events, delivered, failed, refused }.finish(json)
}

/// Reports a refused line (counted from 1).
fn report_refused(json: bool, channel: &str, line: u64, err: &eventbus_client::Error) {
    if json {
        let code = err.status().map_or(0, |s| s.code() as i32);
        let message = err.status().map_or_else(|| err.to_string(), |s| s.message().to_owned());
        println!("{}", json!({"channel": channel, "line": line, "error": {"code": code, "message": message}}));
    } else {
        eprintln!("line {line} refused: {err}");
    }
}

/// One event per stdin line, in `PublishBatch` calls of up to `size` lines: a refused
/// line is reported (on stderr, or as a JSON line with its `error`) without stopping
/// the others, and makes the command fail at the end.
async fn publish_line_batches(
    client: &Client,
    json: bool,
    template: pb::PublishRequest,
    size: usize,
) -> anyhow::Result<()> {
    let channel = template.channel.clone();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tally = LineTally::default();
    let mut batch = Vec::with_capacity(size);
    loop {
        let line = lines.next_line().await.context("cannot read standard input")?;
        let end = line.is_none();
        if let Some(line) = line {
            batch.push(with_payload(&template, line.into_bytes()));
        }
        if batch.len() >= size || (end && !batch.is_empty()) {
            let events = std::mem::replace(&mut batch, Vec::with_capacity(size));
            for answer in client.publish_batch(events).await? {
                tally.record(json, &channel, answer);
            }
        }
        if end {
            break;
        }
    }
    tally.finish(json)
}

/// What the answers of `--lines` add up to, when refused lines do not stop the others.
#[derive(Debug, Default, Clone, Copy)]
struct LineTally {
    events: u64,
    delivered: u64,
    failed: u64,
    refused: u64,
}

impl LineTally {
    /// Prints the summary (unless `json`, where each line was printed) and fails when a
    /// line was refused.
    fn finish(self, json: bool) -> anyhow::Result<()> {
        let Self { events, delivered, failed, refused } = self;
        if !json {
            println!("published {events} events: {delivered} deliveries, {failed} failed, {refused} refused");
        }
        if refused > 0 {
            bail!("{refused} of {} lines were refused", refused + events);
        }
        Ok(())
    }

    fn record(&mut self, json: bool, channel: &str, answer: Result<pb::PublishResponse, eventbus_client::Error>) {
        match answer {
            Ok(resp) => {
                self.events += 1;
                self.delivered += u64::from(resp.delivered_count);
                self.failed += u64::from(resp.failed_count);
                if json {
                    print_published(true, channel, &resp);
                }
            }
            Err(err) => {
                let line = self.events + self.refused + 1;
                self.refused += 1;
                report_refused(json, channel, line, &err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_type_follows_the_payload_unless_given() {
        assert_eq!(infer_content_type(br#"{"id": 1}"#), "application/json");
        assert_eq!(infer_content_type(b"[1, 2]"), "application/json");
        assert_eq!(infer_content_type(b"hello world"), "text/plain");
        assert_eq!(infer_content_type("café {".as_bytes()), "text/plain");
        assert_eq!(infer_content_type(&[0xff, 0xfe, 0x00]), "");
        assert_eq!(infer_content_type(b""), "");
        let given = pb::PublishRequest { content_type: "application/xml".into(), ..Default::default() };
        assert_eq!(with_payload(&given, b"{}".to_vec()).content_type, "application/xml");
        assert_eq!(with_payload(&pb::PublishRequest::default(), b"{}".to_vec()).content_type, "application/json");
    }
}
