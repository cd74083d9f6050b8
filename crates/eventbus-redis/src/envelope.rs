//! What goes over Redis.
//!
//! The broker's own events are a versioned envelope, in one of two encodings:
//! - binary (the default): four magic bytes (`EB 42 55 01`: not valid UTF-8, so no text
//!   payload can start with them) then the protobuf `eventbus.v1.Event`;
//! - JSON (`eventbus.redis.envelope: json`), for services that only have a Redis
//!   client: an object whose `eventbus` member is `1`, with `id`, `channel`,
//!   `timestamp` (RFC 3339), `source`, `content_type`, `metadata` (string values), and
//!   the payload as `payload` (UTF-8 text) or `payload_base64` (anything else).
//!
//! Every instance reads both. Anything else on a prefixed channel comes from a foreign
//! producer (`redis-cli PUBLISH socle:eventbus:orders.created '{"id":1}'`) and becomes
//! an event with that raw payload, a fresh id and the current time.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::event::new_id;
use eventbus_core::history::Position;
use eventbus_proto::pb;
use prost::Message;
use serde::{Deserialize, Serialize};

/// How this instance encodes the events it publishes to Redis (it reads both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Envelope {
    /// Magic bytes and protobuf: compact, what eventbus instances exchange by default.
    #[default]
    Binary,
    /// A JSON object any Redis client can read (see the module documentation).
    Json,
}

/// Version of the JSON envelope, its `eventbus` member.
const JSON_VERSION: u32 = 1;

/// The JSON envelope, as written and read.
#[derive(Serialize, Deserialize)]
struct JsonEvent<'a> {
    eventbus: u32,
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    channel: std::borrow::Cow<'a, str>,
    timestamp: String,
    #[serde(borrow, default)]
    source: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    content_type: std::borrow::Cow<'a, str>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
    /// Set in Redis by the history script, never by the publishing instance.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    position: Option<JsonPosition<'a>>,
}

#[derive(Serialize, Deserialize)]
struct JsonPosition<'a> {
    #[serde(borrow)]
    epoch: std::borrow::Cow<'a, str>,
    offset: u64,
}

/// `event` as this instance publishes it to Redis.
pub(crate) fn encode_as(envelope: Envelope, event: &Event) -> Vec<u8> {
    match envelope {
        Envelope::Binary => encode(event),
        Envelope::Json => encode_json(event),
    }
}

fn encode_json(event: &Event) -> Vec<u8> {
    let (payload, payload_base64) = match std::str::from_utf8(&event.payload) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(BASE64.encode(&event.payload))),
    };
    let json = JsonEvent {
        eventbus: JSON_VERSION,
        id: (*event.id).into(),
        channel: event.channel.as_str().into(),
        timestamp: prost_types::Timestamp::from(event.timestamp).to_string(),
        source: (*event.source).into(),
        content_type: event.content_type.as_str().into(),
        metadata: event.metadata.clone(),
        payload,
        payload_base64,
        position: event.position.as_ref().map(|p| JsonPosition { epoch: (*p.epoch).into(), offset: p.offset }),
    };
    // A struct of strings and a map of strings always serializes.
    serde_json::to_vec(&json).unwrap_or_default()
}

