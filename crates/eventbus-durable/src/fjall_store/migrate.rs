//! First start on a data directory written before the move to fjall.

use std::path::Path;

use super::*;

/// The file an eventbusd from before the move to fjall kept under `durable.data_dir`.
pub const REDB_FILE_NAME: &str = "eventbus.redb";
use REDB_FILE_NAME as FILE_NAME;

/// Where a migration writes until it is complete.
const MIGRATING_DIR: &str = "store.migrating";
/// What the old file is renamed to once migrated.
const MIGRATED_SUFFIX: &str = ".migrated";

fn fs_error(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Open { path: path.display().to_string(), source: source.into() }
}

/// Migrates `data_dir/eventbus.redb` into `store_dir` when the file is there.
pub(super) fn migrate_if_needed(data_dir: &Path, store_dir: &Path, retention: Retention) -> Result<(), StoreError> {
    let old = data_dir.join(FILE_NAME);
    if !old.exists() {
        return Ok(());
    }
    let retired = data_dir.join(format!("{FILE_NAME}{MIGRATED_SUFFIX}"));
    if !store_dir.exists() {
        let staging = data_dir.join(MIGRATING_DIR);
        if staging.exists() {
            tracing::warn!(dir = %staging.display(), "an earlier migration of the durable store did not finish; starting it over");
            std::fs::remove_dir_all(&staging).map_err(|e| fs_error(&staging, e))?;
        }
        copy_from_redb(data_dir, &staging, store_dir, retention)?;
    }
    // The store is complete (a crash may have come between the two renames).
    std::fs::rename(&old, &retired).map_err(|e| fs_error(&old, e))?;
    tracing::info!(old = %retired.display(), "the redb file is kept under this name; delete it once this version is kept");
    Ok(())
}

/// Copies the redb store of `data_dir` into `staging`, then renames it to `store_dir`.
#[cfg(feature = "migrate-redb")]
fn copy_from_redb(data_dir: &Path, staging: &Path, store_dir: &Path, retention: Retention) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let copied = {
        let source = crate::RedbStore::open(data_dir, Fsync::Always, retention)?;
        let target = FjallStore::open_dir(staging, Fsync::Always, retention)?;
        source.copy_into(&target)?
    };
    sync_dir_entry(staging, store_dir)?;
    tracing::info!(
        from = %data_dir.join(FILE_NAME).display(),
        to = %store_dir.display(),
        consumers = copied.consumers,
        events = copied.events,
        entries = copied.entries,
        log_lines = copied.log_lines,
        kept_for_redrive = copied.dead,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "migrated the durable store from redb to fjall"
    );
    Ok(())
}

/// Without the reader of the old format: refused, saying how to migrate.
#[cfg(not(feature = "migrate-redb"))]
fn copy_from_redb(data_dir: &Path, _staging: &Path, _store_dir: &Path, _: Retention) -> Result<(), StoreError> {
    Err(StoreError::Refused {
        path: data_dir.join(FILE_NAME).display().to_string(),
        reason: "it was written by an eventbusd from before the move to fjall, and this one is built without \
                 the migration: start once an eventbusd built with `--features migrate-redb` (it migrates the \
                 directory on start), then this one"
            .into(),
    })
}

/// Renames the finished staging directory into place, durably.
#[cfg(feature = "migrate-redb")]
fn sync_dir_entry(staging: &Path, store_dir: &Path) -> Result<(), StoreError> {
    std::fs::rename(staging, store_dir).map_err(|e| fs_error(store_dir, e))?;
    if let Some(parent) = store_dir.parent() {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| fs_error(parent, e))?;
    }
    Ok(())
}
