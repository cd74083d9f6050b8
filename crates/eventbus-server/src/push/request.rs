//! One push request: what it carries (body, `eventbus-*` headers, signature) and what
//! its answer means for the events in it.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventbus_core::durable::{Delivery, PushConfig, PushEnvelope};
use hmac::{Hmac, Mac};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Serialize;
use sha2::Sha256;

use crate::convert::{self, EventJson, trace};

/// Content type of a payload published without one.
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";
/// Longest `Retry-After` honoured; a longer one is cut to it.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3_600);
/// How much of a refusal's body goes into the failure reason.
const REASON_BODY_BYTES: usize = 256;

/// A request ready to send: its headers (beside the configured ones) and body.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// The JSON envelope's body.
#[derive(Debug, Serialize)]
struct JsonBody<'a> {
    consumer: &'a str,
    deliveries: Vec<JsonDelivery>,
}

#[derive(Debug, Serialize)]
struct JsonDelivery {
    attempt: u32,
    event: EventJson,
}

/// Builds the request for `deliveries` (one, or up to `push.batch` with the JSON
/// envelope), signed at `now` when the consumer has a secret.
pub(crate) fn prepare(consumer: &str, push: &PushConfig, deliveries: &[Delivery], now: SystemTime) -> Prepared {
    let mut headers = HeaderMap::new();
    let body = match (push.envelope, deliveries) {
        (PushEnvelope::Raw, [d]) => {
            raw_headers(&mut headers, consumer, d);
            d.event.payload.clone()
        }
        _ => {
            let body = JsonBody {
                consumer,
                deliveries: deliveries
                    .iter()
                    .map(|d| JsonDelivery { attempt: d.attempt, event: convert::event_json(&d.event) })
                    .collect(),
            };
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(name("eventbus-consumer"), encoded(consumer));
            // Serializing plain structs of strings and numbers cannot fail.
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
        }
    };
    // The event's hops so far, and this push: a receiving broker refuses past its limit.
    let hops = deliveries.iter().map(|d| convert::next_hops(&d.event)).max().unwrap_or(1);
    headers.insert(name(convert::HOPS), HeaderValue::from(hops));
    // A request of one event carries its trace context as the W3C headers (those of a
    // batch are in its body, each event's with its metadata).
    if let [d] = deliveries
        && let Some((parent, state)) = trace::of_event(&d.event.metadata)
    {
        headers.insert(name(trace::TRACEPARENT), encoded(parent));
        if let Some(state) = state {
            headers.insert(name(trace::TRACESTATE), encoded(state));
        }
    }
    if !push.secret.is_empty() {
        let t = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
        headers.insert(name("eventbus-signature"), signature(push.secret.as_bytes(), t, &body));
    }
    Prepared { headers, body }
}

/// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`.
fn signature(secret: &[u8], t: u64, body: &[u8]) -> HeaderValue {
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else { unreachable!("HMAC accepts any key length") };
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let value = format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()));
    encoded(&value)
}

