//! # eventbusd
//!
//! The Socle EventBus daemon around [`eventbus_core::Bus`]:
//!
//! - [`config`]: layered settings (defaults, file, environment, flags) and validation.
//! - [`server`]: listener binding, serving, reload (SIGHUP) and the shutdown drain.
//! - `listener`: accepting connections: TLS handshakes off the accept loop, accept
//!   errors backed off, the peer's address and certificate names ([`PeerInfo`]), the
//!   idle timeout of connections with no request in progress.
//! - `gate`: what a request must be to reach any route: addressed to an allowed host
//!   (DNS rebinding), and on the gRPC port of a gRPC content type.
//! - `tls`: certificates and the client CA, swapped on reload.
//! - `access`: authentication and rights: who a credential is, what it may do, and
//!   the open streams re-checked on reload (docs/security.md).
//! - `ops`: every operation once, for every protocol: rights checked in one order,
//!   then the bus or the durable engine; answers in domain types or a refusal.
//! - `grpc`: the `EventBus` and `Admin` services: decode, call `ops`, encode (the
//!   subscribe and publish streams encoded straight from the bus's types).
//! - `http`: the HTTP listener: probes (`/metrics`, `/healthz`, `/readyz`), the admin
//!   REST routes, the browser's `/v1` routes (Server-Sent Events, JSON publish,
//!   session tokens) and the console; decode, call `ops`, render.
//! - `convert`: the wire edge: every core ↔ protobuf and core → JSON conversion, and
//!   the one table from a refusal to its gRPC status and HTTP code.
//! - [`metrics`]: Prometheus registry; reads the bus's own counters at scrape time.
//! - `process_metrics`: the `process_*` metrics, read from `/proc/self` at scrape time.
//! - `request_limit`: publish requests too large to read, refused like any oversized
//!   payload (the gRPC decode limit and the REST body limit).
//! - `push`: push consumers: the broker POSTs their events to HTTP endpoints.
//! - [`telemetry`]: logging setup.
//! - [`shutdown`]: SIGINT/SIGTERM handling.

pub mod config;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod telemetry;

mod access;
mod convert;
mod gate;
mod grpc;
mod http;
mod listener;
mod ops;
#[cfg(target_os = "linux")]
mod process_metrics;
mod push;
mod request_limit;
mod spans;
mod tls;

pub use config::Settings;
pub use listener::PeerInfo;
pub use push::PushSetupError;
pub use server::{Reloader, Server, ServerError};
pub use spans::SpansError;
pub use tls::{TlsError, TlsSettings};
