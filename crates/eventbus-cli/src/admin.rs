//! `eventbus stats | channels | subscriptions | unsubscribe`.

use eventbus_bench::client::Connector;
use eventbus_proto::pb;
use serde_json::json;

use crate::connect::status_error;
use crate::output::{table, time};

pub(crate) async fn stats(server: &Connector, json: bool) -> anyhow::Result<()> {
    let s = server.admin().await?.get_stats(pb::GetStatsRequest {}).await.map_err(status_error)?.into_inner();
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

pub(crate) async fn channels(server: &Connector, json: bool) -> anyhow::Result<()> {
    let list = server.admin().await?.list_channels(pb::ListChannelsRequest {}).await.map_err(status_error)?;
    let channels = list.into_inner().channels;
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

fn overflow_name(policy: i32) -> &'static str {
    match pb::OverflowPolicy::try_from(policy) {
        Ok(pb::OverflowPolicy::DropNewest) => "drop_newest",
        Ok(pb::OverflowPolicy::DropOldest) => "drop_oldest",
        Ok(pb::OverflowPolicy::Disconnect) => "disconnect",
        _ => "unspecified",
    }
}

pub(crate) async fn subscriptions(server: &Connector, json: bool) -> anyhow::Result<()> {
    let list = server.admin().await?.list_subscriptions(pb::ListSubscriptionsRequest {}).await.map_err(status_error)?;
    let subs = list.into_inner().subscriptions;
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

pub(crate) async fn unsubscribe(server: &Connector, json: bool, id: &str) -> anyhow::Result<()> {
    let req = pb::UnsubscribeRequest { subscription_id: id.to_owned() };
    server.admin().await?.unsubscribe(req).await.map_err(status_error)?;
    if json {
        println!("{}", json!({ "unsubscribed": id }));
    } else {
        println!("unsubscribed {id}");
    }
    Ok(())
}
