//! The wire edge: every conversion between core types and what gRPC (`eventbus.v1`) and
//! the admin REST routes (JSON) carry, and the one table from a refusal to its gRPC
//! status and HTTP code.
//!
//! Each domain object has its protobuf form and its JSON form side by side, and both
//! take the domain struct apart field by field (no `..`): a field added to a core type
//! does not compile until both wire forms say what they do with it, so the two
//! protocols cannot drift apart again.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use bytes::Bytes;
use eventbus_core::durable::from_epoch_ms;
use eventbus_core::durable::{
    Backoff, BackoffKind, ConsumerConfig, ConsumerInfo, Delivery, DurableBackend, DurableError, Failure, LogEntry,
    LogSlice, LogStatus, PendingEntry, PendingSlice, PendingState, PublishedDeadLetter, Redriven,
};
use eventbus_core::{
    Bus, BusStats, ChannelStats, CloseReason, Error, ErrorKind, Event, Overflow, PublishInput, Published,
    SubscribeOptions, SubscriptionInfo,
};
use eventbus_proto::pb;
use prost::Message;
use serde::Serialize;
use tonic::{Code, Status};

// --- refusals ---

/// Why a request is refused, as the edge sees it: a core error, or a refusal decided
/// before the bus is reached. Both protocols render it through [`EdgeError::codes`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum EdgeError {
    /// Refused by the core (names, limits, unknown ids, durable engine, shutdown).
    #[error(transparent)]
    Core(#[from] Error),
    /// A durable-consumer call on a broker without a durable engine.
    #[error("durable consumers are not enabled on this broker")]
    DurableDisabled,
    /// A publish request too large to be read at all (over the gRPC decode limit or the
    /// REST body limit), refused before its payload is buffered.
    #[error(
        "request is over {request_limit} bytes, too large to read; the payload limit is \
         max_payload_bytes = {max_payload_bytes}"
    )]
    RequestTooLarge { request_limit: usize, max_payload_bytes: usize },
    /// A request the edge cannot turn into a core call (missing field, unknown enum
    /// value, malformed JSON).
    #[error("{0}")]
    BadRequest(String),
    /// Missing, malformed, unknown, expired or badly signed credentials (the text
    /// never holds the credential).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller lacks the right the operation needs; `what` names the refused
    /// channel or consumer.
    #[error("permission denied: principal {principal:?} may not {operation}: {what}")]
    PermissionDenied { principal: String, operation: &'static str, what: String },
    /// A per-principal limit (`max_subscriptions`, `max_publish_rate`) is reached.
    #[error("principal {principal:?} is over its {limit}")]
    OverLimit { principal: String, limit: &'static str },
    /// A `PublishBatch` with more events than `eventbus.max_publish_batch`.
    #[error("a batch holds at most eventbus.max_publish_batch = {limit} events; this one has {count}")]
    BatchTooLarge { count: usize, limit: usize },
}

impl From<DurableError> for EdgeError {
    fn from(err: DurableError) -> Self {
        Self::Core(err.into())
    }
}

impl EdgeError {
    /// The one table from a refusal to its wire codes, so a gRPC client and a REST
    /// client always get the same answer. `FAILED_PRECONDITION` (the broker is not set
    /// up for the call; retrying will not help) is 409 Conflict: the request conflicts
    /// with the broker's state, and 503 would invite retries.
    pub(crate) fn codes(&self) -> (Code, StatusCode) {
        match self {
            Self::Core(err) => match err.kind() {
                ErrorKind::InvalidArgument => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
                ErrorKind::TooLarge => (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
                ErrorKind::NotFound => (Code::NotFound, StatusCode::NOT_FOUND),
                ErrorKind::Unavailable => (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
                ErrorKind::AlreadyExists => (Code::AlreadyExists, StatusCode::CONFLICT),
                ErrorKind::StorageFull => (Code::ResourceExhausted, StatusCode::INSUFFICIENT_STORAGE),
                ErrorKind::Internal => {
                    // The client reads no internals; the log keeps the causes.
                    tracing::error!(error = %eventbus_core::error_chain(err), "internal error");
                    (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR)
                }
            },
            Self::DurableDisabled => (Code::FailedPrecondition, StatusCode::CONFLICT),
            Self::RequestTooLarge { .. } => (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
            Self::BadRequest(_) | Self::BatchTooLarge { .. } => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
            Self::Unauthenticated(_) => (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            Self::PermissionDenied { .. } => (Code::PermissionDenied, StatusCode::FORBIDDEN),
            Self::OverLimit { .. } => (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
        }
    }
}

impl From<EdgeError> for Status {
    fn from(err: EdgeError) -> Self {
        let (code, _) = err.codes();
        Status::new(code, err.to_string())
    }
}

/// The gRPC status of a refusal (README "Errors"). Messages name the problem.
pub(crate) fn status(err: impl Into<EdgeError>) -> Status {
    err.into().into()
}

/// The durable engine, or why there is none.
pub(crate) fn durable(bus: &Bus) -> Result<&Arc<dyn DurableBackend>, EdgeError> {
    bus.durable().ok_or(EdgeError::DurableDisabled)
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

// --- scalars ---

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    t.into()
}

/// A time in JSON: RFC 3339, UTC.
fn rfc3339(t: SystemTime) -> String {
    timestamp(t).to_string()
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

// --- publish ---

/// A publish from the wire; `scope` is the publisher's idempotency scope (its name).
pub(crate) fn publish_input(req: pb::PublishRequest, peer: String, scope: &str) -> PublishInput {
    let pb::PublishRequest { channel, payload, metadata, content_type, source, ordering_key, idempotency_key } = req;
    let idempotency_scope = if idempotency_key.is_empty() { String::new() } else { scope.to_owned() };
    PublishInput {
        channel,
        payload,
        metadata,
        content_type,
        source,
        peer,
        ordering_key,
        idempotency_key,
        idempotency_scope,
    }
}

/// `POST /admin/eventbus/publish` body. The payload is any JSON value, stored as its
/// compact JSON text with content type `application/json`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishJson {
    channel: String,
    #[serde(default)]
    payload: Option<serde_json::Value>,
    #[serde(default)]
    metadata: std::collections::HashMap<String, String>,
    #[serde(default)]
    source: String,
}

pub(crate) fn publish_input_json(body: &[u8], peer: String) -> Result<PublishInput, EdgeError> {
    let PublishJson { channel, payload, metadata, source } =
        serde_json::from_slice(body).map_err(|e| EdgeError::BadRequest(format!("invalid JSON body: {e}")))?;
    let payload = match payload {
        Some(value) => {
            serde_json::to_vec(&value).map_err(|e| EdgeError::BadRequest(format!("invalid payload: {e}")))?
        }
        None => Vec::new(),
    };
    Ok(PublishInput {
        channel,
        payload: payload.into(),
        metadata,
        content_type: "application/json".to_owned(),
        source,
        peer,
        ..PublishInput::default()
    })
}

pub(crate) fn publish_response(p: Published) -> pb::PublishResponse {
    let Published { event_id, delivered, failed, duration: took, duplicate } = p;
    pb::PublishResponse {
        event_id,
        delivered_count: delivered,
        failed_count: failed,
        duration: Some(duration(took)),
        duplicate,
        error: None,
    }
}

/// The REST answer to a publish (`PublishResponse`, the duration in microseconds).
#[derive(Debug, Serialize)]
pub(crate) struct PublishedJson {
    event_id: String,
    delivered_count: u32,
    failed_count: u32,
    duration_us: u64,
    duplicate: bool,
}

pub(crate) fn publish_response_json(p: Published) -> PublishedJson {
    let Published { event_id, delivered, failed, duration, duplicate } = p;
    PublishedJson {
        event_id,
        delivered_count: delivered,
        failed_count: failed,
        duration_us: duration.as_micros() as u64,
        duplicate,
    }
}

// --- subscriptions and events ---

pub(crate) fn subscribe_options(
    req: pb::SubscribeRequest,
    peer: String,
    owner: String,
) -> Result<SubscribeOptions, EdgeError> {
    let pb::SubscribeRequest { channels, group, queue_capacity, overflow, max_batch, name, max_queue_bytes } = req;
    let overflow = match pb::OverflowPolicy::try_from(overflow) {
        Ok(pb::OverflowPolicy::Unspecified) => None,
        Ok(pb::OverflowPolicy::DropNewest) => Some(Overflow::DropNewest),
        Ok(pb::OverflowPolicy::DropOldest) => Some(Overflow::DropOldest),
        Ok(pb::OverflowPolicy::Disconnect) => Some(Overflow::Disconnect),
        Ok(pb::OverflowPolicy::DeadLetter) => Some(Overflow::DeadLetter),
        Err(_) => return Err(EdgeError::BadRequest(format!("invalid overflow: unknown policy {overflow}"))),
    };
    Ok(SubscribeOptions {
        channels,
        group,
        queue_capacity: queue_capacity as usize,
        max_queue_bytes: usize::try_from(max_queue_bytes).unwrap_or(usize::MAX),
        overflow,
        max_batch: max_batch as usize,
        name,
        peer,
        owner,
        owner_max_queued_bytes: 0,
    })
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
        id: e.id.clone(),
        channel: e.channel.clone(),
        timestamp: Some(timestamp(e.timestamp)),
        source: e.source.clone(),
        payload: e.payload.clone(),
        metadata: e.metadata.clone(),
        content_type: e.content_type.clone(),
    }
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

// --- durable consumers ---

/// A consumer definition from the wire, created by `owner`; zero values take the
/// defaults.
pub(crate) fn consumer_config_from_pb(c: pb::ConsumerConfig, owner: &str) -> Result<ConsumerConfig, EdgeError> {
    let pb::ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        exclusive,
        max_pending,
    } = c;
    let defaults = ConsumerConfig::new(name.clone(), Vec::new());
    let b = backoff.unwrap_or_default();
    let db = Backoff::default();
    Ok(ConsumerConfig {
        name,
        channels,
        ack_deadline_ms: if ack_deadline_ms == 0 { defaults.ack_deadline_ms } else { ack_deadline_ms },
        max_attempts: max_attempts.unwrap_or(defaults.max_attempts),
        backoff: Backoff {
            initial_ms: if b.initial_ms == 0 { db.initial_ms } else { b.initial_ms },
            multiplier: if b.multiplier == 0.0 { db.multiplier } else { b.multiplier },
            max_ms: if b.max_ms == 0 { db.max_ms } else { b.max_ms },
            kind: backoff_kind_from_pb(b.kind)?,
        },
        max_in_flight: if max_in_flight == 0 { defaults.max_in_flight } else { max_in_flight },
        dead_letter_channel: (!dead_letter_channel.is_empty()).then_some(dead_letter_channel),
        owner: owner.to_owned(),
        exclusive,
        max_pending: max_pending.unwrap_or(defaults.max_pending),
    })
}

fn backoff_kind_from_pb(kind: i32) -> Result<BackoffKind, EdgeError> {
    match pb::BackoffKind::try_from(kind) {
        Ok(pb::BackoffKind::Exponential) => Ok(BackoffKind::Exponential),
        Ok(pb::BackoffKind::Linear) => Ok(BackoffKind::Linear),
        Err(_) => Err(EdgeError::BadRequest(format!("invalid backoff.kind: unknown backoff kind {kind}"))),
    }
}

fn backoff_kind(kind: BackoffKind) -> pb::BackoffKind {
    match kind {
        BackoffKind::Exponential => pb::BackoffKind::Exponential,
        BackoffKind::Linear => pb::BackoffKind::Linear,
    }
}

fn consumer_config(c: &ConsumerConfig) -> pb::ConsumerConfig {
    let ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        owner: _,
        exclusive,
        max_pending,
    } = c;
    let Backoff { initial_ms, multiplier, max_ms, kind } = *backoff;
    pb::ConsumerConfig {
        name: name.clone(),
        channels: channels.clone(),
        ack_deadline_ms: *ack_deadline_ms,
        max_attempts: Some(*max_attempts),
        backoff: Some(pb::Backoff { initial_ms, multiplier, max_ms, kind: backoff_kind(kind).into() }),
        max_in_flight: *max_in_flight,
        dead_letter_channel: dead_letter_channel.clone().unwrap_or_default(),
        exclusive: *exclusive,
        max_pending: Some(*max_pending),
    }
}

pub(crate) fn consumer_info(i: &ConsumerInfo) -> pb::ConsumerInfo {
    let ConsumerInfo {
        config,
        pending,
        in_flight,
        clients,
        acked,
        dead_lettered,
        redelivered,
        redriven,
        dropped,
        paused,
        redrivable,
    } = i;
    pb::ConsumerInfo {
        config: Some(consumer_config(config)),
        pending: *pending,
        in_flight: *in_flight,
        clients: *clients,
        acked: *acked,
        dead_lettered: *dead_lettered,
        redelivered: *redelivered,
        owner: config.owner.clone(),
        paused: *paused,
        redrivable: *redrivable,
        redriven: *redriven,
        dropped: *dropped,
    }
}

/// `Backoff` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct BackoffJson {
    initial_ms: u64,
    multiplier: f64,
    max_ms: u64,
    kind: BackoffKind,
}

/// `ConsumerInfo` in JSON: the definition's fields and the counters side by side; no
/// dead-letter channel (the `dlq.` default) is `null`.
#[derive(Debug, Serialize)]
pub(crate) struct ConsumerJson {
    name: String,
    channels: Vec<String>,
    ack_deadline_ms: u64,
    max_attempts: u32,
    backoff: BackoffJson,
    max_in_flight: u32,
    dead_letter_channel: Option<String>,
    owner: String,
    exclusive: bool,
    max_pending: u64,
    paused: bool,
    pending: u64,
    in_flight: u64,
    clients: u32,
    acked: u64,
    dead_lettered: u64,
    redelivered: u64,
    redriven: u64,
    redrivable: u64,
    dropped: u64,
}

pub(crate) fn consumer_info_json(i: &ConsumerInfo) -> ConsumerJson {
    let ConsumerInfo {
        config,
        pending,
        in_flight,
        clients,
        acked,
        dead_lettered,
        redelivered,
        redriven,
        dropped,
        paused,
        redrivable,
    } = i;
    let ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        owner,
        exclusive,
        max_pending,
    } = config;
    let Backoff { initial_ms, multiplier, max_ms, kind } = *backoff;
    ConsumerJson {
        name: name.clone(),
        channels: channels.clone(),
        ack_deadline_ms: *ack_deadline_ms,
        max_attempts: *max_attempts,
        backoff: BackoffJson { initial_ms, multiplier, max_ms, kind },
        max_in_flight: *max_in_flight,
        dead_letter_channel: dead_letter_channel.clone(),
        owner: owner.clone(),
        exclusive: *exclusive,
        max_pending: *max_pending,
        paused: *paused,
        redriven: *redriven,
        redrivable: *redrivable,
        dropped: *dropped,
        pending: *pending,
        in_flight: *in_flight,
        clients: *clients,
        acked: *acked,
        dead_lettered: *dead_lettered,
        redelivered: *redelivered,
    }
}

pub(crate) fn delivery(d: &Delivery) -> pb::Delivery {
    let Delivery { event: e, attempt, deadline } = d;
    pb::Delivery { event: Some(event(e)), attempt: *attempt, deadline: Some(timestamp(*deadline)) }
}

/// Content type of published dead letters.
pub const DEAD_LETTER_CONTENT_TYPE: &str = "application/x-protobuf; type=eventbus.v1.DeadLetter";

/// The wire form of a dead letter, for `DurableOptions::dead_letter_encoder`.
pub fn encode_dead_letter(dl: &PublishedDeadLetter) -> (Bytes, String) {
    let PublishedDeadLetter { channel: _, event: e, consumer, owner, attempts, failures } = dl;
    let msg = pb::DeadLetter {
        event: Some(event(e)),
        consumer: consumer.clone(),
        owner: owner.clone(),
        attempts: *attempts,
        failures: failures.iter().map(failure).collect(),
    };
    (Bytes::from(msg.encode_to_vec()), DEAD_LETTER_CONTENT_TYPE.to_owned())
}

// --- the terminal log ---

/// Entries a log page holds when the request says 0 (gRPC) or nothing (REST).
const DEFAULT_LOG_LIMIT: usize = 100;

/// The page size asked for; 0 takes the default.
pub(crate) fn log_limit(limit: usize) -> usize {
    if limit == 0 { DEFAULT_LOG_LIMIT } else { limit }
}

/// The `status` filter of `ListEventLog`: unspecified is every entry.
pub(crate) fn log_status_filter(status: i32) -> Result<Option<LogStatus>, EdgeError> {
    match pb::EventStatus::try_from(status) {
        Ok(pb::EventStatus::Unspecified) => Ok(None),
        Ok(pb::EventStatus::Completed) => Ok(Some(LogStatus::Completed)),
        Ok(pb::EventStatus::DeadLettered) => Ok(Some(LogStatus::DeadLettered)),
        Ok(pb::EventStatus::Redriven) => Ok(Some(LogStatus::Redriven)),
        Err(_) => Err(EdgeError::BadRequest(format!("invalid status: unknown event status {status}"))),
    }
}

/// The `?status=` filter of the REST log: a [`log_status_name`], or `all` (or nothing).
pub(crate) fn log_status_filter_json(status: Option<&str>) -> Result<Option<LogStatus>, EdgeError> {
    match status {
        None | Some("" | "all") => Ok(None),
        Some(name) => [LogStatus::Completed, LogStatus::DeadLettered, LogStatus::Redriven]
            .into_iter()
            .find(|s| log_status_name(*s) == name)
            .map(Some)
            .ok_or_else(|| {
                EdgeError::BadRequest(format!(
                    "invalid status {}: expected completed, dead_lettered, redriven or all",
                    eventbus_core::quoted(name)
                ))
            }),
    }
}

fn log_status(s: LogStatus) -> pb::EventStatus {
    match s {
        LogStatus::Completed => pb::EventStatus::Completed,
        LogStatus::DeadLettered => pb::EventStatus::DeadLettered,
        LogStatus::Redriven => pb::EventStatus::Redriven,
    }
}

/// A log status in JSON and in the REST filter.
fn log_status_name(s: LogStatus) -> &'static str {
    match s {
        LogStatus::Completed => "completed",
        LogStatus::DeadLettered => "dead_lettered",
        LogStatus::Redriven => "redriven",
    }
}

fn failure(f: &Failure) -> pb::Failure {
    let Failure { at_ms, reason } = f;
    pb::Failure { at: Some(timestamp(from_epoch_ms(*at_ms))), reason: reason.clone() }
}

/// `Failure` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct FailureJson {
    at: String,
    reason: String,
}

