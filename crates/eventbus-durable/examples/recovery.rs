//! How long the embedded engine takes to start on a store holding many pending events,
//! and the memory it then holds: fills a store with EVENTS pending events spread over
//! CONSUMERS consumers (one consumer per event, 128-byte payloads), closes it, then
//! times opening the store (reading it whole) and starting the engine on it.
//!
//!   cargo run --release -p eventbus-durable --example recovery [EVENTS] [CONSUMERS] [DIR]
//!   STORE=redb cargo run --release -p eventbus-durable --features migrate-redb --example recovery   # redb

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use eventbus_core::Event;
use eventbus_core::durable::{ConsumerConfig, DurableOptions, Retention};
use eventbus_durable::store::StoreOp;
use eventbus_durable::{Durable, FjallStore, Fsync, Store};

const RETENTION: Retention = Retention { max_entries: 100_000, max_age_ms: 86_400_000 };
const GROUP: u64 = 4096;

/// Resident and peak memory of this process, in MiB (from /proc/self/status).
fn memory_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn options() -> DurableOptions {
    DurableOptions {
        dedup_window: std::time::Duration::from_secs(120),
        dead_letter_encoder: Arc::new(|dl| (bytes::Bytes::new(), dl.consumer.clone())),
        on_ack: None,
        min_free_disk_bytes: 0,
        max_captures_per_publish: 0,
        supervisor: eventbus_core::Supervisor::new(),
    }
}

/// The store under test: fjall, or redb with `STORE=redb` (and the `migrate-redb`
/// feature).
fn open(dir: &std::path::Path, fsync: Fsync) -> Result<Arc<dyn Store>, eventbus_durable::StoreError> {
    #[cfg(feature = "migrate-redb")]
    if std::env::var("STORE").as_deref() == Ok("redb") {
        return Ok(Arc::new(eventbus_durable::RedbStore::open(dir, fsync, RETENTION)?));
    }
    Ok(Arc::new(FjallStore::open(dir, fsync, RETENTION)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let events: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let consumers: u64 = args.next().map_or(Ok(10), |a| a.parse())?;
    let temp = tempfile::tempdir()?;
    let dir = args.next().map_or_else(|| temp.path().to_path_buf(), PathBuf::from);

    let names: Vec<Arc<str>> = (0..consumers).map(|i| Arc::from(format!("consumer-{i}"))).collect();
    let started = Instant::now();
    {
        let store = open(&dir, Fsync::Batch)?;
        let configs = names.iter().map(|n| StoreOp::PutConsumer(ConsumerConfig::new(&**n, vec![format!("{n}.>")])));
        store.apply(&configs.collect::<Vec<_>>())?;
        let mut seq = 1;
        while seq <= events {
            let ops: Vec<StoreOp> = (seq..(seq + GROUP).min(events + 1))
                .map(|s| {
                    let consumer = &names[(s % consumers) as usize];
                    let event = Event::from_parts(
                        format!("01J{s:023}"),
                        format!("{consumer}.orders"),
                        SystemTime::now(),
                        String::new(),
                        bytes::Bytes::from_static(&[0xAB; 128]),
                        Default::default(),
                        String::new(),
                    );
                    StoreOp::Capture {
                        seq: s,
                        event: Arc::new(event),
                        ordering_key: None,
                        consumers: vec![Arc::clone(consumer)],
                        dedup: None,
                    }
                })
                .collect();
            seq += GROUP;
            store.write(&ops)?;
        }
        store.apply(&[])?;
    }
    println!("filled: {events} pending events over {consumers} consumers in {:.1} s", started.elapsed().as_secs_f64());

    let (rss_before, _) = memory_mib();
    let started = Instant::now();
    let store = open(&dir, Fsync::Always)?;
    let opened = started.elapsed();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let durable = runtime.block_on(async { Durable::start(store, options()) })?;
    let ready = started.elapsed();
    let pending: u64 = durable.list_consumers().iter().map(|c| c.pending).sum();
    let (rss, peak) = memory_mib();
    println!(
        "store opened in {:.2} s, engine ready in {:.2} s; pending {pending}; resident {} MiB more than before \
         (peak of the process {peak} MiB)",
        opened.as_secs_f64(),
        ready.as_secs_f64(),
        rss.saturating_sub(rss_before),
    );
    Ok(())
}
