//! An attached client: acks, nacks, extends and terms, applied to its consumer's state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventbus_core::durable::{
    BoxFuture, ConsumerClient, ConsumerInfo, Delivery, Failure, LogStatus, REASON_DISCONNECT, REASON_TERM, epoch_ms,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::engine::Durable;
use crate::state::{Consumer, ConsumerState, Effects, EntryState, dead_letter, dispatch, fail, finish, release_client};
use crate::store::StoreOp;

/// A client attached to a consumer: its deliveries and its handle.
#[derive(Debug)]
pub struct Attached {
    pub info: ConsumerInfo,
    pub deliveries: mpsc::Receiver<Vec<Delivery>>,
    pub client: ClientHandle,
}

/// Acks and friends for one attached client. Dropping it detaches the client: events
/// it holds count a failed attempt ("consumer disconnected") and are released at once.
#[derive(Debug)]
pub struct ClientHandle {
    pub(crate) durable: Durable,
    pub(crate) consumer: Arc<Consumer>,
    pub(crate) id: u64,
}

impl ClientHandle {
    fn with_state(&self, f: impl FnOnce(&Arc<Consumer>, &mut ConsumerState, &mut Effects)) {
        let mut fx = Effects::default();
        {
            let mut st = self.consumer.state.lock();
            f(&self.consumer, &mut st, &mut fx);
            dispatch(&self.consumer, &mut st, &mut fx);
        }
        let latencies = std::mem::take(&mut fx.acks);
        if let Some(on_ack) = &self.durable.inner.options.on_ack {
            for l in latencies {
                on_ack(&self.consumer.name, l);
            }
        }
        self.durable.run(fx);
    }

    /// Completes events (also late acks; unknown ids are ignored: already done).
    pub fn ack(&self, event_ids: &[String]) {
        self.with_state(|c, st, fx| {
            for id in event_ids {
                if let Some(seq) = st.by_id.get(id.as_str()).copied() {
                    if let Some(EntryState::InFlight { client, since, .. }) = st.entries.get(&seq).map(|e| &e.state) {
                        fx.acks.push(since.elapsed());
                        let client = *client;
                        release_client(st, client);
                    }
                    finish(c, st, seq, LogStatus::Completed, fx);
                }
            }
        });
    }

    /// Fails one in-flight event now; redelivered after `delay` or the backoff.
    pub fn nack(&self, event_id: &str, reason: &str, delay: Option<Duration>) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let Some(seq) = st.by_id.get(event_id).copied() else { return };
            if matches!(st.entries.get(&seq).map(|e| &e.state), Some(EntryState::InFlight { client, .. }) if *client == id)
            {
                release_client(st, id);
                let reason = if reason.is_empty() { "nacked" } else { reason };
                fail(c, st, seq, reason.to_owned(), delay, fx);
            }
        });
    }

    /// Moves the deadlines of in-flight events to `by` from now (0 = the ack deadline).
    pub fn extend(&self, event_ids: &[String], by: Duration) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let by = if by.is_zero() { c.config.ack_deadline() } else { by };
            let deadline = Instant::now() + by;
            for event_id in event_ids {
                let Some(seq) = st.by_id.get(event_id.as_str()).copied() else { continue };
                if let Some(entry) = st.entries.get_mut(&seq)
                    && let EntryState::InFlight { client, deadline: d, .. } = &mut entry.state
                    && *client == id
                {
                    *d = deadline;
                    fx.timers.push((deadline, Arc::clone(c), seq));
                }
            }
        });
    }

    /// Dead-letters an in-flight event now.
    pub fn term(&self, event_id: &str, reason: &str) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            let Some(seq) = st.by_id.get(event_id).copied() else { return };
            if matches!(st.entries.get(&seq).map(|e| &e.state), Some(EntryState::InFlight { client, .. }) if *client == id)
            {
                release_client(st, id);
                let reason = if reason.is_empty() { REASON_TERM } else { reason };
                if let Some(e) = st.entries.get_mut(&seq) {
                    e.record.failures.push(Failure { at_ms: epoch_ms(SystemTime::now()), reason: reason.to_owned() });
                }
                dead_letter(c, st, seq, fx);
            }
        });
    }

    /// Hands in-flight events this client has not started back to the consumer at
    /// once: the attempt their delivery counted is taken back, no backoff. With
    /// `drain`, the client takes no more deliveries and gets the empty batch that says so.
    pub fn release(&self, event_ids: &[String], drain: bool) {
        let id = self.id;
        let mut released = 0usize;
        self.with_state(|c, st, fx| {
            for event_id in event_ids {
                let Some(seq) = st.by_id.get(event_id.as_str()).copied() else { continue };
                let Some(entry) = st.entries.get_mut(&seq) else { continue };
                if !matches!(entry.state, EntryState::InFlight { client, .. } if client == id) {
                    continue;
                }
                entry.record.attempts = entry.record.attempts.saturating_sub(1);
                entry.state = EntryState::Ready;
                fx.ops.push(StoreOp::Update { consumer: Arc::clone(&c.name), seq, entry: entry.record.clone() });
                st.ready.insert(seq);
                release_client(st, id);
                released += 1;
            }
            if drain && let Some(client) = st.clients.iter_mut().find(|cl| cl.id == id && !cl.draining) {
                client.draining = true;
                fx.sends.push((client.tx.clone(), Vec::new()));
            }
        });
        // A client that leaves holding nothing unstarted (every clean exit) is not news.
        if released > 0 {
            tracing::info!(consumer = %self.consumer.name, client = id, released, drain, "events released unstarted by a client");
        } else if drain {
            tracing::debug!(consumer = %self.consumer.name, client = id, "client draining, nothing unstarted to release");
        }
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        let id = self.id;
        self.with_state(|c, st, fx| {
            st.clients.retain(|cl| cl.id != id);
            let held: Vec<u64> = st
                .entries
                .iter()
                .filter(|(_, e)| matches!(e.state, EntryState::InFlight { client, .. } if client == id))
                .map(|(seq, _)| *seq)
                .collect();
            for seq in held {
                fail(c, st, seq, REASON_DISCONNECT.into(), None, fx);
            }
        });
    }
}

impl ConsumerClient for ClientHandle {
    fn ack(&self, event_ids: Vec<String>) -> BoxFuture<'_, ()> {
        ClientHandle::ack(self, &event_ids);
        Box::pin(std::future::ready(()))
    }

    fn nack(&self, event_id: String, reason: String, delay: Option<Duration>) -> BoxFuture<'_, ()> {
        ClientHandle::nack(self, &event_id, &reason, delay);
        Box::pin(std::future::ready(()))
    }

    fn extend(&self, event_ids: Vec<String>, by: Duration) -> BoxFuture<'_, ()> {
        ClientHandle::extend(self, &event_ids, by);
        Box::pin(std::future::ready(()))
    }

    fn term(&self, event_id: String, reason: String) -> BoxFuture<'_, ()> {
        ClientHandle::term(self, &event_id, &reason);
        Box::pin(std::future::ready(()))
    }

    fn release(&self, event_ids: Vec<String>, drain: bool) -> BoxFuture<'_, ()> {
        ClientHandle::release(self, &event_ids, drain);
        Box::pin(std::future::ready(()))
    }
}
