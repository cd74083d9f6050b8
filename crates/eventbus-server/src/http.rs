//! The HTTP listener (SPEC §6): `/metrics`, `/healthz`, `/readyz` and the admin REST
//! routes. Publishing goes through the same [`Bus::publish`] validation as gRPC; core
//! errors become HTTP codes in [`ApiError::from`] only.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
use eventbus_core::durable::{ConsumerInfo, DurableBackend};
use eventbus_core::durable::{LogStatus, from_epoch_ms};
use eventbus_core::{Bus, Error, ErrorKind, PublishInput, Supervisor, TaskFailure, TransportStatus};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::config::ConsumerSetting;
use crate::metrics::Metrics;

/// Whether the instance should receive traffic: every background task running, not
/// shutting down, and (redis mode) connected to Redis.
#[derive(Debug, Clone)]
pub struct Readiness {
    shutting_down: Arc<AtomicBool>,
    transport: Option<watch::Receiver<TransportStatus>>,
    tasks: watch::Receiver<Option<TaskFailure>>,
}

impl Readiness {
    pub fn new(transport: Option<watch::Receiver<TransportStatus>>, supervisor: &Supervisor) -> Self {
        Self { shutting_down: Arc::default(), transport, tasks: supervisor.failures() }
    }

    /// The background task that stopped, if one did: the process must be restarted.
    pub fn failed_task(&self) -> Option<TaskFailure> {
        self.tasks.borrow().clone()
    }

    /// Shutdown has begun: not ready from now on.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Why the instance is not ready, if it is not.
    pub fn reason(&self) -> Option<String> {
        if let Some(failure) = self.failed_task() {
            Some(failure.to_string())
        } else if self.is_shutting_down() {
            Some("shutting down".to_owned())
        } else if self.transport.as_ref().is_some_and(|t| !t.borrow().connected) {
            Some("not connected to Redis".to_owned())
        } else {
            None
        }
    }

    pub fn get(&self) -> bool {
        self.reason().is_none()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct HttpState {
    pub(crate) bus: Bus,
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) readiness: Readiness,
}

pub(crate) fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/admin/eventbus/stats", get(stats))
        .route("/admin/eventbus/channels", get(channels))
        .route("/admin/eventbus/subscriptions", get(subscriptions))
        .route("/admin/eventbus/subscriptions/{id}", delete(unsubscribe))
        .route("/admin/eventbus/publish", post(publish))
        .route("/admin/eventbus/consumers", get(list_consumers).post(create_consumer))
        .route("/admin/eventbus/consumers/{name}", get(get_consumer).delete(delete_consumer))
        .route("/admin/eventbus/consumers/{name}/log", get(consumer_log))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
        })
        .with_state(state)
}

/// An error answered as `{"error": "..."}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let status = match err.kind() {
            ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::AlreadyExists => StatusCode::CONFLICT,
            ErrorKind::Internal => {
                tracing::error!(error = %eventbus_core::error_chain(&err), "internal error");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Self::new(status, err.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

async fn metrics(State(state): State<HttpState>) -> Result<Response, ApiError> {
    let Some(metrics) = &state.metrics else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "metrics are disabled (eventbus.metrics.enabled: false)"));
    };
    // Refreshes the consumer snapshot the collector reads (a Redis round trip in redis
    // mode); a failure leaves the last known figures, and the scrape still answers.
    if let Some(durable) = state.bus.durable()
        && let Err(err) = durable.list_consumers().await
    {
        tracing::warn!(%err, "cannot refresh durable consumer metrics");
    }
    let text = metrics.render().map_err(|e| {
        tracing::error!(%e, "cannot render metrics");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "cannot render metrics")
    })?;
    Ok(([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response())
}

/// Liveness: fails once a background task has stopped (the process no longer does all
/// its work and must be restarted; README "Health").
async fn healthz(State(state): State<HttpState>) -> Response {
    match state.readiness.failed_task() {
        None => Json(json!({ "status": "ok" })).into_response(),
        Some(failure) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "failed", "reason": failure.to_string() })))
                .into_response()
        }
    }
}

