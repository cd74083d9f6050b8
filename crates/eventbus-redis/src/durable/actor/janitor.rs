//! The janitor, run by an actor while clients are attached: failed events whose retry is
//! due go back onto the stream, events held past their ack deadline by instances that
//! went away are claimed (XAUTOCLAIM), entries orphaned by a restart are released, and
//! the terminal log is trimmed by age.

use std::time::Duration;

use eventbus_core::durable::REASON_DISCONNECT;
use futures::StreamExt;
use redis::RedisResult;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::outbox::OUTBOX_GRACE;
use super::*;
use crate::durable::{GROUP, now_ms};

/// Entries one janitor run handles.
const JANITOR_BATCH: usize = 256;

/// Orphaned entries listed per XPENDING page.
const ORPHAN_PAGE: usize = 1000;

impl Actor {
    /// Releases the entries an earlier actor of this instance left in flight: it lost
    /// Redis and its clients were told to reconnect, so nobody holds them any more.
    /// Each counts a failed attempt ("consumer disconnected", as for any client that
    /// leaves) and comes back after its backoff, instead of only once its ack
    /// deadline has passed. Runs before the first read: everything this instance has
    /// pending then is an orphan. When Redis does not answer, the janitors reclaim
    /// them after the deadline as before.
    pub(super) async fn release_orphans(&mut self) {
        let mut start = "-".to_owned();
        loop {
            let page: RedisResult<Vec<(String, String, u64, u64)>> = redis::cmd("XPENDING")
                .arg(&self.stream)
                .arg(GROUP)
                .arg(&start)
                .arg("+")
                .arg(ORPHAN_PAGE)
                .arg(&self.shared.instance)
                .query_async(&mut self.shared.conn())
                .await;
            let page = match page {
                Ok(page) => page,
                Err(err) => {
                    if !is_missing_stream(&err) {
                        warn!(consumer = %self.rt.name, %err, "cannot list the events an earlier reader left in flight; they come back after their ack deadline");
                    }
                    return;
                }
            };
            let now = now_ms();
            for (sid, _, idle_ms, _) in &page {
                let first_ms = now.saturating_sub(*idle_ms);
                self.fails.push(FailItem {
                    sid: sid.clone(),
                    reason: REASON_DISCONNECT.to_owned(),
                    delay_ms: -1,
                    term: false,
                    first_ms,
                });
            }
            let Some((last, ..)) = page.last() else { break };
            if page.len() < ORPHAN_PAGE {
                break;
            }
            start = format!("({last}");
        }
        if self.fails.is_empty() {
            return;
        }
        debug!(consumer = %self.rt.name, events = self.fails.len(), "releasing events an earlier reader left in flight");
        self.flush();
        while let Some(outcome) = self.ops.next().await {
            if let Some(StopReason::Lost(err)) = self.take_outcome(outcome) {
                warn!(consumer = %self.rt.name, %err, "releasing the events an earlier reader left in flight failed; they come back after their ack deadline");
            }
        }
    }

    pub(super) fn schedule_janitor(&mut self, at: Instant) {
        let slack = Duration::from_millis(5);
        if self.janitor_at.range(at.checked_sub(slack).unwrap_or(at)..=at + slack).next().is_some() {
            return;
        }
        self.janitor_at.insert(at);
        self.add_timer(at, Timer::Janitor);
    }

    /// How often the janitor runs while clients are attached.
    pub(super) fn janitor_every(&self) -> Duration {
        (self.config.ack_deadline() / 2).clamp(Duration::from_millis(100), Duration::from_secs(15))
    }

    pub(super) fn run_janitor(&mut self) {
        let now = now_ms();
        let lock_ms = self.janitor_every().as_millis().max(50) as u64;
        let oldest = now.saturating_sub(self.shared.retention.max_age_ms);
        let mut args = Args::logging(&self.shared.scripts.tick, &self.rt);
        args.push(&self.rt.base)
            .push(GROUP)
            .push(now)
            .push(self.shared.retention.max_entries.max(1))
            .push(&self.shared.instance)
            .push(lock_ms)
            .push(self.config.ack_deadline_ms)
            .push(JANITOR_BATCH)
            .push(format!("{oldest}-0"));
        args.retry_config(&self.config);
        args.push(OUTBOX_GRACE.as_millis() as u64);
        self.script(|s| &s.tick, args, "janitor failed", |v| outcome_of(v, true));
    }
}
