//! The HTTP listener (docs/operations.md): the probes, the admin REST routes, the
//! browser's `/v1` routes (Server-Sent Events, JSON publish, session tokens) and the
//! console. Each handler decodes its request, calls the operation (`ops`, the same one
//! a gRPC call reaches) and renders the answer; a refusal gets its HTTP code from the
//! one table in `convert`. With authentication on, every admin and `/v1` route (and the
//! probes with `auth.protect_metrics`) passes [`authenticate`] first, the same check
//! gRPC calls pass.
//!
//! Before any route (`guards`): requests addressed to a host not in
//! `server.http.allowed_hosts` are refused (421, `gate`); oversized URIs and header
//! sections are refused in JSON, and admin routes refuse cross-site requests: a foreign
//! `Origin` (403) unless listed in `server.http.allowed_origins`, whose CORS preflights
//! are answered; bodies other than `application/json` (415). Every error is
//! `{"error": "..."}`.
//!
//! - `probes`: `/metrics`, `/healthz`, `/readyz`.
//! - `admin`: `/admin/eventbus/...`.
//! - `web`: `/v1/whoami`, `/v1/tokens`, `/v1/publish`; `sse`: `/v1/subscribe`.
//! - `ui`: the console's files at `/ui/`.
//! - `serve`: hyper serving the listener.

mod admin;
mod guards;
mod probes;
mod serve;
mod sse;
mod ui;
mod web;

use std::sync::Arc;

use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use eventbus_core::PublishInput;
use serde_json::json;

pub(crate) use probes::Readiness;
pub(crate) use serve::serve;

use crate::access::{Access, Caller};
use crate::convert;
use crate::listener::PeerInfo;
use crate::ops::{Ops, Refusal};
use crate::request_limit::PayloadLimit;

#[derive(Debug, Clone)]
pub(crate) struct HttpState {
    pub(crate) ops: Ops,
    pub(crate) readiness: Readiness,
    pub(crate) limit: PayloadLimit,
    /// `server.http.allowed_origins`: foreign origins whose pages may call admin routes.
    pub(crate) allowed_origins: Arc<[String]>,
    /// `server.http.allowed_hosts`: the names requests may be addressed to.
    pub(crate) allowed_hosts: crate::gate::AllowedHosts,
    /// `server.http.sse_heartbeat_ms`.
    pub(crate) sse_heartbeat: std::time::Duration,
}

pub(crate) fn router(state: HttpState) -> Router {
    // Bodies are read up to this size at most; a publish over it is refused naming
    // `max_payload_bytes` (see `body`).
    let body_limit = DefaultBodyLimit::max(state.limit.http_body_limit());
    let access = state.ops.access().clone();
    let probes = Router::new()
        .route("/metrics", get(probes::metrics))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz));
    let probes = match access.protect_metrics() {
        true => probes.route_layer(middleware::from_fn_with_state(access.clone(), authenticate)),
        false => probes,
    };
    let admin = admin::routes().route_layer(middleware::from_fn_with_state(access.clone(), authenticate));
    let origins = state.allowed_origins.clone();
    let hosts = state.allowed_hosts.clone();
    probes
        .merge(admin)
        .merge(ui::routes())
        .merge(web::routes(access))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
        })
        .layer(body_limit)
        .layer(middleware::from_fn_with_state(origins, guards::cross_site))
        .layer(middleware::from_fn(guards::request_limits))
        .layer(middleware::from_fn_with_state(hosts, crate::gate::check_host))
        .with_state(state)
}

/// An error answered as `{"error": "..."}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// An HTTP-only refusal.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

impl From<Refusal> for ApiError {
    fn from(err: Refusal) -> Self {
        err.log_internal();
        let (_, status) = err.codes();
        Self { status, message: err.to_string() }
    }
}

impl From<eventbus_core::Error> for ApiError {
    fn from(err: eventbus_core::Error) -> Self {
        Refusal::from(err).into()
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
/// [`crate::access::Caller`] rides in its extensions for the handler.
async fn authenticate(State(access): State<Access>, req: axum::extract::Request, next: Next) -> Response {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let authorization = values.next().map(|v| v.as_bytes());
    let repeated = values.next().is_some();
    let authorization = authorization.map(<[u8]>::to_vec);
    admit(&access, req, authorization.as_deref(), repeated, next).await
}

/// Passes the request on with its caller when `authorization` authenticates it
/// (`repeated`: the request carried more than one credential); else the refusal.
async fn admit(
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

/// A request body, or why it could not be read: not `application/json` is 415 (a
/// browser sends other types cross-site without asking first), over the body limit an
/// oversized publish (413 naming `max_payload_bytes`), anything else a bad request.
fn body(state: &HttpState, headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Bytes, Refusal> {
    if !guards::is_json(headers) {
        return Err(Refusal::NotJson);
    }
    match body {
        Ok(body) => Ok(body),
        Err(BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_))) => {
            Err(state.limit.exceeded(state.limit.http_body_limit()))
        }
        Err(rejection) => Err(Refusal::BadRequest(rejection.body_text())),
    }
}

/// A JSON request body as `T`, every parse failure a 400 naming it.
fn json_body<T: serde::de::DeserializeOwned>(
    state: &HttpState,
    headers: &HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<T, Refusal> {
    serde_json::from_slice(&body(state, headers, raw)?)
        .map_err(|e| Refusal::BadRequest(format!("invalid JSON body: {e}")))
}

/// Publishes the event a JSON body decodes to, as `Publish` would; a body that cannot
/// be read, or an `eventbus-hops` over the limit, is counted as a refused publish like
/// the bus's refusals.
async fn publish_body(
    state: &HttpState,
    caller: &Caller,
    headers: &HeaderMap,
    raw: Result<Bytes, BytesRejection>,
    decode: impl FnOnce(&[u8]) -> Result<PublishInput, Refusal>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let input = body(state, headers, raw).and_then(|raw| {
        let mut input = decode(&raw)?;
        convert::record_hops(headers, &mut input)?;
        if let Some(trace) = convert::trace::TraceContext::from_http(headers) {
            trace.keep_in(&mut input.metadata);
        }
        Ok(input)
    });
    let input = input.inspect_err(|refused| state.ops.count_refused(refused))?;
    Ok(Json(convert::publish_response_json(state.ops.publish(caller, input).await?)))
}
