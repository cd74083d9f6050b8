//! Publish requests decoded by hand from the received bytes: the counterpart of the
//! answers `delivery` writes by hand.
//!
//! prost's generated `merge` goes through its generic field adapters: each string is
//! cleared, reserved and extended through a `Vec<u8>` adapter, then checked; each
//! payload is copied out of a `Buf` window. Here the message is one contiguous `Bytes`
//! (what tonic hands over); fields are read off the slice, each string is checked and
//! allocated once at its exact size, and the payload is a slice of the message (no
//! copy). The result is the same `pb::PublishRequest` prost decodes, refusals included:
//! malformed bytes, a wire type that does not match its field, text that is not UTF-8
//! (tests hold it to prost on valid, odd and broken input). The rare `metadata` map is
//! handed to prost's own map decoder, and bytes this reader finds malformed are handed
//! to prost whole, whose error is the answer.

use bytes::Bytes;
use eventbus_proto::pb;
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// Bytes this reader could not decode; prost says why.
struct Malformed;

impl From<DecodeError> for Malformed {
    fn from(_: DecodeError) -> Self {
        Self
    }
}

/// A request decoded from `message`, as prost would decode it.
pub(crate) fn publish_request(message: Bytes) -> Result<pb::PublishRequest, DecodeError> {
    match read_request(&message) {
        Ok(req) => Ok(req),
        Err(Malformed) => pb::PublishRequest::decode(message),
    }
}

fn read_request(message: &Bytes) -> Result<pb::PublishRequest, Malformed> {
    let mut req = pb::PublishRequest::default();
    let mut reader = Reader { message, at: 0, length_start: 0 };
    while reader.at < message.len() {
        let (tag, wire_type) = reader.key()?;
        match tag {
            1 => reader.string(wire_type, &mut req.channel)?,
            2 => {
                let (start, end) = reader.delimited(wire_type)?;
                req.payload = message.slice(start..end);
            }
            3 => {
                let (_, end) = reader.delimited(wire_type)?;
                // prost's map entry decoder, on the entry's bytes with their length.
                let mut entry = &message[reader.length_start..end];
                encoding::hash_map::merge(
                    encoding::string::merge,
                    encoding::string::merge,
                    &mut req.metadata,
                    &mut entry,
                    DecodeContext::default(),
                )?;
            }
            4 => reader.string(wire_type, &mut req.content_type)?,
            5 => reader.string(wire_type, &mut req.source)?,
            6 => reader.string(wire_type, &mut req.ordering_key)?,
            7 => reader.string(wire_type, &mut req.idempotency_key)?,
            8 => {
                expect(wire_type, WireType::Varint)?;
                // An int32 on the wire is a varint of its 64-bit sign extension.
                req.ack = reader.varint()? as i32;
            }
            _ => reader.skip(tag, wire_type)?,
        }
    }
    Ok(req)
}

/// A `PublishBatchRequest`, each of its events read as [`publish_request`] reads one.
pub(crate) fn publish_batch(message: Bytes) -> Result<pb::PublishBatchRequest, DecodeError> {
    match read_batch(&message) {
        Ok(batch) => Ok(batch),
        Err(Malformed) => pb::PublishBatchRequest::decode(message),
    }
}

fn read_batch(message: &Bytes) -> Result<pb::PublishBatchRequest, Malformed> {
    let mut events = Vec::new();
    let mut reader = Reader { message, at: 0, length_start: 0 };
    while reader.at < message.len() {
        let (tag, wire_type) = reader.key()?;
        match tag {
            1 => {
                let (start, end) = reader.delimited(wire_type)?;
                events.push(read_request(&message.slice(start..end))?);
            }
            _ => reader.skip(tag, wire_type)?,
        }
    }
    Ok(pb::PublishBatchRequest { events })
}

fn expect(actual: WireType, expected: WireType) -> Result<(), Malformed> {
    if actual == expected { Ok(()) } else { Err(Malformed) }
}