/// The event of a JSON envelope, on `channel` or else on the channel the envelope names;
/// `None` when `message` is not one (a foreign producer's JSON, say). Cheap for anything
/// else: only a message that names the `eventbus` member is parsed.
fn decode_json(channel: Option<&str>, message: &[u8]) -> Option<Event> {
    let start = message.iter().position(|b| !b.is_ascii_whitespace())?;
    if message[start] != b'{' || !contains(message, b"\"eventbus\"") {
        return None;
    }
    let json: JsonEvent<'_> = serde_json::from_slice(message).ok()?;
    if json.eventbus != JSON_VERSION || json.id.is_empty() {
        return None;
    }
    let payload = match (json.payload, json.payload_base64) {
        (Some(text), None) => Bytes::from(text),
        (None, Some(b64)) => Bytes::from(BASE64.decode(b64).ok()?),
        (None, None) => Bytes::new(),
        (Some(_), Some(_)) => return None,
    };
    let timestamp = prost_types::Timestamp::from_str(&json.timestamp)
        .ok()
        .and_then(|t| SystemTime::try_from(t).ok())
        .unwrap_or_else(SystemTime::now);
    let channel = match channel {
        Some(channel) => channel.to_owned(),
        None => json.channel.into_owned(),
    };
    let mut event = Event::from_parts(
        json.id.into_owned(),
        channel,
        timestamp,
        json.source.into_owned(),
        payload,
        json.metadata,
        json.content_type.into_owned(),
    );
    event.position = json.position.map(|p| Position { epoch: p.epoch.into(), offset: p.offset });
    Some(event)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Magic prefix and version of the envelope.
pub(crate) const MAGIC: [u8; 4] = [0xEB, 0x42, 0x55, 0x01];

/// `source` of events from foreign producers.
pub(crate) const FOREIGN_SOURCE: &str = "redis";

pub(crate) fn encode(event: &Event) -> Vec<u8> {
    let wire = pb::Event {
        id: event.id.to_string(),
        channel: event.channel.clone(),
        timestamp: Some(event.timestamp.into()),
        source: event.source.to_string(),
        payload: event.payload.clone(),
        metadata: event.metadata.clone(),
        content_type: event.content_type.clone(),
        position: event.position.as_ref().map(|p| pb::EventPosition { epoch: p.epoch.to_string(), offset: p.offset }),
    };
    let mut buf = Vec::with_capacity(MAGIC.len() + wire.encoded_len());
    buf.extend_from_slice(&MAGIC);
    // Encoding into a Vec cannot run out of room.
    let _ = wire.encode(&mut buf);
    buf
}

/// An event this broker encoded, on the channel its envelope names; `None` for
/// anything else.
pub(crate) fn decode_own(message: Bytes) -> Option<Event> {
    if !message.starts_with(&MAGIC) {
        return None;
    }
    let wire = pb::Event::decode(message.slice(MAGIC.len()..)).ok()?;
    let channel = wire.channel.clone();
    Some(from_wire(wire, channel))
}

/// The event of a decoded binary envelope, on `channel`.
fn from_wire(wire: pb::Event, channel: String) -> Event {
    let timestamp = wire.timestamp.and_then(|t| SystemTime::try_from(t).ok()).unwrap_or_else(SystemTime::now);
    let mut event =
        Event::from_parts(wire.id, channel, timestamp, wire.source, wire.payload, wire.metadata, wire.content_type);
    event.position = wire.position.map(|p| Position { epoch: p.epoch.into(), offset: p.offset });
    event
}

/// The event of an envelope (binary or JSON) on the channel the envelope names; `None`
/// for anything else (Redis Cluster's shard channels carry several channels, so a
/// message without an envelope cannot be routed).
pub(crate) fn decode_enveloped(message: Bytes) -> Option<Event> {
    if message.starts_with(&MAGIC) {
        return decode_own(message);
    }
    decode_json(None, &message)
}

/// The event a Redis message on `channel` carries.
pub(crate) fn decode(channel: &str, message: Bytes) -> Event {
    if message.starts_with(&MAGIC)
        && let Ok(wire) = pb::Event::decode(message.slice(MAGIC.len()..))
    {
        return from_wire(wire, channel.to_owned());
    }
    if let Some(event) = decode_json(Some(channel), &message) {
        return event;
    }
    let now = SystemTime::now();
    Event::from_parts(
        new_id().to_string(),
        channel.to_owned(),
        now,
        FOREIGN_SOURCE.to_owned(),
        message,
        HashMap::new(),
        String::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_events_round_trip() {
        let event = Event::from_parts(
            new_id().to_string(),
            "orders.created".into(),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_700_000_000_123_456),
            "billing".into(),
            Bytes::from_static(b"{\"id\":1}"),
            [("k".to_owned(), "v".to_owned())].into(),
            "application/json".into(),
        );
        let back = decode("orders.created", Bytes::from(encode(&event)));
        assert_eq!(
            (back.id, back.timestamp, back.source, back.payload, back.metadata, back.content_type),
            (event.id, event.timestamp, event.source, event.payload, event.metadata, event.content_type)
        );
    }

    fn sample(payload: &'static [u8]) -> Event {
        Event::from_parts(
            new_id().to_string(),
            "orders.created".into(),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_700_000_000_123_456),
            "billing".into(),
            Bytes::from_static(payload),
            [("k".to_owned(), "v".to_owned())].into(),
            "application/json".into(),
        )
    }

    #[test]
    fn json_envelopes_round_trip_text_and_binary_payloads() {
        for payload in [&b"{\"id\":1}"[..], &[0xFF, 0x00, 0x80][..], &b""[..]] {
            let event = sample(payload);
            let wire = encode_as(Envelope::Json, &event);
            let back = decode("orders.created", Bytes::from(wire));
            assert_eq!(
                (back.id, back.timestamp, back.source, back.payload, back.metadata, back.content_type),
                (event.id, event.timestamp, event.source, event.payload, event.metadata, event.content_type)
            );
        }
    }

    #[test]
    fn the_json_envelope_is_the_documented_object() {
        let event = sample(b"{\"id\":1}");
        let v: serde_json::Value = serde_json::from_slice(&encode_as(Envelope::Json, &event)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "eventbus": 1,
                "id": &*event.id,
                "channel": "orders.created",
                "timestamp": "2023-11-14T22:13:20.123456Z",
                "source": "billing",
                "content_type": "application/json",
                "metadata": {"k": "v"},
                "payload": "{\"id\":1}",
            })
        );
        let binary = sample(&[0xFF]);
        let v: serde_json::Value = serde_json::from_slice(&encode_as(Envelope::Json, &binary)).unwrap();
        assert_eq!((v.get("payload"), v["payload_base64"].as_str()), (None, Some("/w==")));
    }

    #[test]
    fn foreign_json_stays_a_raw_payload() {
        for raw in [
            &b"{\"id\":1}"[..],
            b"{\"eventbus\": 2, \"id\": \"x\", \"channel\": \"c\", \"timestamp\": \"\"}",
            b"{\"eventbus\":",
        ] {
            let event = decode("orders.created", Bytes::copy_from_slice(raw));
            assert_eq!((event.payload.as_ref(), &*event.source), (raw, FOREIGN_SOURCE));
        }
    }

    #[test]
    fn foreign_messages_are_raw_payloads() {
        let raw = Bytes::from_static(b"{\"id\":1}");
        let event = decode("orders.created", raw.clone());
        assert_eq!(event.payload, raw);
        assert_eq!(&*event.source, FOREIGN_SOURCE);
        assert!(!event.id.is_empty());
        // Magic bytes followed by garbage are still delivered, raw.
        let odd = Bytes::from([&MAGIC[..], &[0xFF, 0xFF, 0xFF]].concat());
        assert_eq!(decode("x", odd.clone()).payload, odd);
    }
}
