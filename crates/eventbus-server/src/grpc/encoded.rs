//! The subscribe stream's writer: each batch is encoded straight from the shared
//! events into tonic's send buffer.
//!
//! Through the generated code, every delivered event was first converted to a
//! `pb::Event` (its id, channel, source and content type copied into new strings, its
//! metadata map cloned), then encoded by prost (which sizes each nested message again
//! at every level), then freed: per subscriber, per event. Here the wire bytes of a
//! `SubscribeResponse` are written from the `Arc<Event>`s themselves, each event sized
//! once; the bytes are the same as prost's (a test holds them to it), so clients see
//! no difference.
//!
//! The publishing methods, `Publish`, `PublishStream` and `PublishBatch`, are served
//! the same way: requests decoded by hand from one contiguous `Bytes` each
//! ([`super::decode`]; payloads slices of the received buffer), answers written
//! straight from the bus's [`Published`] (no `PublishResponse` with a copy of the event
//! id), and no pass through the generated server's per-call machinery.
//!
//! [`EncodedStreams`] serves both in front of the generated `EventBusServer`; every
//! other method passes through.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut};
use eventbus_core::history::Position;
use eventbus_core::{Event, Published};
use eventbus_proto::pb;

use futures::future::Either;
use prost::Message;
use prost::encoding::{self, WireType};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tower_service::Service;

use super::publish_stream::{Answers, StreamAnswer};
use super::{BatchAnswer, EventBusService, GrpcFrames};
use crate::convert;
use crate::ops::Frame;
use crate::request_limit::PayloadLimit;

// --- encoding ---

/// `SubscribeResponse.events` (field 2 of the `kind` oneof).
const RESPONSE_EVENTS: u32 = 2;
/// `EventBatch.events`.
const BATCH_EVENTS: u32 = 1;

/// An event's size on the wire (without its own key and length) and its timestamp.
struct SizedEvent {
    len: usize,
    timestamp: prost_types::Timestamp,
}

/// The length of a length-delimited field `tag` holding `len` bytes.
fn delimited_len(tag: u32, len: usize) -> usize {
    encoding::key_len(tag) + encoding::encoded_len_varint(len as u64) + len
}

/// `pb::Event`'s fields as the generated code writes them: in field order, empty
/// strings, bytes and maps left out, the timestamp always present.
fn event_len(e: &Event, timestamp: &prost_types::Timestamp) -> usize {
    let string = |tag, s: &str| if s.is_empty() { 0 } else { delimited_len(tag, s.len()) };
    string(1, &e.id)
        + string(2, &e.channel)
        + delimited_len(3, timestamp_len(timestamp))
        + string(4, &e.source)
        + if e.payload.is_empty() { 0 } else { encoding::bytes::encoded_len(5, &e.payload) }
        + metadata_len(&e.metadata)
        + string(7, &e.content_type)
        + e.position.as_ref().map_or(0, |p| delimited_len(8, position_len(p)))
}

/// `EventPosition`'s body.
fn position_len(p: &Position) -> usize {
    let epoch = if p.epoch.is_empty() { 0 } else { delimited_len(1, p.epoch.len()) };
    let offset = if p.offset == 0 { 0 } else { 1 + encoding::encoded_len_varint(p.offset) };
    epoch + offset
}

/// `google.protobuf.Timestamp`'s body.
fn timestamp_len(t: &prost_types::Timestamp) -> usize {
    seconds_nanos_len(t.seconds, t.nanos)
}

/// The body of a `google.protobuf.Timestamp` or `Duration` (both `int64 seconds = 1;
/// int32 nanos = 2;`): zero fields are left out; an `int32` is a sign-extended varint,
/// as prost writes it.
fn seconds_nanos_len(seconds: i64, nanos: i32) -> usize {
    let seconds = if seconds == 0 { 0 } else { 1 + encoding::encoded_len_varint(seconds as u64) };
    let nanos = if nanos == 0 { 0 } else { 1 + encoding::encoded_len_varint(i64::from(nanos) as u64) };
    seconds + nanos
}

