//! The browser's routes on the HTTP port (docs/web.md): `GET /v1/subscribe` (Server-Sent
//! Events, in `sse`), `POST /v1/publish` (JSON), `POST /v1/tokens` (session tokens) and
//! `GET /v1/whoami`. Each calls the same operation as its gRPC counterpart.
//!
//! A browser's `EventSource` sends no headers, so `/v1/subscribe` also takes a `token`
//! in the query — only a session token (`ebs_…`, short-lived, minted by `POST /v1/tokens`):
//! a long-lived credential never goes in a URL, where logs and histories keep it.

use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use eventbus_auth::SESSION_PREFIX;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, HttpState, admit, json_body, publish_body, sse};
use crate::access::{Access, Caller};
use crate::convert;
use crate::listener::PeerInfo;
use crate::ops::Refusal;

/// The `/v1` routes, authenticated by header or by a session token in the query.
pub(super) fn routes(access: Access) -> Router<HttpState> {
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/tokens", post(tokens))
        .route("/v1/subscribe", get(sse::subscribe))
        .route("/v1/publish", post(publish))
        .route_layer(middleware::from_fn_with_state(access, authenticate))
}

/// Authenticates like the admin routes, but `/v1/subscribe` also takes `token=` from
/// the query: a session token only.
async fn authenticate(State(access): State<Access>, req: axum::extract::Request, next: Next) -> Response {
    let query_token = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    if query_token.is_some() && req.uri().path() != "/v1/subscribe" {
        // Only EventSource cannot send a header; a token in any other URL would only
        // end up in logs and histories.
        let refused = Refusal::Unauthenticated(
            "a token in the URL (token=) is accepted on GET /v1/subscribe only: send it in the authorization \
             header"
                .into(),
        );
        return ApiError::from(refused).into_response();
    }
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let header_value = values.next().map(|v| v.as_bytes().to_vec());
    let mut repeated = values.next().is_some();
    let authorization = match (header_value, query_token) {
        (Some(_), Some(_)) => {
            repeated = true;
            None
        }
        (Some(value), None) => Some(value),
        (None, Some(token)) if !access.enabled() || token.starts_with(SESSION_PREFIX) => {
            Some(format!("Bearer {token}").into_bytes())
        }
        (None, Some(_)) => {
            let refused = Refusal::Unauthenticated(
                "only a session token from POST /v1/tokens may travel in a URL (token=ebs_…); send a long-lived \
                 credential in the authorization header"
                    .into(),
            );
            return ApiError::from(refused).into_response();
        }
        (None, None) => None,
    };
    admit(&access, req, authorization.as_deref(), repeated, next).await
}

/// `GET /v1/whoami`: who the caller is and what it may do, for a page to show only
/// what it may use.
async fn whoami(State(state): State<HttpState>, Extension(caller): Extension<Caller>) -> Json<serde_json::Value> {
    let principal = caller.principal();
    let rights = &principal.permissions;
    Json(json!({
        "auth": state.ops.access().enabled(),
        "principal": principal.name,
        "admin": rights.is_admin(),
        "publish": rights.publish,
        "subscribe": rights.subscribe,
        "may_attach": rights.consumers.allow,
        "may_manage": rights.manage_consumers,
        "expires_at": principal.expires_at.map(convert::rfc3339),
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    /// Shorter than the configured lifetime, if wanted.
    ttl_ms: Option<u64>,
}

/// `POST /v1/tokens`: a session token with the caller's name and rights.
async fn tokens(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let asked = match &raw {
        Ok(b) if b.is_empty() => TokenRequest::default(),
        _ => json_body(&state, &headers, raw)?,
    };
    Ok(Json(match state.ops.mint_session(&caller, asked.ttl_ms.map(Duration::from_millis))? {
        Some((token, expires)) => json!({ "token": token, "expires_at": convert::rfc3339(expires) }),
        None => json!({ "token": "", "expires_at": null }),
    }))
}

/// `POST /v1/publish`: one event, as `Publish` would publish it.
async fn publish(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    ConnectInfo(peer): ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let scope = caller.name();
    publish_body(&state, &caller, &headers, raw, |raw| convert::publish_input_web(raw, peer.addr_text.clone(), scope))
        .await
}
