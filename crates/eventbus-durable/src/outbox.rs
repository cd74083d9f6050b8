//! The dead-letter outbox (docs/durable.md "Dead letters"): a dead letter is written in the same
//! commit as the final failure that made it, published once that commit is done, and
//! removed only when its publication is answered. A crash in between leaves it in the
//! store, and the next start publishes it: a dead letter may be published twice, never
//! lost. A publication that fails is retried with backoff for as long as the engine runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use eventbus_core::durable::{DeadLetterSink, PublishedDeadLetter};
use parking_lot::Mutex;

use crate::engine::{Durable, Inner};
use crate::store::{DeadLetterRecord, StoreError, StoreOp};

/// First retry of a failed publication; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Outbox bookkeeping kept in memory; the records themselves are in the store.
#[derive(Debug)]
pub(crate) struct Outbox {
    next_id: AtomicU64,
    /// Records waiting for a sink: loaded at start, before the bus exists.
    waiting: Mutex<Vec<(u64, DeadLetterRecord)>>,
}

impl Outbox {
    pub(crate) fn new(loaded: Vec<(u64, DeadLetterRecord)>) -> Self {
        let next = loaded.iter().map(|(id, _)| id + 1).max().unwrap_or(1);
        Self { next_id: AtomicU64::new(next), waiting: Mutex::new(loaded) }
    }
}

/// What a commit answers its waiter.
pub(crate) type Committed = tokio::sync::oneshot::Receiver<Result<(), Arc<StoreError>>>;

impl Durable {
    /// Encodes `dead_letters` into outbox records, adding the ops that store them to
    /// `ops` (the same commit as the `Finish` ops that dead-lettered them).
    pub(crate) fn to_outbox(
        &self,
        dead_letters: Vec<PublishedDeadLetter>,
        ops: &mut Vec<StoreOp>,
    ) -> Vec<(u64, DeadLetterRecord)> {
        let encode = &self.inner.options.dead_letter_encoder;
        dead_letters
            .into_iter()
            .map(|dl| {
                let (payload, content_type) = encode(&dl);
                let id = self.inner.outbox.next_id.fetch_add(1, Ordering::Relaxed);
                let record = DeadLetterRecord {
                    channel: dl.channel,
                    payload,
                    content_type,
                    consumer: dl.consumer,
                    event_id: dl.event.id.to_string(),
                };
                ops.push(StoreOp::PutDeadLetter { id, record: record.clone() });
                (id, record)
            })
            .collect()
    }

    /// Publishes outbox records once `committed` says they are stored.
    pub(crate) fn publish_when_committed(&self, records: Vec<(u64, DeadLetterRecord)>, committed: Committed) {
        let engine = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            match committed.await {
                Ok(Ok(())) => publish_all(engine, records).await,
                Ok(Err(err)) => {
                    tracing::error!(error = %eventbus_core::error_chain(&*err), count = records.len(), "dead letters not stored; their events stay unfinished in the store")
                }
                Err(_) => {
                    tracing::error!(count = records.len(), "the store writer stopped before storing dead letters")
                }
            }
        });
    }

    /// The sink is set: publishes what waited for it.
    pub(crate) fn release_waiting(&self) {
        let waiting = std::mem::take(&mut *self.inner.outbox.waiting.lock());
        if !waiting.is_empty() {
            tracing::info!(count = waiting.len(), "publishing dead letters left unpublished by the last run");
            tokio::spawn(publish_all(Arc::downgrade(&self.inner), waiting));
        }
    }
}

async fn publish_all(engine: Weak<Inner>, records: Vec<(u64, DeadLetterRecord)>) {
    for (id, record) in records {
        publish_one(&engine, id, record).await;
    }
}

/// Publishes one record until it is answered (or the engine is gone: it stays stored
/// for the next start), then removes it from the outbox.
async fn publish_one(engine: &Weak<Inner>, id: u64, record: DeadLetterRecord) {
    let mut retry = FIRST_RETRY;
    loop {
        let Some(inner) = engine.upgrade() else { return };
        let Some(sink) = inner.sink.get().cloned() else {
            inner.outbox.waiting.lock().push((id, record));
            return;
        };
        drop(inner);
        match publish(&sink, &record).await {
            Ok(()) => break,
            Err(err) => {
                tracing::error!(channel = %record.channel, consumer = %record.consumer, event = %record.event_id, %err, retry_in = ?retry, "cannot publish a dead letter; it stays in the outbox");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
            }
        }
    }
    if let Some(inner) = engine.upgrade() {
        Durable { inner }.submit(vec![StoreOp::DeleteDeadLetter { id }]);
    }
}

async fn publish(sink: &DeadLetterSink, record: &DeadLetterRecord) -> Result<(), eventbus_core::Error> {
    sink(record.channel.clone(), record.payload.clone(), record.content_type.clone()).await
}
