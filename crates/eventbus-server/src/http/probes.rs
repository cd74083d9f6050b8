//! The probes: `/metrics` (Prometheus), `/healthz` (liveness) and `/readyz`
//! (readiness, [`Readiness`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use eventbus_core::durable::DurableBackend;
use eventbus_core::{Supervisor, TaskFailure, TransportStatus};
use serde_json::json;
use tokio::sync::watch;

use super::{ApiError, HttpState};

/// Whether the instance should receive traffic: every background task running, not
/// shutting down, (redis mode) connected to Redis, and the durable engine able to take
/// captures (its disk not nearly full).
#[derive(Debug, Clone)]
pub(crate) struct Readiness {
    shutting_down: Arc<AtomicBool>,
    transport: Option<watch::Receiver<TransportStatus>>,
    tasks: watch::Receiver<Option<TaskFailure>>,
    durable: Option<Arc<dyn DurableBackend>>,
}

impl Readiness {
    pub(crate) fn new(transport: Option<watch::Receiver<TransportStatus>>, supervisor: &Supervisor) -> Self {
        Self { shutting_down: Arc::default(), transport, tasks: supervisor.failures(), durable: None }
    }

    /// Also asks the durable engine ([`DurableBackend::unready`]).
    pub(crate) fn with_durable(mut self, durable: Option<Arc<dyn DurableBackend>>) -> Self {
        self.durable = durable;
        self
    }

    /// The background task that stopped, if one did: the process must be restarted.
    pub(crate) fn failed_task(&self) -> Option<TaskFailure> {
        self.tasks.borrow().clone()
    }

    /// Why the process must be restarted, if it must: a background task stopped, or
    /// the durable store refuses writes after a failed one.
    pub(crate) fn failed(&self) -> Option<String> {
        match self.failed_task() {
            Some(failure) => Some(failure.to_string()),
            None => self.durable.as_ref().and_then(|d| d.failed()),
        }
    }

    /// Shutdown has begun: not ready from now on.
    pub(crate) fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Why the instance is not ready, if it is not.
    pub(crate) fn reason(&self) -> Option<String> {
        if let Some(failure) = self.failed() {
            Some(failure)
        } else if self.is_shutting_down() {
            Some("shutting down".to_owned())
        } else if let Some(status) = self.transport.as_ref().map(|t| *t.borrow())
            && !status.connected
        {
            Some(if status.stalled { "Redis is not answering PING" } else { "not connected to Redis" }.to_owned())
        } else {
            self.durable.as_ref().and_then(|d| d.unready())
        }
    }

    pub(crate) fn get(&self) -> bool {
        self.reason().is_none()
    }
}

pub(super) async fn metrics(State(state): State<HttpState>) -> Result<Response, ApiError> {
    let Some(metrics) = state.ops.metrics() else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "metrics are disabled (eventbus.metrics.enabled: false)"));
    };
    // Refreshes the consumer snapshot the collector reads (a Redis round trip in redis
    // mode); a failure leaves the last known figures, and the scrape still answers.
    if let Some(durable) = state.ops.bus().durable()
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
/// its work and must be restarted; docs/operations.md).
pub(super) async fn healthz(State(state): State<HttpState>) -> Response {
    match state.readiness.failed() {
        None => Json(json!({ "status": "ok" })).into_response(),
        Some(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "failed", "reason": reason }))).into_response()
        }
    }
}

pub(super) async fn readyz(State(state): State<HttpState>) -> Response {
    match state.readiness.reason() {
        None => match state.ops.bus().transport_status().map(|s| s.borrow().degraded_slots).unwrap_or(0) {
            0 => (StatusCode::OK, Json(json!({ "status": "ready" }))).into_response(),
            // Ready: the other shards serve; taking every instance out would stop them too.
            slots => (
                StatusCode::OK,
                Json(json!({
                    "status": "ready",
                    "degraded": format!("{slots} of 16384 Redis Cluster slots have no master: publishes to their channels fail"),
                })),
            )
                .into_response(),
        },
        Some(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "not ready", "reason": reason }))).into_response()
        }
    }
}
