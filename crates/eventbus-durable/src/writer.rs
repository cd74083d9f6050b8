//! The group-commit writer thread: every change queued meanwhile goes into one store
//! transaction, so concurrent publishes share one commit (and one fsync).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use eventbus_core::durable::DurableError;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::store::{BATCH_FLUSH_MS, Store, StoreError, StoreOp};

/// Most changes one group commit takes.
const MAX_GROUP: usize = 4096;
/// Changes queued for the writer before submitters wait.
pub(crate) const WRITER_QUEUE: usize = 65_536;

/// A commit's outcome as a waiting caller sees it.
pub(crate) type CommitResult = Result<(), Arc<StoreError>>;

/// Work that must follow a commit, run with its outcome.
pub(crate) type AfterCommit = Box<dyn FnOnce(Result<(), DurableError>) + Send>;

/// What the writer does once a request's changes are committed (or refused).
pub(crate) enum Completion {
    /// Nothing: nobody waits.
    None,
    /// Tells a waiting caller.
    Notify(oneshot::Sender<CommitResult>),
    /// Runs on the writer's side, whether or not whoever queued the changes still
    /// waits: the in-memory state that must follow a commit (a capture handed to its
    /// consumers, a consumer registered) cannot be skipped by a caller that went away.
    Then(AfterCommit),
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Completion::None => "None",
            Completion::Notify(_) => "Notify",
            Completion::Then(_) => "Then",
        })
    }
}

#[derive(Debug)]
pub(crate) struct WriteRequest {
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) done: Completion,
}

impl WriteRequest {
    /// Completes the request with the commit's outcome.
    pub(crate) fn complete(self, result: &CommitResult) {
        match self.done {
            Completion::None => {}
            Completion::Notify(tx) => {
                let _ = tx.send(result.clone());
            }
            Completion::Then(then) => {
                then(result.clone().map_err(|err| DurableError::internal("commit", err)));
            }
        }
    }

    /// The writer is gone: the request will never be committed. Work waiting for it
    /// still runs, told so.
    pub(crate) fn abandon(self) {
        match self.done {
            Completion::None | Completion::Notify(_) => {}
            Completion::Then(then) => then(Err(writer_stopped())),
        }
    }
}

/// The writer's queue, first in first out even when full: a request that finds it full
/// waits in an overflow, and so does every request after it until the overflow has
/// drained, so that requests queued in order (keyed captures, under the sequencer)
/// reach the writer in that order, however hard the writer is pressed.
#[derive(Debug)]
pub(crate) struct WriteQueue {
    tx: mpsc::Sender<WriteRequest>,
    /// Requests waiting for room, in order; drained by one task at a time.
    overflow: parking_lot::Mutex<VecDeque<WriteRequest>>,
    /// `overflow` is not empty: the lock-free test on the way in.
    overflowing: AtomicBool,
}

impl WriteQueue {
    pub(crate) fn new(tx: mpsc::Sender<WriteRequest>) -> Arc<Self> {
        Arc::new(Self { tx, overflow: parking_lot::Mutex::default(), overflowing: AtomicBool::new(false) })
    }

    /// Hands a request to the writer, or behind the ones waiting for room (off the
    /// caller's path). False when the writer has stopped (the request is abandoned:
    /// work waiting for it runs, told so).
    pub(crate) fn queue(self: &Arc<Self>, req: WriteRequest) -> bool {
        if !self.overflowing.load(Ordering::Acquire) {
            match self.tx.try_send(req) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Closed(req)) => {
                    req.abandon();
                    return false;
                }
                Err(mpsc::error::TrySendError::Full(req)) => return self.overflow(req),
            }
        }
        self.overflow(req)
    }

    fn overflow(self: &Arc<Self>, req: WriteRequest) -> bool {
        let mut waiting = self.overflow.lock();
        if waiting.is_empty() {
            // Emptied meanwhile (the drain ended): room may be back.
            match self.tx.try_send(req) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Closed(req)) => {
                    req.abandon();
                    return false;
                }
                Err(mpsc::error::TrySendError::Full(req)) => waiting.push_back(req),
            }
            self.overflowing.store(true, Ordering::Release);
            tokio::spawn(Arc::clone(self).drain());
        } else {
            waiting.push_back(req);
        }
        true
    }

    /// Sends the waiting requests as room frees up, in order, until none waits.
    async fn drain(self: Arc<Self>) {
        loop {
            let Ok(permit) = self.tx.reserve().await else {
                let abandoned = std::mem::take(&mut *self.overflow.lock());
                self.overflowing.store(false, Ordering::Release);
                abandoned.into_iter().for_each(WriteRequest::abandon);
                return;
            };
            // Sent under the lock: a request queued meanwhile goes behind it.
            let mut waiting = self.overflow.lock();
            if let Some(req) = waiting.pop_front() {
                permit.send(req);
            }
            if waiting.is_empty() {
                self.overflowing.store(false, Ordering::Release);
                return;
            }
        }
    }
}

