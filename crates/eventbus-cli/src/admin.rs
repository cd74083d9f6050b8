//! `eventbus stats | channels | subscriptions | unsubscribe`.

use eventbus_client::{Client, pb};
use serde_json::json;

use crate::output::{table, time};

pub(crate) async fn stats(client: &Client, json: bool) -> anyhow::Result<()> {
    let s = client.stats().await?;
    let fields: [(&str, String); 9] = [
        ("mode", s.mode.clone()),
        ("instance_id", s.instance_id.clone()),
        ("started_at", time(s.started_at.as_ref())),
        ("total_published", s.total_published.to_string()),
        ("total_delivered", s.total_delivered.to_string()),
        ("total_failed", s.total_failed.to_string()),
        ("total_dropped", s.total_dropped.to_string()),
        ("active_subscriptions", s.active_subscriptions.to_string()),
        ("active_channels", s.active_channels.to_string()),
    ];
    if json {
        let value = json!({
            "mode": s.mode,
            "instance_id": s.instance_id,
            "started_at": time(s.started_at.as_ref()),
            "total_published": s.total_published,
            "total_delivered": s.total_delivered,
            "total_failed": s.total_failed,
            "total_dropped": s.total_dropped,
            "active_subscriptions": s.active_subscriptions,
            "active_channels": s.active_channels,
        });
        println!("{value}");
    } else {
        for (name, value) in fields {
            println!("{name:<21} {value}");
        }
    }
    Ok(())
}

pub(crate) async fn channels(client: &Client, json: bool) -> anyhow::Result<()> {
    let channels = client.channels().await?;
    if json {
        let values: Vec<_> = channels
            .iter()
            .map(|c| {
                json!({
                    "channel": c.channel,
                    "published_count": c.published_count,
                    "delivered_count": c.delivered_count,
                    "subscriber_count": c.subscriber_count,
                    "last_published_at": c.last_published_at.as_ref().map(ToString::to_string),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(values));
    } else {
        let rows: Vec<Vec<String>> = channels
            .iter()
            .map(|c| {
                vec![
                    c.channel.clone(),
                    c.published_count.to_string(),
                    c.delivered_count.to_string(),
                    c.subscriber_count.to_string(),
                    time(c.last_published_at.as_ref()),
                ]
            })
            .collect();
        print!("{}", table(&["CHANNEL", "PUBLISHED", "DELIVERED", "SUBSCRIBERS", "LAST PUBLISHED"], &rows));
    }
    Ok(())
}

pub(crate) async fn history(client: &Client, json: bool, args: crate::cli::HistoryArgs) -> anyhow::Result<()> {
    let since =
        match args.since.as_deref().map(crate::subscribe::parse_since).transpose().map_err(anyhow::Error::msg)? {
            None => None,
            Some(crate::subscribe::Since::Age(age)) => {
                Some(std::time::SystemTime::now().checked_sub(age).unwrap_or(std::time::UNIX_EPOCH).into())
            }
            Some(crate::subscribe::Since::Time(time)) => Some(time),
            Some(crate::subscribe::Since::Position(_)) => {
                anyhow::bail!("--since takes an age or a time here; a position's offset goes to --after")
            }
        };
    let request = pb::GetChannelHistoryRequest {
        channel: args.channel,
        after_offset: args.after.unwrap_or(0),
        since,
        limit: args.limit,
    };
    let page = client.channel_history(request).await?;
    let h = page.history.unwrap_or_default();
    if json {
        let events: Vec<_> = page.events.iter().map(crate::output::event_json).collect();
        let history = json!({
            "channel": h.channel,
            "epoch": h.epoch,
            "first_offset": h.first_offset,
            "last_offset": h.last_offset,
            "events": h.events,
            "bytes": h.bytes,
        });
        println!("{}", json!({ "history": history, "events": events, "more": page.more }));
        return Ok(());
    }
    println!(
        "{}: epoch {}, offsets {}..{}, {} events, {} bytes",
        h.channel, h.epoch, h.first_offset, h.last_offset, h.events, h.bytes
    );
    for event in &page.events {
        println!("{}", crate::output::event_line(event));
    }
    if page.more
        && let Some(last) = page.events.last().and_then(|e| e.position.as_ref())
    {
        println!("(more: --after {})", last.offset);
    }
    Ok(())
}

fn overflow_name(policy: i32) -> &'static str {
    match pb::OverflowPolicy::try_from(policy) {
        Ok(pb::OverflowPolicy::DropNewest) => "drop_newest",
        Ok(pb::OverflowPolicy::DropOldest) => "drop_oldest",
        Ok(pb::OverflowPolicy::Disconnect) => "disconnect",
        Ok(pb::OverflowPolicy::DeadLetter) => "dead_letter",
        _ => "unspecified",
    }
}

pub(crate) async fn subscriptions(client: &Client, json: bool) -> anyhow::Result<()> {
    let subs = client.subscriptions().await?;
    if json {
        let values: Vec<_> = subs
            .iter()
            .map(|s| {
                json!({
                    "id": s.id,
                    "channels": s.channels,
                    "group": s.group,
                    "name": s.name,
                    "pending": s.pending,
                    "capacity": s.capacity,
                    "delivered": s.delivered,
                    "dropped": s.dropped,
                    "overflow": overflow_name(s.overflow),
                    "peer": s.peer,
                    "created_at": time(s.created_at.as_ref()),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(values));
    } else {
        let rows: Vec<Vec<String>> = subs
            .iter()
            .map(|s| {
                vec![
                    s.id.clone(),
                    s.name.clone(),
                    s.channels.join(","),
                    if s.group.is_empty() { "-".into() } else { s.group.clone() },
                    format!("{}/{}", s.pending, s.capacity),
                    s.delivered.to_string(),
                    s.dropped.to_string(),
                    overflow_name(s.overflow).to_owned(),
                    s.peer.clone(),
                ]
            })
            .collect();
        let header = ["ID", "NAME", "CHANNELS", "GROUP", "QUEUED", "DELIVERED", "DROPPED", "OVERFLOW", "PEER"];
        print!("{}", table(&header, &rows));
    }
    Ok(())
}

pub(crate) async fn unsubscribe(client: &Client, json: bool, id: &str) -> anyhow::Result<()> {
    client.unsubscribe(id).await?;
    if json {
        println!("{}", json!({ "unsubscribed": id }));
    } else {
        println!("unsubscribed {id}");
    }
    Ok(())
}
