//! The `EventBus` and `Admin` gRPC services: thin adapters over [`Bus`]. Every call
//! passes [`Authenticate`] first; each method checks the right it needs (docs/security.md, the rights table).

use std::pin::Pin;
use std::sync::Arc;

use eventbus_core::{Bus, Published};
use eventbus_proto::pb::{self, subscribe_response::Kind};
use futures::{Stream, StreamExt, stream};
use tonic::{Request, Response, Status, Streaming};

use crate::access::{Access, Caller, Operation, StreamUse};
use crate::consume;
use crate::convert::{self, EdgeError, status};
use crate::delivery::{Frame, Frames, Streamer, next_batch};
use crate::listener::PeerInfo;
use crate::metrics::Metrics;
use crate::publish_stream::{StreamAnswer, count_refused};
use crate::request_limit::PayloadLimit;

pub(crate) type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The answer to one event of a `PublishBatch`, before encoding.
#[derive(Debug, Clone)]
pub(crate) enum BatchAnswer {
    Published(Published),
    /// The status the event would have got alone.
    Refused(pb::PublishError),
}

impl BatchAnswer {
    fn refused(err: impl Into<EdgeError>) -> Self {
        Self::Refused(publish_error(&Status::from(err.into())))
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
pub(crate) fn peer<T>(req: &Request<T>) -> String {
    req.extensions().get::<PeerInfo>().map(|p| p.addr_text().to_owned()).unwrap_or_default()
}

/// [`peer`], shared with the connection's other calls (no copy).
pub(crate) fn shared_peer<T>(req: &Request<T>) -> Arc<str> {
    req.extensions().get::<PeerInfo>().map_or_else(|| Arc::from(""), |p| Arc::clone(&p.addr_text))
}

/// Who sent the request, as [`Authenticate`] found.
pub(crate) fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions().get::<Caller>().cloned().ok_or_else(|| Status::unauthenticated("no credentials were checked"))
}

/// Authenticates every call of the services it wraps, once, before the method runs;
/// the [`Caller`] rides in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Authenticate(pub(crate) Access);

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
    pub(crate) bus: Bus,
    pub(crate) access: Access,
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Turns the decode-limit status of an oversized `PublishStream` request into ours.
    pub(crate) limit: PayloadLimit,
    /// Most events in one `PublishBatch` (`eventbus.max_publish_batch`).
    max_publish_batch: usize,
}

impl EventBusService {
    /// Publishes a unary `Publish`: its duration recorded, a refusal counted.
    pub(crate) async fn answer_publish(&self, req: Request<pb::PublishRequest>) -> Result<Published, Status> {
        let peer = shared_peer(&req);
        let caller = caller(&req)?;
        let req = req.into_inner();
        let metrics = self.metrics.as_deref();
        let published = match self.access.check_publish(&caller, [req.channel.as_str()]) {
            Ok(()) => self.bus.publish(convert::publish_input(req, peer, caller.name())).await.map_err(status),
            Err(refused) => Err(refused.into()),
        };
        match published {
            Ok(published) => {
                observe(metrics, &published);
                Ok(published)
            }
            Err(refused) => {
                count_refused(metrics, &refused);
                Err(refused)
            }
        }
    }

    pub(crate) fn new(
        bus: Bus,
        access: Access,
        metrics: Option<Arc<Metrics>>,
        limit: PayloadLimit,
        max_publish_batch: usize,
    ) -> Self {
        Self { bus, access, metrics, limit, max_publish_batch }
    }
}

/// Records a publish's duration.
pub(crate) fn observe(metrics: Option<&Metrics>, published: &Published) {
    if let Some(metrics) = metrics {
        metrics.observe_publish(published.duration);
    }
}

#[tonic::async_trait]
impl pb::event_bus_server::EventBus for EventBusService {
    /// Served by [`crate::delivery::EncodedStreams`], which writes the answer without
    /// this conversion to the generated type; this form is for direct callers.
    async fn publish(&self, req: Request<pb::PublishRequest>) -> Result<Response<pb::PublishResponse>, Status> {
        self.answer_publish(req).await.map(|published| Response::new(convert::publish_response(published)))
    }

    type PublishStreamStream = RpcStream<pb::PublishResponse>;

    /// Served by [`crate::delivery::EncodedStreams`], which writes the answers without
    /// this conversion to the generated type; this form is for direct callers.
    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let answers = self.answer_publishes(req)?;
        Ok(Response::new(Box::pin(answers.map(|answer| answer.map(StreamAnswer::into_pb)))))
    }

    /// Served by [`crate::delivery::EncodedStreams`], which writes the answers without
    /// this conversion to the generated type; this form is for direct callers.
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
        Ok(Response::new(consume::consume(&self.bus, &self.access, caller, req.into_inner()).await?))
    }

    type SubscribeStream = RpcStream<pb::SubscribeResponse>;

    /// Served by [`crate::delivery::EncodedStreams`], which encodes the stream without this
    /// conversion to the generated types; this form is for direct callers.
    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let frames = self.open_subscription(req).await?;
        Ok(Response::new(Box::pin(frames.map(|frame| frame.map(Frame::into_pb)))))
    }
}

