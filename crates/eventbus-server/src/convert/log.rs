//! The terminal log and the consumer operations (pending events, redrive).

use super::*;

/// Entries a log page holds when the request says 0 (gRPC) or nothing (REST).
pub(super) const DEFAULT_LOG_LIMIT: usize = 100;

/// The page size asked for; 0 takes the default.
pub(crate) fn log_limit(limit: usize) -> usize {
    if limit == 0 { DEFAULT_LOG_LIMIT } else { limit }
}

/// The `status` filter of `ListEventLog`: unspecified is every entry.
pub(crate) fn log_status_filter(status: i32) -> Result<Option<LogStatus>, Refusal> {
    match pb::EventStatus::try_from(status) {
        Ok(pb::EventStatus::Unspecified) => Ok(None),
        Ok(pb::EventStatus::Completed) => Ok(Some(LogStatus::Completed)),
        Ok(pb::EventStatus::DeadLettered) => Ok(Some(LogStatus::DeadLettered)),
        Ok(pb::EventStatus::Redriven) => Ok(Some(LogStatus::Redriven)),
        Err(_) => Err(Refusal::BadRequest(format!("invalid status: unknown event status {status}"))),
    }
}

/// The `?status=` filter of the REST log: a [`log_status_name`], or `all` (or nothing).
pub(crate) fn log_status_filter_json(status: Option<&str>) -> Result<Option<LogStatus>, Refusal> {
    match status {
        None | Some("" | "all") => Ok(None),
        Some(name) => [LogStatus::Completed, LogStatus::DeadLettered, LogStatus::Redriven]
            .into_iter()
            .find(|s| log_status_name(*s) == name)
            .map(Some)
            .ok_or_else(|| {
                Refusal::BadRequest(format!(
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
pub(super) fn log_status_name(s: LogStatus) -> &'static str {
    match s {
        LogStatus::Completed => "completed",
        LogStatus::DeadLettered => "dead_lettered",
        LogStatus::Redriven => "redriven",
    }
}

pub(super) fn failure(f: &Failure) -> pb::Failure {
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
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<PositionJson>,
}

/// `EventPosition` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct PositionJson {
    epoch: String,
    offset: u64,
}

pub(crate) fn event_json(e: &Event) -> EventJson {
    use base64::Engine as _;
    let json = (e.content_type == "application/json")
        .then(|| serde_json::from_slice::<serde_json::Value>(&e.payload).ok())
        .flatten();
    let base64 = json.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(&e.payload));
    EventJson {
        id: e.id.to_string(),
        channel: e.channel.clone(),
        timestamp: rfc3339(e.timestamp),
        source: e.source.to_string(),
        content_type: e.content_type.clone(),
        metadata: e.metadata.clone(),
        payload: json,
        payload_base64: base64,
        position: e.position.as_ref().map(|p| PositionJson { epoch: p.epoch.to_string(), offset: p.offset }),
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
