//! Durable consumers (SPEC §9): at-least-once delivery with acks, redelivery with
//! backoff, dead letters, a terminal log, ordering keys and idempotent publish.
//!
//! - [`config`]: a consumer's definition and its backoff schedule.
//! - [`store`]: the [`Store`](store::Store) trait every durable backend implements, and
//!   the records it keeps.
//! - [`redb_store`]: the embedded, crash-safe implementation (redb), on disk or in memory.
//! - [`backend`]: the [`DurableBackend`] trait the wire layer uses, implemented by the
//!   engine below and by the Redis Streams engine of `eventbus-redis`.
//! - [`engine`]: the state machine: capture, push delivery to attached clients, ack,
//!   nack, extend, term, deadlines, backoff, dead-lettering, ordering keys, dedup; one
//!   scheduler for every timer and one writer that group-commits every change.

pub mod backend;
pub mod config;
pub mod engine;
pub mod redb_store;
pub mod store;

#[cfg(test)]
mod tests;

pub use backend::{Attachment, BoxFuture, CaptureRequest, Captured, ConsumerClient, DurableBackend, LogSlice};
pub use config::{Backoff, ConsumerConfig};
pub use engine::{
    Attached, ClientHandle, ClientOptions, ConsumerInfo, Delivery, Durable, DurableError, DurableOptions,
    PublishedDeadLetter,
};
pub use redb_store::{Fsync, RedbStore, Retention};
pub use store::{Failure, LogEntry, LogStatus, Store, StoreError};