fn failure_json(f: &Failure) -> FailureJson {
    let Failure { at_ms, reason } = f;
    FailureJson { at: rfc3339(from_epoch_ms(*at_ms)), reason: reason.clone() }
}

fn log_entry(e: &LogEntry) -> pb::EventLogEntry {
    let LogEntry { event_id, channel, status, attempts, first_delivered_ms, finished_ms, failures } = e;
    pb::EventLogEntry {
        event_id: event_id.clone(),
        channel: channel.clone(),
        status: log_status(*status).into(),
        attempts: *attempts,
        first_delivered_at: first_delivered_ms.map(|ms| timestamp(from_epoch_ms(ms))),
        finished_at: Some(timestamp(from_epoch_ms(*finished_ms))),
        failures: failures.iter().map(failure).collect(),
    }
}

/// `EventLogEntry` in JSON: the status as its [`log_status_name`].
#[derive(Debug, Serialize)]
pub(crate) struct LogEntryJson {
    event_id: String,
    channel: String,
    status: &'static str,
    attempts: u32,
    first_delivered_at: Option<String>,
    finished_at: String,
    failures: Vec<FailureJson>,
}

fn log_entry_json(e: &LogEntry) -> LogEntryJson {
    let LogEntry { event_id, channel, status, attempts, first_delivered_ms, finished_ms, failures } = e;
    LogEntryJson {
        event_id: event_id.clone(),
        channel: channel.clone(),
        status: log_status_name(*status),
        attempts: *attempts,
        first_delivered_at: first_delivered_ms.map(|ms| rfc3339(from_epoch_ms(ms))),
        finished_at: rfc3339(from_epoch_ms(*finished_ms)),
        failures: failures.iter().map(failure_json).collect(),
    }
}

