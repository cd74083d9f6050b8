//! A push consumer acts with its owner's rights (docs/push.md "Whose rights it uses"),
//! judged as an open stream of that principal is: when it starts, and again after each
//! reload of the principals. While the owner is gone or may not subscribe to the
//! consumer's channels, the worker stays detached: nothing is sent, the events wait in
//! the consumer, a log line and `push_owner_revoked` say why, until a reload restores
//! the right or an admin deletes the consumer.

use prometheus::IntGauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::access::Access;

/// One push consumer's owner and the channels it needs the right to.
#[derive(Debug)]
pub(crate) struct Owner {
    consumer: String,
    owner: String,
    channels: Vec<String>,
    access: Access,
    reloads: watch::Receiver<u64>,
    revoked: IntGauge,
}

impl Owner {
    pub(crate) fn new(
        consumer: String,
        owner: String,
        channels: Vec<String>,
        access: Access,
        revoked: IntGauge,
    ) -> Self {
        let reloads = access.reloads();
        Self { consumer, owner, channels, access, reloads, revoked }
    }

    /// Resolves once the owner may receive the consumer's events: at once when it may;
    /// else after the reload that gives the right back. `false` when `stop` comes first.
    pub(crate) async fn allowed(&mut self, stop: &CancellationToken) -> bool {
        // Marked before the check: a reload after it is seen by `revoked`.
        self.reloads.mark_unchanged();
        let mut stopped = false;
        loop {
            match self.access.owner_refusal(&self.owner, &self.channels) {
                None => {
                    if stopped {
                        info!(consumer = %self.consumer, owner = %self.owner, "push consumer resumed: its owner's rights are back");
                    }
                    self.revoked.set(0);
                    return true;
                }
                Some(why) if !stopped => {
                    warn!(
                        consumer = %self.consumer, owner = %self.owner, %why,
                        "push consumer stopped: nothing is sent until its owner's rights are restored or an admin deletes it"
                    );
                    self.revoked.set(1);
                    stopped = true;
                }
                Some(_) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                changed = self.reloads.changed() => if changed.is_err() {
                    stop.cancelled().await;
                    return false;
                },
            }
        }
    }

    /// Resolves when a reload withdraws the owner's rights. Cancel-safe: a `select!`
    /// branch.
    pub(crate) async fn revoked(&mut self) {
        loop {
            if self.reloads.changed().await.is_err() {
                return std::future::pending().await;
            }
            if self.access.owner_refusal(&self.owner, &self.channels).is_some() {
                return;
            }
        }
    }
}

impl Drop for Owner {
    /// A retired worker (its consumer deleted or redefined) is no longer stopped.
    fn drop(&mut self) {
        self.revoked.set(0);
    }
}