async fn readyz(State(state): State<HttpState>) -> Response {
    match state.readiness.reason() {
        None => (StatusCode::OK, Json(json!({ "status": "ready" }))).into_response(),
        Some(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "not ready", "reason": reason }))).into_response()
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    prost_types::Timestamp::from(t).to_string()
}

#[derive(Debug, Serialize)]
struct StatsBody {
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

async fn stats(State(state): State<HttpState>) -> Json<StatsBody> {
    let s = state.bus.stats();
    Json(StatsBody {
        total_published: s.total_published,
        total_delivered: s.total_delivered,
        total_failed: s.total_failed,
        total_dropped: s.total_dropped,
        active_subscriptions: s.active_subscriptions,
        active_channels: s.active_channels,
        started_at: rfc3339(s.started_at),
        mode: s.mode,
        instance_id: s.instance_id,
    })
}

#[derive(Debug, Serialize)]
struct ChannelBody {
    channel: String,
    published_count: u64,
    delivered_count: u64,
    subscriber_count: u64,
    last_published_at: Option<String>,
}

async fn channels(State(state): State<HttpState>) -> Json<serde_json::Value> {
    let channels: Vec<ChannelBody> = state
        .bus
        .channels()
        .into_iter()
        .map(|c| ChannelBody {
            channel: c.channel,
            published_count: c.published_count,
            delivered_count: c.delivered_count,
            subscriber_count: c.subscriber_count,
            last_published_at: c.last_published_at.map(rfc3339),
        })
        .collect();
    Json(json!({ "channels": channels }))
}

#[derive(Debug, Serialize)]
struct SubscriptionBody {
    id: String,
    channels: Vec<String>,
    group: Option<String>,
    name: String,
    pending: u64,
    capacity: u64,
    delivered: u64,
    dropped: u64,
    overflow: &'static str,
    peer: String,
    created_at: String,
}

async fn subscriptions(State(state): State<HttpState>) -> Json<serde_json::Value> {
    let subscriptions: Vec<SubscriptionBody> = state
        .bus
        .subscriptions()
        .into_iter()
        .map(|s| SubscriptionBody {
            id: s.id,
            channels: s.channels,
            group: s.group,
            name: s.name,
            pending: s.pending,
            capacity: s.capacity,
            delivered: s.delivered,
            dropped: s.dropped,
            overflow: s.overflow.as_str(),
            peer: s.peer,
            created_at: rfc3339(s.created_at),
        })
        .collect();
    Json(json!({ "subscriptions": subscriptions }))
}

async fn unsubscribe(State(state): State<HttpState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    state.bus.unsubscribe(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /admin/eventbus/publish` body. The payload is any JSON value, stored as its
/// JSON text with content type `application/json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    channel: String,
    #[serde(default)]
    payload: Option<serde_json::Value>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    source: String,
}

#[derive(Debug, Serialize)]
struct PublishedBody {
    event_id: String,
    delivered_count: u32,
    failed_count: u32,
    duration_us: u64,
}

/// The body is parsed by hand rather than with `Json<T>`, so any content type (curl's
/// `-d` sends a form type) is accepted and every parse failure is a 400 naming it.
async fn publish(
    State(state): State<HttpState>,
    peer: axum::extract::ConnectInfo<std::net::SocketAddr>,
    body: Bytes,
) -> Result<Json<PublishedBody>, ApiError> {
    let body: PublishBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    let payload = match &body.payload {
        Some(value) => serde_json::to_vec(value)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid payload: {e}")))?,
        None => Vec::new(),
    };
    let input = PublishInput {
        channel: body.channel,
        payload: payload.into(),
        metadata: body.metadata,
        content_type: "application/json".to_owned(),
        source: body.source,
        peer: peer.0.to_string(),
        ..PublishInput::default()
    };
    let published = state.bus.publish(input).await?;
    if let Some(metrics) = &state.metrics {
        metrics.observe_publish(published.duration);
    }
    Ok(Json(PublishedBody {
        event_id: published.event_id,
        delivered_count: published.delivered,
        failed_count: published.failed,
        duration_us: published.duration.as_micros() as u64,
    }))
}

// --- durable consumers ---

fn engine(state: &HttpState) -> Result<&Arc<dyn DurableBackend>, ApiError> {
    state
        .bus
        .durable()
        .ok_or_else(|| ApiError::new(StatusCode::CONFLICT, "durable consumers are not enabled on this broker"))
}

fn consumer_json(i: &ConsumerInfo) -> serde_json::Value {
    let c = &i.config;
    json!({
        "name": c.name,
        "channels": c.channels,
        "ack_deadline_ms": c.ack_deadline_ms,
        "max_attempts": c.max_attempts,
        "backoff": {"initial_ms": c.backoff.initial_ms, "multiplier": c.backoff.multiplier, "max_ms": c.backoff.max_ms},
        "max_in_flight": c.max_in_flight,
        "dead_letter_channel": c.dead_letter_channel,
        "pending": i.pending,
        "in_flight": i.in_flight,
        "clients": i.clients,
        "acked": i.acked,
        "dead_lettered": i.dead_lettered,
        "redelivered": i.redelivered,
    })
}

async fn list_consumers(State(state): State<HttpState>) -> Result<Json<serde_json::Value>, ApiError> {
    let consumers = engine(&state)?.list_consumers().await.map_err(Error::from)?;
    let consumers: Vec<_> = consumers.iter().map(consumer_json).collect();
    Ok(Json(json!({ "consumers": consumers })))
}

/// Body: a consumer definition; omitted fields take the defaults (as in the config file).
async fn create_consumer(State(state): State<HttpState>, body: Bytes) -> Result<Response, ApiError> {
    let setting: ConsumerSetting = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    let info = engine(&state)?.create_consumer(setting.to_config()).await.map_err(Error::from)?;
    Ok((StatusCode::CREATED, Json(consumer_json(&info))).into_response())
}

async fn get_consumer(
    State(state): State<HttpState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let info = engine(&state)?.get_consumer(&name).await.map_err(Error::from)?;
    Ok(Json(consumer_json(&info)))
}

async fn delete_consumer(State(state): State<HttpState>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    engine(&state)?.delete_consumer(&name).await.map_err(Error::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogQuery {
    status: Option<String>,
    limit: Option<usize>,
    page_token: Option<String>,
}

async fn consumer_log(
    State(state): State<HttpState>,
    Path(name): Path<String>,
    query: Result<axum::extract::Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let status = match q.status.as_deref() {
        None | Some("") | Some("all") => None,
        Some("completed") => Some(LogStatus::Completed),
        Some("dead_lettered") => Some(LogStatus::DeadLettered),
        Some(other) => {
            let message = format!("invalid status {other:?}: expected completed, dead_lettered or all");
            return Err(ApiError::new(StatusCode::BAD_REQUEST, message));
        }
    };
    let token = q.page_token.unwrap_or_default();
    let page = engine(&state)?.log(&name, status, q.limit.unwrap_or(100), &token).await.map_err(Error::from)?;
    let ms = |ms: u64| rfc3339(from_epoch_ms(ms));
    let entries: Vec<_> = page
        .entries
        .iter()
        .map(|e| {
            json!({
                "event_id": e.event_id,
                "channel": e.channel,
                "status": match e.status { LogStatus::Completed => "completed", LogStatus::DeadLettered => "dead_lettered" },
                "attempts": e.attempts,
                "first_delivered_at": e.first_delivered_ms.map(ms),
                "finished_at": ms(e.finished_ms),
                "failures": e.failures.iter().map(|f| json!({"at": ms(f.at_ms), "reason": f.reason})).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({ "entries": entries, "next_page_token": page.next_page_token })))
}
