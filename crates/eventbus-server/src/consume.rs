//! Durable consumers on the wire: `EventBus.Consume`, the Admin consumer RPCs, and the
//! conversions between the engine's types and `eventbus.v1`.

use std::pin::Pin;

use bytes::Bytes;
use eventbus_core::durable::{
    Backoff, ClientOptions, ConsumerClient, ConsumerConfig, ConsumerInfo, Delivery, DurableBackend, PublishedDeadLetter,
};
use eventbus_core::durable::{Failure, LogEntry, LogStatus, from_epoch_ms};
use eventbus_core::{Bus, Error};
use eventbus_proto::pb::{self, consume_request, consume_response};
use futures::{Stream, StreamExt};
use prost::Message;
use std::sync::Arc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::convert::{self, status};

/// Content type of published dead letters.
pub const DEAD_LETTER_CONTENT_TYPE: &str = "application/x-protobuf; type=eventbus.v1.DeadLetter";

/// The engine, or why there is none.
pub(crate) fn durable(bus: &Bus) -> Result<&Arc<dyn DurableBackend>, Status> {
    bus.durable().ok_or_else(|| Status::failed_precondition("durable consumers are not enabled on this broker"))
}

/// A consumer definition from the wire; zero values take the defaults.
pub(crate) fn config_from_pb(c: pb::ConsumerConfig) -> ConsumerConfig {
    let defaults = ConsumerConfig::new(c.name.clone(), Vec::new());
    let b = c.backoff.unwrap_or_default();
    let db = Backoff::default();
    ConsumerConfig {
        name: c.name,
        channels: c.channels,
        ack_deadline_ms: if c.ack_deadline_ms == 0 { defaults.ack_deadline_ms } else { c.ack_deadline_ms },
        max_attempts: c.max_attempts.unwrap_or(defaults.max_attempts),
        backoff: Backoff {
            initial_ms: if b.initial_ms == 0 { db.initial_ms } else { b.initial_ms },
            multiplier: if b.multiplier == 0.0 { db.multiplier } else { b.multiplier },
            max_ms: if b.max_ms == 0 { db.max_ms } else { b.max_ms },
        },
        max_in_flight: if c.max_in_flight == 0 { defaults.max_in_flight } else { c.max_in_flight },
        dead_letter_channel: (!c.dead_letter_channel.is_empty()).then_some(c.dead_letter_channel),
    }
}

fn config_to_pb(c: &ConsumerConfig) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        name: c.name.clone(),
        channels: c.channels.clone(),
        ack_deadline_ms: c.ack_deadline_ms,
        max_attempts: Some(c.max_attempts),
        backoff: Some(pb::Backoff {
            initial_ms: c.backoff.initial_ms,
            multiplier: c.backoff.multiplier,
            max_ms: c.backoff.max_ms,
        }),
        max_in_flight: c.max_in_flight,
        dead_letter_channel: c.dead_letter_channel.clone().unwrap_or_default(),
    }
}

pub(crate) fn info_to_pb(i: &ConsumerInfo) -> pb::ConsumerInfo {
    pb::ConsumerInfo {
        config: Some(config_to_pb(&i.config)),
        pending: i.pending,
        in_flight: i.in_flight,
        clients: i.clients,
        acked: i.acked,
        dead_lettered: i.dead_lettered,
    }
}

fn failure_to_pb(f: &Failure) -> pb::Failure {
    pb::Failure { at: Some(convert::timestamp(from_epoch_ms(f.at_ms))), reason: f.reason.clone() }
}

fn status_to_pb(s: LogStatus) -> pb::EventStatus {
    match s {
        LogStatus::Completed => pb::EventStatus::Completed,
        LogStatus::DeadLettered => pb::EventStatus::DeadLettered,
    }
}

pub(crate) fn log_entry_to_pb(e: &LogEntry) -> pb::EventLogEntry {
    pb::EventLogEntry {
        event_id: e.event_id.clone(),
        channel: e.channel.clone(),
        status: status_to_pb(e.status).into(),
        attempts: e.attempts,
        first_delivered_at: e.first_delivered_ms.map(|ms| convert::timestamp(from_epoch_ms(ms))),
        finished_at: Some(convert::timestamp(from_epoch_ms(e.finished_ms))),
        failures: e.failures.iter().map(failure_to_pb).collect(),
    }
}

