//! The browser's routes on the HTTP port (docs/web.md): `GET /v1/subscribe` (Server-Sent
//! Events), `POST /v1/publish` (JSON), `POST /v1/tokens` (session tokens) and
//! `GET /v1/whoami`. Subscribing goes through the same path as the gRPC `Subscribe`
//! (names, rights, limits, queue bounds, recovery, metrics), publishing through the same
//! checks as `Publish`.
//!
//! A browser's `EventSource` sends no headers, so `/v1/subscribe` also takes a `token`
//! in the query — only a session token (`ebs_…`, short-lived, minted by `POST /v1/tokens`):
//! a long-lived credential never goes in a URL, where logs and histories keep it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use eventbus_auth::{CredentialKind, SESSION_PREFIX};
use eventbus_core::{Event, Pattern};
use eventbus_proto::pb;
use futures::{StreamExt, stream};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::access::{Access, Caller};
use crate::convert::{self, EdgeError};
use crate::delivery::Frame;
use crate::http::{ApiError, HttpState, admit, body, published_json};
use crate::listener::PeerInfo;

/// The `/v1` routes, authenticated by header or by a session token in the query.
pub(crate) fn routes(access: Access) -> Router<HttpState> {
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/tokens", post(tokens))
        .route("/v1/subscribe", get(subscribe))
        .route("/v1/publish", post(publish))
        .route_layer(middleware::from_fn_with_state(access, authenticate))
}

/// Query parameters of `/v1/subscribe` (besides the repeatable `channel`).
const SUBSCRIBE_PARAMS: &str = "channel, group, queue_capacity, max_queue_bytes, overflow, name, last_event_id, token";

/// Authenticates like the admin routes, but `/v1/subscribe` also takes `token=` from
/// the query: a session token only.
async fn authenticate(State(access): State<Access>, req: axum::extract::Request, next: Next) -> Response {
    let query_token = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    if query_token.is_some() && req.uri().path() != "/v1/subscribe" {
        // Only EventSource cannot send a header; a token in any other URL would only
        // end up in logs and histories.
        let refused = EdgeError::Unauthenticated(
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
            let refused = EdgeError::Unauthenticated(
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
        "auth": state.access.enabled(),
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
        _ => serde_json::from_slice(&body(&state, &headers, raw)?)
            .map_err(|e| EdgeError::BadRequest(format!("invalid JSON body: {e}")))?,
    };
    if asked.ttl_ms == Some(0) {
        return Err(EdgeError::BadRequest("ttl_ms must be positive".into()).into());
    }
    let principal = caller.principal();
    if principal.source == CredentialKind::Session {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "a session token cannot mint another: ask with the credential it was minted from",
        ));
    }
    Ok(Json(match state.access.mint_session(&caller, asked.ttl_ms.map(Duration::from_millis)) {
        Some((token, expires)) => json!({ "token": token, "expires_at": convert::rfc3339(expires) }),
        None => json!({ "token": "", "expires_at": null }),
    }))
}

