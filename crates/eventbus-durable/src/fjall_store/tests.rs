use std::sync::Arc;

use eventbus_core::durable::ConsumerConfig;

use super::*;
use crate::Store;
use crate::store_tests::{RETAIN, event};

fn capture(seq: u64, consumers: &[&Arc<str>]) -> StoreOp {
    StoreOp::Capture {
        seq,
        event: event(&format!("e{seq}")),
        ordering_key: seq.is_multiple_of(2).then(|| "k".into()),
        consumers: consumers.iter().map(|c| Arc::clone(c)).collect(),
        dedup: Some(DedupRecord { key: format!("key-{seq}"), event_id: format!("e{seq}"), expires_ms: u64::MAX }),
    }
}

/// Data directories written before the move to fjall.
#[cfg(feature = "migrate-redb")]
mod from_redb {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicU64;
    use std::time::SystemTime;

    use super::*;
    use crate::RedbStore;
    use crate::store::{DeadLetterRecord, RedriveSelection};
    use crate::store_tests::log_entry;

    /// Everything a store holds, in a form two stores can be compared by.
    fn contents(store: &dyn Store) -> String {
        let loaded = store.load().unwrap();
        let consumers: Vec<String> = loaded.consumers.iter().map(|c| c.name.clone()).collect();
        let events: BTreeMap<u64, (String, Option<String>, Vec<u8>)> = loaded
            .events
            .iter()
            .map(|e| (e.seq, (e.event.id.to_string(), e.ordering_key.clone(), e.event.payload.to_vec())))
            .collect();
        let dedup: BTreeMap<String, String> =
            loaded.dedup.iter().map(|d| (d.key.clone(), d.event_id.clone())).collect();
        let mut logs = BTreeMap::new();
        for name in ["a", "b"] {
            let page = store.log(name, None, 1000, None).unwrap();
            let ids: Vec<(String, LogStatus)> = page.entries.into_iter().map(|e| (e.event_id, e.status)).collect();
            logs.insert(name, (ids, store.redrivable(name)));
        }
        let mut finished: Vec<_> = loaded.finished.iter().collect();
        finished.sort_by_key(|(name, _)| name.as_str());
        format!(
            "consumers {consumers:?}\nevents {events:?}\nentries {:?}\ndedup {dedup:?}\nnext_seq {}\nfinished {finished:?}\n\
             dead letters {:?}\npaused {:?}\nlogs {logs:?}",
            loaded.entries, loaded.next_seq, loaded.dead_letters, loaded.paused,
        )
    }

    /// A data directory written by the redb store (every kind of state in it) is migrated
    /// on first open: the fjall store then holds exactly what the redb one did, and the
    /// old file is set aside.
    #[test]
    fn a_redb_data_directory_is_migrated_on_first_open() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let now = epoch_ms(SystemTime::now());
        let before = {
            let old = RedbStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
            let mut ops = vec![
                StoreOp::PutConsumer(ConsumerConfig::new("a", vec!["orders.>".into()])),
                StoreOp::PutConsumer(ConsumerConfig::new("b", vec!["orders.>".into()])),
                StoreOp::SetPaused { consumer: b.clone(), paused: true },
            ];
            ops.extend((1..=8).map(|seq| capture(seq, &[&a, &b])));
            old.apply(&ops).unwrap();
            old.apply(&[
                // In flight, with a failure behind it and a due time.
                StoreOp::Update {
                    consumer: a.clone(),
                    seq: 1,
                    entry: EntryRecord {
                        attempts: 2,
                        first_delivered_ms: Some(now),
                        due_ms: Some(now + 5_000),
                        failures: vec![],
                    },
                },
                StoreOp::Finish { consumer: a.clone(), seq: 2, log: log_entry("e2", LogStatus::Completed, now) },
                StoreOp::Finish { consumer: a.clone(), seq: 3, log: log_entry("e3", LogStatus::DeadLettered, now) },
                StoreOp::Finish { consumer: b.clone(), seq: 3, log: log_entry("e3", LogStatus::DeadLettered, now) },
                StoreOp::PutDeadLetter {
                    id: 7,
                    record: DeadLetterRecord {
                        channel: "dlq.orders".into(),
                        payload: bytes::Bytes::from_static(b"dl"),
                        content_type: "text/plain".into(),
                        consumer: "a".into(),
                        event_id: "e3".into(),
                    },
                },
            ])
            .unwrap();
            contents(&old)
        };
        let store = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
        assert_eq!(contents(&store), before);
        assert!(!dir.path().join(crate::redb_store::FILE_NAME).exists(), "the old file is set aside");
        assert!(dir.path().join("eventbus.redb.migrated").exists());
        // And it works on: the dead-lettered event is redriven, counters continue.
        let next = AtomicU64::new(store.load().unwrap().next_seq);
        let moved = store.redrive("a", RedriveSelection::Oldest(10), &next).unwrap();
        assert_eq!(moved.iter().map(|m| (m.seq, &*m.event.id)).collect::<Vec<_>>(), [(9, "e3")]);
        drop(store);
        let again = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
        assert_eq!(again.load().unwrap().next_seq, 10);
        assert_eq!(again.redrivable("a"), 0);
    }

    /// A migration cut short (its staging directory left behind) starts over.
    #[test]
    fn an_interrupted_migration_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        {
            let old = RedbStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
            old.apply(&[StoreOp::PutConsumer(ConsumerConfig::new("a", vec!["x".into()]))]).unwrap();
        }
        let staging = dir.path().join("store.migrating");
        std::fs::create_dir_all(staging.join("half")).unwrap();
        let store = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
        assert_eq!(store.load().unwrap().consumers.len(), 1);
        assert!(!staging.exists());
    }
}

