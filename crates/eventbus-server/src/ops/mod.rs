//! The broker's operations, once, for every protocol: each checks the caller's rights
//! (in the order docs/security.md gives), calls the bus or the durable engine, and
//! answers in domain types or a [`Refusal`]. The gRPC services (`grpc/`) and the HTTP
//! routes (`http/`) only decode a request, call an operation and encode its answer;
//! `convert` maps a refusal to its gRPC status and HTTP code.
//!
//! Operations on one consumer or channel are reached through a handle that only a
//! passed check gives ([`Ops::readable_consumer`], [`Ops::managed_consumer`],
//! [`Ops::attachable_consumer`], [`Ops::admin`], [`Ops::readable_history`]): a protocol
//! adapter cannot call one without the check it needs.

mod admin;
mod consumers;
mod publish;
mod refusal;
mod sessions;
mod subscribe;

use std::sync::Arc;

use eventbus_core::Bus;
use eventbus_core::durable::DurableBackend;

pub(crate) use admin::{HistoryFrom, HistoryPage, MAX_HISTORY_LIMIT};
pub(crate) use refusal::{Refusal, Withdrawn};
pub(crate) use subscribe::{Frame, Frames, Started};

use crate::access::{Access, Caller};
use crate::metrics::Metrics;
use crate::spans::Spans;

/// What every operation needs: the bus, the access rules and the metrics.
#[derive(Debug, Clone)]
pub(crate) struct Ops {
    bus: Bus,
    access: Access,
    metrics: Option<Arc<Metrics>>,
    spans: Spans,
    /// Most events in one `PublishBatch` (`eventbus.max_publish_batch`).
    max_publish_batch: usize,
}

impl Ops {
    pub(crate) fn new(
        bus: Bus,
        access: Access,
        metrics: Option<Arc<Metrics>>,
        spans: Spans,
        max_publish_batch: usize,
    ) -> Self {
        Self { bus, access, metrics, spans, max_publish_batch }
    }

    /// eventbusd's own spans (none unless exported).
    pub(crate) fn spans(&self) -> &Spans {
        &self.spans
    }

    pub(crate) fn bus(&self) -> &Bus {
        &self.bus
    }

    pub(crate) fn access(&self) -> &Access {
        &self.access
    }

    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    /// The durable engine, or why there is none.
    pub(crate) fn durable(&self) -> Result<&Arc<dyn DurableBackend>, Refusal> {
        self.bus.durable().ok_or(Refusal::DurableDisabled)
    }

    /// `Admin.Unsubscribe` / `DELETE …/subscriptions/{id}`: ends another subscription.
    pub(crate) fn unsubscribe(&self, caller: &Caller, id: &str) -> Result<(), Refusal> {
        self.access.check_unsubscribe(&self.bus, caller, id)?;
        Ok(self.bus.unsubscribe(id)?)
    }
}
