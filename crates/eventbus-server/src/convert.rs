//! The edge between core types and wire types: conversions, and the one place core
//! errors become gRPC statuses.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventbus_core::{
    BusStats, ChannelStats, CloseReason, Error, ErrorKind, Event, Overflow, PublishInput, Published, SubscribeOptions,
    SubscriptionInfo,
};
use eventbus_proto::pb;
use tonic::Status;

/// Maps a core error to its gRPC status (README "Errors"). Messages name the problem;
/// an internal error is logged with its causes and answered without them.
pub(crate) fn status(err: Error) -> Status {
    let message = err.to_string();
    match err.kind() {
        ErrorKind::Internal => {
            tracing::error!(error = %eventbus_core::error_chain(&err), "internal error");
            Status::internal(message)
        }
        ErrorKind::InvalidArgument => Status::invalid_argument(message),
        ErrorKind::TooLarge => Status::resource_exhausted(message),
        ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::Unavailable => Status::unavailable(message),
        ErrorKind::AlreadyExists => Status::already_exists(message),
    }
}

/// The status a subscription stream ends with, or `None` for a normal end.
pub(crate) fn close_status(reason: CloseReason) -> Option<Status> {
    match reason {
        CloseReason::Unsubscribed => None,
        CloseReason::SlowConsumer => Some(Status::resource_exhausted(
            "slow consumer: the subscription queue overflowed (overflow policy DISCONNECT)",
        )),
        CloseReason::ShuttingDown => Some(Status::unavailable("shutting down")),
    }
}

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    t.into()
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub(crate) fn publish_input(req: pb::PublishRequest, peer: String) -> PublishInput {
    PublishInput {
        channel: req.channel,
        payload: req.payload,
        metadata: req.metadata,
        content_type: req.content_type,
        source: req.source,
        peer,
        ordering_key: req.ordering_key,
        idempotency_key: req.idempotency_key,
    }
}

pub(crate) fn publish_response(p: Published) -> pb::PublishResponse {
    pb::PublishResponse {
        event_id: p.event_id,
        delivered_count: p.delivered,
        failed_count: p.failed,
        duration: Some(duration(p.duration)),
        duplicate: p.duplicate,
    }
}

pub(crate) fn subscribe_options(req: pb::SubscribeRequest, peer: String) -> Result<SubscribeOptions, Status> {
    let overflow = match pb::OverflowPolicy::try_from(req.overflow) {
        Ok(pb::OverflowPolicy::Unspecified) => None,
        Ok(pb::OverflowPolicy::DropNewest) => Some(Overflow::DropNewest),
        Ok(pb::OverflowPolicy::DropOldest) => Some(Overflow::DropOldest),
        Ok(pb::OverflowPolicy::Disconnect) => Some(Overflow::Disconnect),
        Err(_) => return Err(Status::invalid_argument(format!("invalid overflow: unknown policy {}", req.overflow))),
    };
    Ok(SubscribeOptions {
        channels: req.channels,
        group: req.group,
        queue_capacity: req.queue_capacity as usize,
        overflow,
        max_batch: req.max_batch as usize,
        name: req.name,
        peer,
    })
}

fn overflow_policy(o: Overflow) -> pb::OverflowPolicy {
    match o {
        Overflow::DropNewest => pb::OverflowPolicy::DropNewest,
        Overflow::DropOldest => pb::OverflowPolicy::DropOldest,
        Overflow::Disconnect => pb::OverflowPolicy::Disconnect,
    }
}

pub(crate) fn event(e: &Arc<Event>) -> pb::Event {
    pb::Event {
        id: e.id.clone(),
        channel: e.channel.clone(),
        timestamp: Some(timestamp(e.timestamp)),
        source: e.source.clone(),
        payload: e.payload.clone(),
        metadata: e.metadata.clone(),
        content_type: e.content_type.clone(),
    }
}

pub(crate) fn stats(s: BusStats) -> pb::GetStatsResponse {
    pb::GetStatsResponse {
        total_published: s.total_published,
        total_delivered: s.total_delivered,
        total_failed: s.total_failed,
        total_dropped: s.total_dropped,
        active_subscriptions: s.active_subscriptions,
        active_channels: s.active_channels,
        started_at: Some(timestamp(s.started_at)),
        mode: s.mode.to_owned(),
        instance_id: s.instance_id,
    }
}

pub(crate) fn channel(c: ChannelStats) -> pb::ChannelStats {
    pb::ChannelStats {
        channel: c.channel,
        published_count: c.published_count,
        delivered_count: c.delivered_count,
        subscriber_count: c.subscriber_count,
        last_published_at: c.last_published_at.map(timestamp),
    }
}

pub(crate) fn subscription(s: SubscriptionInfo) -> pb::SubscriptionInfo {
    pb::SubscriptionInfo {
        id: s.id,
        channels: s.channels,
        group: s.group.unwrap_or_default(),
        name: s.name,
        pending: s.pending,
        capacity: s.capacity,
        delivered: s.delivered,
        dropped: s.dropped,
        overflow: overflow_policy(s.overflow).into(),
        peer: s.peer,
        created_at: Some(timestamp(s.created_at)),
    }
}