/// Keys, lengths and small varints gathered on the stack and written with one
/// `put_slice`: written byte by byte (prost's `encode_varint`), each byte pays the
/// send buffer's capacity check, and they were a third of the encoder's cost.
struct Head {
    bytes: [u8; 48],
    len: usize,
}

impl Head {
    fn new() -> Self {
        Self { bytes: [0; 48], len: 0 }
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes[self.len] = (value as u8 & 0x7f) | 0x80;
            self.len += 1;
            value >>= 7;
        }
        self.bytes[self.len] = value as u8;
        self.len += 1;
    }

    fn key(&mut self, tag: u32, wire_type: WireType) {
        self.varint(u64::from(tag << 3 | wire_type as u32));
    }

    /// A length-delimited field's key and length (its bytes follow).
    fn delimited(&mut self, tag: u32, len: usize) {
        self.key(tag, WireType::LengthDelimited);
        self.varint(len as u64);
    }

    /// `Event.timestamp` (field 3), whole.
    fn timestamp(&mut self, t: &prost_types::Timestamp) {
        self.seconds_nanos(3, t.seconds, t.nanos);
    }

    /// A `Timestamp` or `Duration` field `tag`, whole (see [`seconds_nanos_len`]).
    fn seconds_nanos(&mut self, tag: u32, seconds: i64, nanos: i32) {
        self.delimited(tag, seconds_nanos_len(seconds, nanos));
        self.uint(1, seconds as u64);
        self.uint(2, i64::from(nanos) as u64);
    }

    /// A varint field, left out when zero.
    fn uint(&mut self, tag: u32, value: u64) {
        if value != 0 {
            self.key(tag, WireType::Varint);
            self.varint(value);
        }
    }

    fn flush(&mut self, buf: &mut impl BufMut) {
        buf.put_slice(&self.bytes[..self.len]);
        self.len = 0;
    }
}

fn metadata_len(m: &HashMap<String, String>) -> usize {
    encoding::hash_map::encoded_len(encoding::string::encoded_len, encoding::string::encoded_len, 6, m)
}

/// A string field, left out when empty.
fn put_string(tag: u32, s: &str, head: &mut Head, buf: &mut impl BufMut) {
    if !s.is_empty() {
        head.delimited(tag, s.len());
        head.flush(buf);
        buf.put_slice(s.as_bytes());
    }
}

/// Writes one event, its key and length already in `head`. At most 46 bytes are ever
/// pending in `head` (the batch's key and length, the event's, a whole timestamp).
fn encode_event(e: &Event, timestamp: &prost_types::Timestamp, head: &mut Head, buf: &mut impl BufMut) {
    put_string(1, &e.id, head, buf);
    put_string(2, &e.channel, head, buf);
    head.timestamp(timestamp);
    head.flush(buf);
    put_string(4, &e.source, head, buf);
    if !e.payload.is_empty() {
        head.delimited(5, e.payload.len());
        head.flush(buf);
        buf.put_slice(&e.payload);
    }
    if !e.metadata.is_empty() {
        encoding::hash_map::encode(
            encoding::string::encode,
            encoding::string::encoded_len,
            encoding::string::encode,
            encoding::string::encoded_len,
            6,
            &e.metadata,
            buf,
        );
    }
    put_string(7, &e.content_type, head, buf);
    if let Some(p) = &e.position {
        head.delimited(8, position_len(p));
        put_string(1, &p.epoch, head, buf);
        head.uint(2, p.offset);
        head.flush(buf);
    }
}

