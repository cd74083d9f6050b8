//! # eventbus-bench
//!
//! The load generator behind `eventbus bench`, written once for any pub/sub system so
//! that eventbus, NATS and Redis are measured by the same code (`bench/peers` plugs the
//! other two in).
//!
//! - [`target`]: what a system must offer: publishers and live subscribers.
//! - [`workload`]: the three workloads (fan-out, latency at a fixed rate, publish-only),
//!   their command-line arguments and their [`Report`](workload::Report).
//! - [`durable`]: the durable workload's arguments and report (eventbus and JetStream).
//! - [`eventbus`]: the eventbus target (unary `Publish`, `PublishStream` or
//!   `PublishBatch`), on
//!   `eventbus-client` like every other client in the repository.

pub mod durable;
pub mod eventbus;
pub mod target;
pub mod workload;

pub use target::{Ack, PublishMode, Publisher, Publishing, Subscriber, Target};
pub use workload::{BenchCommand, Report, run};
