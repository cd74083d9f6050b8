//! The timer scheduler: one task holds every timer (ack deadlines, redeliveries) in a
//! sorted map and sleeps until the earliest; stale timers are recognised and skipped.
//! No timer, no wake-up (zero CPU when idle).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use eventbus_core::durable::REASON_DEADLINE;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::engine::{Durable, Inner};
use crate::state::{Consumer, Effects, EntryState, dispatch, fail, release_client};

/// Every pending timer: (due, tie-breaker) → (consumer, event seq).
pub(crate) type Timers = BTreeMap<(Instant, u64), (Weak<Consumer>, u64)>;

/// Sleeps until the earliest timer, fires every due one, repeats. No timer, no wake-up.
pub(crate) async fn run_scheduler(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        // `notify_one` leaves a permit when nobody waits: a timer added after this
        // look still wakes the sleep below.
        let notified = wake.notified();
        let next = {
            let Some(strong) = inner.upgrade() else {
                // The engine is being dropped, and its drop aborts this task: wait for
                // that rather than end first (an end before it is reported as a failure).
                return std::future::pending().await;
            };
            let now = Instant::now();
            let next = strong.timers.lock().first_key_value().map(|(k, _)| k.0);
            if next.is_some_and(|n| n <= now) {
                fire_due(&Durable { inner: strong }, now);
                continue;
            }
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = notified => {}
                }
            }
            None => notified.await,
        }
    }
}

pub(crate) fn fire_due(durable: &Durable, now: Instant) {
    let due: Vec<(Weak<Consumer>, u64)> = {
        let mut timers = durable.inner.timers.lock();
        let later = timers.split_off(&(now + Duration::from_nanos(1), 0));
        std::mem::replace(&mut *timers, later).into_values().collect()
    };
    for (consumer, seq) in due {
        if let Some(consumer) = consumer.upgrade() {
            durable.fire(&consumer, seq);
        }
    }
}

impl Durable {
    /// A timer fired: an ack deadline passed or a redelivery is due.
    pub(crate) fn fire(&self, consumer: &Arc<Consumer>, seq: u64) {
        let now = Instant::now();
        let mut fx = Effects::default();
        {
            let mut st = consumer.state.lock();
            let Some(entry) = st.entries.get(&seq) else { return };
            match entry.state {
                EntryState::InFlight { client, deadline, .. } if deadline <= now => {
                    release_client(&mut st, client);
                    fail(consumer, &mut st, seq, REASON_DEADLINE.into(), None, &mut fx);
                }
                EntryState::Waiting(due) if due <= now => {
                    if let Some(e) = st.entries.get_mut(&seq) {
                        e.state = EntryState::Ready;
                    }
                    st.ready.insert(seq);
                    consumer.redelivered.fetch_add(1, Ordering::Relaxed);
                }
                _ => return,
            }
            dispatch(consumer, &mut st, &mut fx);
        }
        self.run(fx);
    }
}
