//! The embedded store's commit path (`RedbStore::apply`, run by the group-commit writer
//! thread): a group of 16 captures, as 16 concurrent unary publishers produce, and the
//! rest of those events' lives (delivered, acked). In memory, so the measure is CPU,
//! not the disk's sync.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use criterion::{Criterion, criterion_group, criterion_main};
use eventbus_core::Event;
use eventbus_core::durable::{LogEntry, LogStatus, Retention, epoch_ms};
use eventbus_durable::store::{EntryRecord, StoreOp};
use eventbus_durable::{Fsync, RedbStore, Store};

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

fn store_apply(c: &mut Criterion) {
    let retention = Retention { max_entries: 100_000, max_age_ms: 86_400_000 };
    let store = RedbStore::open(Path::new(""), Fsync::Always, retention).expect("in-memory store");
    let consumer: Arc<str> = "bench".into();
    let mut next = 1u64;
    c.bench_function("apply_16_captures", |b| {
        b.iter(|| {
            let ops = captures(next..next + GROUP, &consumer);
            next += GROUP;
            store.apply(black_box(&ops)).expect("apply");
        })
    });
    c.bench_function("apply_16_delivered_and_acked", |b| {
        let now = epoch_ms(SystemTime::now());
        b.iter(|| {
            let seqs = next..next + GROUP;
            next += GROUP;
            store.apply(&captures(seqs.clone(), &consumer)).expect("apply");
            let mut ops = Vec::new();
            for seq in seqs {
                let entry = EntryRecord { attempts: 1, first_delivered_ms: Some(now), ..Default::default() };
                ops.push(StoreOp::Update { consumer: Arc::clone(&consumer), seq, entry });
                let log = LogEntry {
                    event_id: format!("01J{seq:023}"),
                    channel: "bench.durable.orders".into(),
                    status: LogStatus::Completed,
                    attempts: 1,
                    first_delivered_ms: Some(now),
                    finished_ms: now,
                    failures: Vec::new(),
                };
                ops.push(StoreOp::Finish { consumer: Arc::clone(&consumer), seq, log });
            }
            store.apply(black_box(&ops)).expect("apply");
        })
    });
}

criterion_group!(benches, store_apply);
criterion_main!(benches);