pub(crate) fn log_page(page: LogSlice) -> pb::ListEventLogResponse {
    let LogSlice { entries, next_page_token } = page;
    pb::ListEventLogResponse { entries: entries.iter().map(log_entry).collect(), next_page_token }
}

/// `ListEventLogResponse` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct LogPageJson {
    entries: Vec<LogEntryJson>,
    next_page_token: String,
}

pub(crate) fn log_page_json(page: LogSlice) -> LogPageJson {
    let LogSlice { entries, next_page_token } = page;
    LogPageJson { entries: entries.iter().map(log_entry_json).collect(), next_page_token }
}

// --- consumer operations ---

fn pending_state(s: PendingState) -> pb::PendingState {
    match s {
        PendingState::Ready => pb::PendingState::Ready,
        PendingState::Delayed => pb::PendingState::Delayed,
        PendingState::InFlight => pb::PendingState::InFlight,
        PendingState::BlockedByOrderingKey => pb::PendingState::BlockedByOrderingKey,
    }
}

/// A pending state in JSON.
fn pending_state_name(s: PendingState) -> &'static str {
    match s {
        PendingState::Ready => "ready",
        PendingState::Delayed => "delayed",
        PendingState::InFlight => "in_flight",
        PendingState::BlockedByOrderingKey => "blocked_by_ordering_key",
    }
}