/// Sizes a batch into `sizes` (scratch space kept between batches); returns the
/// length of its `EventBatch`.
fn size_batch(events: &[Arc<Event>], sizes: &mut Vec<SizedEvent>) -> usize {
    sizes.clear();
    sizes.extend(events.iter().map(|e| {
        let timestamp = convert::timestamp(e.timestamp);
        SizedEvent { len: event_len(e, &timestamp), timestamp }
    }));
    sizes.iter().map(|s| delimited_len(BATCH_EVENTS, s.len)).sum()
}

/// Writes `SubscribeResponse { events: EventBatch { events } }`, sized by
/// [`size_batch`] into `sizes` as `batch_len`.
fn encode_batch(events: &[Arc<Event>], sizes: &[SizedEvent], batch_len: usize, buf: &mut impl BufMut) {
    let mut head = Head::new();
    head.delimited(RESPONSE_EVENTS, batch_len);
    for (event, size) in events.iter().zip(sizes.iter()) {
        head.delimited(BATCH_EVENTS, size.len);
        encode_event(event, &size.timestamp, &mut head, buf);
    }
    head.flush(buf);
}

/// Encodes [`Frame`]s; one per stream.
#[derive(Default)]
pub(crate) struct FrameEncoder {
    sizes: Vec<SizedEvent>,
}

impl Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            Frame::Started(started) => convert::subscription_started(started)
                .encode(buf)
                .map_err(|e| Status::internal(format!("cannot encode a stream message: {e}"))),
            Frame::Events(events) => {
                let batch_len = size_batch(&events, &mut self.sizes);
                // Room for the whole message at once, not grown field by field.
                buf.reserve(delimited_len(RESPONSE_EVENTS, batch_len));
                encode_batch(&events, &self.sizes, batch_len, buf);
                Ok(())
            }
        }
    }
}

/// `Subscribe`'s codec: the request as prost decodes it, the stream through
/// [`FrameEncoder`].
#[derive(Debug, Default)]
pub(crate) struct SubscribeCodec;

type RequestCodec = tonic_prost::ProstCodec<pb::SubscribeResponse, pb::SubscribeRequest>;

/// Decodes `SubscribeRequest` exactly as the generated server does.
pub(crate) struct RequestDecoder(<RequestCodec as Codec>::Decoder);

impl Decoder for RequestDecoder {
    type Item = pb::SubscribeRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<pb::SubscribeRequest>, Status> {
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

impl Codec for SubscribeCodec {
    type Encode = Frame;
    type Decode = pb::SubscribeRequest;
    type Encoder = FrameEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder::default()
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder(RequestCodec::default().decoder())
    }
}

// --- publish streams ---

/// Writes `PublishResponse` as the generated code would from the same values: in field
/// order, zero values left out, the duration always present.
fn encode_published(p: &Published, buf: &mut impl BufMut) {
    let mut head = Head::new();
    put_string(1, &p.event_id, &mut head, buf);
    head.uint(2, u64::from(p.delivered));
    head.uint(3, u64::from(p.failed));
    head.seconds_nanos(4, p.duration.as_secs() as i64, p.duration.subsec_nanos() as i32);
    head.uint(5, u64::from(p.duplicate));
    head.uint(7, u64::from(p.captured));
    head.flush(buf);
}

/// Writes each answer of a `PublishStream`.
#[derive(Default)]
pub(crate) struct AnswerEncoder;

impl Encoder for AnswerEncoder {
    type Item = StreamAnswer;
    type Error = Status;

    fn encode(&mut self, item: StreamAnswer, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            StreamAnswer::Published(p) => encode_published(&p, buf),
            // Refusals and totals are rare (at most one of totals per chunk): prost.
            other => other.into_pb().encode_raw(buf),
        }
        Ok(())
    }
}

/// The length of [`encode_published`]'s bytes.
fn published_len(p: &Published) -> usize {
    let uint =
        |tag, value: u64| if value == 0 { 0 } else { encoding::key_len(tag) + encoding::encoded_len_varint(value) };
    let id = if p.event_id.is_empty() { 0 } else { delimited_len(1, p.event_id.len()) };
    let duration = seconds_nanos_len(p.duration.as_secs() as i64, p.duration.subsec_nanos() as i32);
    id + uint(2, u64::from(p.delivered))
        + uint(3, u64::from(p.failed))
        + delimited_len(4, duration)
        + uint(5, u64::from(p.duplicate))
        + uint(7, u64::from(p.captured))
}

