//! # Socle EventBus embedded durable consumers
//!
//! The `in_memory` mode's engine behind the core's
//! [`DurableBackend`](eventbus_core::durable::DurableBackend) seam: working state in
//! memory, every change persisted to an embedded store: fjall (log-structured) on disk,
//! or maps in memory when there is no data directory (docs/ARCHITECTURE.md "A durable
//! delivery" follows one event through it).
//!
//! - [`engine`]: the [`Durable`] handle: start-up and restore, consumer definitions,
//!   attach, and carrying out the effects of each state change.
//! - `state`: a consumer's working state and its transitions (under its lock only).
//! - `capture`: storing a publish for every matching consumer before it is answered.
//! - `client`: an attached client's ack, nack, extend and term.
//! - `scheduler`: the one task holding every timer (deadlines, redeliveries).
//! - `writer`: the group-commit writer thread and the sync thread behind it.
//! - `outbox`: dead letters stored with their final failure, then published.
//! - `dedup`: idempotency keys within the window.
//! - `backend`: the [`DurableBackend`](eventbus_core::durable::DurableBackend) impl.
//! - [`store`]: the [`Store`] trait and the records it keeps; `codec`: their binary form.
//! - [`fjall_store`]: the store on disk (a fjall database); [`memory_store`]: the store
//!   in memory; `redb_store` (feature `migrate-redb`): the reader of data directories
//!   written before the move to fjall, which are migrated when eventbusd first starts
//!   on them.

mod backend;
mod capture;
mod client;
mod codec;
mod dedup;
pub mod engine;
pub mod fjall_store;
pub mod memory_store;
mod outbox;
#[cfg(feature = "migrate-redb")]
pub mod redb_store;
mod scheduler;
mod state;
pub mod store;
mod writer;

#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;

pub use client::{Attached, ClientHandle};
pub use engine::Durable;
pub use eventbus_core::durable::Retention;
pub use fjall_store::FjallStore;
pub use memory_store::MemoryStore;
#[cfg(feature = "migrate-redb")]
pub use redb_store::RedbStore;
pub use store::{BATCH_FLUSH_MS, Fsync, Store, StoreError};

/// Opens the store for `durable.data_dir`: in memory when it is empty (nothing survives
/// a restart), else the fjall store under it (migrating a redb file left by an older
/// eventbusd first).
pub fn open_store(
    data_dir: &std::path::Path,
    fsync: Fsync,
    retention: Retention,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if data_dir.as_os_str().is_empty() {
        return Ok(std::sync::Arc::new(MemoryStore::new(retention)));
    }
    Ok(std::sync::Arc::new(FjallStore::open(data_dir, fsync, retention)?))
}
