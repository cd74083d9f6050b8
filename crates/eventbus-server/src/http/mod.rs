//! The HTTP listener (docs/operations.md): `/metrics`, `/healthz`, `/readyz` and the admin REST
//! routes. With authentication on, every admin route (and the probes with
//! `auth.protect_metrics`) passes [`authenticate`] first, the same check gRPC calls
//! pass, and each handler checks the right it needs (docs/security.md). Publishing goes through the same [`Bus::publish`] validation as gRPC; bodies
//! are rendered, and refusals given their HTTP code, by `convert`, the same edge gRPC
//! uses.
//!
//! Before any route: requests addressed to a host not in `server.http.allowed_hosts`
//! are refused (421, `gate`); oversized URIs and header sections are refused in JSON
//! ([`request_limits`]), and admin routes refuse cross-site requests ([`cross_site`]):
//! a foreign `Origin` (403) unless listed in `server.http.allowed_origins`, whose CORS
//! preflights are answered; bodies other than `application/json` (415). Every error
//! is `{"error": "..."}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
use eventbus_core::durable::{DurableBackend, DurableError};
use eventbus_core::{Bus, Error, Supervisor, TaskFailure, TransportStatus};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::access::{Access, Caller, Operation};
use crate::config::ConsumerSetting;
use crate::convert::{self, EdgeError};
use crate::grpc::EventBusService;
use crate::listener::PeerInfo;
use crate::metrics::Metrics;
use crate::request_limit::PayloadLimit;

/// Whether the instance should receive traffic: every background task running, not
/// shutting down, (redis mode) connected to Redis, and the durable engine able to take
/// captures (its disk not nearly full).
#[derive(Debug, Clone)]
pub struct Readiness {
    shutting_down: Arc<AtomicBool>,
    transport: Option<watch::Receiver<TransportStatus>>,
    tasks: watch::Receiver<Option<TaskFailure>>,
    durable: Option<Arc<dyn DurableBackend>>,
}

impl Readiness {
    pub fn new(transport: Option<watch::Receiver<TransportStatus>>, supervisor: &Supervisor) -> Self {
        Self { shutting_down: Arc::default(), transport, tasks: supervisor.failures(), durable: None }
    }

    /// Also asks the durable engine ([`DurableBackend::unready`]).
    pub fn with_durable(mut self, durable: Option<Arc<dyn DurableBackend>>) -> Self {
        self.durable = durable;
        self
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
        } else if let Some(status) = self.transport.as_ref().map(|t| *t.borrow())
            && !status.connected
        {
            Some(if status.stalled { "Redis is not answering PING" } else { "not connected to Redis" }.to_owned())
        } else {
            self.durable.as_ref().and_then(|d| d.unready())
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
    pub(crate) limit: PayloadLimit,
    pub(crate) access: Access,
    /// `server.http.allowed_origins`: foreign origins whose pages may call admin routes.
    pub(crate) allowed_origins: Arc<[String]>,
    /// `server.http.allowed_hosts`: the names requests may be addressed to.
    pub(crate) allowed_hosts: crate::gate::AllowedHosts,
    /// The gRPC service, whose subscribe path `/v1/subscribe` takes.
    pub(crate) events: EventBusService,
    /// `server.http.sse_heartbeat_ms`.
    pub(crate) sse_heartbeat: std::time::Duration,
}

/// Longest request target (path and query) the router reads; longer: 414.
pub(crate) const MAX_URI_BYTES: usize = 32 << 10;
/// Most headers in a request; more: 431.
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest header section (names and values); larger: 431.
pub(crate) const MAX_HEADER_BYTES: usize = 32 << 10;

pub(crate) fn router(state: HttpState) -> Router {
    // Bodies are read up to this size at most; a publish over it is refused naming
    // `max_payload_bytes` (see `publish`).
    let body_limit = DefaultBodyLimit::max(state.limit.http_body_limit());
    let probes =
        Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz)).route("/readyz", get(readyz));
    let probes = match state.access.protect_metrics() {
        true => probes.route_layer(middleware::from_fn_with_state(state.access.clone(), authenticate)),
        false => probes,
    };
    let admin = Router::new()
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
        .route_layer(middleware::from_fn_with_state(state.access.clone(), authenticate));
    let origins = state.allowed_origins.clone();
    let hosts = state.allowed_hosts.clone();
    let web = crate::web::routes(state.access.clone());
    probes
        .merge(admin)
        .merge(crate::ui::routes())
        .merge(web)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
        })
        .layer(body_limit)
        .layer(middleware::from_fn_with_state(origins, cross_site))
        .layer(middleware::from_fn(request_limits))
        .layer(middleware::from_fn_with_state(hosts, crate::gate::check_host))
        .with_state(state)
}

