//! What local subscriptions need from Redis, shared by both transports: the filters,
//! versioned so a subscriber can wait until Redis has the version that includes its own
//! (the `started` message means "live everywhere"). A set, not a queue of commands: a
//! transport reconciles what Redis has with it, so nothing piles up while Redis is away.

use std::collections::BTreeSet;

use eventbus_core::transport::WatchedFuture;
use eventbus_core::{Pattern, TransportStatus};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

#[derive(Debug, Default)]
struct Wanted {
    filters: BTreeSet<Pattern>,
    version: u64,
}

#[derive(Debug)]
pub(crate) struct Demand {
    wanted: Mutex<Wanted>,
    /// Woken on every change, for the transport's task.
    pub(crate) changed: Notify,
    /// Version last applied to Redis.
    applied: watch::Sender<u64>,
}

impl Demand {
    pub(crate) fn new() -> Self {
        Self { wanted: Mutex::default(), changed: Notify::new(), applied: watch::Sender::new(0) }
    }

    pub(crate) fn watch(&self, filter: &Pattern) {
        self.change(|filters| {
            filters.insert(filter.clone());
        });
    }

    pub(crate) fn unwatch(&self, filter: &Pattern) {
        self.change(|filters| {
            filters.remove(filter);
        });
    }

    fn change(&self, edit: impl FnOnce(&mut BTreeSet<Pattern>)) {
        let mut wanted = self.wanted.lock();
        edit(&mut wanted.filters);
        wanted.version += 1;
        drop(wanted);
        self.changed.notify_one();
    }

    /// `read` of the filters wanted now, and their version (for [`Demand::applied`]).
    pub(crate) fn read<R>(&self, read: impl FnOnce(&BTreeSet<Pattern>) -> R) -> (R, u64) {
        let wanted = self.wanted.lock();
        (read(&wanted.filters), wanted.version)
    }

    /// Redis has every filter of `version`.
    pub(crate) fn applied(&self, version: u64) {
        self.applied.send_replace(version);
    }

    /// Resolves once Redis has every filter wanted now, or while not connected (they are
    /// restored on reconnect).
    pub(crate) fn watched<'a>(&'a self, status: &'a watch::Sender<TransportStatus>) -> WatchedFuture<'a> {
        Box::pin(async move {
            let target = self.wanted.lock().version;
            let mut applied = self.applied.subscribe();
            let mut status = status.subscribe();
            loop {
                if *applied.borrow_and_update() >= target || !status.borrow_and_update().connected {
                    return;
                }
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { return },
                    changed = status.changed() => if changed.is_err() { return },
                }
            }
        })
    }
}
