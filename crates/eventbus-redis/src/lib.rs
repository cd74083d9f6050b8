//! # Socle EventBus redis mode
//!
//! Several `eventbusd` instances share one fan-out through Redis Pub/Sub (docs/redis.md).
//! This crate implements the core's [`eventbus_core::Transport`]; the router, queues and
//! overflow policies are the core's, unchanged.
//!
//! - [`transport`]: [`RedisTransport`]: publishes on a multiplexed connection, receives
//!   on a dedicated pub/sub connection driven by one task that reconnects with capped
//!   exponential backoff and restores the Redis subscriptions local demand needs.
//! - `envelope`: the versioned wire envelope (magic prefix + protobuf `Event`), and the
//!   raw form a foreign producer's plain `PUBLISH` takes.
//! - `glob`: filters mapped to Redis channels and globs.
//! - `groups`: groups that span the instances (one member across the fleet per event).
//! - `history`: channel histories in Redis (a capped stream per channel) and the
//!   script that publishes and keeps an event in one step.
//! - `dedup`: one copy per instance when an exact channel and patterns both match.
//! - [`cluster`]: [`ClusterTransport`], the same on a Redis Cluster with sharded
//!   Pub/Sub (`SPUBLISH`/`SSUBSCRIBE`) over a fixed set of shard channels.
//! - [`durable`]: [`RedisDurable`], durable consumers on Redis Streams, shared by every
//!   instance (the core's `DurableBackend`).

pub mod cluster;
mod dedup;
mod demand;
pub mod durable;
mod envelope;
mod glob;
mod groups;
mod history;
#[cfg(test)]
mod test_redis;
pub mod transport;

pub use cluster::ClusterTransport;
pub use durable::{RedisDurable, RedisDurableSettings};
pub use envelope::Envelope;
/// The Redis client's error, for callers that report a bad Redis setting.
pub use redis::RedisError;
pub use transport::{RedisOptions, RedisTransport};