/// `GET /v1/subscribe?channel=…`: the events as Server-Sent Events.
async fn subscribe(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    ConnectInfo(peer): ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let mut req = pb::SubscribeRequest::default();
    let mut last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let number = |key: &str, value: &str| {
        value.parse::<u64>().map_err(|_| EdgeError::BadRequest(format!("{key} must be a number, not {value:?}")))
    };
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match &*key {
            "channel" => req.channels.push(value.into_owned()),
            "group" => req.group = value.into_owned(),
            "name" => req.name = value.into_owned(),
            "queue_capacity" => req.queue_capacity = u32::try_from(number(&key, &value)?).unwrap_or(u32::MAX),
            "max_queue_bytes" => req.max_queue_bytes = number(&key, &value)?,
            "overflow" => req.overflow = overflow(&value)? as i32,
            "last_event_id" => last_event_id = Some(value.into_owned()),
            "token" => {}
            other => {
                let shown = eventbus_core::quoted(other);
                return Err(EdgeError::BadRequest(format!("unknown parameter {shown}: use {SUBSCRIBE_PARAMS}")).into());
            }
        }
    }
    if req.channels.is_empty() {
        return Err(EdgeError::BadRequest("name at least one channel or pattern: ?channel=orders.>".into()).into());
    }
    // Resuming after the last event received: recovered from history when every filter
    // has one (the events published from that event's millisecond on), else a gap.
    let mut gap = false;
    let last_event_id = last_event_id.filter(|id| !id.is_empty());
    if let Some(last) = &last_event_id {
        let at = event_time(last).ok_or_else(|| {
            EdgeError::BadRequest(format!("Last-Event-ID {} is not an event id", eventbus_core::quoted(last)))
        })?;
        let rules = state.bus.history_rules();
        let covered = req.group.is_empty()
            && req.channels.iter().all(|c| Pattern::parse(c).is_ok_and(|filter| rules.cover(&filter)));
        match covered {
            true => {
                req.since = Some(pb::SubscribeSince { timestamp: Some(convert::timestamp(at)), ..Default::default() })
            }
            false => gap = true,
        }
    }
    let mut request = tonic::Request::new(req);
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(peer);
    let frames = state.events.open_subscription(request).await.map_err(ApiError::from_status)?;
    let mut sse = SseFrames { resumed: last_event_id.is_some(), gap, seen: last_event_id, ended: false };
    // `None` after the last frame: a stream the broker closed without an error (an
    // operator's unsubscribe) still tells the page why it ends.
    let frames = frames.map(Some).chain(stream::once(std::future::ready(None)));
    let events = frames.flat_map(move |frame| stream::iter(sse.events(frame)));
    let mut response =
        Sse::new(events).keep_alive(KeepAlive::new().interval(state.sse_heartbeat).text("keepalive")).into_response();
    // Proxies that buffer responses (nginx) must pass each event on at once.
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// Turns subscription frames into SSE events.
struct SseFrames {
    /// The page resumed after an event it had (`Last-Event-ID` or `last_event_id`).
    resumed: bool,
    /// A gap is known before the stream starts: no history covers every channel.
    gap: bool,
    /// The last event the page received: never sent again (others of its millisecond
    /// may be).
    seen: Option<String>,
    /// `event: end` was sent.
    ended: bool,
}

impl SseFrames {
    /// The SSE events of one frame; `None` is the end of the frames.
    fn events(&mut self, frame: Option<Result<Frame, tonic::Status>>) -> Vec<Result<SseEvent, Infallible>> {
        match frame {
            Some(Ok(Frame::Started(started))) => {
                let Some(pb::subscribe_response::Kind::Started(s)) = started.kind else { return Vec::new() };
                let data = json!({
                    "subscription_id": s.subscription_id,
                    "recovered": s.recovered,
                    "started_at": s.started_at.map(|t| t.to_string()),
                });
                let mut out = vec![Ok(SseEvent::default().event("started").data(data.to_string()))];
                let why = if self.gap {
                    Some("no history covers every channel: events published while away are not recovered")
                } else if self.resumed && !s.recovered {
                    Some(
                        "the history no longer holds every event published while away: the stream starts from what it keeps",
                    )
                } else {
                    None
                };
                if let Some(why) = why {
                    out.push(Ok(SseEvent::default().event("gap").data(json!({ "reason": why }).to_string())));
                }
                out
            }
            Some(Ok(Frame::Events(events))) => {
                let seen = self.seen.as_deref();
                events.iter().filter(|e| Some(&*e.id) != seen).map(|e| Ok(message(e))).collect()
            }
            Some(Err(status)) => {
                self.ended = true;
                vec![Ok(end(&format!("{:?}", status.code()), status.message()))]
            }
            None if self.ended => Vec::new(),
            None => vec![Ok(end("Ok", "the subscription was closed by an operator"))],
        }
    }
}

/// `event: end`: why the broker ends the stream.
fn end(code: &str, reason: &str) -> SseEvent {
    SseEvent::default().event("end").data(json!({ "code": code, "reason": reason }).to_string())
}

/// One broker event as an SSE `message`: its id as the SSE id (a reconnecting
/// `EventSource` sends it back as `Last-Event-ID`), its fields as JSON.
fn message(e: &Event) -> SseEvent {
    let data = serde_json::to_string(&EventText::of(e)).unwrap_or_default();
    SseEvent::default().id(&*e.id).data(data)
}

/// An event for a browser: the payload as text when it is text, else in base64.
#[derive(Debug, Serialize)]
struct EventText<'a> {
    id: &'a str,
    channel: &'a str,
    timestamp: String,
    source: &'a str,
    content_type: &'a str,
    metadata: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<serde_json::Value>,
}

impl<'a> EventText<'a> {
    fn of(e: &'a Event) -> Self {
        use base64::Engine as _;
        let text = is_textual(&e.content_type).then(|| std::str::from_utf8(&e.payload).ok()).flatten();
        Self {
            id: &e.id,
            channel: &e.channel,
            timestamp: convert::rfc3339(e.timestamp),
            source: &e.source,
            content_type: &e.content_type,
            metadata: &e.metadata,
            payload: text,
            payload_base64: text.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(&e.payload)),
            position: e.position.as_ref().map(|p| json!({ "epoch": &*p.epoch, "offset": p.offset })),
        }
    }
}