impl EventBusService {
    /// Publishes a `PublishBatch`, every event answered in its slot: the ones refused at
    /// the edge (no right on their channel) or by the bus get their error, and do not
    /// stop the others. Only what concerns the whole call (size, rate, shutdown) fails it.
    pub(crate) async fn answer_batch(&self, req: Request<pb::PublishBatchRequest>) -> Result<Vec<BatchAnswer>, Status> {
        let peer: Arc<str> = peer(&req).into();
        let caller = caller(&req)?;
        let events = req.into_inner().events;
        if events.len() > self.max_publish_batch {
            return Err(EdgeError::BatchTooLarge { count: events.len(), limit: self.max_publish_batch }.into());
        }
        if self.bus.is_shutting_down() {
            return Err(status(eventbus_core::Error::ShuttingDown));
        }
        // `None`: the slot of an event handed to the bus, answered below in order.
        let mut answers: Vec<Option<BatchAnswer>> = Vec::with_capacity(events.len());
        let mut inputs = Vec::with_capacity(events.len());
        for req in events {
            match self.access.check_publish_right(&caller, &req.channel) {
                Ok(()) => {
                    inputs.push(convert::publish_input(req, peer.clone(), caller.name()));
                    answers.push(None);
                }
                Err(refused) => answers.push(Some(BatchAnswer::refused(refused))),
            }
        }
        self.access.take_publish_rate(&caller, u32::try_from(inputs.len()).unwrap_or(u32::MAX))?;
        let mut published = self.bus.publish_each(inputs).await.into_iter();
        let metrics = self.metrics.as_deref();
        let answers: Vec<BatchAnswer> = answers
            .into_iter()
            .map(|slot| match slot {
                Some(refused) => refused,
                None => match published.next() {
                    Some(Ok(p)) => {
                        observe(metrics, &p);
                        BatchAnswer::Published(p)
                    }
                    Some(Err(err)) => BatchAnswer::refused(err),
                    // The bus answers every input; should it not, the event is not
                    // reported as published.
                    None => BatchAnswer::refused(eventbus_core::durable::DurableError::unavailable(
                        "the broker gave no answer for this event",
                    )),
                },
            })
            .collect();
        if let Some(metrics) = metrics {
            for answer in &answers {
                if let BatchAnswer::Refused(error) = answer {
                    metrics.count_refused(tonic::Code::from_i32(error.code));
                }
            }
        }
        Ok(answers)
    }

    /// Opens a subscription: its stream is `started`, then the batches.
    pub(crate) async fn open_subscription(&self, req: Request<pb::SubscribeRequest>) -> Result<Frames, Status> {
        let peer = peer(&req);
        let caller = caller(&req)?;
        let (mut options, since) = convert::subscribe_options(req.into_inner(), peer, caller.name().to_owned())?;
        options.owner_max_queued_bytes = self.access.max_queued_bytes(&caller);
        self.access.check_subscribe(&caller, &options.channels)?;
        let guard = self.access.open_stream(&caller, StreamUse::Subscribe(options.channels.clone()))?;
        // Read before the subscription goes live: a subscriber that resumes from them
        // gets anything published meanwhile.
        let started_at = std::time::SystemTime::now();
        let positions = match self.bus.history_rules().is_empty() {
            true => Default::default(),
            false => self.bus.latest_positions(&options.channels).await.map_err(status)?,
        };
        let mut handle = self.bus.subscribe(options).await.map_err(status)?;
        let recovered = match &since {
            Some(since) => {
                let complete = self.bus.recover(&mut handle, since).await.map_err(status)?;
                if let Some(metrics) = &self.metrics {
                    metrics.count_recovery(complete, handle.recovered());
                }
                complete
            }
            None => false,
        };
        let started = pb::SubscribeResponse {
            kind: Some(Kind::Started(pb::SubscriptionStarted {
                subscription_id: handle.id().to_owned(),
                recovered,
                positions: positions.iter().map(|(c, p)| (c.clone(), convert::position(p))).collect(),
                started_at: Some(convert::timestamp(started_at)),
            })),
        };
        tracing::debug!(subscription = handle.id(), recovered, "subscription started");
        let batches = stream::unfold(Some(Streamer { handle, metrics: self.metrics.clone() }), next_batch);
        Ok(Box::pin(guard.guard(stream::once(async { Ok(Frame::Started(started)) }).chain(batches))))
    }
}

/// Implements `eventbus.v1.Admin`.
#[derive(Debug, Clone)]
pub(crate) struct AdminService {
    bus: Bus,
    access: Access,
}

impl AdminService {
    pub(crate) fn new(bus: Bus, access: Access) -> Self {
        Self { bus, access }
    }

    /// The caller, when it is an admin.
    fn admin<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let caller = caller(req)?;
        self.access
            .require(&caller, Operation::Admin, caller.principal().permissions.is_admin(), || "an admin call".into())?;
        Ok(caller)
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn get_stats(&self, req: Request<pb::GetStatsRequest>) -> Result<Response<pb::GetStatsResponse>, Status> {
        self.admin(&req)?;
        Ok(Response::new(convert::stats(self.bus.stats())))
    }

