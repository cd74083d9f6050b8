//! The embedded stores' commit path, as the group-commit writer runs it: a group of 16
//! captures (what 16 concurrent unary publishers produce), and the rest of those
//! events' lives (delivered, acked).
//!
//! - `*/write`: the commit without the disk's sync (`Store::write`): CPU. The memory
//!   store, and fjall on a temporary directory (its journal reaches the page cache).
//! - `*/synced`: a group written and synced on disk (`Store::apply`, fsync always),
//!   fjall (and redb, with the `migrate-redb` feature) on a temporary directory: the
//!   disk's sync included.

use std::hint::black_box;
use std::sync::Arc;
use std::time::SystemTime;

use criterion::{Criterion, criterion_group, criterion_main};
use eventbus_core::Event;
use eventbus_core::durable::{LogEntry, LogStatus, Retention, epoch_ms};
use eventbus_durable::store::{EntryRecord, StoreOp};
use eventbus_durable::{FjallStore, Fsync, MemoryStore, Store};

const GROUP: u64 = 16;

fn event(seq: u64) -> Arc<Event> {
    Arc::new(Event::from_parts(
        format!("01J{seq:023}"),
        "bench.durable.orders".into(),
        SystemTime::now(),
        String::new(),
        bytes::Bytes::from_static(&[0xAB; 128]),
        Default::default(),
        String::new(),
    ))
}

/// One capture per sequence number, each for `consumer`.
fn captures(seqs: std::ops::Range<u64>, consumer: &Arc<str>) -> Vec<StoreOp> {
    seqs.map(|seq| StoreOp::Capture {
        seq,
        event: event(seq),
        ordering_key: None,
        consumers: vec![Arc::clone(consumer)],
        dedup: None,
    })
    .collect()
}

const RETENTION: Retention = Retention { max_entries: 100_000, max_age_ms: 86_400_000 };

/// The ops that deliver and ack `seqs` for `consumer`.
fn delivered_and_acked(seqs: std::ops::Range<u64>, consumer: &Arc<str>, now: u64) -> Vec<StoreOp> {
    let mut ops = Vec::new();
    for seq in seqs {
        let entry = EntryRecord { attempts: 1, first_delivered_ms: Some(now), ..Default::default() };
        ops.push(StoreOp::Update { consumer: Arc::clone(consumer), seq, entry });
        let log = LogEntry {
            event_id: format!("01J{seq:023}"),
            channel: "bench.durable.orders".into(),
            status: LogStatus::Completed,
            attempts: 1,
            first_delivered_ms: Some(now),
            finished_ms: now,
            failures: Vec::new(),
        };
        ops.push(StoreOp::Finish { consumer: Arc::clone(consumer), seq, log });
    }
    ops
}

/// Runs both workloads on `store`, committing with `commit` (write, or write + sync).
fn workloads(c: &mut Criterion, name: &str, store: &dyn Store, commit: fn(&dyn Store, &[StoreOp])) {
    let consumer: Arc<str> = "bench".into();
    let mut next = 1u64;
    c.bench_function(&format!("{name}/16_captures"), |b| {
        b.iter(|| {
            let ops = captures(next..next + GROUP, &consumer);
            next += GROUP;
            commit(store, black_box(&ops));
        })
    });
    c.bench_function(&format!("{name}/16_captured_delivered_acked"), |b| {
        let now = epoch_ms(SystemTime::now());
        b.iter(|| {
            let seqs = next..next + GROUP;
            next += GROUP;
            commit(store, &captures(seqs.clone(), &consumer));
            commit(store, black_box(&delivered_and_acked(seqs, &consumer, now)));
        })
    });
}

fn write(store: &dyn Store, ops: &[StoreOp]) {
    store.write(ops).expect("write");
}

fn synced(store: &dyn Store, ops: &[StoreOp]) {
    store.apply(ops).expect("apply");
}

fn stores(c: &mut Criterion) {
    let memory = MemoryStore::new(RETENTION);
    workloads(c, "memory/write", &memory, write);
    let dir = tempfile::tempdir().expect("temporary directory");
    let fjall = FjallStore::open(dir.path(), Fsync::Always, RETENTION).expect("fjall store");
    workloads(c, "fjall/write", &fjall, write);
    workloads(c, "fjall/synced", &fjall, synced);
    drop(fjall);
    #[cfg(feature = "migrate-redb")]
    {
        let dir = tempfile::tempdir().expect("temporary directory");
        let redb = eventbus_durable::RedbStore::open(dir.path(), Fsync::Always, RETENTION).expect("redb store");
        workloads(c, "redb/synced", &redb, synced);
    }
}

criterion_group!(benches, stores);
criterion_main!(benches);