/// Text formats (and no content type at all: the payload is shown as text when it is
/// valid UTF-8).
fn is_textual(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence.is_empty()
        || essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json" | "application/xml" | "application/javascript" | "application/x-www-form-urlencoded"
        )
}

/// When the event with this id was published: the first 48 bits of a UUIDv7 are its
/// milliseconds since the epoch.
fn event_time(id: &str) -> Option<SystemTime> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) || hex.as_bytes()[12] != b'7' {
        return None;
    }
    let ms = u64::from_str_radix(&hex[..12], 16).ok()?;
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    // 48 bits of milliseconds reach past year 9999, which no event was published in.
    eventbus_proto::time::check_timestamp(&convert::timestamp(at)).ok()?;
    Some(at)
}

fn overflow(value: &str) -> Result<pb::OverflowPolicy, EdgeError> {
    Ok(match value {
        "drop_oldest" => pb::OverflowPolicy::DropOldest,
        "drop_newest" => pb::OverflowPolicy::DropNewest,
        "disconnect" => pb::OverflowPolicy::Disconnect,
        "dead_letter" => pb::OverflowPolicy::DeadLetter,
        other => {
            let shown = eventbus_core::quoted(other);
            return Err(EdgeError::BadRequest(format!(
                "overflow {shown}: use drop_oldest, drop_newest, disconnect or dead_letter"
            )));
        }
    })
}

/// The body of `POST /v1/publish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    channel: String,
    /// A string is published as text; any other JSON value as JSON.
    #[serde(default)]
    payload: Option<serde_json::Value>,
    /// Binary payloads.
    #[serde(default)]
    payload_base64: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    source: String,
    #[serde(default)]
    ordering_key: String,
    #[serde(default)]
    idempotency_key: String,
}

/// `POST /v1/publish`: one event, as `Publish` would publish it.
async fn publish(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    ConnectInfo(peer): ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<convert::PublishedJson>, ApiError> {
    let published = async {
        let b: PublishBody = serde_json::from_slice(&body(&state, &headers, raw)?)
            .map_err(|e| EdgeError::BadRequest(format!("invalid JSON body: {e}")))?;
        let (payload, default_type) = match (b.payload, b.payload_base64) {
            (Some(_), Some(_)) => {
                return Err(EdgeError::BadRequest("give payload or payload_base64, not both".into()).into());
            }
            (Some(serde_json::Value::String(text)), None) => (Bytes::from(text), "text/plain; charset=utf-8"),
            (Some(value), None) => (Bytes::from(value.to_string()), "application/json"),
            (None, Some(encoded)) => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|e| EdgeError::BadRequest(format!("invalid payload_base64: {e}")))?;
                (Bytes::from(bytes), "application/octet-stream")
            }
            (None, None) => (Bytes::new(), ""),
        };
        let req = pb::PublishRequest {
            channel: b.channel,
            payload,
            metadata: b.metadata,
            content_type: b.content_type.unwrap_or_else(|| default_type.to_owned()),
            source: b.source,
            ordering_key: b.ordering_key,
            idempotency_key: b.idempotency_key,
            ..pb::PublishRequest::default()
        };
        state.access.check_publish(&caller, [req.channel.as_str()])?;
        let mut input = convert::publish_input(req, peer.addr_text.clone(), caller.name());
        convert::record_hops(&headers, &mut input)?;
        Ok::<_, ApiError>(state.bus.publish(input).await?)
    }
    .await;
    published_json(&state, published)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_give_their_time() {
        let id = eventbus_core::event::new_id();
        let at = event_time(&id).expect("a UUIDv7");
        let drift = SystemTime::now().duration_since(at).unwrap_or_default();
        assert!(drift < Duration::from_secs(5), "{drift:?}");
        assert_eq!(event_time("not-an-id"), None);
        assert_eq!(event_time("01234567-89ab-4def-8123-456789abcdef"), None, "not a v7");
    }

    #[test]
    fn text_is_shown_as_text_and_the_rest_in_base64() {
        for t in ["", "text/plain", "application/json; charset=utf-8", "application/cloudevents+json", "TEXT/CSV"] {
            assert!(is_textual(t), "{t}");
        }
        for t in ["application/octet-stream", "application/x-protobuf; type=eventbus.v1.DeadLetter", "image/png"] {
            assert!(!is_textual(t), "{t}");
        }
    }
}