/// A cursor over a message's bytes.
struct Reader<'a> {
    message: &'a [u8],
    at: usize,
    /// Where the last length-delimited field's length began.
    length_start: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &[u8] {
        &self.message[self.at..]
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut rest = self.rest();
        let before = rest.len();
        let value = encoding::decode_varint(&mut rest)?;
        self.at += before - rest.len();
        Ok(value)
    }

    fn key(&mut self) -> Result<(u32, WireType), Malformed> {
        let mut rest = self.rest();
        let before = rest.len();
        let key = encoding::decode_key(&mut rest)?;
        self.at += before - rest.len();
        Ok(key)
    }

    /// The bounds of a length-delimited field's value, the cursor moved past it.
    fn delimited(&mut self, wire_type: WireType) -> Result<(usize, usize), Malformed> {
        expect(wire_type, WireType::LengthDelimited)?;
        self.length_start = self.at;
        let len = self.varint()?;
        let start = self.at;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|end| *end <= self.message.len())
            .ok_or(Malformed)?;
        self.at = end;
        Ok((start, end))
    }

    /// A string field, replacing `value` (proto3: the last one wins).
    fn string(&mut self, wire_type: WireType, value: &mut String) -> Result<(), Malformed> {
        let (start, end) = self.delimited(wire_type)?;
        let text = std::str::from_utf8(&self.message[start..end]).map_err(|_| Malformed)?;
        // An exact allocation (a cleared `String` grows through `reserve`).
        *value = text.to_owned();
        Ok(())
    }

    fn skip(&mut self, tag: u32, wire_type: WireType) -> Result<(), Malformed> {
        let mut rest = self.rest();
        let before = rest.len();
        encoding::skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
        self.at += before - rest.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn both(bytes: &[u8]) -> (Result<pb::PublishRequest, DecodeError>, Result<pb::PublishRequest, DecodeError>) {
        (publish_request(Bytes::copy_from_slice(bytes)), pb::PublishRequest::decode(bytes))
    }

    fn same_as_prost(bytes: &[u8]) {
        match both(bytes) {
            (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs, "{bytes:?}"),
            (Err(_), Err(_)) => {}
            (ours, theirs) => panic!("{bytes:?}: ours {ours:?}, prost {theirs:?}"),
        }
    }

    #[test]
    fn requests_decode_as_prost_decodes_them() {
        let full = pb::PublishRequest {
            channel: "orders.created".into(),
            payload: Bytes::from_static(b"{\"id\":1}"),
            metadata: [("k".to_owned(), "v".to_owned()), ("trace".to_owned(), String::new())].into(),
            content_type: "application/json".into(),
            source: "billing".into(),
            ordering_key: "o-1".into(),
            idempotency_key: "i-1".into(),
            ack: pb::AckMode::EachInPlace as i32,
        };
        for req in [full, pb::PublishRequest::default(), pb::PublishRequest { ack: -1, ..Default::default() }] {
            let wire = req.encode_to_vec();
            assert_eq!(publish_request(Bytes::from(wire.clone())).unwrap(), req);
            same_as_prost(&wire);
        }
        let mut fields = Vec::new();
        // A repeated field: the last value wins; an unknown field is skipped.
        pb::PublishRequest { channel: "a".into(), ..Default::default() }.encode(&mut fields).unwrap();
        fields.extend_from_slice(&[0x48, 0x01, 0x52, 0x01, b'x']); // fields 9 (varint) and 10 (bytes)
        pb::PublishRequest { channel: "b".into(), ..Default::default() }.encode(&mut fields).unwrap();
        assert_eq!(publish_request(Bytes::from(fields.clone())).unwrap().channel, "b");
        same_as_prost(&fields);
    }

    #[test]
    fn the_payload_is_a_slice_of_the_message() {
        let req = pb::PublishRequest { payload: Bytes::from_static(b"0123456789"), ..Default::default() };
        let wire = Bytes::from(req.encode_to_vec());
        let decoded = publish_request(wire.clone()).unwrap();
        assert!(wire.as_ptr_range().contains(&decoded.payload.as_ptr()));
    }

    #[test]
    fn broken_requests_are_refused_as_prost_refuses_them() {
        for bytes in [
            &[0x0a, 0x05, b'a'][..],                                                 // cut short
            &[0x0a, 0x02, 0xff, 0xfe][..],                                           // not UTF-8
            &[0x08, 0x01][..],                                                       // channel as a varint
            &[0x40][..],                                                             // ack without its value
            &[0x42, 0x00][..],                                                       // ack length-delimited
            &[0x1a, 0x03, 0x0a, 0x01][..],                                           // a map entry cut short
            &[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..], // length past u64
            &[0x00][..],                                                             // field 0
        ] {
            assert!(publish_request(Bytes::copy_from_slice(bytes)).is_err(), "{bytes:?}");
            same_as_prost(bytes);
        }
    }

    #[test]
    fn batches_decode_as_prost_decodes_them() {
        let batch = pb::PublishBatchRequest {
            events: vec![
                pb::PublishRequest { channel: "a".into(), payload: Bytes::from_static(b"1"), ..Default::default() },
                pb::PublishRequest::default(),
                pb::PublishRequest { channel: "b".into(), ordering_key: "k".into(), ..Default::default() },
            ],
        };
        let wire = batch.encode_to_vec();
        assert_eq!(publish_batch(Bytes::from(wire)).unwrap(), batch);
        assert!(publish_batch(Bytes::from_static(&[0x0a, 0x03, 0x0a, 0x05, b'a'])).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_as_with_prost(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            same_as_prost(&bytes);
        }

        #[test]
        fn any_request_round_trips(
            channel in "[a-z.]{0,20}",
            payload in proptest::collection::vec(any::<u8>(), 0..40),
            meta in proptest::collection::hash_map("[a-z]{0,4}", "\\PC{0,6}", 0..4),
            ordering_key in "\\PC{0,8}",
            ack in any::<i32>(),
        ) {
            let req = pb::PublishRequest {
                channel,
                payload: payload.into(),
                metadata: meta,
                ordering_key,
                ack,
                ..Default::default()
            };
            let wire = req.encode_to_vec();
            prop_assert_eq!(publish_request(Bytes::from(wire)).unwrap(), req);
        }
    }
}