fn pending_entry(e: &PendingEntry) -> pb::PendingEntry {
    let PendingEntry { event: ev, attempt, next_delivery_ms, failures, state } = e;
    pb::PendingEntry {
        event: Some(event(ev)),
        attempt: *attempt,
        next_delivery: next_delivery_ms.map(|ms| timestamp(from_epoch_ms(ms))),
        failures: failures.iter().map(failure).collect(),
        state: pending_state(*state).into(),
    }
}

pub(crate) fn pending_page(page: PendingSlice) -> pb::ListPendingResponse {
    let PendingSlice { entries, next_page_token } = page;
    pb::ListPendingResponse { entries: entries.iter().map(pending_entry).collect(), next_page_token }
}

/// An event in JSON: a JSON payload (content type `application/json`, as the REST
/// publish stores it) as its value under `payload`, any other as `payload_base64`.
#[derive(Debug, Serialize)]
pub(crate) struct EventJson {
    id: String,
    channel: String,
    timestamp: String,
    source: String,
    content_type: String,
    metadata: std::collections::HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

pub(crate) fn event_json(e: &Event) -> EventJson {
    use base64::Engine as _;
    let json = (e.content_type == "application/json")
        .then(|| serde_json::from_slice::<serde_json::Value>(&e.payload).ok())
        .flatten();
    let base64 = json.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(&e.payload));
    EventJson {
        id: e.id.clone(),
        channel: e.channel.clone(),
        timestamp: rfc3339(e.timestamp),
        source: e.source.clone(),
        content_type: e.content_type.clone(),
        metadata: e.metadata.clone(),
        payload: json,
        payload_base64: base64,
    }
}