/// Without the migration built in, an old directory is refused, saying how to migrate.
#[cfg(not(feature = "migrate-redb"))]
#[test]
fn an_old_redb_directory_is_refused_saying_how_to_migrate() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(REDB_FILE_NAME), b"an old store").unwrap();
    let err = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap_err();
    assert!(err.to_string().contains("eventbus.redb"), "{err}");
    assert!(format!("{err:?}").contains("--features migrate-redb"), "{err:?}");
    assert!(dir.path().join(REDB_FILE_NAME).exists(), "the old store is left as it was");
}

#[test]
fn refuses_a_database_that_is_not_ours() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::builder(dir.path().join(STORE_DIR)).open().unwrap();
        db.keyspace("someone_else", KeyspaceCreateOptions::default).unwrap().insert("k", "v").unwrap();
    }
    let err = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap_err();
    assert!(err.to_string().contains("not an eventbus store"), "{err}");
}

/// Where the journal's written bytes end (it is preallocated with zeros).
fn journal_end(dir: &Path) -> (PathBuf, u64) {
    let journal = std::fs::read_dir(dir.join(STORE_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jnl"))
        .expect("a journal file");
    let bytes = std::fs::read(&journal).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i as u64 + 1);
    (journal, end)
}

const TORN_DIR: &str = "EVENTBUS_TEST_TORN_WRITE_DIR";

/// The crashing half of [`a_journal_torn_mid_record_loses_only_that_record`], run in a
/// child process: commits two groups, reporting where the journal ended after each,
/// then aborts (no clean close, as kill -9).
#[test]
fn torn_write_child() {
    let Some(dir) = std::env::var_os(TORN_DIR) else { return };
    let dir = PathBuf::from(dir);
    let store = FjallStore::open(&dir, Fsync::Always, RETAIN).unwrap();
    let a: Arc<str> = "a".into();
    let mut ops = vec![StoreOp::PutConsumer(ConsumerConfig::new("a", vec!["orders.>".into()]))];
    ops.extend((1..=20).map(|seq| capture(seq, &[&a])));
    store.apply(&ops).unwrap();
    println!("answered-end {}", journal_end(&dir).1);
    store.apply(&(21..=40).map(|seq| capture(seq, &[&a])).collect::<Vec<_>>()).unwrap();
    println!("torn-end {}", journal_end(&dir).1);
    std::process::abort();
}

/// A crash that tore the journal's last record (the record of a group whose callers
/// were never answered): the store opens, every earlier group is there, the torn one
/// is not, and the store takes writes again.
#[test]
fn a_journal_torn_mid_record_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fjall_store::tests::torn_write_child", "--nocapture", "--test-threads=1"])
        .env(TORN_DIR, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let position = |label: &str| -> u64 {
        let line = stdout.lines().find_map(|l| l.split(label).nth(1)).unwrap_or_else(|| panic!("{stdout}"));
        line.trim().parse().unwrap()
    };
    let (answered, torn) = (position("answered-end"), position("torn-end"));
    assert!(!out.status.success(), "the child aborts");
    assert!(torn > answered, "{stdout}");
    let (journal, _) = journal_end(dir.path());
    let file = std::fs::OpenOptions::new().write(true).open(&journal).unwrap();
    file.set_len(answered + (torn - answered) / 2).unwrap();
    drop(file);

    let store = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
    let loaded = store.load().unwrap();
    let seqs: Vec<u64> = loaded.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "the answered group whole, the torn one gone");
    assert_eq!(loaded.entries.len(), 20);
    assert_eq!(loaded.next_seq, 21);
    let a: Arc<str> = "a".into();
    store.apply(&[capture(21, &[&a])]).unwrap();
    drop(store);
    let again = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
    assert_eq!(again.load().unwrap().events.len(), 21);
}

#[test]
fn a_failed_commit_leaves_the_store_refusing_until_a_restart_and_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
    let consumer: Arc<str> = "c".into();
    store.apply(&[capture(1, &[&consumer])]).unwrap();
    assert_eq!(store.failed(), None);
    // What a commit that failed (a full disk, an I/O error) leaves behind.
    store.broken.store(true, Ordering::Relaxed);
    let failed = store.failed().expect("the store says it failed");
    assert!(failed.contains("restart eventbusd"), "{failed}");
    assert!(store.apply(&[capture(2, &[&consumer])]).is_err(), "writes are refused");
    drop(store);
    // A restart recovers what was committed before, and writes again.
    let store = FjallStore::open(dir.path(), Fsync::Always, RETAIN).unwrap();
    assert_eq!(store.failed(), None);
    assert_eq!(store.load().unwrap().events.len(), 1);
    store.apply(&[capture(2, &[&consumer])]).unwrap();
}
