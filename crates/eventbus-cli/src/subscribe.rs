//! `eventbus subscribe`.

use std::io::Write as _;

use eventbus_client::{Client, SubscribeOptions, SubscriptionItem, pb};

use crate::cli::SubscribeArgs;
use crate::output;

pub(crate) async fn run(client: &Client, json: bool, args: SubscribeArgs) -> anyhow::Result<()> {
    let req = pb::SubscribeRequest {
        channels: args.patterns.clone(),
        group: args.group.clone().unwrap_or_default(),
        queue_capacity: args.queue_capacity,
        max_queue_bytes: args.max_queue_bytes,
        overflow: args.overflow.map_or(pb::OverflowPolicy::Unspecified, Into::into) as i32,
        max_batch: args.max_batch,
        name: args.name.clone(),
        since: None,
    };
    // Lost (a broker restart, say), it is made again; the gap is reported, as events
    // published meanwhile are missed. With --no-reconnect, a loss ends the command.
    let mut subscription = client.subscribe(SubscribeOptions::from(req).reconnect(!args.no_reconnect)).await?;
    let mut received = 0u64;
    if args.count == Some(0) {
        return Ok(());
    }
    loop {
        let message = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            item = subscription.next() => item,
        };
        match message.transpose()? {
            None => {
                note("subscription closed by the broker");
                return Ok(());
            }
            Some(SubscriptionItem::Started { subscription_id }) => {
                note(&format!("subscribed {subscription_id} to {}", args.patterns.join(" ")));
            }
            Some(SubscriptionItem::Gap { reason }) => {
                note(&format!(
                    "gap: the subscription was lost ({reason}); events published until it is made again are missed"
                ));
            }
            Some(SubscriptionItem::Events(events)) => {
                let mut out = std::io::stdout().lock();
                for event in &events {
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
            Some(_) => {}
        }
    }
}

/// A status line on stderr; a closed stderr is not worth failing for.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