/// `PendingEntry` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct PendingEntryJson {
    event: EventJson,
    attempt: u32,
    next_delivery: Option<String>,
    failures: Vec<FailureJson>,
    state: &'static str,
}

/// `ListPendingResponse` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct PendingPageJson {
    entries: Vec<PendingEntryJson>,
    next_page_token: String,
}

pub(crate) fn pending_page_json(page: PendingSlice) -> PendingPageJson {
    let PendingSlice { entries, next_page_token } = page;
    let entries = entries
        .iter()
        .map(|e| PendingEntryJson {
            event: event_json(&e.event),
            attempt: e.attempt,
            next_delivery: e.next_delivery_ms.map(|ms| rfc3339(from_epoch_ms(ms))),
            failures: e.failures.iter().map(failure_json).collect(),
            state: pending_state_name(e.state),
        })
        .collect();
    PendingPageJson { entries, next_page_token }
}

pub(crate) fn redriven(r: Redriven) -> pb::RedriveResponse {
    pb::RedriveResponse { redriven: r.redriven, remaining: r.remaining }
}

/// `RedriveResponse` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct RedrivenJson {
    redriven: u64,
    remaining: u64,
}

pub(crate) fn redriven_json(r: Redriven) -> RedrivenJson {
    RedrivenJson { redriven: r.redriven, remaining: r.remaining }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols_take_their_codes_from_one_table() {
        let too_large = EdgeError::RequestTooLarge { request_limit: 2 << 20, max_payload_bytes: 1 << 20 };
        let cases: [(EdgeError, Code, StatusCode); 11] = [
            (Error::NoChannels.into(), Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (
                Error::PayloadTooLarge { size: 2, limit: 1 }.into(),
                Code::ResourceExhausted,
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (too_large, Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
            (Error::UnknownSubscription("s".into()).into(), Code::NotFound, StatusCode::NOT_FOUND),
            (Error::ShuttingDown.into(), Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (DurableError::AlreadyExists("c".into()).into(), Code::AlreadyExists, StatusCode::CONFLICT),
            (EdgeError::DurableDisabled, Code::FailedPrecondition, StatusCode::CONFLICT),
            (EdgeError::BadRequest("config is required".into()), Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (EdgeError::Unauthenticated("missing".into()), Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            (
                EdgeError::PermissionDenied { principal: "p".into(), operation: "publish", what: "channel a".into() },
                Code::PermissionDenied,
                StatusCode::FORBIDDEN,
            ),
            (
                EdgeError::OverLimit { principal: "p".into(), limit: "max_subscriptions" },
                Code::ResourceExhausted,
                StatusCode::TOO_MANY_REQUESTS,
            ),
        ];
        for (err, code, http) in cases {
            assert_eq!(err.codes(), (code, http), "{err}");
            let message = err.to_string();
            let status = status(err);
            assert_eq!((status.code(), status.message()), (code, message.as_str()));
        }
    }

    #[test]
    fn an_oversized_request_names_the_payload_limit() {
        let err = EdgeError::RequestTooLarge { request_limit: 2 << 20, max_payload_bytes: 1 << 20 };
        assert!(err.to_string().contains("max_payload_bytes = 1048576"), "{err}");
    }

    #[test]
    fn log_status_names_round_trip_through_the_rest_filter() {
        for s in [LogStatus::Completed, LogStatus::DeadLettered, LogStatus::Redriven] {
            assert_eq!(log_status_filter_json(Some(log_status_name(s))).ok(), Some(Some(s)));
        }
        assert_eq!(log_status_filter_json(Some("all")).ok(), Some(None));
        assert!(log_status_filter_json(Some("lost")).is_err());
        assert_eq!((log_limit(0), log_limit(7)), (DEFAULT_LOG_LIMIT, 7));
    }
}
