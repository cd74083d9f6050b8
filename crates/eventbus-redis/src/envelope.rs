//! What goes over Redis.
//!
//! The broker's own events are a versioned envelope: four magic bytes (`EB 42 55 01`:
//! not valid UTF-8, so no text payload can start with them) then the protobuf
//! `eventbus.v1.Event`. Anything else on a prefixed channel comes from a foreign
//! producer (`redis-cli PUBLISH socle:eventbus:orders.created '{"id":1}'`) and becomes
//! an event with that raw payload, a fresh id and the current time.

use std::collections::HashMap;
use std::time::SystemTime;

use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::event::new_id;
use eventbus_proto::pb;
use prost::Message;

/// Magic prefix and version of the envelope.
pub(crate) const MAGIC: [u8; 4] = [0xEB, 0x42, 0x55, 0x01];

/// `source` of events from foreign producers.
pub(crate) const FOREIGN_SOURCE: &str = "redis";

pub(crate) fn encode(event: &Event) -> Vec<u8> {
    let wire = pb::Event {
        id: event.id.clone(),
        channel: event.channel.clone(),
        timestamp: Some(event.timestamp.into()),
        source: event.source.clone(),
        payload: event.payload.clone(),
        metadata: event.metadata.clone(),
        content_type: event.content_type.clone(),
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
    let timestamp = wire.timestamp.and_then(|t| SystemTime::try_from(t).ok()).unwrap_or_else(SystemTime::now);
    Some(Event::from_parts(
        wire.id,
        wire.channel,
        timestamp,
        wire.source,
        wire.payload,
        wire.metadata,
        wire.content_type,
    ))
}

/// The event a Redis message on `channel` carries.
pub(crate) fn decode(channel: &str, message: Bytes) -> Event {
    if message.starts_with(&MAGIC)
        && let Ok(wire) = pb::Event::decode(message.slice(MAGIC.len()..))
    {
        let timestamp = wire.timestamp.and_then(|t| SystemTime::try_from(t).ok()).unwrap_or_else(SystemTime::now);
        return Event::from_parts(
            wire.id,
            channel.to_owned(),
            timestamp,
            wire.source,
            wire.payload,
            wire.metadata,
            wire.content_type,
        );
    }
    let now = SystemTime::now();
    Event::from_parts(
        new_id(),
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
            new_id(),
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

    #[test]
    fn foreign_messages_are_raw_payloads() {
        let raw = Bytes::from_static(b"{\"id\":1}");
        let event = decode("orders.created", raw.clone());
        assert_eq!(event.payload, raw);
        assert_eq!(event.source, FOREIGN_SOURCE);
        assert!(!event.id.is_empty());
        // Magic bytes followed by garbage are still delivered, raw.
        let odd = Bytes::from([&MAGIC[..], &[0xFF, 0xFF, 0xFF]].concat());
        assert_eq!(decode("x", odd.clone()).payload, odd);
    }
}
