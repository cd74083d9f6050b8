//! Capture: storing a publish for every consumer it matches, before it is answered.
//! Concurrent publishes share one commit; an idempotency key is claimed at planning
//! time, so a repeat within the same batch is already a duplicate.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use eventbus_core::Event;
use eventbus_core::durable::{CaptureRequest, Captured, DurableError, epoch_ms};
use tokio::time::Instant;

use crate::engine::Durable;
use crate::state::{Consumer, Effects, add_entry, dispatch};
use crate::store::{DedupRecord, EntryRecord, StoreOp};
use crate::writer::writer_stopped;

/// Where a batch of captures stands once planned and queued.
enum Queued {
    Answered(Vec<Result<Captured, DurableError>>),
    Waiting(tokio::sync::oneshot::Receiver<Vec<Result<Captured, DurableError>>>),
}

/// A capture waiting for its store commit.
pub(crate) struct CapturePlan {
    seq: u64,
    event: Arc<Event>,
    key: Option<Arc<str>>,
    consumers: Vec<Arc<Consumer>>,
    dedup: Option<DedupRecord>,
    /// Taken for the commit.
    op: Option<StoreOp>,
}

impl Durable {
    /// Captures several events of one publisher with one store commit (one sync
    /// under `fsync: always`), in order. On a failed commit none is captured and the
    /// one answer is the error.
    pub async fn capture_many(&self, batch: &[CaptureRequest<'_>]) -> Vec<Result<Captured, DurableError>> {
        if self.inner.consumer_count.load(Ordering::Relaxed) == 0 && batch.iter().all(|r| r.idempotency_key.is_none()) {
            // The common case without consumers: nothing to store, nothing to plan.
            return batch.iter().map(|_| Ok(Captured::Stored(0))).collect();
        }
        let keyed = batch.iter().any(|r| r.ordering_key.is_some_and(|k| !k.is_empty()) || r.idempotency_key.is_some());
        let queued = {
            let _order = keyed.then(|| self.inner.sequencer.lock());
            self.plan_and_queue(batch)
        };
        match queued {
            Queued::Answered(answers) => answers,
            Queued::Waiting(answers) => answers.await.unwrap_or_else(|_| vec![Err(writer_stopped())]),
        }
    }

    /// Plans the captures and hands them to the writer: answered at once when nothing
    /// needs storing (or something was refused), else once committed. The plans are
    /// applied (or their keys freed) on the writer's side once the commit is known, so a
    /// publisher that goes away meanwhile (a killed client, a dropped future) cannot
    /// leave a stored capture out of its consumers' state.
    fn plan_and_queue(&self, batch: &[CaptureRequest<'_>]) -> Queued {
        let mut planned: Vec<Result<CapturePlan, Captured>> = Vec::with_capacity(batch.len());
        for r in batch {
            match self.plan_capture(r.event, r.ordering_key, r.idempotency_key) {
                Ok(plan) => planned.push(plan),
                Err(refused) => {
                    // Answers stop at the first error: what came before is captured,
                    // this one and the rest are not (their keys are not kept).
                    let plans: Vec<CapturePlan> = planned.into_iter().filter_map(Result::ok).collect();
                    self.forget_dedup(&plans);
                    return Queued::Answered(vec![Err(refused)]);
                }
            }
        }
        let ops: Vec<StoreOp> = planned.iter_mut().filter_map(|p| p.as_mut().ok()?.op.take()).collect();
        if !ops.is_empty()
            && let Some(full) = self.disk_full()
        {
            let plans: Vec<CapturePlan> = planned.into_iter().filter_map(Result::ok).collect();
            self.forget_dedup(&plans);
            return Queued::Answered(vec![Err(full)]);
        }
        if ops.is_empty() {
            return Queued::Answered(
                planned
                    .into_iter()
                    .map(|p| Ok(p.map(|plan| self.apply_capture(plan)).unwrap_or_else(|done| done)))
                    .collect(),
            );
        }
        let this = self.clone();
        Queued::Waiting(self.queue_then(ops, move |committed| {
            match committed {
                Ok(()) => planned
                    .into_iter()
                    .map(|p| Ok(p.map(|plan| this.apply_capture(plan)).unwrap_or_else(|done| done)))
                    .collect(),
                Err(err) => {
                    let plans: Vec<CapturePlan> = planned.into_iter().filter_map(Result::ok).collect();
                    this.forget_dedup(&plans);
                    vec![Err(err)]
                }
            }
        }))
    }

    /// What capturing `event` takes: `Err` when nothing needs storing (the answer is
    /// final), else the store op and what to apply once it is committed. Claims the
    /// idempotency key at once, so a repeat later in the same batch is a duplicate.
    /// Refused when the event matches more consumers than `max_captures_per_publish`.
    fn plan_capture(
        &self,
        event: &Arc<Event>,
        ordering_key: Option<&str>,
        idempotency_key: Option<&str>,
    ) -> Result<Result<CapturePlan, Captured>, DurableError> {
        if idempotency_key.is_none() && self.inner.consumer_count.load(Ordering::Relaxed) == 0 {
            return Ok(Err(Captured::Stored(0)));
        }
        let mut consumers: Vec<Arc<Consumer>> = {
            let registry = self.inner.registry.read();
            let mut names = Vec::new();
            registry.trie.collect(&event.channel, &mut names);
            names.sort();
            names.dedup();
            names.iter().filter_map(|n| registry.by_name.get(n).cloned()).collect()
        };
        let limit = self.inner.options.max_captures_per_publish;
        if limit != 0 && consumers.len() > limit {
            return Err(DurableError::TooManyCaptures {
                channel: event.channel.to_string(),
                matched: consumers.len(),
                limit,
            });
        }
        let window = self.inner.options.dedup_window;
        let dedup = match idempotency_key {
            Some(key) => {
                let mut d = self.inner.dedup.lock();
                let now = Instant::now();
                d.prune(now);
                if let Some((original, _)) = d.keys.get(key) {
                    return Ok(Err(Captured::Duplicate(original.clone())));
                }
                let expires_ms = epoch_ms(event.timestamp) + window.as_millis() as u64;
                d.insert(key.to_owned(), event.id.to_string(), now + window);
                Some(DedupRecord { key: key.to_owned(), event_id: event.id.to_string(), expires_ms })
            }
            None => None,
        };
        // A consumer holding `max_pending` events takes no more (docs/limits.md).
        consumers.retain(|c| {
            let full = c.config.max_pending != 0 && c.held.load(Ordering::Relaxed) >= c.config.max_pending;
            if full && c.dropped.fetch_add(1, Ordering::Relaxed) % 10_000 == 0 {
                tracing::warn!(consumer = %c.name, max_pending = c.config.max_pending, dropped = c.dropped.load(Ordering::Relaxed), "durable consumer full: captures dropped for it (logged once per 10,000)");
            }
            !full
        });
        if consumers.is_empty() && dedup.is_none() {
            return Ok(Err(Captured::Stored(0)));
        }
        let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
        let key: Option<Arc<str>> = ordering_key.filter(|k| !k.is_empty()).map(Arc::from);
        let op = match (consumers.is_empty(), dedup.clone()) {
            (true, Some(record)) => StoreOp::Dedup(record),
            _ => StoreOp::Capture {
                seq,
                event: Arc::clone(event),
                ordering_key: key.clone(),
                consumers: consumers.iter().map(|c| Arc::clone(&c.name)).collect(),
                dedup: dedup.clone(),
            },
        };
        Ok(Ok(CapturePlan { seq, event: Arc::clone(event), key, consumers, dedup, op: Some(op) }))
    }

    /// A commit failed: the keys these plans claimed are free again.
    fn forget_dedup(&self, plans: &[CapturePlan]) {
        let mut d = self.inner.dedup.lock();
        for record in plans.iter().filter_map(|p| p.dedup.as_ref()) {
            d.keys.remove(&record.key);
        }
    }

    /// Hands a committed capture to its consumers.
    fn apply_capture(&self, plan: CapturePlan) -> Captured {
        let mut fx = Effects::default();
        for consumer in &plan.consumers {
            let mut st = consumer.state.lock();
            if st.deleted {
                continue;
            }
            let (event, key) = (Arc::clone(&plan.event), plan.key.clone());
            add_entry(consumer, &mut st, plan.seq, event, key, EntryRecord::default(), None, &mut fx);
            dispatch(consumer, &mut st, &mut fx);
        }
        self.run(fx);
        Captured::Stored(plan.consumers.len())
    }
}