    async fn list_channels(
        &self,
        req: Request<pb::ListChannelsRequest>,
    ) -> Result<Response<pb::ListChannelsResponse>, Status> {
        self.admin(&req)?;
        let channels = self.bus.channels().into_iter().map(convert::channel).collect();
        Ok(Response::new(pb::ListChannelsResponse { channels }))
    }

    async fn list_subscriptions(
        &self,
        req: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        self.admin(&req)?;
        let subscriptions = self.bus.subscriptions().into_iter().map(convert::subscription).collect();
        Ok(Response::new(pb::ListSubscriptionsResponse { subscriptions }))
    }

    async fn unsubscribe(
        &self,
        req: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        let caller = caller(&req)?;
        let id = req.into_inner().subscription_id;
        self.access.check_unsubscribe(&self.bus, &caller, &id)?;
        self.bus.unsubscribe(&id).map_err(status)?;
        Ok(Response::new(pb::UnsubscribeResponse {}))
    }

    async fn create_consumer(
        &self,
        req: Request<pb::CreateConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let config = req.into_inner().config.ok_or_else(|| EdgeError::BadRequest("config is required".into()))?;
        let config = convert::consumer_config_from_pb(config, caller.name())?;
        self.access.check_create_consumer(&caller, &config)?;
        let durable = convert::durable(&self.bus)?;
        self.access.check_consumer_room(durable.as_ref(), &caller, &config.name).await?;
        let info = durable.create_consumer(config).await.map_err(status)?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn get_consumer(&self, req: Request<pb::GetConsumerRequest>) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        self.access.check_read_consumer(&caller, &name)?;
        let durable = convert::durable(&self.bus)?;
        let info = durable.get_consumer(&name).await.map_err(status)?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn list_consumers(
        &self,
        req: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        let caller = caller(&req)?;
        let consumers = convert::durable(&self.bus)?.list_consumers().await.map_err(status)?;
        let consumers = consumers
            .iter()
            .filter(|c| self.access.may_read_consumer(&caller, &c.config.name))
            .map(convert::consumer_info)
            .collect();
        Ok(Response::new(pb::ListConsumersResponse { consumers }))
    }

    async fn delete_consumer(
        &self,
        req: Request<pb::DeleteConsumerRequest>,
    ) -> Result<Response<pb::DeleteConsumerResponse>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        self.access.check_manage_consumer(&caller, &name)?;
        let durable = convert::durable(&self.bus)?;
        durable.delete_consumer(&name).await.map_err(status)?;
        Ok(Response::new(pb::DeleteConsumerResponse {}))
    }

    async fn list_event_log(
        &self,
        req: Request<pb::ListEventLogRequest>,
    ) -> Result<Response<pb::ListEventLogResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        self.access.check_read_consumer(&caller, &req.consumer)?;
        let status_filter = convert::log_status_filter(req.status)?;
        let limit = convert::log_limit(req.limit as usize);
        let page = convert::durable(&self.bus)?
            .log(&req.consumer, status_filter, limit, &req.page_token)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::log_page(page)))
    }

    async fn list_pending(
        &self,
        req: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        self.access.check_read_consumer(&caller, &req.consumer)?;
        let limit = convert::log_limit(req.limit as usize);
        let page =
            convert::durable(&self.bus)?.list_pending(&req.consumer, limit, &req.page_token).await.map_err(status)?;
        Ok(Response::new(convert::pending_page(page)))
    }

    async fn redrive_dead_letters(
        &self,
        req: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        self.access.check_manage_consumer(&caller, &req.consumer)?;
        let durable = convert::durable(&self.bus)?;
        let done = durable.redrive(&req.consumer, &req.event_ids, req.limit as usize).await.map_err(status)?;
        Ok(Response::new(convert::redriven(done)))
    }

    async fn pause_consumer(
        &self,
        req: Request<pb::PauseConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        self.set_paused(&caller, &name, true).await
    }

    async fn resume_consumer(
        &self,
        req: Request<pb::ResumeConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        self.set_paused(&caller, &name, false).await
    }

    async fn get_channel_history(
        &self,
        req: Request<pb::GetChannelHistoryRequest>,
    ) -> Result<Response<pb::GetChannelHistoryResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        // Whoever may subscribe to the channel may read what a subscription would recover.
        self.access.check_subscribe(&caller, &[&req.channel])?;
        let from = match req.since {
            Some(t) => convert::HistoryFrom::Time(convert::valid_time("since", t)?),
            None => convert::HistoryFrom::Offset(req.after_offset),
        };
        let page = convert::history_page(&self.bus, &req.channel, from, req.limit as usize).await?;
        Ok(Response::new(convert::history_response(page)))
    }
}

impl AdminService {
    async fn set_paused(
        &self,
        caller: &Caller,
        name: &str,
        paused: bool,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        self.access.check_manage_consumer(caller, name)?;
        let info = convert::durable(&self.bus)?.set_paused(name, paused).await.map_err(status)?;
        Ok(Response::new(convert::consumer_info(&info)))
    }
}
