//! `EventBus.Consume`: a durable consumer's client attaches, then its acks are served
//! and its deliveries pushed. The conversions live in `convert`.

use std::pin::Pin;
use std::sync::Arc;

use eventbus_core::durable::{ClientOptions, ConsumerClient};
use eventbus_proto::pb::{self, consume_request, consume_response};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::access::Caller;
use crate::convert::{self, status};
use crate::ops::{Ops, Refusal};
use crate::spans::{Delivered, Recipient};

pub(crate) type ConsumeStream = Pin<Box<dyn Stream<Item = Result<pb::ConsumeResponse, Status>> + Send + 'static>>;

/// `EventBus.Consume`: attach, then serve requests and push deliveries until either
/// side goes away (or a reload withdraws the caller's right to attach).
pub(crate) async fn consume(
    ops: &Ops,
    caller: Caller,
    mut inbound: Streaming<pb::ConsumeRequest>,
) -> Result<ConsumeStream, Status> {
    // Refused at once on a broker without durable consumers, before any request.
    ops.durable()?;
    let first = inbound.message().await.map_err(crate::request_limit::refused_request)?.and_then(|r| r.kind);
    let Some(consume_request::Kind::Attach(attach)) = first else {
        return Err(Refusal::BadRequest("the first Consume request must be `attach`".into()).into());
    };
    let options = ClientOptions { max_in_flight: attach.max_in_flight, max_batch: attach.max_batch };
    let consumer = ops.attachable_consumer(&caller, &attach.consumer)?;
    let create = attach.create_if_missing.map(|c| convert::consumer_config_from_pb(c, caller.name())).transpose()?;
    let (attached, guard) = consumer.attach(options, create).await?;
    let client: Arc<dyn ConsumerClient> = Arc::from(attached.client);
    // Weak: the request task below owns the handle, so a client that closes its request
    // stream (a graceful drain: last acks and nacks, then half-close) drops it, which
    // ends the deliveries and then this response stream with OK. The client learns that
    // every request it sent was applied.
    let watcher = Arc::downgrade(&client);
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
                Some(consume_request::Kind::Release(r)) => client.release(r.event_ids, r.drain).await,
                Some(consume_request::Kind::Attach(_)) | None => {
                    tracing::debug!(%consumer, "ignoring a second attach on a Consume stream");
                }
            }
        }
        drop(client);
    });
    let attached_msg = pb::ConsumeResponse {
        kind: Some(consume_response::Kind::Attached(pb::Attached {
            consumer: Some(convert::consumer_info(&attached.info)),
        })),
    };
    let spans = ops.spans().clone();
    let deliveries = ReceiverStream::new(attached.deliveries).map(move |batch| {
        if spans.enabled() {
            let delivered =
                batch.iter().map(|d| Delivered { event: &d.event, attempt: Some(d.attempt), recovered: false });
            spans.deliver(Recipient::Consumer(&attach.consumer), delivered);
        }
        // The engines' empty batch answers a draining release.
        let kind = if batch.is_empty() {
            consume_response::Kind::Drained(pb::Drained {})
        } else {
            consume_response::Kind::Deliveries(pb::Deliveries {
                deliveries: batch.iter().map(convert::delivery).collect(),
            })
        };
        Ok(pb::ConsumeResponse { kind: Some(kind) })
    });
    // Detached by shutdown or a lost store: say so, so the client reconnects.
    let bus = ops.bus().clone();
    let end = futures::stream::once(async move {
        if let Some(err) = watcher.upgrade().and_then(|c| c.closed_reason()) {
            return Some(Err(status(err)));
        }
        bus.is_shutting_down().then(|| Err(status(Refusal::Closed(eventbus_core::CloseReason::ShuttingDown))))
    })
    .filter_map(|end| async move { end });
    Ok(Box::pin(guard.guard(futures::stream::once(async { Ok(attached_msg) }).chain(deliveries).chain(end))))
}
