//! `eventbus subscribe`.

use std::io::Write as _;

use eventbus_bench::client::Connector;
use eventbus_proto::pb::{self, subscribe_response::Kind};

use crate::cli::SubscribeArgs;
use crate::connect::status_error;
use crate::output;

pub(crate) async fn run(server: &Connector, json: bool, args: SubscribeArgs) -> anyhow::Result<()> {
    let mut client = server.event_bus().await?;
    let req = pb::SubscribeRequest {
        channels: args.patterns.clone(),
        group: args.group.clone().unwrap_or_default(),
        queue_capacity: args.queue_capacity,
        overflow: args.overflow.map_or(pb::OverflowPolicy::Unspecified, Into::into) as i32,
        max_batch: args.max_batch,
        name: args.name.clone(),
    };
    let mut stream = client.subscribe(req).await.map_err(status_error)?.into_inner();
    let mut received = 0u64;
    if args.count == Some(0) {
        return Ok(());
    }
    loop {
        let message = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            message = stream.message() => message,
        };
        match message.map_err(status_error)? {
            None => {
                note("subscription closed by the broker");
                return Ok(());
            }
            Some(pb::SubscribeResponse { kind: Some(Kind::Started(started)) }) => {
                note(&format!("subscribed {} to {}", started.subscription_id, args.patterns.join(" ")));
            }
            Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) }) => {
                let mut out = std::io::stdout().lock();
                for event in &batch.events {
                    let line = if json { output::event_json(event).to_string() } else { output::event_line(event) };
                    if writeln!(out, "{line}").is_err() {
                        return Ok(()); // stdout closed (e.g. `| head`): nothing left to do
                    }
                    received += 1;
                    if args.count == Some(received) {
                        let _ = out.flush();
                        return Ok(());
                    }
                }
                if out.flush().is_err() {
                    return Ok(());
                }
            }
            Some(pb::SubscribeResponse { kind: None }) => {}
        }
    }
}

/// A status line on stderr; a closed stderr is not worth failing for.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
