//! Durable consumers (docs/durable.md): at-least-once delivery with acks,
//! redelivery with backoff, dead letters, a terminal log, ordering keys and idempotent
//! publish. This module holds the seam and every type it speaks; the engines live in
//! their own crates (`eventbus-durable`: embedded, redb; `eventbus-redis`: Redis
//! Streams), so the core depends on no storage engine.
//!
//! - [`backend`]: the [`DurableBackend`] trait the wire layers use, with its call and
//!   answer types ([`ConsumerInfo`], [`Attachment`], [`ConsumerClient`], [`Captured`]).
//! - [`config`]: a consumer's definition, its backoff schedule and its dead-letter channel.
//! - [`delivery`]: what a client receives, its options, the failure reasons, and the
//!   round-robin picker both engines share.
//! - [`dead_letter`]: a dead letter, and how it is encoded and published.
//! - [`log`]: the terminal log's records.
//! - [`options`]: engine settings.
//! - [`push`]: a push consumer's HTTP endpoint.
//! - [`error`]: why a call was refused ([`DurableError`]).

pub mod backend;
pub mod config;
pub mod dead_letter;
pub mod delivery;
pub mod error;
pub mod log;
pub mod options;
pub mod push;

pub use backend::{
    Attachment, BoxFuture, CaptureRequest, Captured, ConsumerClient, ConsumerInfo, DurableBackend, MAX_REDRIVE,
    PendingEntry, PendingSlice, PendingState, Redriven,
};
pub use config::{
    Backoff, BackoffKind, ConfigError, ConsumerConfig, DEFAULT_DEAD_LETTER_SHOWN, DEFAULT_MAX_PENDING, DLQ_PREFIX,
    default_dead_letter_channel,
};
pub use dead_letter::{DeadLetterEncoder, DeadLetterSink, PublishedDeadLetter};
pub use delivery::{
    ClientOptions, DEFAULT_MAX_BATCH, Delivery, REASON_DEADLINE, REASON_DISCONNECT, REASON_TERM, next_with_room,
};
pub use error::{BoxError, DurableError};
pub use log::{Failure, LogEntry, LogSlice, LogStatus, Retention, epoch_ms, from_epoch_ms};
pub use options::{AckObserver, DurableOptions};
pub use push::{PushConfig, PushEnvelope, PushError};
