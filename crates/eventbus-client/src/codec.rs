//! The streams that carry most messages (`Subscribe`'s events, `PublishStream`'s
//! answers) decoded from one contiguous `Bytes` per message.
//!
//! The generated client decodes through tonic's `DecodeBuf`, a window on the
//! connection's receive buffer: every varint, key and length read advances that
//! `BytesMut` through a bounds check and its offset bookkeeping, about forty times per
//! event. Taking the message out first is free (`BytesMut::split_to`, no copy), and a
//! `Bytes` is the cheapest `Buf` for prost; payloads stay slices of the received
//! buffer, as before. Under callgrind this cut a subscriber's instructions per event
//! (see docs/PERFORMANCE.md).

use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{GrpcMethod, IntoRequest, IntoStreamingRequest, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::options::{AuthChannel, MAX_MESSAGE};

/// Encodes `E` as the generated code does; decodes `D` with [`BytesDecoder`].
pub(crate) struct BytesCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for BytesCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for BytesCodec<E, D>
where
    E: Message + Send + 'static,
    D: Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = <ProstCodec<E, D> as Codec>::Encoder;
    type Decoder = BytesDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<E, D>::default().encoder()
    }

    fn decoder(&mut self) -> BytesDecoder<D> {
        BytesDecoder(PhantomData)
    }
}

/// Decodes a message from its bytes taken out of the receive buffer whole.
pub(crate) struct BytesDecoder<D>(PhantomData<fn() -> D>);

impl<D: Message + Default> Decoder for BytesDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        decode(buf.copy_to_bytes(buf.remaining())).map(Some)
    }
}

/// One message from its bytes; INTERNAL when they are not one, as the generated client
/// answers.
fn decode<D: Message + Default>(message: Bytes) -> Result<D, Status> {
    D::decode(message).map_err(|e| Status::internal(e.to_string()))
}

/// A server-streaming call of `EventBus` with [`BytesCodec`].
pub(crate) async fn server_streaming<E, D>(
    channel: AuthChannel,
    method: Method,
    request: impl IntoRequest<E>,
) -> Result<Streaming<D>, Status>
where
    E: Message + Send + 'static,
    D: Message + Default + Send + 'static,
{
    let mut grpc = ready(channel).await?;
    let mut request = request.into_request();
    request.extensions_mut().insert(GrpcMethod::new(SERVICE, method.name()));
    let codec = BytesCodec::<E, D>::default();
    Ok(grpc.server_streaming(request, method.path(), codec).await?.into_inner())
}

/// A bidirectional call of `EventBus` with [`BytesCodec`].
pub(crate) async fn streaming<E, D>(
    channel: AuthChannel,
    method: Method,
    request: impl IntoStreamingRequest<Message = E>,
) -> Result<Streaming<D>, Status>
where
    E: Message + Send + 'static,
    D: Message + Default + Send + 'static,
{
    let mut grpc = ready(channel).await?;
    let mut request = request.into_streaming_request();
    request.extensions_mut().insert(GrpcMethod::new(SERVICE, method.name()));
    let codec = BytesCodec::<E, D>::default();
    Ok(grpc.streaming(request, method.path(), codec).await?.into_inner())
}

const SERVICE: &str = "eventbus.v1.EventBus";

/// The `EventBus` methods called through here.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Method {
    Subscribe,
    PublishStream,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Subscribe => "Subscribe",
            Self::PublishStream => "PublishStream",
        }
    }

    fn path(self) -> PathAndQuery {
        PathAndQuery::from_static(match self {
            Self::Subscribe => "/eventbus.v1.EventBus/Subscribe",
            Self::PublishStream => "/eventbus.v1.EventBus/PublishStream",
        })
    }
}

/// The generated client's settings: the same decode limit, the channel ready.
async fn ready(channel: AuthChannel) -> Result<tonic::client::Grpc<AuthChannel>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE);
    grpc.ready().await.map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
    Ok(grpc)
}

#[cfg(test)]
mod tests {
    use eventbus_proto::pb;

    use super::*;

    #[test]
    fn decodes_what_prost_decodes_and_shares_the_payload() {
        let message = pb::SubscribeResponse {
            kind: Some(pb::subscribe_response::Kind::Events(pb::EventBatch {
                events: vec![pb::Event {
                    id: "0190".into(),
                    channel: "orders.created".into(),
                    payload: vec![7u8; 300].into(),
                    metadata: [("k".to_owned(), "v".to_owned())].into(),
                    ..Default::default()
                }],
            })),
        };
        let bytes = Bytes::from(message.encode_to_vec());
        let decoded: pb::SubscribeResponse = decode(bytes.clone()).unwrap();
        assert_eq!(decoded, message);
        let Some(pb::subscribe_response::Kind::Events(batch)) = decoded.kind else { panic!("not events") };
        // The payload points into the received bytes: not copied.
        let payload = batch.events[0].payload.as_ptr() as usize;
        let received = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
        assert!(received.contains(&payload));
    }

    #[test]
    fn bytes_that_are_not_a_message_are_internal() {
        let err = decode::<pb::SubscribeResponse>(Bytes::from_static(&[0xff, 0xff])).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
    }
}
