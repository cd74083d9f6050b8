//! Requests tonic refuses before a handler runs, given the status docs/errors.md promises
//! (docs/errors.md):
//!
//! - publish requests too large to read (docs/concepts.md): every oversized
//!   payload is refused with `RESOURCE_EXHAUSTED` / 413 naming `max_payload_bytes`,
//!   whatever its size;
//! - requests that do not decode (not protobuf, a string field that is not UTF-8, a
//!   message cut short): `INVALID_ARGUMENT`, where tonic says `INTERNAL` (which gRPC
//!   reserves for the server's own failures, and which clients treat as a server bug);
//! - any other request over the decode limit: `RESOURCE_EXHAUSTED` (as grpc-go and
//!   grpc-java answer it), where tonic says `OUT_OF_RANGE`.
//!
//! A payload a little over the limit reaches the bus, which refuses it. A request far
//! over it must not be buffered at all, so gRPC keeps a decode limit and REST a body
//! limit; what those limits answer on their own (tonic's `OUT_OF_RANGE` "decoded message
//! length too large", axum's plain-text 413) is translated here into our refusal.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower_service::Service;

use crate::ops::Refusal;

/// Room above `max_payload_bytes` for the rest of a publish request: metadata is up to
/// 64 × (128 + 4 KiB), plus the channel, keys and framing.
const REQUEST_OVERHEAD: usize = 1 << 20;

/// The request limits that follow from `max_payload_bytes`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadLimit {
    max_payload_bytes: usize,
}

impl PayloadLimit {
    pub(crate) fn new(max_payload_bytes: usize) -> Self {
        Self { max_payload_bytes }
    }

    /// Largest gRPC message decoded (`max_decoding_message_size`): what a client can
    /// make us buffer per message.
    pub(crate) fn grpc_message_limit(self) -> usize {
        self.max_payload_bytes.saturating_add(REQUEST_OVERHEAD)
    }

    /// Largest REST body read. The payload is stored as compact JSON; the body may spell
    /// it longer (indentation, `\u` escapes), hence twice the payload limit.
    pub(crate) fn http_body_limit(self) -> usize {
        self.max_payload_bytes.saturating_mul(2).saturating_add(REQUEST_OVERHEAD)
    }

    /// The refusal of a request over `request_limit` bytes.
    pub(crate) fn exceeded(self, request_limit: usize) -> Refusal {
        Refusal::RequestTooLarge { request_limit, max_payload_bytes: self.max_payload_bytes }
    }

    /// For a publish: our refusal in place of tonic's decode-limit status; otherwise
    /// as [`refused_request`].
    pub(crate) fn translate(self, status: Status) -> Status {
        if is_decode_limit(&status) { self.exceeded(self.grpc_message_limit()).into() } else { refused_request(status) }
    }
}

/// Our status in place of tonic's for a request message it could not take:
/// `INVALID_ARGUMENT` for one that does not decode, `RESOURCE_EXHAUSTED` for one over the
/// decode limit; any other status unchanged.
pub(crate) fn refused_request(status: Status) -> Status {
    if is_malformed(&status) {
        Status::invalid_argument(format!("malformed request: {}", status.message()))
    } else if is_decode_limit(&status) {
        Status::resource_exhausted(format!("request too large to read: {}", status.message()))
    } else {
        status
    }
}

/// Whether tonic could not decode a request message: prost's error (not protobuf, a
/// string that is not UTF-8, a field of the wrong type), or a body that ends inside a
/// message. (A compressed-flag without `grpc-encoding` stays `INTERNAL`, as the gRPC
/// specification requires.)
fn is_malformed(status: &Status) -> bool {
    status.code() == Code::Internal
        && (status.message().starts_with("failed to decode Protobuf message")
            || status.message() == "Unexpected EOF decoding stream.")
}

/// Whether tonic refused a message over `max_decoding_message_size`. The services never
/// answer `OUT_OF_RANGE` themselves; the message check guards against tonic using the
/// code for something else one day.
fn is_decode_limit(status: &Status) -> bool {
    status.code() == Code::OutOfRange && status.message().contains("message length too large")
}

