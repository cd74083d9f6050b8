//! Durable consumers: create, read, manage and attach. Each operation on a named
//! consumer goes through the handle its right gives: reading (get, log, pending),
//! managing (delete, redrive, pause, resume) or attaching a client.

use std::sync::Arc;

use eventbus_core::durable::{
    Attachment, ClientOptions, ConsumerConfig, ConsumerInfo, DurableBackend, DurableError, LogSlice, LogStatus,
    PendingSlice, Redriven,
};

use super::{Ops, Refusal};
use crate::access::{Caller, StreamGuard, StreamUse};
use crate::convert::trace::TraceContext;
use crate::spans::Spans;

impl Ops {
    /// Creates a consumer (or finds the same definition): the right to manage it, to
    /// subscribe to its channels and to publish its dead letters, then room under the
    /// caller's and the broker's consumer limits.
    pub(crate) async fn create_consumer(
        &self,
        caller: &Caller,
        config: ConsumerConfig,
    ) -> Result<ConsumerInfo, Refusal> {
        self.access.check_create_consumer(caller, &config)?;
        let durable = self.durable()?;
        self.access.check_consumer_room(durable.as_ref(), caller, &config.name).await?;
        Ok(durable.create_consumer(config).await?)
    }

    /// Every consumer the caller may read, sorted by name.
    pub(crate) async fn list_consumers(&self, caller: &Caller) -> Result<Vec<ConsumerInfo>, Refusal> {
        let mut consumers = self.durable()?.list_consumers().await?;
        consumers.retain(|c| self.access.may_read_consumer(caller, &c.config.name));
        Ok(consumers)
    }

    /// The consumer `name`, for a caller that may read it.
    pub(crate) fn readable_consumer<'a>(
        &'a self,
        caller: &Caller,
        name: &'a str,
    ) -> Result<ReadableConsumer<'a>, Refusal> {
        self.access.check_read_consumer(caller, name)?;
        Ok(ReadableConsumer(Named { durable: self.durable()?, name }))
    }

    /// The consumer `name`, for a caller that may manage it.
    pub(crate) fn managed_consumer<'a>(
        &'a self,
        caller: &Caller,
        name: &'a str,
    ) -> Result<ManagedConsumer<'a>, Refusal> {
        self.access.check_manage_consumer(caller, name)?;
        Ok(ManagedConsumer(Named { durable: self.durable()?, name }, &self.spans))
    }

    /// The consumer `name`, for a caller that may attach to it.
    pub(crate) fn attachable_consumer<'a>(
        &'a self,
        caller: &'a Caller,
        name: &'a str,
    ) -> Result<AttachableConsumer<'a>, Refusal> {
        let durable = self.durable()?;
        self.access.check_attach(caller, name)?;
        Ok(AttachableConsumer { ops: self, caller, consumer: Named { durable, name } })
    }
}

/// A consumer by name on the durable engine.
#[derive(Debug)]
struct Named<'a> {
    durable: &'a Arc<dyn DurableBackend>,
    name: &'a str,
}

/// A consumer the caller may read.
#[derive(Debug)]
pub(crate) struct ReadableConsumer<'a>(Named<'a>);

impl ReadableConsumer<'_> {
    pub(crate) async fn info(&self) -> Result<ConsumerInfo, Refusal> {
        Ok(self.0.durable.get_consumer(self.0.name).await?)
    }

    /// Its terminal log, oldest first, from `page_token` (empty: the start).
    pub(crate) async fn log(
        &self,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &str,
    ) -> Result<LogSlice, Refusal> {
        Ok(self.0.durable.log(self.0.name, status, limit, page_token).await?)
    }

    /// Its unfinished events, from `page_token` (empty: the start).
    pub(crate) async fn pending(&self, limit: usize, page_token: &str) -> Result<PendingSlice, Refusal> {
        Ok(self.0.durable.list_pending(self.0.name, limit, page_token).await?)
    }
}

/// A consumer the caller may manage.
#[derive(Debug)]
pub(crate) struct ManagedConsumer<'a>(Named<'a>, &'a Spans);

impl ManagedConsumer<'_> {
    pub(crate) async fn delete(&self) -> Result<(), Refusal> {
        Ok(self.0.durable.delete_consumer(self.0.name).await?)
    }

    /// Puts dead letters back: the ones named, or with none named the oldest `limit`.
    /// A redriven event keeps its own trace context; the `redrive` span is the caller's
    /// (`trace`).
    pub(crate) async fn redrive(
        &self,
        event_ids: &[String],
        limit: usize,
        trace: Option<&TraceContext>,
    ) -> Result<Redriven, Refusal> {
        let redriven = self.0.durable.redrive(self.0.name, event_ids, limit).await.map_err(Refusal::from);
        self.1.redrive(self.0.name, trace, redriven.as_ref().map(|done| done.redriven));
        redriven
    }

    /// Pauses (`true`) or resumes it.
    pub(crate) async fn set_paused(&self, paused: bool) -> Result<ConsumerInfo, Refusal> {
        Ok(self.0.durable.set_paused(self.0.name, paused).await?)
    }
}

/// A consumer the caller may attach a client to.
#[derive(Debug)]
pub(crate) struct AttachableConsumer<'a> {
    ops: &'a Ops,
    caller: &'a Caller,
    consumer: Named<'a>,
}

impl AttachableConsumer<'_> {
    /// Attaches a client, creating the consumer from `create` when it is missing; the
    /// guard registers the open stream, so that a reload can end it.
    ///
    /// Creating on attach needs the rights of creating a consumer, asked only when the
    /// consumer is missing: a worker that always sends its definition needs no more
    /// than the right to attach once the consumer exists.
    pub(crate) async fn attach(
        self,
        options: ClientOptions,
        create: Option<ConsumerConfig>,
    ) -> Result<(Attachment, StreamGuard), Refusal> {
        let Self { ops, caller, consumer: Named { durable, name } } = self;
        let access = &ops.access;
        if create.is_some() && matches!(durable.get_consumer(name).await, Err(DurableError::UnknownConsumer(_))) {
            if let Some(config) = create.as_ref().filter(|_| access.enabled()) {
                access.check_create_consumer(caller, config)?;
            }
            access.check_consumer_room(durable.as_ref(), caller, name).await?;
        }
        let guard = access.open_stream(caller, StreamUse::Consume(name.to_owned()))?;
        let attached = durable.attach(name, options, create).await?;
        Ok((attached, guard))
    }
}
