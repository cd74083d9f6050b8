//! # Socle EventBus embedded durable consumers
//!
//! The `in_memory` mode's engine behind the core's
//! [`DurableBackend`](eventbus_core::durable::DurableBackend) seam: working state in
//! memory, every change persisted to an embedded redb store (docs/ARCHITECTURE.md "A
//! durable delivery" follows one event through it).
//!
//! - [`engine`]: the [`Durable`] handle: start-up and restore, consumer definitions,
//!   attach, and carrying out the effects of each state change.
//! - `state`: a consumer's working state and its transitions (under its lock only).
//! - `capture`: storing a publish for every matching consumer before it is answered.
//! - `client`: an attached client's ack, nack, extend and term.
//! - `scheduler`: the one task holding every timer (deadlines, redeliveries).
//! - `writer`: the group-commit writer thread.
//! - `outbox`: dead letters stored with their final failure, then published.
//! - `dedup`: idempotency keys within the window.
//! - `backend`: the [`DurableBackend`](eventbus_core::durable::DurableBackend) impl.
//! - [`store`]: the [`Store`] trait and the records it keeps; `codec`: their binary form.
//! - [`redb_store`]: the crash-safe redb implementation, on disk or in memory.

mod backend;
mod capture;
mod client;
mod codec;
mod dedup;
pub mod engine;
mod outbox;
pub mod redb_store;
mod scheduler;
mod state;
pub mod store;
mod writer;

#[cfg(test)]
mod tests;

pub use client::{Attached, ClientHandle};
pub use engine::Durable;
pub use eventbus_core::durable::Retention;
pub use redb_store::{BATCH_FLUSH_MS, Fsync, RedbStore};
pub use store::{Store, StoreError};
