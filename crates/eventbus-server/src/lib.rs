//! # eventbusd
//!
//! The Socle EventBus daemon around [`eventbus_core::Bus`]:
//!
//! - [`config`]: layered settings (defaults, file, environment, flags) and validation.
//! - [`server`]: listener binding, serving, reload (SIGHUP) and the shutdown drain.
//! - `listener`: accepting connections: TLS handshakes off the accept loop, accept
//!   errors backed off, the peer's address and certificate names ([`PeerInfo`]), the
//!   idle timeout of connections with no request in progress.
//! - `http_server`: hyper serving the HTTP listener: header-read timeout, parser
//!   limits, graceful close.
//! - `gate`: what a request must be to reach any route: addressed to an allowed host
//!   (DNS rebinding), and on the gRPC port of a gRPC content type.
//! - `tls`: certificates and the client CA, swapped on reload.
//! - `access`: authentication and rights at the edge, for gRPC and HTTP alike; open
//!   streams re-checked on reload (docs/security.md).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` and the admin REST routes.
//! - [`metrics`]: Prometheus registry; reads the bus's own counters at scrape time.
//! - `grpc`: the `EventBus` and `Admin` services, thin adapters over the bus.
//! - `publish_stream`: `PublishStream`'s requests read ahead and answered in the
//!   publisher's ack mode (each event, running totals, or refusals only).
//! - `delivery`: the subscribe stream's writer: batches encoded straight from the
//!   shared events, no per-subscriber conversion to the generated types.
//! - `convert`: the wire edge: every core ↔ protobuf and core → JSON conversion, and
//!   the one table from a refusal to its gRPC status and HTTP code.
//! - `request_limit`: publish requests too large to read, refused like any oversized
//!   payload (the gRPC decode limit and the REST body limit).
//! - `push`: push consumers: the broker POSTs their events to HTTP endpoints.
//! - `web`: the browser's routes: Server-Sent Events, JSON publish, session tokens.
//! - [`telemetry`]: logging setup.
//! - [`shutdown`]: SIGINT/SIGTERM handling.

pub mod config;
pub mod http;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod telemetry;

mod access;
pub mod consume;
mod convert;
mod decode;
mod delivery;
mod gate;
mod grpc;
mod http_server;
mod listener;
mod publish_stream;
mod push;
mod request_limit;
mod tls;
mod ui;
mod web;

pub use config::Settings;
pub use listener::PeerInfo;
pub use push::PushSetupError;
pub use server::{Reloader, Server, ServerError};
pub use tls::{TlsError, TlsSettings};
