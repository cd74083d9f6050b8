//! The durable conformance suite (`eventbus_testkit::conformance`) on the embedded
//! engine: every check on the in-memory store as a test of its own, and every check
//! in turn on the on-disk fjall store, whose commits go through the writer and sync
//! threads (unlike the in-memory store's inline ones).

use std::path::Path;
use std::sync::Arc;

use eventbus_durable::{Durable, FjallStore, Fsync, MemoryStore, Store};
use eventbus_testkit::conformance::{self, Harness, RETENTION, options};

/// The embedded engine on `store`.
fn harness(store: Arc<dyn Store>) -> Harness {
    let (options, sink, letters) = options();
    let engine = Durable::start(store, options).expect("embedded engine");
    engine.set_dead_letter_sink(sink);
    Harness::new(Box::new(engine), letters, Vec::new())
}

fn in_memory() -> Harness {
    harness(Arc::new(MemoryStore::new(RETENTION)))
}

fn on_disk(dir: &Path) -> Harness {
    harness(Arc::new(FjallStore::open(dir, Fsync::Always, RETENTION).expect("on-disk store")))
}

eventbus_testkit::durable_conformance!(async { Some(in_memory()) });

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_disk_passes_every_check() {
    let dirs = tempfile::tempdir().expect("temp dir");
    conformance::every_check(|check| {
        let dir = dirs.path().join(check);
        async move { on_disk(&dir) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_disk_dropped_capture_callers() {
    let dir = tempfile::tempdir().expect("temp dir");
    conformance::dropped_capture_callers(&mut on_disk(dir.path())).await;
}