/// URIs and header sections over the router's limits get a JSON 414 / 431. (hyper's
/// own parser limits sit above these and answer without a body: docs/limits.md.)
async fn request_limits(req: axum::extract::Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the request target is {target} bytes; the limit is {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    let headers = req.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "{} headers of {bytes} bytes; the limits are {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// Methods and request headers a page from an allowed origin may use (CORS preflight).
const CORS_METHODS: &str = "GET, POST, DELETE";
const CORS_HEADERS: &str = "authorization, content-type, last-event-id";
/// How long a browser may cache a preflight's answer, seconds.
const CORS_MAX_AGE: &str = "600";

/// How an admin request relates to the broker's origin.
enum Site {
    /// No `Origin` (curl, scripts, servers) or the broker's own: no CORS involved.
    Same,
    /// A foreign origin listed in `server.http.allowed_origins`.
    Allowed(HeaderValue),
}

/// The cross-site rules of admin routes (docs/security.md): a browser page from
/// another origin may not call them (403) unless its origin is in
/// `server.http.allowed_origins`, and then gets CORS headers (preflights answered
/// here, before authentication: a preflight carries no credentials); a body must be
/// `application/json` ([`body`]: 415), which also keeps "simple" cross-site form posts
/// out.
async fn cross_site(State(allowed): State<Arc<[String]>>, req: axum::extract::Request, next: Next) -> Response {
    let path = req.uri().path();
    if !(path.starts_with("/admin/") || path.starts_with("/v1/")) {
        return next.run(req).await;
    }
    let site = match req.headers().get(header::ORIGIN) {
        None => Site::Same,
        Some(origin) if is_same_origin(origin, req.headers(), req.uri()) => Site::Same,
        Some(origin) if origin.to_str().is_ok_and(|o| allowed.iter().any(|a| a.eq_ignore_ascii_case(o))) => {
            Site::Allowed(origin.clone())
        }
        Some(origin) => {
            let shown = eventbus_core::quoted(&String::from_utf8_lossy(origin.as_bytes()));
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!("cross-site request refused: origin {shown} is not this broker's and not in server.http.allowed_origins"),
            )
            .into_response();
        }
    };
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut response = StatusCode::NO_CONTENT.into_response();
        if let Site::Allowed(origin) = site {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(CORS_METHODS));
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(CORS_HEADERS));
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(CORS_MAX_AGE));
            headers.insert(header::VARY, HeaderValue::from_static("origin"));
        }
        return response;
    }
    let mut response = next.run(req).await;
    if let Site::Allowed(origin) = site {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        response.headers_mut().append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

/// `Content-Type: application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Whether `origin` names the host the request was sent to (its `Host`, or the
/// HTTP/2 authority), default ports aside. The scheme is not compared: TLS is a
/// property of the listener, not something a page can choose.
fn is_same_origin(origin: &HeaderValue, headers: &HeaderMap, uri: &axum::http::Uri) -> bool {
    let Some((scheme, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else { return false };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| uri.authority().map(|a| a.as_str()));
    let Some(host) = host else { return false };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    let normal = |a: &str| {
        let a = a.to_ascii_lowercase();
        match a.strip_suffix(default_port) {
            Some(bare) if !default_port.is_empty() => bare.to_owned(),
            _ => a,
        }
    };
    normal(authority) == normal(host)
}

/// An error answered as `{"error": "..."}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    /// The gRPC status code of the same refusal (`UNKNOWN` for the HTTP-only ones).
    code: tonic::Code,
    message: String,
}

impl ApiError {
    /// An HTTP-only refusal.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, code: tonic::Code::Unknown, message: message.into() }
    }

    /// A refusal the gRPC path answered, with the HTTP code of its status code.
    pub(crate) fn from_status(status: tonic::Status) -> Self {
        use tonic::Code;
        let http = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self { status: http, code: status.code(), message: status.message().to_owned() }
    }
}

