//! The contract every [`Store`] keeps, run on each: the fjall store, the memory store
//! and (with the `migrate-redb` feature) redb's.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use eventbus_core::Event;
use eventbus_core::durable::{ConsumerConfig, Failure, LogEntry, LogStatus, Retention, epoch_ms};

use crate::store::{EntryRecord, RedriveSelection, Store, StoreOp};
use crate::{FjallStore, Fsync, MemoryStore};

pub(crate) fn event(id: &str) -> Arc<Event> {
    Arc::new(Event::from_parts(
        id.into(),
        "orders.created".into(),
        SystemTime::now(),
        "t".into(),
        bytes::Bytes::from_static(b"p"),
        Default::default(),
        String::new(),
    ))
}

pub(crate) fn log_entry(id: &str, status: LogStatus, finished_ms: u64) -> LogEntry {
    LogEntry {
        event_id: id.into(),
        channel: "orders.created".into(),
        status,
        attempts: 1,
        first_delivered_ms: Some(finished_ms),
        finished_ms,
        failures: vec![Failure { at_ms: finished_ms, reason: "x".into() }],
    }
}

pub(crate) const RETAIN: Retention = Retention { max_entries: 3, max_age_ms: 86_400_000 };

/// Opens a store of one kind on a directory (again after a reopen).
type Open = fn(&Path) -> Arc<dyn Store>;

#[cfg(feature = "migrate-redb")]
fn redb(dir: &Path) -> Arc<dyn Store> {
    Arc::new(crate::RedbStore::open(dir, Fsync::Always, RETAIN).unwrap())
}

fn fjall(dir: &Path) -> Arc<dyn Store> {
    Arc::new(FjallStore::open(dir, Fsync::Always, RETAIN).unwrap())
}

/// The memory store of `dir`: "reopened", the same store, which lives as long as the
/// process (as the broker's does).
fn memory(dir: &Path) -> Arc<dyn Store> {
    type Open = std::collections::HashMap<std::path::PathBuf, Arc<MemoryStore>>;
    static OPEN: std::sync::LazyLock<parking_lot::Mutex<Open>> = std::sync::LazyLock::new(Default::default);
    let mut open = OPEN.lock();
    open.entry(dir.to_path_buf()).or_insert_with(|| Arc::new(MemoryStore::new(RETAIN))).clone()
}

