//! Publish requests and answers.

use super::*;

/// A publish from the wire; `scope` is the publisher's idempotency scope (its name).
pub(crate) fn publish_input(req: pb::PublishRequest, peer: Arc<str>, scope: &str) -> PublishInput {
    // `ack` is the stream's, read before this.
    let pb::PublishRequest { channel, payload, metadata, content_type, source, ordering_key, idempotency_key, ack: _ } =
        req;
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

/// The header a pushed request carries (and the metadata key its event keeps): how many
/// pushes brought the event here. An HTTP publish records it on the event it publishes,
/// and a push of that event carries one more, so a loop of push consumers through
/// publish routes ends after [`MAX_HOPS`].
pub(crate) const HOPS: &str = "eventbus-hops";
/// Most pushes an HTTP publish may come from (docs/push.md "Loops").
pub(crate) const MAX_HOPS: u32 = 4;

/// Records the request's `eventbus-hops` on the event `input` publishes; past
/// [`MAX_HOPS`] the publish is refused.
pub(crate) fn record_hops(headers: &axum::http::HeaderMap, input: &mut PublishInput) -> Result<(), Refusal> {
    let Some(value) = headers.get(HOPS) else { return Ok(()) };
    let hops = value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()).ok_or_else(|| {
        Refusal::BadRequest(format!("{HOPS} must be a number, not {:?}", String::from_utf8_lossy(value.as_bytes())))
    })?;
    if hops > MAX_HOPS {
        return Err(Refusal::TooManyHops { hops });
    }
    input.metadata.insert(HOPS.to_owned(), hops.to_string());
    Ok(())
}

/// The `eventbus-hops` a push of `event` carries: one more than it came with.
pub(crate) fn next_hops(event: &Event) -> u32 {
    let came = event.metadata.get(HOPS).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    came.saturating_add(1)
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

pub(crate) fn publish_input_json(body: &[u8], peer: Arc<str>) -> Result<PublishInput, Refusal> {
    let PublishJson { channel, payload, metadata, source } =
        serde_json::from_slice(body).map_err(|e| Refusal::BadRequest(format!("invalid JSON body: {e}")))?;
    let payload = match payload {
        Some(value) => serde_json::to_vec(&value).map_err(|e| Refusal::BadRequest(format!("invalid payload: {e}")))?,
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

/// The body of `POST /v1/publish`.
#[derive(Debug, serde::Deserialize)]
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
    metadata: std::collections::HashMap<String, String>,
    #[serde(default)]
    source: String,
    #[serde(default)]
    ordering_key: String,
    #[serde(default)]
    idempotency_key: String,
}

/// The event a `POST /v1/publish` body asks for; `scope` is the publisher's idempotency
/// scope (its name).
pub(crate) fn publish_input_web(body: &[u8], peer: Arc<str>, scope: &str) -> Result<PublishInput, Refusal> {
    let b: PublishBody =
        serde_json::from_slice(body).map_err(|e| Refusal::BadRequest(format!("invalid JSON body: {e}")))?;
    let (payload, default_type) = match (b.payload, b.payload_base64) {
        (Some(_), Some(_)) => return Err(Refusal::BadRequest("give payload or payload_base64, not both".into())),
        (Some(serde_json::Value::String(text)), None) => (Bytes::from(text), "text/plain; charset=utf-8"),
        (Some(value), None) => (Bytes::from(value.to_string()), "application/json"),
        (None, Some(encoded)) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|e| Refusal::BadRequest(format!("invalid payload_base64: {e}")))?;
            (Bytes::from(bytes), "application/octet-stream")
        }
        (None, None) => (Bytes::new(), ""),
    };
    let idempotency_scope = if b.idempotency_key.is_empty() { String::new() } else { scope.to_owned() };
    Ok(PublishInput {
        channel: b.channel,
        payload,
        metadata: b.metadata,
        content_type: b.content_type.unwrap_or_else(|| default_type.to_owned()),
        source: b.source,
        peer,
        ordering_key: b.ordering_key,
        idempotency_key: b.idempotency_key,
        idempotency_scope,
    })
}

pub(crate) fn publish_response(p: Published) -> pb::PublishResponse {
    let Published { event_id, delivered, failed, duration: took, duplicate, captured, capture: _ } = p;
    pb::PublishResponse {
        event_id: event_id.to_string(),
        delivered_count: delivered,
        failed_count: failed,
        duration: Some(duration(took)),
        duplicate,
        captured_count: captured,
        ..Default::default()
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
    captured_count: u32,
}

pub(crate) fn publish_response_json(p: Published) -> PublishedJson {
    let Published { event_id, delivered, failed, duration, duplicate, captured, capture: _ } = p;
    PublishedJson {
        event_id: event_id.to_string(),
        delivered_count: delivered,
        failed_count: failed,
        duration_us: duration.as_micros() as u64,
        duplicate,
        captured_count: captured,
    }
}
