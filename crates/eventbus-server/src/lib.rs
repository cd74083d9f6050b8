//! # eventbusd
//!
//! The Socle EventBus daemon around [`eventbus_core::Bus`]:
//!
//! - [`config`]: layered settings (defaults, file, environment, flags) and validation.
//! - [`server`]: listener binding, serving and the shutdown drain.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` and the admin REST routes.
//! - [`metrics`]: Prometheus registry; reads the bus's own counters at scrape time.
//! - `grpc`: the `EventBus` and `Admin` services, thin adapters over the bus.
//! - `convert`: the wire edge: every core ↔ protobuf and core → JSON conversion, and
//!   the one table from a refusal to its gRPC status and HTTP code.
//! - `request_limit`: publish requests too large to read, refused like any oversized
//!   payload (the gRPC decode limit and the REST body limit).
//! - [`telemetry`]: logging setup.
//! - [`shutdown`]: SIGINT/SIGTERM handling.

pub mod config;
pub mod http;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod telemetry;

pub mod consume;
mod convert;
mod grpc;
mod request_limit;

pub use config::Settings;
pub use server::{Server, ServerError};
