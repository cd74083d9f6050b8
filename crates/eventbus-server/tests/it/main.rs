//! The server's integration tests, one binary: each module a feature area, every test
//! against a real server on 127.0.0.1:0 (or the real `eventbusd` binary) and real
//! clients, with the harness in `common` shared by all (one build and one link instead
//! of one per area).

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

mod ack_modes;
mod batch;
mod broker;
mod cardinality;
mod consumer_ops;
mod daemon;
mod deploy;
mod durable;
mod flow;
mod history;
mod hostile;
mod memory;
mod ops;
mod push;
mod redis_cluster;
mod redis_durable;
mod redis_mode;
mod security;
mod security_authz;
mod security_handshake;
mod security_hardening;
mod security_push;
mod security_sessions;
mod security_streams;
mod security_tenants;
mod tls;
mod traces;
mod web;
