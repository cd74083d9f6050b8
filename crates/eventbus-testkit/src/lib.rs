//! What the workspace's tests share (a dev-dependency only, never shipped):
//!
//! - [`within`], [`eventually`] and [`DEADLINE`]: every wait bounded, none a sleep;
//! - [`redis`]: a private `redis-server` per test ([`redis::RedisProc`]) and a private
//!   Redis Cluster of 3 masters and 3 replicas ([`redis::RedisCluster`]);
//! - [`conformance`]: the checks every durable engine passes, written against the
//!   `DurableBackend` trait alone; each engine's crate runs them on its engine;
//! - [`otlp`]: an OTLP/gRPC trace receiver that keeps the spans it is sent.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // Test support fails loudly on purpose.

pub mod conformance;
pub mod otlp;
pub mod redis;

use std::future::Future;
use std::time::Duration;

/// Bound on every wait in the tests: generous for a loaded 2-core machine, and
/// reached only when something is broken.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test past [`DEADLINE`].
pub async fn within<F: Future>(fut: F) -> F::Output {
    within_deadline(DEADLINE, fut).await
}

/// Awaits `fut`, failing the test past `deadline`.
pub async fn within_deadline<F: Future>(deadline: Duration, fut: F) -> F::Output {
    tokio::time::timeout(deadline, fut).await.expect("timed out")
}

/// Polls `check` until it returns true, failing the test past [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(DEADLINE, what, check).await
}

/// Polls `check` until it returns true, failing the test past `deadline`.
pub async fn eventually_within<F, Fut>(deadline: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    while !check().await {
        assert!(tokio::time::Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Copies the directory `from` into `to`, recursively (a data directory holds the
/// store's own directory tree).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