macro_rules! on_each_store {
    ($($test:ident),* $(,)?) => {
        #[cfg(feature = "migrate-redb")]
        mod redb_store {
            $(#[test] fn $test() { super::$test(super::redb) })*
        }
        mod fjall_store {
            $(#[test] fn $test() { super::$test(super::fjall) })*
        }
        mod memory_store {
            $(#[test] fn $test() { super::$test(super::memory) })*
        }
    };
}

on_each_store!(
    survives_reopen_and_releases_shared_events,
    dead_letters_are_kept_for_redrive_within_the_bounds_and_moved_once,
    log_is_bounded_and_paged,
);

fn survives_reopen_and_releases_shared_events(open: Open) {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        store
            .apply(&[
                StoreOp::PutConsumer(ConsumerConfig::new("a", vec!["orders.>".into()])),
                StoreOp::PutConsumer(ConsumerConfig::new("b", vec!["orders.>".into()])),
                StoreOp::Capture {
                    seq: 1,
                    event: event("e1"),
                    ordering_key: Some("k".into()),
                    consumers: vec![a.clone(), b.clone()],
                    dedup: None,
                },
                StoreOp::Update {
                    consumer: a.clone(),
                    seq: 1,
                    entry: EntryRecord { attempts: 2, ..Default::default() },
                },
            ])
            .unwrap();
        let now = epoch_ms(SystemTime::now());
        store
            .apply(&[StoreOp::Finish { consumer: b, seq: 1, log: log_entry("e1", LogStatus::Completed, now) }])
            .unwrap();
    }
    let store = open(dir.path());
    let loaded = store.load().unwrap();
    assert_eq!(loaded.consumers.len(), 2);
    assert_eq!(loaded.events.len(), 1, "still held by a");
    assert_eq!(loaded.events[0].ordering_key.as_deref(), Some("k"));
    assert_eq!(loaded.entries, vec![("a".to_owned(), 1, EntryRecord { attempts: 2, ..Default::default() })]);
    assert_eq!(loaded.next_seq, 2);
    assert_eq!(loaded.finished.get("b"), Some(&crate::store::LogCounts { acked: 1, ..Default::default() }));
    store
        .apply(&[StoreOp::Finish { consumer: "a".into(), seq: 1, log: log_entry("e1", LogStatus::Completed, 2) }])
        .unwrap();
    assert!(store.load().unwrap().events.is_empty(), "released by the last holder");
}

fn dead_letters_are_kept_for_redrive_within_the_bounds_and_moved_once(open: Open) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c: Arc<str> = "c".into();
    let now = epoch_ms(SystemTime::now());
    for seq in 1..=5u64 {
        let id = format!("e{seq}");
        store
            .apply(&[
                StoreOp::Capture {
                    seq,
                    event: event(&id),
                    ordering_key: None,
                    consumers: vec![c.clone()],
                    dedup: None,
                },
                StoreOp::Finish { consumer: c.clone(), seq, log: log_entry(&id, LogStatus::DeadLettered, now) },
            ])
            .unwrap();
    }
    assert_eq!(store.redrivable("c"), 3, "the oldest beyond max_entries are dropped");
    assert_eq!(store.load().unwrap().events.len(), 3, "with their events");
    let next = AtomicU64::new(10);
    let ids = ["e2".to_owned(), "e4".to_owned()];
    let moved = store.redrive("c", RedriveSelection::Ids(&ids), &next).unwrap();
    assert_eq!(moved.iter().map(|m| (m.seq, &*m.event.id)).collect::<Vec<_>>(), [(10, "e4")], "e2 was dropped");
    assert!(store.redrive("c", RedriveSelection::Ids(&ids), &next).unwrap().is_empty(), "moved once");
    let rest = store.redrive("c", RedriveSelection::Oldest(10), &next).unwrap();
    assert_eq!(rest.iter().map(|m| &*m.event.id).collect::<Vec<_>>(), ["e3", "e5"]);
    assert_eq!(store.redrivable("c"), 0);
    let loaded = store.load().unwrap();
    let entries: Vec<u64> = loaded.entries.iter().map(|(_, seq, _)| *seq).collect();
    assert_eq!(entries, [10, 11, 12], "pending again under their new numbers");
    assert_eq!(loaded.events.len(), 3);
    assert_eq!(loaded.next_seq, 13);
    // The log keeps its newest 3 lines: the three `Redriven` ones.
    assert_eq!(loaded.finished.get("c").map(|c| (c.dead_lettered, c.redriven)), Some((0, 3)));
}

fn log_is_bounded_and_paged(open: Open) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let now = epoch_ms(SystemTime::now());
    for i in 0..5 {
        let status = if i % 2 == 0 { LogStatus::Completed } else { LogStatus::DeadLettered };
        store
            .apply(&[StoreOp::Finish { consumer: "c".into(), seq: i, log: log_entry(&format!("e{i}"), status, now) }])
            .unwrap();
    }
    let page = store.log("c", None, 2, None).unwrap();
    let ids: Vec<&str> = page.entries.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["e2", "e3"], "only the newest 3 are kept");
    let rest = store.log("c", None, 2, page.next).unwrap();
    assert_eq!(rest.entries.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["e4"]);
    assert!(rest.next.is_none());
    let dead = store.log("c", Some(LogStatus::DeadLettered), 10, None).unwrap();
    assert_eq!(dead.entries.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["e3"]);
    // Too old: dropped when the next line is written.
    store
        .apply(&[StoreOp::Finish { consumer: "old".into(), seq: 9, log: log_entry("old", LogStatus::Completed, 1) }])
        .unwrap();
    store
        .apply(&[StoreOp::Finish { consumer: "old".into(), seq: 10, log: log_entry("new", LogStatus::Completed, now) }])
        .unwrap();
    let ids: Vec<String> = store.log("old", None, 10, None).unwrap().entries.into_iter().map(|e| e.event_id).collect();
    assert_eq!(ids, ["new"]);
}