/// The wire form of a dead letter, for `DurableOptions::dead_letter_encoder`.
pub fn encode_dead_letter(dl: &PublishedDeadLetter) -> (Bytes, String) {
    let msg = pb::DeadLetter {
        event: Some(convert::event(&dl.event)),
        consumer: dl.consumer.clone(),
        attempts: dl.attempts,
        failures: dl.failures.iter().map(failure_to_pb).collect(),
    };
    (Bytes::from(msg.encode_to_vec()), DEAD_LETTER_CONTENT_TYPE.to_owned())
}

fn delivery_to_pb(d: &Delivery) -> pb::Delivery {
    pb::Delivery {
        event: Some(convert::event(&d.event)),
        attempt: d.attempt,
        deadline: Some(convert::timestamp(d.deadline)),
    }
}

/// `status` filter of ListEventLog / the REST `?status=`.
pub(crate) fn status_filter(status: i32) -> Result<Option<LogStatus>, Status> {
    match pb::EventStatus::try_from(status) {
        Ok(pb::EventStatus::Unspecified) => Ok(None),
        Ok(pb::EventStatus::Completed) => Ok(Some(LogStatus::Completed)),
        Ok(pb::EventStatus::DeadLettered) => Ok(Some(LogStatus::DeadLettered)),
        Err(_) => Err(Status::invalid_argument(format!("invalid status: unknown event status {status}"))),
    }
}

pub(crate) type ConsumeStream = Pin<Box<dyn Stream<Item = Result<pb::ConsumeResponse, Status>> + Send + 'static>>;

/// `EventBus.Consume`: attach, then serve requests and push deliveries until either
/// side goes away.
pub(crate) async fn consume(bus: &Bus, mut inbound: Streaming<pb::ConsumeRequest>) -> Result<ConsumeStream, Status> {
    let durable = durable(bus)?.clone();
    let first = inbound.message().await?.and_then(|r| r.kind);
    let Some(consume_request::Kind::Attach(attach)) = first else {
        return Err(Status::invalid_argument("the first Consume request must be `attach`"));
    };
    let options = ClientOptions { max_in_flight: attach.max_in_flight, max_batch: attach.max_batch };
    let create = attach.create_if_missing.map(config_from_pb);
    let attached = durable.attach(&attach.consumer, options, create).await.map_err(|e| status(Error::from(e)))?;
    let client: Arc<dyn ConsumerClient> = Arc::from(attached.client);
    let watcher = Arc::clone(&client);
    let consumer = attach.consumer.clone();
    // Requests are served by their own task; when the client's request stream ends (or
    // breaks), the handle drops and what it held is released at once.
    tokio::spawn(async move {
        loop {
            let request = match inbound.message().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(%consumer, %err, "consume stream broken");
                    break;
                }
            };
            match request.kind {
                Some(consume_request::Kind::Ack(a)) => client.ack(a.event_ids).await,
                Some(consume_request::Kind::Nack(n)) => {
                    let delay = (n.delay_ms > 0).then(|| std::time::Duration::from_millis(n.delay_ms));
                    client.nack(n.event_id, n.reason, delay).await;
                }
                Some(consume_request::Kind::Extend(e)) => {
                    client.extend(e.event_ids, std::time::Duration::from_millis(e.by_ms)).await;
                }
                Some(consume_request::Kind::Term(t)) => client.term(t.event_id, t.reason).await,
                Some(consume_request::Kind::Attach(_)) | None => {
                    tracing::debug!(%consumer, "ignoring a second attach on a Consume stream");
                }
            }
        }
        drop(client);
    });
    let attached_msg = pb::ConsumeResponse {
        kind: Some(consume_response::Kind::Attached(pb::Attached { consumer: Some(info_to_pb(&attached.info)) })),
    };
    let deliveries = ReceiverStream::new(attached.deliveries).map(|batch| {
        let deliveries = batch.iter().map(delivery_to_pb).collect();
        Ok(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(pb::Deliveries { deliveries })) })
    });
    // Detached by shutdown or a lost store: say so, so the client reconnects.
    let bus = bus.clone();
    let end = futures::stream::once(async move {
        if let Some(err) = watcher.closed_reason() {
            return Some(Err(status(Error::from(err))));
        }
        drop(watcher);
        bus.is_shutting_down().then(|| Err(Status::unavailable("shutting down")))
    })
    .filter_map(|end| async move { end });
    Ok(Box::pin(futures::stream::once(async { Ok(attached_msg) }).chain(deliveries).chain(end)))
}
