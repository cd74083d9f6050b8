//! `GET /v1/subscribe`: a subscription as Server-Sent Events, opened through the same
//! operation as the gRPC `Subscribe` (names, rights, limits, queue bounds, recovery,
//! metrics). A page that reconnects with `Last-Event-ID` resumes from history when
//! every filter has one, and is told of a gap otherwise.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use eventbus_core::{Event, Overflow, Pattern, Since, SubscribeOptions};
use futures::{StreamExt, stream};
use serde::Serialize;
use serde_json::json;

use super::{ApiError, HttpState};
use crate::access::Caller;
use crate::convert;
use crate::listener::PeerInfo;
use crate::ops::{Frame, Refusal};

/// Query parameters of `/v1/subscribe` (besides the repeatable `channel`).
const SUBSCRIBE_PARAMS: &str = "channel, group, queue_capacity, max_queue_bytes, overflow, name, last_event_id, token";

/// `GET /v1/subscribe?channel=…`: the events as Server-Sent Events.
pub(super) async fn subscribe(
    State(state): State<HttpState>,
    Extension(caller): Extension<Caller>,
    ConnectInfo(peer): ConnectInfo<PeerInfo>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let mut options = SubscribeOptions { peer: peer.addr_text().to_owned(), ..SubscribeOptions::default() };
    let mut last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let number = |key: &str, value: &str| {
        value.parse::<u64>().map_err(|_| Refusal::BadRequest(format!("{key} must be a number, not {value:?}")))
    };
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match &*key {
            "channel" => options.channels.push(value.into_owned()),
            "group" => options.group = value.into_owned(),
            "name" => options.name = value.into_owned(),
            "queue_capacity" => options.queue_capacity = bounded(number(&key, &value)?.min(u64::from(u32::MAX))),
            "max_queue_bytes" => options.max_queue_bytes = bounded(number(&key, &value)?),
            "overflow" => options.overflow = Some(overflow(&value)?),
            "last_event_id" => last_event_id = Some(value.into_owned()),
            "token" => {}
            other => {
                let shown = eventbus_core::quoted(other);
                return Err(Refusal::BadRequest(format!("unknown parameter {shown}: use {SUBSCRIBE_PARAMS}")).into());
            }
        }
    }
    if options.channels.is_empty() {
        return Err(Refusal::BadRequest("name at least one channel or pattern: ?channel=orders.>".into()).into());
    }
    // Resuming after the last event received: recovered from history when every filter
    // has one (the events published from that event's millisecond on), else a gap.
    let mut gap = false;
    let mut since = None;
    let last_event_id = last_event_id.filter(|id| !id.is_empty());
    if let Some(last) = &last_event_id {
        let at = event_time(last).ok_or_else(|| {
            Refusal::BadRequest(format!("Last-Event-ID {} is not an event id", eventbus_core::quoted(last)))
        })?;
        let rules = state.ops.bus().history_rules();
        let covered = options.group.is_empty()
            && options.channels.iter().all(|c| Pattern::parse(c).is_ok_and(|filter| rules.cover(&filter)));
        match covered {
            true => since = Some(Since { positions: HashMap::new(), timestamp: Some(at) }),
            false => gap = true,
        }
    }
    let frames = state.ops.subscribe(&caller, options, since).await?;
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
    fn events(&mut self, frame: Option<Result<Frame, Refusal>>) -> Vec<Result<SseEvent, Infallible>> {
        match frame {
            Some(Ok(Frame::Started(s))) => {
                let data = json!({
                    "subscription_id": s.id,
                    "recovered": s.recovered,
                    "started_at": convert::rfc3339(s.started_at),
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
            Some(Err(refused)) => {
                self.ended = true;
                refused.log_internal();
                let (code, _) = refused.codes();
                vec![Ok(end(&format!("{code:?}"), &refused.to_string()))]
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

/// A count from the query, as large as this machine holds.
fn bounded(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn overflow(value: &str) -> Result<Overflow, Refusal> {
    Ok(match value {
        "drop_oldest" => Overflow::DropOldest,
        "drop_newest" => Overflow::DropNewest,
        "disconnect" => Overflow::Disconnect,
        "dead_letter" => Overflow::DeadLetter,
        other => {
            let shown = eventbus_core::quoted(other);
            return Err(Refusal::BadRequest(format!(
                "overflow {shown}: use drop_oldest, drop_newest, disconnect or dead_letter"
            )));
        }
    })
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
