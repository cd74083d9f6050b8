//! Compact binary records: captured events (payloads are bytes; JSON would bloat them)
//! and outbox dead letters.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use eventbus_core::Event;

use crate::store::{DeadLetterRecord, StoreError};

/// Compact binary form of a captured event (payloads are bytes; JSON would bloat them).
pub(crate) fn encode_event(event: &Event, ordering_key: Option<&str>, refs: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(event.approx_size() + 32);
    out.extend_from_slice(&refs.to_le_bytes());
    let micros = event.timestamp.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    out.extend_from_slice(&micros.to_le_bytes());
    for s in [&*event.id, event.channel.as_str(), &*event.source, event.content_type.as_str()] {
        put(&mut out, s.as_bytes());
    }
    match ordering_key {
        Some(k) => {
            out.push(1);
            put(&mut out, k.as_bytes());
        }
        None => out.push(0),
    }
    out.extend_from_slice(&(event.metadata.len() as u32).to_le_bytes());
    for (k, v) in &event.metadata {
        put(&mut out, k.as_bytes());
        put(&mut out, v.as_bytes());
    }
    put(&mut out, &event.payload);
    out
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(StoreError::corrupt("truncated record"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| StoreError::corrupt("non-UTF-8 text in a record"))
    }
}

/// Decodes [`encode_event`]: (event, ordering key, remaining references).
pub(crate) fn decode_event(bytes: &[u8]) -> Result<(Event, Option<String>, u32), StoreError> {
    let mut r = Reader(bytes);
    let refs = r.u32()?;
    let micros = r.u64()?;
    let (id, channel, source, content_type) = (r.string()?, r.string()?, r.string()?, r.string()?);
    let ordering_key = match r.take(1)?[0] {
        0 => None,
        _ => Some(r.string()?),
    };
    let n = r.u32()? as usize;
    let mut metadata = HashMap::with_capacity(n.min(64));
    for _ in 0..n {
        metadata.insert(r.string()?, r.string()?);
    }
    let payload = Bytes::copy_from_slice(r.bytes()?);
    let timestamp = UNIX_EPOCH + Duration::from_micros(micros);
    Ok((Event::from_parts(id, channel, timestamp, source, payload, metadata, content_type), ordering_key, refs))
}

/// Sets the remaining-references count of an encoded event in place.
#[cfg(any(test, feature = "migrate-redb"))]
pub(crate) fn set_refs(bytes: &mut [u8], refs: u32) {
    bytes[..4].copy_from_slice(&refs.to_le_bytes());
}

/// Binary form of an outbox dead letter.
pub(crate) fn encode_dead_letter(record: &DeadLetterRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(record.payload.len() + 128);
    for s in [&record.channel, &record.content_type, &record.consumer, &record.event_id] {
        put(&mut out, s.as_bytes());
    }
    put(&mut out, &record.payload);
    out
}

/// Decodes [`encode_dead_letter`].
pub(crate) fn decode_dead_letter(bytes: &[u8]) -> Result<DeadLetterRecord, StoreError> {
    let mut r = Reader(bytes);
    let (channel, content_type, consumer, event_id) = (r.string()?, r.string()?, r.string()?, r.string()?);
    let payload = Bytes::copy_from_slice(r.bytes()?);
    Ok(DeadLetterRecord { channel, payload, content_type, consumer, event_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_codec_round_trips() {
        let event = Event::from_parts(
            "id-1".into(),
            "orders.created".into(),
            UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_001),
            "src".into(),
            Bytes::from_static(b"\x00\xffpayload"),
            [("k".to_owned(), "v".to_owned())].into(),
            "application/json".into(),
        );
        let mut bytes = encode_event(&event, Some("order-7"), 3);
        set_refs(&mut bytes, 2);
        let (back, key, refs) = decode_event(&bytes).unwrap();
        assert_eq!((key.as_deref(), refs), (Some("order-7"), 2));
        assert_eq!((back.id, back.channel, back.timestamp), (event.id, event.channel, event.timestamp));
        assert_eq!(
            (back.payload, back.metadata, back.content_type),
            (event.payload, event.metadata, event.content_type)
        );
        assert!(decode_event(&bytes[..bytes.len() - 1]).is_err(), "truncation is detected");
    }

    #[test]
    fn dead_letter_codec_round_trips() {
        let record = DeadLetterRecord {
            channel: "dlq.a".into(),
            payload: Bytes::from_static(b"\x00dl"),
            content_type: "application/x-protobuf".into(),
            consumer: "c".into(),
            event_id: "e".into(),
        };
        let bytes = encode_dead_letter(&record);
        assert_eq!(decode_dead_letter(&bytes).unwrap(), record);
        assert!(decode_dead_letter(&bytes[..bytes.len() - 1]).is_err());
    }
}
