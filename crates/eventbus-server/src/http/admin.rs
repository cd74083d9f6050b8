//! The admin REST routes, `/admin/eventbus/...`: each decodes its request, calls the
//! operation and renders the answer in JSON.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, HttpState, json_body, publish_body};
use crate::access::Caller;
use crate::config::ConsumerSetting;
use crate::convert;
use crate::convert::trace::TraceContext;
use crate::listener::PeerInfo;
use crate::ops::Refusal;

/// The routes, authenticated by the caller's router.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/admin/eventbus/stats", get(stats))
        .route("/admin/eventbus/channels", get(channels))
        .route("/admin/eventbus/channels/{name}/history", get(channel_history))
        .route("/admin/eventbus/subscriptions", get(subscriptions))
        .route("/admin/eventbus/subscriptions/{id}", delete(unsubscribe))
        .route("/admin/eventbus/publish", post(publish))
        .route("/admin/eventbus/consumers", get(list_consumers).post(create_consumer))
        .route("/admin/eventbus/consumers/{name}", get(get_consumer).delete(delete_consumer))
        .route("/admin/eventbus/consumers/{name}/log", get(consumer_log))
        .route("/admin/eventbus/consumers/{name}/pending", get(consumer_pending))
        .route("/admin/eventbus/consumers/{name}/redrive", post(redrive))
        .route("/admin/eventbus/consumers/{name}/pause", post(pause))
        .route("/admin/eventbus/consumers/{name}/resume", post(resume))
}

/// A query string as `T`, or a 400 naming what is wrong with it.
fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Refusal> {
    query.map(|Query(q)| q).map_err(|e| Refusal::BadRequest(e.body_text()))
}

async fn stats(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<convert::StatsJson>, ApiError> {
    let stats = state.ops.admin(&caller)?.stats();
    Ok(Json(convert::stats_json(stats)))
}

async fn channels(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let channels: Vec<_> = state.ops.admin(&caller)?.channels().into_iter().map(convert::channel_json).collect();
    Ok(Json(json!({ "channels": channels })))
}

async fn subscriptions(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let subscriptions = state.ops.admin(&caller)?.subscriptions();
    let subscriptions: Vec<_> = subscriptions.into_iter().map(convert::subscription_json).collect();
    Ok(Json(json!({ "subscriptions": subscriptions })))
}

async fn unsubscribe(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.ops.unsubscribe(&caller, &id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /admin/eventbus/publish`. The body (`application/json`) is parsed by hand
/// rather than with `Json<T>`, so every parse failure is a 400 naming it.
async fn publish(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    peer: ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let peer: std::sync::Arc<str> = peer.0.addr.to_string().into();
    publish_body(&state, &caller, &headers, raw, |raw| convert::publish_input_json(raw, peer)).await
}

// --- durable consumers ---

async fn list_consumers(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let consumers = state.ops.list_consumers(&caller).await?;
    let consumers: Vec<_> = consumers.iter().map(convert::consumer_info_json).collect();
    Ok(Json(json!({ "consumers": consumers })))
}

/// Body: a consumer definition; omitted fields take the defaults (as in the config file).
async fn create_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let setting: ConsumerSetting = json_body(&state, &headers, raw)?;
    let config = eventbus_core::durable::ConsumerConfig { owner: caller.name().to_owned(), ..setting.to_config() };
    let info = state.ops.create_consumer(&caller, config).await?;
    Ok((StatusCode::CREATED, Json(convert::consumer_info_json(&info))).into_response())
}

async fn get_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    let info = state.ops.readable_consumer(&caller, &name)?.info().await?;
    Ok(Json(convert::consumer_info_json(&info)))
}

async fn delete_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.ops.managed_consumer(&caller, &name)?.delete().await?;
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
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    q: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Json<convert::LogPageJson>, ApiError> {
    let consumer = state.ops.readable_consumer(&caller, &name)?;
    let q = query(q)?;
    let status = convert::log_status_filter_json(q.status.as_deref())?;
    let limit = convert::log_limit(q.limit.unwrap_or(0));
    let page = consumer.log(status, limit, &q.page_token.unwrap_or_default()).await?;
    Ok(Json(convert::log_page_json(page)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    since: Option<String>,
    limit: Option<usize>,
}

async fn channel_history(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Json<convert::HistoryPageJson>, ApiError> {
    let history = state.ops.readable_history(&caller, &name)?;
    let q = query(q)?;
    let from = convert::history_from_query(q.since.as_deref())?;
    let limit = convert::history_limit_query(q.limit)?;
    Ok(Json(convert::history_page_json(history.page(from, limit).await?)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    limit: Option<usize>,
    page_token: Option<String>,
}

async fn consumer_pending(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<convert::PendingPageJson>, ApiError> {
    let consumer = state.ops.readable_consumer(&caller, &name)?;
    let q = query(q)?;
    let limit = convert::log_limit(q.limit.unwrap_or(0));
    let page = consumer.pending(limit, &q.page_token.unwrap_or_default()).await?;
    Ok(Json(convert::pending_page_json(page)))
}

/// `POST …/redrive` body (optional): `{"event_ids": [...], "limit": n}`; none = the
/// oldest 10,000.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    #[serde(default)]
    event_ids: Vec<String>,
    #[serde(default)]
    limit: usize,
}

async fn redrive(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<convert::RedrivenJson>, ApiError> {
    let consumer = state.ops.managed_consumer(&caller, &name)?;
    // No body (a bare POST) needs no content type; a body must be JSON.
    let empty = raw.as_ref().is_ok_and(|b| b.iter().all(u8::is_ascii_whitespace));
    let req: RedriveBody = if empty { RedriveBody::default() } else { json_body(&state, &headers, raw)? };
    let trace = TraceContext::from_http(&headers);
    let done = consumer.redrive(&req.event_ids, req.limit, trace.as_ref()).await?;
    Ok(Json(convert::redriven_json(done)))
}

async fn pause(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    let info = state.ops.managed_consumer(&caller, &name)?.set_paused(true).await?;
    Ok(Json(convert::consumer_info_json(&info)))
}

async fn resume(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    let info = state.ops.managed_consumer(&caller, &name)?.set_paused(false).await?;
    Ok(Json(convert::consumer_info_json(&info)))
}