/// Writes `PublishBatchResponse`: each answer in its slot (`results`, field 1), the
/// published ones straight from [`Published`], the rare refused ones through prost.
fn encode_batch_answers(answers: &[BatchAnswer], buf: &mut impl BufMut) {
    let mut head = Head::new();
    for answer in answers {
        match answer {
            BatchAnswer::Published(p) => {
                head.delimited(1, published_len(p));
                head.flush(buf);
                encode_published(p, buf);
            }
            BatchAnswer::Refused(_) => {
                let refused = answer.clone().into_pb();
                head.delimited(1, refused.encoded_len());
                head.flush(buf);
                refused.encode_raw(buf);
            }
        }
    }
}

/// Writes a `PublishBatch`'s answers.
#[derive(Default)]
pub(crate) struct BatchEncoder;

impl Encoder for BatchEncoder {
    type Item = Vec<BatchAnswer>;
    type Error = Status;

    fn encode(&mut self, answers: Vec<BatchAnswer>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // Room for the whole message at once, not grown answer by answer.
        buf.reserve(answers.len() * 64);
        encode_batch_answers(&answers, buf);
        Ok(())
    }
}

/// Decodes a request from its bytes taken out of the receive buffer whole (no copy):
/// prost reads a `Bytes` faster than tonic's window on its buffer, and payloads stay
/// slices of the received bytes. A message that does not decode gets the status
/// tonic's own decoder gives it, which [`crate::request_limit::refused_request`] turns
/// into `INVALID_ARGUMENT`.
pub(crate) struct BytesDecoder<M>(PhantomData<fn() -> M>);

impl<M> Default for BytesDecoder<M> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<M: DecodeRequest> Decoder for BytesDecoder<M> {
    type Item = M;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<M>, Status> {
        decode_request(buf.copy_to_bytes(buf.remaining())).map(Some)
    }
}

/// A request decoded by hand ([`super::decode`]).
pub(crate) trait DecodeRequest: Sized {
    fn decode(message: bytes::Bytes) -> Result<Self, prost::DecodeError>;
}

impl DecodeRequest for pb::PublishRequest {
    fn decode(message: bytes::Bytes) -> Result<Self, prost::DecodeError> {
        super::decode::publish_request(message)
    }
}

impl DecodeRequest for pb::PublishBatchRequest {
    fn decode(message: bytes::Bytes) -> Result<Self, prost::DecodeError> {
        super::decode::publish_batch(message)
    }
}

/// One request from its bytes, with tonic's status for bytes that are not one.
fn decode_request<M: DecodeRequest>(message: bytes::Bytes) -> Result<M, Status> {
    M::decode(message).map_err(|e| Status::internal(e.to_string()))
}

/// The codec of a method served here: requests through [`BytesDecoder`], answers
/// through `E`.
pub(crate) struct DirectCodec<M, E>(PhantomData<fn(M) -> E>);

impl<M, E> Default for DirectCodec<M, E> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<M, E> Codec for DirectCodec<M, E>
where
    M: DecodeRequest + Send + 'static,
    E: Encoder<Error = Status> + Default + Send + 'static,
    E::Item: Send + 'static,
{
    type Encode = E::Item;
    type Decode = M;
    type Encoder = E;
    type Decoder = BytesDecoder<M>;

    fn encoder(&mut self) -> E {
        E::default()
    }

    fn decoder(&mut self) -> BytesDecoder<M> {
        BytesDecoder::default()
    }
}

/// Writes a unary `Publish`'s answer.
#[derive(Default)]
pub(crate) struct PublishedEncoder;

