//! The group-commit writer thread: every change queued meanwhile goes into one store
//! transaction, so concurrent publishes share one commit (and one fsync).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::store::{Store, StoreError, StoreOp};

/// Most changes one group commit takes.
const MAX_GROUP: usize = 4096;
/// Changes queued for the writer before submitters wait.
pub(crate) const WRITER_QUEUE: usize = 65_536;

#[derive(Debug)]
pub(crate) struct WriteRequest {
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) done: Option<oneshot::Sender<Result<(), Arc<StoreError>>>>,
}

/// The group-commit writer: takes every queued change and commits them together. Ends
/// when the engine is gone (its queue closes).
pub(crate) fn writer_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<WriteRequest>,
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
            let result = store.apply(&ops).map_err(Arc::new);
            if let Err(err) = &result {
                tracing::error!(error = %eventbus_core::error_chain(&**err), changes = ops.len(), "durable store commit failed");
            }
            for req in batch {
                if let Some(done) = req.done {
                    let _ = done.send(result.clone());
                }
            }
        }
    }
}
