//! Subscriptions, events and statistics.

use super::*;
use eventbus_core::Since;
use eventbus_core::history::Position;

use crate::ops::{Frame, Started};

/// A `SubscribeRequest`'s options; the owner and its bounds are the operation's to set.
pub(crate) fn subscribe_options(
    req: pb::SubscribeRequest,
    peer: String,
) -> Result<(SubscribeOptions, Option<Since>), Refusal> {
    let pb::SubscribeRequest {
        channels,
        group,
        queue_capacity,
        overflow,
        max_batch,
        name,
        max_queue_bytes,
        since: asked,
    } = req;
    let overflow = match pb::OverflowPolicy::try_from(overflow) {
        Ok(pb::OverflowPolicy::Unspecified) => None,
        Ok(pb::OverflowPolicy::DropNewest) => Some(Overflow::DropNewest),
        Ok(pb::OverflowPolicy::DropOldest) => Some(Overflow::DropOldest),
        Ok(pb::OverflowPolicy::Disconnect) => Some(Overflow::Disconnect),
        Ok(pb::OverflowPolicy::DeadLetter) => Some(Overflow::DeadLetter),
        Err(_) => return Err(Refusal::BadRequest(format!("invalid overflow: unknown policy {overflow}"))),
    };
    let options = SubscribeOptions {
        channels,
        group,
        queue_capacity: queue_capacity as usize,
        max_queue_bytes: usize::try_from(max_queue_bytes).unwrap_or(usize::MAX),
        overflow,
        max_batch: max_batch as usize,
        name,
        peer,
        owner: String::new(),
        owner_max_queued_bytes: 0,
    };
    Ok((options, since(asked)?))
}

/// A subscription's first message.
pub(crate) fn subscription_started(started: Started) -> pb::SubscribeResponse {
    let Started { id, recovered, positions, started_at } = started;
    pb::SubscribeResponse {
        kind: Some(pb::subscribe_response::Kind::Started(pb::SubscriptionStarted {
            subscription_id: id,
            recovered,
            positions: positions.into_iter().map(|(c, p)| (c, position(&p))).collect(),
            started_at: Some(timestamp(started_at)),
        })),
    }
}

/// A subscription's frame as the generated message (for callers of the service trait;
/// the stream itself is encoded without it).
pub(crate) fn subscribe_response(frame: Frame) -> pb::SubscribeResponse {
    match frame {
        Frame::Started(started) => subscription_started(started),
        Frame::Events(events) => pb::SubscribeResponse {
            kind: Some(pb::subscribe_response::Kind::Events(pb::EventBatch {
                events: events.iter().map(event).collect(),
            })),
        },
    }
}

fn overflow_policy(o: Overflow) -> pb::OverflowPolicy {
    match o {
        Overflow::DropNewest => pb::OverflowPolicy::DropNewest,
        Overflow::DropOldest => pb::OverflowPolicy::DropOldest,
        Overflow::Disconnect => pb::OverflowPolicy::Disconnect,
        Overflow::DeadLetter => pb::OverflowPolicy::DeadLetter,
    }
}

pub(crate) fn event(e: &Arc<Event>) -> pb::Event {
    pb::Event {
        id: e.id.to_string(),
        channel: e.channel.clone(),
        timestamp: Some(timestamp(e.timestamp)),
        source: e.source.to_string(),
        payload: e.payload.clone(),
        metadata: e.metadata.clone(),
        content_type: e.content_type.clone(),
        position: e.position.as_ref().map(position),
    }
}

pub(crate) fn position(p: &Position) -> pb::EventPosition {
    pb::EventPosition { epoch: p.epoch.to_string(), offset: p.offset }
}

/// `SubscribeRequest.since`: `None` when absent or empty.
fn since(since: Option<pb::SubscribeSince>) -> Result<Option<Since>, Refusal> {
    let Some(pb::SubscribeSince { positions, timestamp }) = since else { return Ok(None) };
    let timestamp = timestamp.map(|t| valid_time("since.timestamp", t)).transpose()?;
    let positions = positions
        .into_iter()
        .map(|(channel, p)| (channel, Position { epoch: p.epoch.into(), offset: p.offset }))
        .collect();
    let since = Since { positions, timestamp };
    Ok((!since.is_empty()).then_some(since))
}

