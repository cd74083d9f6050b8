use std::sync::Arc;
use std::time::SystemTime;

use eventbus_core::Event;
use eventbus_core::durable::{ConsumerConfig, Failure};

use super::*;
use crate::store::EntryRecord;

fn event(id: &str) -> Arc<Event> {
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

fn log_entry(id: &str, status: LogStatus, finished_ms: u64) -> LogEntry {
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

const RETAIN: Retention = Retention { max_entries: 3, max_age_ms: 86_400_000 };

#[test]
fn survives_reopen_and_releases_shared_events() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RedbStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
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
    let store = RedbStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
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

#[test]
fn dead_letters_are_kept_for_redrive_within_the_bounds_and_moved_once() {
    let store = RedbStore::open(Path::new(""), Fsync::Always, RETAIN).unwrap();
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
    assert_eq!(moved.iter().map(|m| (m.seq, m.event.id.as_str())).collect::<Vec<_>>(), [(10, "e4")], "e2 was dropped");
    assert!(store.redrive("c", RedriveSelection::Ids(&ids), &next).unwrap().is_empty(), "moved once");
    let rest = store.redrive("c", RedriveSelection::Oldest(10), &next).unwrap();
    assert_eq!(rest.iter().map(|m| m.event.id.as_str()).collect::<Vec<_>>(), ["e3", "e5"]);
    assert_eq!(store.redrivable("c"), 0);
    let loaded = store.load().unwrap();
    let entries: Vec<u64> = loaded.entries.iter().map(|(_, seq, _)| *seq).collect();
    assert_eq!(entries, [10, 11, 12], "pending again under their new numbers");
    assert_eq!(loaded.events.len(), 3);
    assert_eq!(loaded.next_seq, 13);
    // The log keeps its newest 3 lines: the three `Redriven` ones.
    assert_eq!(loaded.finished.get("c").map(|c| (c.dead_lettered, c.redriven)), Some((0, 3)));
}

#[test]
fn log_is_bounded_and_paged() {
    let store = RedbStore::open(Path::new(""), Fsync::Always, RETAIN).unwrap();
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

#[test]
fn a_fresh_entry_is_the_default_record() {
    assert_eq!(FRESH_ENTRY, serde_json::to_string(&EntryRecord::default()).unwrap());
    assert_eq!(serde_json::from_str::<EntryRecord>(FRESH_ENTRY).unwrap(), EntryRecord::default());
}

#[test]
fn the_remembered_log_age_still_drops_lines_that_grow_old() {
    let mut store =
        RedbStore::open(Path::new(""), Fsync::Always, Retention { max_entries: 100, max_age_ms: 60_000 }).unwrap();
    let finish = |seq: u64, at: u64| StoreOp::Finish {
        consumer: "c".into(),
        seq,
        log: log_entry(&format!("e{seq}"), LogStatus::Completed, at),
    };
    let now = epoch_ms(SystemTime::now());
    store.apply(&[finish(1, now - 30_000)]).unwrap();
    store.apply(&[finish(2, now - 5_000)]).unwrap();
    assert_eq!(store.log("c", None, 10, None).unwrap().entries.len(), 2, "both young");
    // The age of e1, remembered, is judged against the clock of each append: once
    // past the bound (here the bound moves instead of the clock), e1 goes.
    store.retention.max_age_ms = 10_000;
    store.apply(&[finish(3, now - 5_000)]).unwrap();
    let ids: Vec<String> = store.log("c", None, 10, None).unwrap().entries.into_iter().map(|e| e.event_id).collect();
    assert_eq!(ids, ["e2", "e3"]);
    // A failed transaction forgets the remembered ages; the next append reads again.
    store.forget_log_ages();
    store.retention.max_age_ms = 1_000;
    store.apply(&[finish(4, now + 60_000)]).unwrap();
    let ids: Vec<String> = store.log("c", None, 10, None).unwrap().entries.into_iter().map(|e| e.event_id).collect();
    assert_eq!(ids, ["e4"]);
}

#[test]
fn refuses_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE_NAME), b"this is not a database").unwrap();
    let err = RedbStore::open(dir.path(), Fsync::Always, RETAIN).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err}");
    assert!(err.to_string().contains(FILE_NAME), "{err}");

    let other = tempfile::tempdir().unwrap();
    {
        let db = Database::create(other.path().join(FILE_NAME)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<&str, &str>::new("someone_else")).unwrap();
        txn.commit().unwrap();
    }
    let err = RedbStore::open(other.path(), Fsync::Always, RETAIN).unwrap_err();
    assert!(err.to_string().contains("not an eventbus store"), "{err}");
}