impl From<EdgeError> for ApiError {
    fn from(err: EdgeError) -> Self {
        let (code, status) = err.codes();
        Self { status, code, message: err.to_string() }
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        EdgeError::from(err).into()
    }
}

impl From<DurableError> for ApiError {
    fn from(err: DurableError) -> Self {
        EdgeError::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Authenticates a request the way gRPC calls are ([`Access::authenticate`]); the
/// [`Caller`] rides in its extensions for the handler.
async fn authenticate(State(access): State<Access>, req: axum::extract::Request, next: Next) -> Response {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let authorization = values.next().map(|v| v.as_bytes());
    let repeated = values.next().is_some();
    let authorization = authorization.map(<[u8]>::to_vec);
    admit(&access, req, authorization.as_deref(), repeated, next).await
}

/// Passes the request on with its [`Caller`] when `authorization` authenticates it
/// (`repeated`: the request carried more than one credential); else the refusal.
pub(crate) async fn admit(
    access: &Access,
    mut req: axum::extract::Request,
    authorization: Option<&[u8]>,
    repeated: bool,
    next: Next,
) -> Response {
    let peer = req.extensions().get::<ConnectInfo<PeerInfo>>().map(|c| &c.0);
    match access.authenticate(authorization, repeated, peer) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refused) => ApiError::from(refused).into_response(),
    }
}

/// The caller, when it is an admin.
fn admin(state: &HttpState, caller: &Caller) -> Result<(), ApiError> {
    let allowed = caller.principal().permissions.is_admin();
    Ok(state.access.require(caller, Operation::Admin, allowed, || "an admin call".into())?)
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
/// its work and must be restarted; docs/operations.md).
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
        None => match state.bus.transport_status().map(|s| s.borrow().degraded_slots).unwrap_or(0) {
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

async fn stats(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<convert::StatsJson>, ApiError> {
    admin(&state, &caller)?;
    Ok(Json(convert::stats_json(state.bus.stats())))
}

async fn channels(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&state, &caller)?;
    let channels: Vec<_> = state.bus.channels().into_iter().map(convert::channel_json).collect();
    Ok(Json(json!({ "channels": channels })))
}

async fn subscriptions(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&state, &caller)?;
    let subscriptions: Vec<_> = state.bus.subscriptions().into_iter().map(convert::subscription_json).collect();
    Ok(Json(json!({ "subscriptions": subscriptions })))
}

async fn unsubscribe(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.access.check_unsubscribe(&state.bus, &caller, &id)?;
    state.bus.unsubscribe(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A request body, or why it could not be read: not `application/json` is 415 (a
/// browser sends other types cross-site without asking first), over the body limit an
/// oversized publish (413 naming `max_payload_bytes`), anything else a bad request.
pub(crate) fn body(
    state: &HttpState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "request bodies must be application/json"));
    }
    match body {
        Ok(body) => Ok(body),
        Err(BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_))) => {
            Err(state.limit.exceeded(state.limit.http_body_limit()).into())
        }
        Err(rejection) => Err(EdgeError::BadRequest(rejection.body_text()).into()),
    }
}

/// `POST /admin/eventbus/publish`. The body (`application/json`, checked by
/// [`cross_site`]) is parsed by hand rather than with `Json<T>`, so every parse failure
/// is a 400 naming it.
async fn publish(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    peer: ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let published = async {
        let mut input = convert::publish_input_json(&body(&state, &headers, raw)?, peer.0.addr.to_string().into())?;
        convert::record_hops(&headers, &mut input)?;
        state.access.check_publish(&caller, [input.channel.as_str()])?;
        Ok::<_, ApiError>(state.bus.publish(input).await?)
    }
    .await;
    published_json(&state, published)
}

/// The answer to a publish over HTTP, its duration or its refusal counted as a gRPC
/// publish's is.
pub(crate) fn published_json(
    state: &HttpState,
    published: Result<eventbus_core::Published, ApiError>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let Some(metrics) = &state.metrics else { return published.map(|p| Json(convert::publish_response_json(p))) };
    match published {
        Ok(published) => {
            metrics.observe_publish(published.duration);
            Ok(Json(convert::publish_response_json(published)))
        }
        Err(refused) => {
            metrics.count_refused(refused.code);
            Err(refused)
        }
    }
}