/// Wraps a gRPC service so that the requests tonic refuses itself get our status
/// ([`refused_request`]), and (with a payload limit, the `EventBus` server) a unary
/// `Publish` or `PublishBatch` over the decode limit our refusal naming `max_payload_bytes`. tonic
/// answers such a request before the handler runs, with a trailers-only response; this
/// rewrites that response. (Streaming requests' statuses reach the handlers, which
/// translate them: [`PayloadLimit::translate`], [`refused_request`].)
#[derive(Debug, Clone)]
pub(crate) struct RequestErrors<S> {
    inner: S,
    limit: Option<PayloadLimit>,
}

impl<S> RequestErrors<S> {
    pub(crate) fn new(inner: S, limit: Option<PayloadLimit>) -> Self {
        Self { inner, limit }
    }
}

impl<S: NamedService> NamedService for RequestErrors<S> {
    const NAME: &'static str = S::NAME;
}

/// Whether `path` is `/{service}/Publish` or `/{service}/PublishBatch`, the unary
/// publishes.
fn is_unary_publish<S: NamedService>(path: &str) -> bool {
    matches!(path.strip_prefix('/').and_then(|p| p.strip_prefix(S::NAME)), Some("/Publish" | "/PublishBatch"))
}

impl<S> Service<Request<Body>> for RequestErrors<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + NamedService,
    S::Future: Unpin,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = RequestErrorsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let limit = self.limit.filter(|_| is_unary_publish::<S>(req.uri().path()));
        RequestErrorsFuture { inner: self.inner.call(req), limit }
    }
}

/// The inner service's response, rewritten when it is tonic's own refusal.
#[derive(Debug)]
pub(crate) struct RequestErrorsFuture<F> {
    inner: F,
    /// Set for a unary `Publish` or `PublishBatch`: the only calls rewritten.
    limit: Option<PayloadLimit>,
}

impl<F, E> Future for RequestErrorsFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>> + Unpin,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = match Pin::new(&mut this.inner).poll(cx) {
            Poll::Ready(Ok(response)) => response,
            other => return other,
        };
        // A trailers-only response carries its status in the headers; a normal one
        // (status in the trailers) has none there and passes untouched.
        match Status::from_header_map(response.headers()) {
            Some(status) if is_malformed(&status) || is_decode_limit(&status) => {
                let ours = match this.limit {
                    Some(limit) => limit.translate(status),
                    None => refused_request(status),
                };
                Poll::Ready(Ok(ours.into_http()))
            }
            _ => Poll::Ready(Ok(response)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;
    impl NamedService for Named {
        const NAME: &'static str = "eventbus.v1.EventBus";
    }

    #[test]
    fn only_the_unary_publish_is_rewritten() {
        assert!(is_unary_publish::<Named>("/eventbus.v1.EventBus/Publish"));
        assert!(is_unary_publish::<Named>("/eventbus.v1.EventBus/PublishBatch"));
        assert!(!is_unary_publish::<Named>("/eventbus.v1.EventBus/PublishStream"));
        assert!(!is_unary_publish::<Named>("/eventbus.v1.EventBus/Subscribe"));
        assert!(!is_unary_publish::<Named>("/eventbus.v1.Admin/Publish"));
    }

    #[test]
    fn the_decode_limit_status_becomes_ours_naming_the_limit() {
        let limit = PayloadLimit::new(1024);
        let tonic_says = Status::out_of_range(format!(
            "Error, decoded message length too large: found 9999999 bytes, the limit is: {} bytes",
            limit.grpc_message_limit()
        ));
        let ours = limit.translate(tonic_says);
        assert_eq!(ours.code(), Code::ResourceExhausted);
        assert!(ours.message().contains("max_payload_bytes = 1024"), "{}", ours.message());
        let other = limit.translate(Status::invalid_argument("bad channel"));
        assert_eq!((other.code(), other.message()), (Code::InvalidArgument, "bad channel"));
    }

    #[test]
    fn undecodable_requests_are_invalid_argument_and_other_internal_errors_stay() {
        let prost = Status::internal("failed to decode Protobuf message: invalid varint");
        assert_eq!(refused_request(prost).code(), Code::InvalidArgument);
        let cut = Status::internal("Unexpected EOF decoding stream.");
        assert_eq!(refused_request(cut).code(), Code::InvalidArgument);
        let ours = Status::internal("the durable store failed");
        assert_eq!(refused_request(ours).code(), Code::Internal);
        let big = Status::out_of_range("Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes");
        assert_eq!(refused_request(big).code(), Code::ResourceExhausted);
        let flag = Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        );
        assert_eq!(PayloadLimit::new(1).translate(flag).code(), Code::Internal);
    }
}
