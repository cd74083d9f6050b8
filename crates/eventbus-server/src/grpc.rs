//! The `EventBus` and `Admin` gRPC services: thin adapters over [`Bus`].

use std::pin::Pin;
use std::sync::Arc;

use eventbus_core::{Bus, Event, SubscriptionHandle};
use eventbus_proto::pb::{self, subscribe_response::Kind};
use futures::{Stream, StreamExt, stream};
use tonic::{Request, Response, Status, Streaming};

use crate::convert::{self, status};

type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Where a request came from, for `Event.source` and `SubscriptionInfo.peer`.
fn peer<T>(req: &Request<T>) -> String {
    req.remote_addr().map(|a| a.to_string()).unwrap_or_default()
}

/// Implements `eventbus.v1.EventBus`.
#[derive(Debug, Clone)]
pub(crate) struct EventBusService {
    bus: Bus,
}

impl EventBusService {
    pub(crate) fn new(bus: Bus) -> Self {
        Self { bus }
    }
}

#[tonic::async_trait]
impl pb::event_bus_server::EventBus for EventBusService {
    async fn publish(&self, req: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        let peer = peer(&req);
        let published = self.bus.publish(convert::publish_input(req.into_inner(), peer)).await.map_err(status)?;
        Ok(Response::new(convert::publish_response(published)))
    }

    type PublishStreamStream = RpcStream<pb::PublishResponse>;

    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let peer = peer(&req);
        let state = (req.into_inner(), self.bus.clone(), peer);
        // One request at a time, in order: the response order and the per-publisher
        // event order both follow from it. An error ends the stream.
        let responses = stream::try_unfold(state, |(mut inbound, bus, peer)| async move {
            let Some(req) = inbound.message().await? else { return Ok(None) };
            let published = bus.publish(convert::publish_input(req, peer.clone())).await.map_err(status)?;
            Ok(Some((convert::publish_response(published), (inbound, bus, peer))))
        });
        Ok(Response::new(Box::pin(responses)))
    }

    type SubscribeStream = RpcStream<pb::SubscribeResponse>;

    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let peer = peer(&req);
        let options = convert::subscribe_options(req.into_inner(), peer)?;
        let handle = self.bus.subscribe(options).map_err(status)?;
        let started = pb::SubscribeResponse {
            kind: Some(Kind::Started(pb::SubscriptionStarted { subscription_id: handle.id().to_owned() })),
        };
        tracing::debug!(subscription = handle.id(), "subscription started");
        let batches = stream::unfold(Some((handle, Vec::new())), next_batch);
        Ok(Response::new(Box::pin(stream::once(async { Ok(started) }).chain(batches))))
    }
}

/// One stream message: the next batch, or the status that ends the stream. The handle
/// lives inside the stream, so a client that goes away drops it and unsubscribes.
async fn next_batch(
    state: Option<(SubscriptionHandle, Vec<Arc<Event>>)>,
) -> Option<(Result<pb::SubscribeResponse, Status>, Option<(SubscriptionHandle, Vec<Arc<Event>>)>)> {
    let (handle, mut buf) = state?;
    match handle.next_batch(&mut buf).await {
        Ok(()) => {
            let events = buf.drain(..).map(|e| convert::event(&e)).collect();
            let msg = pb::SubscribeResponse { kind: Some(Kind::Events(pb::EventBatch { events })) };
            Some((Ok(msg), Some((handle, buf))))
        }
        Err(reason) => {
            tracing::debug!(subscription = handle.id(), ?reason, "subscription ended");
            convert::close_status(reason).map(|s| (Err(s), None))
        }
    }
}

/// Implements `eventbus.v1.Admin`.
#[derive(Debug, Clone)]
pub(crate) struct AdminService {
    bus: Bus,
}

impl AdminService {
    pub(crate) fn new(bus: Bus) -> Self {
        Self { bus }
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn get_stats(&self, _: Request<pb::GetStatsRequest>) -> Result<Response<pb::GetStatsResponse>, Status> {
        Ok(Response::new(convert::stats(self.bus.stats())))
    }

    async fn list_channels(
        &self,
        _: Request<pb::ListChannelsRequest>,
    ) -> Result<Response<pb::ListChannelsResponse>, Status> {
        let channels = self.bus.channels().into_iter().map(convert::channel).collect();
        Ok(Response::new(pb::ListChannelsResponse { channels }))
    }

    async fn list_subscriptions(
        &self,
        _: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        let subscriptions = self.bus.subscriptions().into_iter().map(convert::subscription).collect();
        Ok(Response::new(pb::ListSubscriptionsResponse { subscriptions }))
    }

    async fn unsubscribe(
        &self,
        req: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        self.bus.unsubscribe(&req.into_inner().subscription_id).map_err(status)?;
        Ok(Response::new(pb::UnsubscribeResponse {}))
    }
}
