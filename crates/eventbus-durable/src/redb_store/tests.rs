use std::time::SystemTime;

use super::*;
use crate::store::EntryRecord;
use crate::store_tests::{RETAIN, log_entry};

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
