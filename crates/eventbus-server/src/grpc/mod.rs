//! The gRPC services, `eventbus.v1.EventBus` and `eventbus.v1.Admin`: each method
//! decodes its request, calls the operation (`ops`) and encodes the answer. Every call
//! passes [`Authenticate`] first.
//!
//! - `encoded`: `Subscribe` and the publishing methods served without the generated
//!   code's per-call conversions (answers and batches encoded straight from the bus's
//!   types), in front of the generated server.
//! - `decode`: publish requests decoded by hand, payloads borrowed from the buffer.
//! - `publish_stream`: `PublishStream`'s requests read ahead and answered in the
//!   publisher's ack mode.
//! - `consume`: `Consume`, a durable consumer's client.
//! - `admin`: the `Admin` service.

mod admin;
mod consume;
pub(crate) mod decode;
mod encoded;
mod publish_stream;

use std::pin::Pin;
use std::sync::Arc;

use eventbus_core::Published;
use eventbus_proto::pb;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub(crate) use admin::AdminService;
pub(crate) use encoded::EncodedStreams;

use crate::access::Caller;
use crate::convert::trace::TraceContext;
use crate::convert::{self, status};
use crate::listener::PeerInfo;
use crate::ops::{Frame, Frames, Ops, Refusal};
use crate::request_limit::PayloadLimit;
use publish_stream::StreamAnswer;

pub(crate) type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A subscription's frames as the gRPC stream carries them.
pub(crate) type GrpcFrames = RpcStream<Frame>;

/// The answer to one event of a `PublishBatch`, before encoding.
#[derive(Debug, Clone)]
pub(crate) enum BatchAnswer {
    Published(Published),
    /// The status the event would have got alone.
    Refused(pb::PublishError),
}

impl BatchAnswer {
    fn of(answer: Result<Published, Refusal>) -> Self {
        match answer {
            Ok(published) => Self::Published(published),
            Err(refused) => Self::Refused(publish_error(&status(refused))),
        }
    }

    /// The generated message with the same bytes.
    pub(crate) fn into_pb(self) -> pb::PublishResponse {
        match self {
            Self::Published(p) => convert::publish_response(p),
            Self::Refused(error) => pb::PublishResponse { error: Some(error), ..Default::default() },
        }
    }
}

/// A refused publish's answer: what the call's status would have been.
pub(crate) fn publish_error(status: &Status) -> pb::PublishError {
    pb::PublishError { code: status.code() as i32, message: status.message().to_owned() }
}

/// Where a request came from, for `Event.source` and `SubscriptionInfo.peer`.
fn peer<T>(req: &Request<T>) -> String {
    req.extensions().get::<PeerInfo>().map(|p| p.addr_text().to_owned()).unwrap_or_default()
}

/// [`peer`], shared with the connection's other calls (no copy).
fn shared_peer<T>(req: &Request<T>) -> Arc<str> {
    req.extensions().get::<PeerInfo>().map_or_else(|| Arc::from(""), |p| Arc::clone(&p.addr_text))
}

/// Who sent the request, as [`Authenticate`] found.
fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions().get::<Caller>().cloned().ok_or_else(|| Status::unauthenticated("no credentials were checked"))
}

/// Authenticates every call of the services it wraps, once, before the method runs;
/// the [`Caller`] rides in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Authenticate(pub(crate) crate::access::Access);

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let mut values = req.metadata().get_all("authorization").iter();
        let authorization = values.next().map(|v| v.as_bytes());
        let repeated = values.next().is_some();
        let caller = self.0.authenticate(authorization, repeated, req.extensions().get::<PeerInfo>())?;
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// Implements `eventbus.v1.EventBus`.
#[derive(Debug, Clone)]
pub(crate) struct EventBusService {
    ops: Ops,
    /// Turns the decode-limit status of an oversized `PublishStream` request into ours.
    limit: PayloadLimit,
}

impl EventBusService {
    pub(crate) fn new(ops: Ops, limit: PayloadLimit) -> Self {
        Self { ops, limit }
    }

    /// `Publish`.
    async fn answer_publish(&self, req: Request<pb::PublishRequest>) -> Result<Published, Status> {
        let peer = shared_peer(&req);
        let caller = caller(&req)?;
        let trace = TraceContext::from_grpc(req.metadata());
        let mut input = convert::publish_input(req.into_inner(), peer, caller.name());
        if let Some(trace) = &trace {
            trace.keep_in(&mut input.metadata);
        }
        Ok(self.ops.publish(&caller, input).await?)
    }

    /// `PublishBatch`: every event answered in its slot.
    async fn answer_batch(&self, req: Request<pb::PublishBatchRequest>) -> Result<Vec<BatchAnswer>, Status> {
        let peer = shared_peer(&req);
        let caller = caller(&req)?;
        let trace = TraceContext::from_grpc(req.metadata());
        let inputs = req
            .into_inner()
            .events
            .into_iter()
            .map(|e| {
                let mut input = convert::publish_input(e, peer.clone(), caller.name());
                if let Some(trace) = &trace {
                    trace.keep_in(&mut input.metadata);
                }
                input
            })
            .collect();
        let answers = self.ops.publish_batch(&caller, inputs).await?;
        Ok(answers.into_iter().map(BatchAnswer::of).collect())
    }

    /// `Subscribe`: `started`, then the batches.
    async fn open_subscription(&self, req: Request<pb::SubscribeRequest>) -> Result<GrpcFrames, Status> {
        let peer = peer(&req);
        let caller = caller(&req)?;
        let (options, since) = convert::subscribe_options(req.into_inner(), peer)?;
        let frames: Frames = self.ops.subscribe(&caller, options, since).await?;
        Ok(Box::pin(frames.map(|frame| frame.map_err(Status::from))))
    }
}

#[tonic::async_trait]
impl pb::event_bus_server::EventBus for EventBusService {
    /// Served by [`EncodedStreams`], which writes the answer without this conversion to
    /// the generated type; this form is for direct callers.
    async fn publish(&self, req: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        self.answer_publish(req).await.map(|published| Response::new(convert::publish_response(published)))
    }

    type PublishStreamStream = RpcStream<pb::PublishResponse>;

    /// Served by [`EncodedStreams`], which writes the answers without this conversion
    /// to the generated type; this form is for direct callers.
    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let answers = self.answer_publishes(req)?;
        Ok(Response::new(Box::pin(answers.map(|answer| answer.map(StreamAnswer::into_pb)))))
    }

    /// Served by [`EncodedStreams`], which writes the answers without this conversion
    /// to the generated type; this form is for direct callers.
    async fn publish_batch(
        &self,
        req: Request<pb::PublishBatchRequest>,
    ) -> Result<Response<pb::PublishBatchResponse>, Status> {
        let answers = self.answer_batch(req).await?;
        let results = answers.into_iter().map(BatchAnswer::into_pb).collect();
        Ok(Response::new(pb::PublishBatchResponse { results }))
    }

    type ConsumeStream = consume::ConsumeStream;

    async fn consume(
        &self,
        req: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let caller = caller(&req)?;
        Ok(Response::new(consume::consume(&self.ops, caller, req.into_inner()).await?))
    }

    type SubscribeStream = RpcStream<pb::SubscribeResponse>;

    /// Served by [`EncodedStreams`], which encodes the stream without this conversion
    /// to the generated types; this form is for direct callers.
    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let frames = self.open_subscription(req).await?;
        Ok(Response::new(Box::pin(frames.map(|frame| frame.map(convert::subscribe_response)))))
    }
}