impl Encoder for PublishedEncoder {
    type Item = Published;
    type Error = Status;

    fn encode(&mut self, published: Published, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_published(&published, buf);
        Ok(())
    }
}

/// `Publish`'s codec.
type PublishCodec = DirectCodec<pb::PublishRequest, PublishedEncoder>;
/// `PublishStream`'s codec.
type PublishStreamCodec = DirectCodec<pb::PublishRequest, AnswerEncoder>;
/// `PublishBatch`'s codec.
type PublishBatchCodec = DirectCodec<pb::PublishBatchRequest, BatchEncoder>;

// --- serving ---

/// The `Subscribe` path.
const SUBSCRIBE_PATH: &str = "/eventbus.v1.EventBus/Subscribe";
/// The `Publish` path.
const PUBLISH_PATH: &str = "/eventbus.v1.EventBus/Publish";
/// The `PublishStream` path.
const PUBLISH_STREAM_PATH: &str = "/eventbus.v1.EventBus/PublishStream";
/// The `PublishBatch` path.
const PUBLISH_BATCH_PATH: &str = "/eventbus.v1.EventBus/PublishBatch";

/// `Subscribe` served with [`SubscribeCodec`], `PublishStream` and `PublishBatch` with
/// [`DirectCodec`]s, in front of the generated server (`inner`), which serves every
/// other method.
#[derive(Debug, Clone)]
pub(crate) struct EncodedStreams<S> {
    inner: S,
    service: EventBusService,
    limit: PayloadLimit,
}

impl<S> EncodedStreams<S> {
    pub(crate) fn new(inner: S, service: EventBusService, limit: PayloadLimit) -> Self {
        Self { inner, service, limit }
    }
}

impl<S: NamedService> NamedService for EncodedStreams<S> {
    const NAME: &'static str = S::NAME;
}

type BoxResponse = Pin<Box<dyn Future<Output = Result<axum::http::Response<Body>, Infallible>> + Send>>;

impl<S> Service<axum::http::Request<Body>> for EncodedStreams<S>
where
    S: Service<axum::http::Request<Body>, Response = axum::http::Response<Body>, Error = Infallible>,
{
    type Response = axum::http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxResponse>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<Body>) -> Self::Future {
        // The same decode limit as the generated server's, no compression (none is
        // configured on it either).
        let limit = Some(self.limit.grpc_message_limit());
        match req.uri().path() {
            SUBSCRIBE_PATH => {
                let handler = Handler(self.service.clone());
                let mut grpc = Grpc::new(SubscribeCodec).apply_max_message_size_config(limit, None);
                Either::Right(Box::pin(async move { Ok(grpc.server_streaming(handler, req).await) }))
            }
            PUBLISH_PATH => {
                let handler = UnaryPublishHandler(self.service.clone());
                let mut grpc = Grpc::new(PublishCodec::default()).apply_max_message_size_config(limit, None);
                Either::Right(Box::pin(async move { Ok(grpc.unary(handler, req).await) }))
            }
            PUBLISH_STREAM_PATH => {
                let handler = PublishHandler(self.service.clone());
                let mut grpc = Grpc::new(PublishStreamCodec::default()).apply_max_message_size_config(limit, None);
                Either::Right(Box::pin(async move { Ok(grpc.streaming(handler, req).await) }))
            }
            PUBLISH_BATCH_PATH => {
                let handler = BatchHandler(self.service.clone());
                let mut grpc = Grpc::new(PublishBatchCodec::default()).apply_max_message_size_config(limit, None);
                Either::Right(Box::pin(async move { Ok(grpc.unary(handler, req).await) }))
            }
            _ => Either::Left(self.inner.call(req)),
        }
    }
}

struct PublishHandler(EventBusService);

impl StreamingService<pb::PublishRequest> for PublishHandler {
    type Response = StreamAnswer;
    type ResponseStream = Answers;
    type Future = std::future::Ready<Result<Response<Answers>, Status>>;

