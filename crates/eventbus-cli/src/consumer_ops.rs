//! `eventbus consumer pending|redrive|pause|resume`: what a stuck consumer holds, and
//! the repairs (docs/consumer-operations.md).

use eventbus_client::{Client, pb};
use serde_json::json;

use crate::cli::{PendingArgs, RedriveArgs};
use crate::durable::print_info;
use crate::output::{self, table, time};

/// `PendingState` as the REST routes spell it.
fn state_name(state: i32) -> &'static str {
    match pb::PendingState::try_from(state) {
        Ok(pb::PendingState::Ready) => "ready",
        Ok(pb::PendingState::Delayed) => "delayed",
        Ok(pb::PendingState::InFlight) => "in_flight",
        Ok(pb::PendingState::BlockedByOrderingKey) => "blocked_by_ordering_key",
        Ok(pb::PendingState::Unspecified) | Err(_) => "unknown",
    }
}

/// One pending entry in the shape of `GET …/{name}/pending` (the event as `consume
/// --json` prints it).
fn entry_json(e: &pb::PendingEntry) -> serde_json::Value {
    let failures: Vec<_> = e.failures.iter().map(|f| json!({"at": time(f.at.as_ref()), "reason": f.reason})).collect();
    json!({
        "event": e.event.as_ref().map(output::event_json),
        "attempt": e.attempt,
        "next_delivery": e.next_delivery.as_ref().map(ToString::to_string),
        "failures": failures,
        "state": state_name(e.state),
    })
}

fn entry_row(e: &pb::PendingEntry) -> Vec<String> {
    let (id, channel) = e.event.as_ref().map(|ev| (ev.id.clone(), ev.channel.clone())).unwrap_or_default();
    vec![
        id,
        channel,
        state_name(e.state).to_owned(),
        e.attempt.to_string(),
        time(e.next_delivery.as_ref()),
        e.failures.last().map(|f| f.reason.clone()).unwrap_or_else(|| "-".to_owned()),
    ]
}

/// `consumer pending`: one page, or every page with `--all`. JSON: one entry per line.
pub(crate) async fn pending(client: &Client, json: bool, a: PendingArgs) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut rows = Vec::new();
    let more = loop {
        let page = client.pending(a.name.clone(), a.limit, std::mem::take(&mut token)).await?;
        for e in &page.entries {
            if json {
                println!("{}", entry_json(e));
            } else {
                rows.push(entry_row(e));
            }
        }
        if page.next_page_token.is_empty() {
            break false;
        }
        if !a.all {
            break true;
        }
        token = page.next_page_token;
    };
    if !json {
        let header = ["EVENT ID", "CHANNEL", "STATE", "ATTEMPT", "NEXT DELIVERY", "LAST FAILURE"];
        print!("{}", table(&header, &rows));
    }
    if more {
        eprintln!("more pending events: --all lists every page");
    }
    Ok(())
}

/// `consumer redrive`: the given ids, the oldest `--limit`, or with `--all` until none
/// is left (or a call moves none, so it cannot loop forever).
pub(crate) async fn redrive(client: &Client, json: bool, a: RedriveArgs) -> anyhow::Result<()> {
    let asked = a.event_ids.len();
    let mut total = client.redrive(a.name.clone(), a.event_ids, a.limit).await?;
    while a.all && total.remaining > 0 {
        let next = client.redrive(a.name.clone(), Vec::new(), a.limit).await?;
        total.redriven += next.redriven;
        total.remaining = next.remaining;
        if next.redriven == 0 {
            break;
        }
    }
    if json {
        println!("{}", json!({"redriven": total.redriven, "remaining": total.remaining}));
    } else {
        println!("redriven {}, remaining {}", total.redriven, total.remaining);
    }
    let skipped = (asked as u64).saturating_sub(total.redriven);
    if skipped > 0 {
        eprintln!(
            "{skipped} of the given event ids were not kept for redrive (not dead-lettered, or already redriven)"
        );
    }
    Ok(())
}

/// `consumer pause|resume`: a line for people, the consumer's info for scripts.
pub(crate) fn print_paused(json: bool, info: &pb::ConsumerInfo) {
    if json {
        print_info(true, info);
        return;
    }
    let name = info.config.as_ref().map(|c| c.name.as_str()).unwrap_or_default();
    let verb = if info.paused { "paused" } else { "resumed" };
    println!("{verb} {name} ({} pending, {} in flight, {} clients)", info.pending, info.in_flight, info.clients);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_entry_prints_its_last_failure_and_next_delivery() {
        let e = pb::PendingEntry {
            event: Some(pb::Event { id: "e1".into(), channel: "orders.created".into(), ..Default::default() }),
            attempt: 2,
            next_delivery: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
            failures: vec![
                pb::Failure { at: None, reason: "first".into() },
                pb::Failure { at: None, reason: "card declined".into() },
            ],
            state: pb::PendingState::Delayed.into(),
        };
        assert_eq!(entry_row(&e), ["e1", "orders.created", "delayed", "2", "2023-11-14T22:13:20Z", "card declined"]);
        let v = entry_json(&e);
        assert_eq!((v["state"].as_str(), v["attempt"].as_u64()), (Some("delayed"), Some(2)));
        assert_eq!(v["failures"][1]["reason"], "card declined");
        assert_eq!(v["event"]["id"], "e1");
        let ready = pb::PendingEntry { state: pb::PendingState::Ready.into(), ..Default::default() };
        assert_eq!(entry_row(&ready)[4..], ["-", "-"]);
        assert!(entry_json(&ready)["next_delivery"].is_null());
    }
}