/// The error of a change the writer will never commit.
pub(crate) fn writer_stopped() -> DurableError {
    DurableError::unavailable("the durable store writer has stopped")
}

/// A group the writer appended, waiting for the sync that makes it durable.
pub(crate) struct Written {
    batch: Vec<WriteRequest>,
    result: CommitResult,
}

/// Groups appended but not yet synced before the writer waits for the sync thread.
pub(crate) const SYNC_QUEUE: usize = 64;

/// The group-commit writer: takes every queued change and appends them together
/// ([`Store::write`]), then hands the group to the sync thread and goes on with the
/// next one: changes queued while a sync runs are prepared and appended meanwhile, and
/// join the next sync. Ends when the engine is gone (its queue closes) or the sync
/// thread is.
pub(crate) fn writer_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<WriteRequest>,
    synced: std::sync::mpsc::SyncSender<Written>,
) -> impl FnOnce() + Send + 'static {
    move || {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            let mut ops_count = batch[0].ops.len();
            while ops_count < MAX_GROUP {
                match rx.try_recv() {
                    Ok(req) => {
                        ops_count += req.ops.len();
                        batch.push(req);
                    }
                    Err(_) => break,
                }
            }
            let ops: Vec<StoreOp> = batch.iter_mut().flat_map(|r| std::mem::take(&mut r.ops)).collect();
            let result = store.write(&ops).map_err(Arc::new);
            if let Err(err) = &result {
                tracing::error!(error = %eventbus_core::error_chain(&**err), changes = ops.len(), "durable store commit failed");
            }
            if let Err(std::sync::mpsc::SendError(lost)) = synced.send(Written { batch, result }) {
                tracing::error!(changes = ops.len(), "durable store sync thread has stopped; refusing further changes");
                lost.batch.into_iter().for_each(WriteRequest::abandon);
                break;
            }
        }
    }
}

/// The sync thread: makes every group appended so far durable with one sync
/// ([`Store::sync`]), then completes them, in commit order, in the runtime's context
/// (work that follows a commit may spawn tasks). With `fsync: batch`, writes left
/// unsynced are synced within [`BATCH_FLUSH_MS`]. Ends when the writer does.
pub(crate) fn sync_loop(
    store: Arc<dyn Store>,
    rx: std::sync::mpsc::Receiver<Written>,
    runtime: Option<Handle>,
) -> impl FnOnce() + Send + 'static {
    move || {
        loop {
            // Writes left unsynced (`fsync: batch`) are synced within the flush
            // interval even when nothing else is written; an idle store sleeps.
            let first = match store.unsynced() {
                true => match rx.recv_timeout(Duration::from_millis(BATCH_FLUSH_MS)) {
                    Ok(group) => group,
                    Err(RecvTimeoutError::Timeout) => {
                        if let Err(err) = store.sync() {
                            tracing::error!(error = %eventbus_core::error_chain(&err), "durable store sync failed");
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                },
                false => match rx.recv() {
                    Ok(group) => group,
                    Err(_) => break,
                },
            };
            let mut groups = vec![first];
            groups.extend(rx.try_iter());
            let synced = match groups.iter().any(|g| g.result.is_ok()) {
                true => store.sync().map_err(Arc::new),
                false => Ok(()),
            };
            if let Err(err) = &synced {
                tracing::error!(error = %eventbus_core::error_chain(&**err), "durable store sync failed");
            }
            let _context = runtime.as_ref().map(Handle::enter);
            for group in groups {
                let result = group.result.and(synced.clone());
                for req in group.batch {
                    req.complete(&result);
                }
            }
        }
    }
}