// --- durable consumers ---

async fn list_consumers(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let consumers = convert::durable(&state.bus)?.list_consumers().await?;
    let consumers: Vec<_> = consumers
        .iter()
        .filter(|c| state.access.may_read_consumer(&caller, &c.config.name))
        .map(convert::consumer_info_json)
        .collect();
    Ok(Json(json!({ "consumers": consumers })))
}

/// Body: a consumer definition; omitted fields take the defaults (as in the config file).
async fn create_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let setting: ConsumerSetting = serde_json::from_slice(&body(&state, &headers, raw)?)
        .map_err(|e| EdgeError::BadRequest(format!("invalid JSON body: {e}")))?;
    let config = eventbus_core::durable::ConsumerConfig { owner: caller.name().to_owned(), ..setting.to_config() };
    state.access.check_create_consumer(&caller, &config)?;
    let durable = convert::durable(&state.bus)?;
    state.access.check_consumer_room(durable.as_ref(), &caller, &config.name).await?;
    let info = durable.create_consumer(config).await?;
    Ok((StatusCode::CREATED, Json(convert::consumer_info_json(&info))).into_response())
}

async fn get_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    state.access.check_read_consumer(&caller, &name)?;
    let info = convert::durable(&state.bus)?.get_consumer(&name).await?;
    Ok(Json(convert::consumer_info_json(&info)))
}

async fn delete_consumer(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.access.check_manage_consumer(&caller, &name)?;
    convert::durable(&state.bus)?.delete_consumer(&name).await?;
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
    query: Result<axum::extract::Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<convert::LogPageJson>, ApiError> {
    state.access.check_read_consumer(&caller, &name)?;
    let axum::extract::Query(q) = query.map_err(|e| EdgeError::BadRequest(e.body_text()))?;
    let status = convert::log_status_filter_json(q.status.as_deref())?;
    let limit = convert::log_limit(q.limit.unwrap_or(0));
    let token = q.page_token.unwrap_or_default();
    let page = convert::durable(&state.bus)?.log(&name, status, limit, &token).await?;
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
    query: Result<axum::extract::Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<convert::HistoryPageJson>, ApiError> {
    state.access.check_subscribe(&caller, &[&name])?;
    let axum::extract::Query(q) = query.map_err(|e| EdgeError::BadRequest(e.body_text()))?;
    let from = convert::history_from_query(q.since.as_deref())?;
    let limit = convert::history_limit_query(q.limit)?;
    let page = convert::history_page(&state.bus, &name, from, limit).await?;
    Ok(Json(convert::history_page_json(page)))
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
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<convert::PendingPageJson>, ApiError> {
    state.access.check_read_consumer(&caller, &name)?;
    let axum::extract::Query(q) = query.map_err(|e| EdgeError::BadRequest(e.body_text()))?;
    let limit = convert::log_limit(q.limit.unwrap_or(0));
    let token = q.page_token.unwrap_or_default();
    let page = convert::durable(&state.bus)?.list_pending(&name, limit, &token).await?;
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
    state.access.check_manage_consumer(&caller, &name)?;
    // No body (a bare POST) needs no content type; a body must be JSON.
    let empty = raw.as_ref().is_ok_and(|b| b.iter().all(u8::is_ascii_whitespace));
    let req: RedriveBody = if empty {
        RedriveBody::default()
    } else {
        let raw = body(&state, &headers, raw)?;
        serde_json::from_slice(&raw).map_err(|e| EdgeError::BadRequest(format!("invalid JSON body: {e}")))?
    };
    let done = convert::durable(&state.bus)?.redrive(&name, &req.event_ids, req.limit).await?;
    Ok(Json(convert::redriven_json(done)))
}

async fn pause(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    set_paused(&state, &caller, &name, true).await
}

async fn resume(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    set_paused(&state, &caller, &name, false).await
}

async fn set_paused(
    state: &HttpState,
    caller: &Caller,
    name: &str,
    paused: bool,
) -> Result<Json<convert::ConsumerJson>, ApiError> {
    state.access.check_manage_consumer(caller, name)?;
    let info = convert::durable(&state.bus)?.set_paused(name, paused).await?;
    Ok(Json(convert::consumer_info_json(&info)))
}