fn raw_headers(headers: &mut HeaderMap, consumer: &str, d: &Delivery) {
    let e = &d.event;
    let content_type = if e.content_type.is_empty() { DEFAULT_CONTENT_TYPE } else { &e.content_type };
    headers.insert(CONTENT_TYPE, encoded(content_type));
    headers.insert(name("eventbus-id"), encoded(&e.id));
    headers.insert(name("eventbus-channel"), encoded(&e.channel));
    headers.insert(name("eventbus-consumer"), encoded(consumer));
    headers.insert(name("eventbus-attempt"), HeaderValue::from(d.attempt));
    headers.insert(name("eventbus-timestamp"), encoded(&convert::rfc3339(e.timestamp)));
    headers.insert(name("eventbus-source"), encoded(&e.source));
    for (key, value) in &e.metadata {
        if [convert::HOPS, trace::TRACEPARENT, trace::TRACESTATE].contains(&key.as_str()) {
            // Sent as headers of their own.
            continue;
        }
        let mut header = String::with_capacity(META_PREFIX.len() + key.len());
        header.push_str(META_PREFIX);
        percent_encode(&mut header, key, |b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        if let Ok(header) = HeaderName::from_bytes(header.as_bytes()) {
            headers.append(header, encoded(value));
        }
    }
}

/// Prefix of the metadata headers; the key follows, percent-encoded.
const META_PREFIX: &str = "eventbus-meta-";

fn name(n: &'static str) -> HeaderName {
    HeaderName::from_static(n)
}

/// `value` as a header value: control characters, `%` and non-ASCII bytes
/// percent-encoded, the rest as is (a plain value reads as itself).
fn encoded(value: &str) -> HeaderValue {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'%';
    if value.bytes().all(plain)
        && let Ok(v) = HeaderValue::from_str(value)
    {
        return v;
    }
    let mut out = String::with_capacity(value.len() + 8);
    percent_encode(&mut out, value, plain);
    // Only visible ASCII is left.
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn percent_encode(out: &mut String, s: &str, keep: impl Fn(u8) -> bool) {
    for b in s.bytes() {
        if keep(b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// What an answer (or its absence) does to the events of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 2xx: acked.
    Ack,
    /// Failed, retried: after `delay` (from `Retry-After`), else after the backoff.
    Retry { reason: String, delay: Option<Duration> },
    /// A refusal retrying will not change (3xx, 4xx but 429): dead-lettered now.
    Reject { reason: String },
}

/// The outcome of an HTTP answer with `status`, its `Retry-After` and the first bytes
/// of its body.
pub(crate) fn classify(status: u16, retry_after: Option<&HeaderValue>, body: &[u8], now: SystemTime) -> Outcome {
    let reason = || {
        let mut reason = format!("HTTP {status}");
        let text = String::from_utf8_lossy(&body[..body.len().min(REASON_BODY_BYTES)]);
        let text: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let text = text.trim();
        if !text.is_empty() {
            reason.push_str(": ");
            reason.push_str(text);
        }
        reason
    };
    match status {
        200..=299 => Outcome::Ack,
        // The endpoint found a loop (a broker past its hop limit): retrying loops again.
        508 => Outcome::Reject { reason: reason() },
        429 | 503 => Outcome::Retry { reason: reason(), delay: retry_after.and_then(|v| retry_delay(v, now)) },
        300..=499 => Outcome::Reject { reason: reason() },
        _ => Outcome::Retry { reason: reason(), delay: None },
    }
}

/// Seconds, or an HTTP date, from `now`; capped at [`MAX_RETRY_AFTER`].
fn retry_delay(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    let delay = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(text).ok()?.duration_since(now).unwrap_or_default(),
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// The `Retry-After` header of an answer.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<&HeaderValue> {
    headers.get(RETRY_AFTER)
}

/// The answer class a request counts under (`2xx` … `5xx`; `error` for a status
/// outside them).
pub(crate) fn class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use eventbus_core::Event;

    use super::*;

    fn delivery(metadata: &[(&str, &str)]) -> Delivery {
        let metadata: HashMap<String, String> =
            metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let event = Event::from_parts(
            eventbus_core::event::new_id().to_string(),
            "orders.created".into(),
            SystemTime::now(),
            "test".into(),
            Bytes::from_static(b"{\"n\":1}"),
            metadata,
            "application/json".into(),
        );
        Delivery { event: Arc::new(event), attempt: 2, deadline: SystemTime::now() }
    }

    #[test]
    fn raw_requests_carry_the_payload_and_the_fields_as_headers() {
        let d = delivery(&[("tenant", "acme"), ("Trace Id", "é%\n")]);
        let p = prepare("billing", &PushConfig::new("http://h/"), std::slice::from_ref(&d), SystemTime::now());
        assert_eq!(p.body, d.event.payload);
        let h = |n: &str| p.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(h("content-type").as_deref(), Some("application/json"));
        assert_eq!(h("eventbus-id").as_deref(), Some(&*d.event.id));
        assert_eq!(h("eventbus-channel").as_deref(), Some("orders.created"));
        assert_eq!(h("eventbus-attempt").as_deref(), Some("2"));
        assert_eq!(h("eventbus-consumer").as_deref(), Some("billing"));
        assert_eq!(h("eventbus-meta-tenant").as_deref(), Some("acme"));
        // Case, spaces and non-ASCII survive as percent-encoding.
        assert_eq!(h("eventbus-meta-%54race%20%49d").as_deref(), Some("%C3%A9%25%0A"));
        assert_eq!(h("eventbus-signature"), None, "no secret, no signature");
        assert_eq!(h("eventbus-hops").as_deref(), Some("1"), "a first push");
        let pushed = delivery(&[("eventbus-hops", "3")]);
        let p = prepare("billing", &PushConfig::new("http://h/"), std::slice::from_ref(&pushed), SystemTime::now());
        assert_eq!(p.headers["eventbus-hops"], "4", "one more than it came with");
        assert!(!p.headers.contains_key("eventbus-meta-eventbus-hops"));
    }

    #[test]
    fn a_push_carries_its_events_trace_context_as_the_w3c_headers() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let d = delivery(&[("traceparent", parent), ("tracestate", "congo=t61rcWkgMzE")]);
        for envelope in [PushEnvelope::Raw, PushEnvelope::Json] {
            let push = PushConfig { envelope, ..PushConfig::new("http://h/") };
            let p = prepare("billing", &push, std::slice::from_ref(&d), SystemTime::now());
            assert_eq!(p.headers["traceparent"], parent, "{envelope:?}");
            assert_eq!(p.headers["tracestate"], "congo=t61rcWkgMzE");
            assert!(!p.headers.contains_key("eventbus-meta-traceparent"));
        }
        // A batch's events each keep theirs in the body; the request carries none.
        let json = PushConfig { envelope: PushEnvelope::Json, batch: 2, ..PushConfig::new("http://h/") };
        let p = prepare("billing", &json, &[d.clone(), d], SystemTime::now());
        assert!(!p.headers.contains_key("traceparent"));
        // One that is not a valid traceparent is not handed on as one.
        let odd = delivery(&[("traceparent", "not-a-trace")]);
        let p = prepare("billing", &PushConfig::new("http://h/"), std::slice::from_ref(&odd), SystemTime::now());
        assert!(!p.headers.contains_key("traceparent"));
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_time_and_the_body() {
        let d = delivery(&[]);
        let push = PushConfig { secret: "s3cret".into(), ..PushConfig::new("http://h/") };
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let p = prepare("billing", &push, std::slice::from_ref(&d), at);
        let header = p.headers["eventbus-signature"].to_str().unwrap().to_owned();
        // printf '1700000000.{"n":1}' | openssl dgst -sha256 -hmac s3cret
        let expected = "t=1700000000,v1=7c4ceb6f84be2af81c730e6f7e5b38798496a065acc0f03f8128618075f3f993";
        assert_eq!(header, expected);
    }

    #[test]
    fn json_requests_hold_every_delivery() {
        let push = PushConfig { envelope: PushEnvelope::Json, batch: 2, ..PushConfig::new("http://h/") };
        let batch = [delivery(&[("k", "v")]), delivery(&[])];
        let p = prepare("billing", &push, &batch, SystemTime::now());
        assert_eq!(p.headers["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(body["consumer"], "billing");
        assert_eq!(body["deliveries"].as_array().unwrap().len(), 2);
        assert_eq!(body["deliveries"][0]["attempt"], 2);
        assert_eq!(body["deliveries"][0]["event"]["payload"]["n"], 1);
        assert_eq!(body["deliveries"][0]["event"]["metadata"]["k"], "v");
        assert_eq!(body["deliveries"][1]["event"]["id"], &*batch[1].event.id);
    }

    #[test]
    fn answers_map_to_ack_retry_or_dead_letter() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(classify(204, None, b"", now), Outcome::Ack);
        let secs = HeaderValue::from_static("7");
        assert_eq!(
            classify(429, Some(&secs), b"slow down", now),
            Outcome::Retry { reason: "HTTP 429: slow down".into(), delay: Some(Duration::from_secs(7)) }
        );
        let date = HeaderValue::from_str(&httpdate::fmt_http_date(now + Duration::from_secs(30))).unwrap();
        assert_eq!(
            classify(503, Some(&date), b"", now),
            Outcome::Retry { reason: "HTTP 503".into(), delay: Some(Duration::from_secs(30)) }
        );
        let huge = HeaderValue::from_static("999999999");
        assert!(
            matches!(classify(503, Some(&huge), b"", now), Outcome::Retry { delay: Some(d), .. } if d == MAX_RETRY_AFTER)
        );
        let junk = HeaderValue::from_static("soon");
        assert!(matches!(classify(503, Some(&junk), b"", now), Outcome::Retry { delay: None, .. }));
        assert_eq!(
            classify(500, None, b"boom\n", now),
            Outcome::Retry { reason: "HTTP 500: boom".into(), delay: None }
        );
        assert_eq!(
            classify(404, None, b"no such hook", now),
            Outcome::Reject { reason: "HTTP 404: no such hook".into() }
        );
        assert!(matches!(classify(302, None, b"", now), Outcome::Reject { .. }));
        assert!(matches!(classify(508, None, b"", now), Outcome::Reject { .. }), "a loop is not retried");
        let long = vec![b'x'; 10_000];
        let Outcome::Reject { reason } = classify(400, None, &long, now) else { panic!() };
        assert_eq!(reason.len(), "HTTP 400: ".len() + REASON_BODY_BYTES);
    }
}