    fn call(&mut self, req: Request<Streaming<pb::PublishRequest>>) -> Self::Future {
        std::future::ready(self.0.answer_publishes(req).map(Response::new))
    }
}

struct UnaryPublishHandler(EventBusService);

impl UnaryService<pb::PublishRequest> for UnaryPublishHandler {
    type Response = Published;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Published>, Status>> + Send>>;

    fn call(&mut self, req: Request<pb::PublishRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.answer_publish(req).await.map(Response::new) })
    }
}

struct BatchHandler(EventBusService);

impl UnaryService<pb::PublishBatchRequest> for BatchHandler {
    type Response = Vec<BatchAnswer>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Vec<BatchAnswer>>, Status>> + Send>>;

    fn call(&mut self, req: Request<pb::PublishBatchRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.answer_batch(req).await.map(Response::new) })
    }
}

struct Handler(EventBusService);

impl ServerStreamingService<pb::SubscribeRequest> for Handler {
    type Response = Frame;
    type ResponseStream = GrpcFrames;
    type Future = Pin<Box<dyn Future<Output = Result<Response<GrpcFrames>, Status>> + Send>>;

    fn call(&mut self, req: Request<pb::SubscribeRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.open_subscription(req).await.map(Response::new) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;

    use super::*;

    fn event(id: &str, payload: &'static [u8], metadata: &[(&str, &str)], at: SystemTime) -> Arc<Event> {
        let metadata = metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Arc::new(Event::from_parts(
            id.to_owned(),
            "orders.created".to_owned(),
            at,
            "127.0.0.1:5000".to_owned(),
            Bytes::from_static(payload),
            metadata,
            "application/json".to_owned(),
        ))
    }

    fn at(mut e: Arc<Event>, epoch: &str, offset: u64) -> Arc<Event> {
        Arc::make_mut(&mut e).position = Some(Position { epoch: epoch.into(), offset });
        e
    }

    fn prost_bytes(events: &[Arc<Event>]) -> Vec<u8> {
        convert::subscribe_response(Frame::Events(events.to_vec())).encode_to_vec()
    }

    fn ours(events: &[Arc<Event>]) -> Vec<u8> {
        let mut sizes = Vec::new();
        let mut buf = Vec::new();
        let batch_len = size_batch(events, &mut sizes);
        encode_batch(events, &sizes, batch_len, &mut buf);
        assert_eq!(buf.len(), delimited_len(RESPONSE_EVENTS, batch_len));
        buf
    }

    #[test]
    fn batches_encode_to_the_bytes_prost_writes() {
        let now = SystemTime::now();
        let big: &'static [u8] = Box::leak(vec![7u8; 70_000].into_boxed_slice());
        let cases: Vec<Vec<Arc<Event>>> = vec![
            vec![],
            vec![event("0190-a", b"{\"n\":1}", &[], now)],
            vec![event("", b"", &[], SystemTime::UNIX_EPOCH)],
            vec![event("old", b"", &[], SystemTime::UNIX_EPOCH - Duration::from_millis(1500))],
            vec![event("s", b"", &[], SystemTime::UNIX_EPOCH + Duration::from_secs(1))],
            vec![event("id", b"x", &[("k", "v")], now + Duration::from_nanos(1))],
            vec![event("id", b"x", &[("", "v"), ("k", ""), ("a", "b")], now)],
            vec![event("a", big, &[("trace", "1")], now), event("b", b"", &[], now), event("c", b"c", &[], now)],
            vec![at(event("p", b"x", &[], now), "18f2a9c0d1e2ab", 1), at(event("q", b"", &[], now), "", u64::MAX)],
            vec![at(event("z", b"x", &[], now), "e", 0)],
        ];
        for events in cases {
            // One metadata entry at most where order matters: a map's order is its own.
            if events.iter().all(|e| e.metadata.len() <= 1) {
                assert_eq!(ours(&events), prost_bytes(&events));
            }
            let decoded = pb::SubscribeResponse::decode(ours(&events).as_slice()).unwrap();
            assert_eq!(decoded, convert::subscribe_response(Frame::Events(events.clone())));
        }
    }

    #[test]
    fn the_encoder_reuses_its_scratch_space() {
        let now = SystemTime::now();
        let mut sizes = Vec::new();
        let events = vec![event("x", b"p", &[], now); 3];
        for batch in [&events[..], &events[..1], &events[..]] {
            let mut buf = Vec::new();
            let batch_len = size_batch(batch, &mut sizes);
            encode_batch(batch, &sizes, batch_len, &mut buf);
            assert_eq!(buf, prost_bytes(batch));
        }
    }

    #[test]
    fn answers_encode_to_the_bytes_prost_writes() {
        let published = |id: &str, delivered, failed, duration, duplicate, captured| Published {
            event_id: id.into(),
            delivered,
            failed,
            duration,
            duplicate,
            captured,
            capture: None,
        };
        let cases = [
            published("", 0, 0, Duration::ZERO, false, 0),
            published("0190a8e4-7b1c-7cc3-8f00-0123456789ab", 1, 0, Duration::from_micros(12), false, 2),
            published("x", 0, 3, Duration::from_secs(2), true, 0),
            published("dup", u32::MAX, u32::MAX, Duration::new(1, 999_999_999), true, u32::MAX),
            published(&"i".repeat(300), 16, 1, Duration::from_secs(u64::from(u32::MAX) * 4), false, 300),
        ];
        for p in &cases {
            let mut buf = Vec::new();
            encode_published(p, &mut buf);
            assert_eq!(buf, convert::publish_response(p.clone()).encode_to_vec(), "{p:?}");
            assert_eq!(published_len(p), buf.len(), "{p:?}");
        }

        // A batch: every slot in order, refused ones with their error.
        let refused = |code: tonic::Code, message: &str| {
            BatchAnswer::Refused(pb::PublishError { code: code as i32, message: message.to_owned() })
        };
        let mut answers: Vec<BatchAnswer> = cases.iter().cloned().map(BatchAnswer::Published).collect();
        answers.insert(1, refused(tonic::Code::PermissionDenied, "no publish right on channel \"a.b\""));
        answers.push(refused(tonic::Code::InvalidArgument, ""));
        for batch in [&answers[..], &answers[..0], &answers[1..2]] {
            let mut buf = Vec::new();
            encode_batch_answers(batch, &mut buf);
            let results = batch.iter().cloned().map(BatchAnswer::into_pb).collect();
            assert_eq!(buf, pb::PublishBatchResponse { results }.encode_to_vec());
        }
    }

    #[test]
    fn requests_decode_as_prost_decodes_them_and_share_the_payload() {
        let req = pb::PublishRequest {
            channel: "orders.created".into(),
            payload: Bytes::from_static(b"{\"id\":1}"),
            metadata: [("k".to_owned(), "v".to_owned())].into(),
            ordering_key: "o-1".into(),
            ..Default::default()
        };
        let wire = Bytes::from(req.encode_to_vec());
        let decoded: pb::PublishRequest = decode_request(wire.clone()).unwrap();
        assert_eq!(decoded, req);
        let inside = wire.as_ptr_range();
        assert!(inside.contains(&decoded.payload.as_ptr()), "the payload is a slice of the message");

        // Cut short, and a channel that is not UTF-8: both refused as tonic's decoder
        // refuses them, which the edge answers INVALID_ARGUMENT.
        for malformed in [&[0x0a, 0x05, b'a'][..], &[0x0a, 0x02, 0xff, 0xfe][..]] {
            let status = decode_request::<pb::PublishRequest>(Bytes::copy_from_slice(malformed)).unwrap_err();
            let refused = crate::request_limit::refused_request(status);
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        }
    }
}
