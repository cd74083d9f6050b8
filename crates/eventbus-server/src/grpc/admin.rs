//! `eventbus.v1.Admin`: each method decodes its request, calls the operation and
//! encodes the answer.

use eventbus_proto::pb;
use tonic::{Request, Response, Status};

use super::caller;
use crate::convert;
use crate::convert::trace::TraceContext;
use crate::ops::{HistoryFrom, Ops, Refusal};

/// Implements `eventbus.v1.Admin`.
#[derive(Debug, Clone)]
pub(crate) struct AdminService {
    ops: Ops,
}

impl AdminService {
    pub(crate) fn new(ops: Ops) -> Self {
        Self { ops }
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn get_stats(&self, req: Request<pb::GetStatsRequest>) -> Result<Response<pb::GetStatsResponse>, Status> {
        let stats = self.ops.admin(&caller(&req)?)?.stats();
        Ok(Response::new(convert::stats(stats)))
    }

    async fn list_channels(
        &self,
        req: Request<pb::ListChannelsRequest>,
    ) -> Result<Response<pb::ListChannelsResponse>, Status> {
        let channels = self.ops.admin(&caller(&req)?)?.channels();
        Ok(Response::new(pb::ListChannelsResponse { channels: channels.into_iter().map(convert::channel).collect() }))
    }

    async fn list_subscriptions(
        &self,
        req: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        let subscriptions = self.ops.admin(&caller(&req)?)?.subscriptions();
        let subscriptions = subscriptions.into_iter().map(convert::subscription).collect();
        Ok(Response::new(pb::ListSubscriptionsResponse { subscriptions }))
    }

    async fn unsubscribe(
        &self,
        req: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        let caller = caller(&req)?;
        self.ops.unsubscribe(&caller, &req.into_inner().subscription_id)?;
        Ok(Response::new(pb::UnsubscribeResponse {}))
    }

    async fn create_consumer(
        &self,
        req: Request<pb::CreateConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let config = req.into_inner().config.ok_or_else(|| Refusal::BadRequest("config is required".into()))?;
        let config = convert::consumer_config_from_pb(config, caller.name())?;
        let info = self.ops.create_consumer(&caller, config).await?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn get_consumer(&self, req: Request<pb::GetConsumerRequest>) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        let info = self.ops.readable_consumer(&caller, &name)?.info().await?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn list_consumers(
        &self,
        req: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        let consumers = self.ops.list_consumers(&caller(&req)?).await?;
        Ok(Response::new(pb::ListConsumersResponse {
            consumers: consumers.iter().map(convert::consumer_info).collect(),
        }))
    }

    async fn delete_consumer(
        &self,
        req: Request<pb::DeleteConsumerRequest>,
    ) -> Result<Response<pb::DeleteConsumerResponse>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        self.ops.managed_consumer(&caller, &name)?.delete().await?;
        Ok(Response::new(pb::DeleteConsumerResponse {}))
    }

    async fn list_event_log(
        &self,
        req: Request<pb::ListEventLogRequest>,
    ) -> Result<Response<pb::ListEventLogResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        let consumer = self.ops.readable_consumer(&caller, &req.consumer)?;
        let status_filter = convert::log_status_filter(req.status)?;
        let page = consumer.log(status_filter, convert::log_limit(req.limit as usize), &req.page_token).await?;
        Ok(Response::new(convert::log_page(page)))
    }

    async fn list_pending(
        &self,
        req: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        let consumer = self.ops.readable_consumer(&caller, &req.consumer)?;
        let page = consumer.pending(convert::log_limit(req.limit as usize), &req.page_token).await?;
        Ok(Response::new(convert::pending_page(page)))
    }

    async fn redrive_dead_letters(
        &self,
        req: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let caller = caller(&req)?;
        let trace = TraceContext::from_grpc(req.metadata());
        let req = req.into_inner();
        let consumer = self.ops.managed_consumer(&caller, &req.consumer)?;
        let done = consumer.redrive(&req.event_ids, req.limit as usize, trace.as_ref()).await?;
        Ok(Response::new(convert::redriven(done)))
    }

    async fn pause_consumer(
        &self,
        req: Request<pb::PauseConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        let info = self.ops.managed_consumer(&caller, &name)?.set_paused(true).await?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn resume_consumer(
        &self,
        req: Request<pb::ResumeConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        let caller = caller(&req)?;
        let name = req.into_inner().name;
        let info = self.ops.managed_consumer(&caller, &name)?.set_paused(false).await?;
        Ok(Response::new(convert::consumer_info(&info)))
    }

    async fn get_channel_history(
        &self,
        req: Request<pb::GetChannelHistoryRequest>,
    ) -> Result<Response<pb::GetChannelHistoryResponse>, Status> {
        let caller = caller(&req)?;
        let req = req.into_inner();
        let history = self.ops.readable_history(&caller, &req.channel)?;
        let from = match req.since {
            Some(t) => HistoryFrom::Time(convert::valid_time("since", t)?),
            None => HistoryFrom::Offset(req.after_offset),
        };
        let page = history.page(from, req.limit as usize).await?;
        Ok(Response::new(convert::history_response(page)))
    }
}