pub(crate) fn subscription(s: SubscriptionInfo) -> pb::SubscriptionInfo {
    let SubscriptionInfo {
        id,
        channels,
        group,
        name,
        pending,
        capacity,
        queued_bytes,
        max_queue_bytes,
        delivered,
        dropped,
        overflow,
        peer,
        owner,
        created_at,
    } = s;
    pb::SubscriptionInfo {
        id,
        channels,
        group: group.unwrap_or_default(),
        name,
        pending,
        capacity,
        queued_bytes,
        max_queue_bytes,
        delivered,
        dropped,
        overflow: overflow_policy(overflow).into(),
        peer,
        created_at: Some(timestamp(created_at)),
        owner,
    }
}

/// `SubscriptionInfo` in JSON: no group is `null`, the policy its configuration spelling.
#[derive(Debug, Serialize)]
pub(crate) struct SubscriptionJson {
    id: String,
    channels: Vec<String>,
    group: Option<String>,
    name: String,
    pending: u64,
    capacity: u64,
    queued_bytes: u64,
    max_queue_bytes: u64,
    delivered: u64,
    dropped: u64,
    overflow: &'static str,
    peer: String,
    owner: String,
    created_at: String,
}

pub(crate) fn subscription_json(s: SubscriptionInfo) -> SubscriptionJson {
    let SubscriptionInfo {
        id,
        channels,
        group,
        name,
        pending,
        capacity,
        queued_bytes,
        max_queue_bytes,
        delivered,
        dropped,
        overflow,
        peer,
        owner,
        created_at,
    } = s;
    SubscriptionJson {
        id,
        channels,
        group,
        name,
        pending,
        capacity,
        queued_bytes,
        max_queue_bytes,
        delivered,
        dropped,
        overflow: overflow.as_str(),
        peer,
        owner,
        created_at: rfc3339(created_at),
    }
}

// --- stats ---

pub(crate) fn stats(s: BusStats) -> pb::GetStatsResponse {
    let BusStats {
        total_published,
        total_delivered,
        total_failed,
        total_dropped,
        active_subscriptions,
        active_channels,
        started_at,
        mode,
        instance_id,
    } = s;
    pb::GetStatsResponse {
        total_published,
        total_delivered,
        total_failed,
        total_dropped,
        active_subscriptions,
        active_channels,
        started_at: Some(timestamp(started_at)),
        mode: mode.to_owned(),
        instance_id,
    }
}

/// `GetStatsResponse` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct StatsJson {
    total_published: u64,
    total_delivered: u64,
    total_failed: u64,
    total_dropped: u64,
    active_subscriptions: u64,
    active_channels: u64,
    started_at: String,
    mode: &'static str,
    instance_id: String,
}

pub(crate) fn stats_json(s: BusStats) -> StatsJson {
    let BusStats {
        total_published,
        total_delivered,
        total_failed,
        total_dropped,
        active_subscriptions,
        active_channels,
        started_at,
        mode,
        instance_id,
    } = s;
    StatsJson {
        total_published,
        total_delivered,
        total_failed,
        total_dropped,
        active_subscriptions,
        active_channels,
        started_at: rfc3339(started_at),
        mode,
        instance_id,
    }
}

// `failed_count` and `dropped_count` feed the per-channel metrics; neither wire form
// carries them (yet), and both say so here.
pub(crate) fn channel(c: ChannelStats) -> pb::ChannelStats {
    let ChannelStats {
        channel,
        published_count,
        delivered_count,
        failed_count: _,
        dropped_count: _,
        subscriber_count,
        last_published_at,
    } = c;
    pb::ChannelStats {
        channel,
        published_count,
        delivered_count,
        subscriber_count,
        last_published_at: last_published_at.map(timestamp),
    }
}

/// `ChannelStats` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelJson {
    channel: String,
    published_count: u64,
    delivered_count: u64,
    subscriber_count: u64,
    last_published_at: Option<String>,
}

pub(crate) fn channel_json(c: ChannelStats) -> ChannelJson {
    let ChannelStats {
        channel,
        published_count,
        delivered_count,
        failed_count: _,
        dropped_count: _,
        subscriber_count,
        last_published_at,
    } = c;
    ChannelJson {
        channel,
        published_count,
        delivered_count,
        subscriber_count,
        last_published_at: last_published_at.map(rfc3339),
    }
}
