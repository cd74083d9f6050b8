//! # eventbus-client
//!
//! The Rust client of Socle EventBus: everything a program needs to publish,
//! subscribe and work a durable consumer without touching the raw gRPC API. The
//! `eventbus` CLI and `eventbus bench` are built on it: one client code path.
//!
//! # Layout
//! - [`options`]: [`ClientOptions`] (address, bearer token, TLS files) and the
//!   connection they make.
//! - [`Client`] (`client`): publish (concurrent calls share one stream: `publisher`), pipelined [`publish_stream`](Client::publish_stream),
//!   subscribe, the raw [`consume`](Client::consume) stream and the admin calls.
//! - [`Subscription`] (`subscribe`): a subscribe stream that reconnects with backoff,
//!   recovers what it missed on channels that keep a history, and reports each
//!   [`Gap`](SubscriptionItem::Gap) history could not fill (core pub/sub is at most once).
//! - [`Worker`] (`worker`): the push worker for durable consumers — concurrency,
//!   retries, dead letters, batched acks, deadline extension, reconnection, drain,
//!   hooks, stats and `socle_push_worker_*` metrics.
//! - `outbox` and `inbox` (feature `postgres`): the transactional outbox relay and the
//!   inbox handler wrapper on PostgreSQL (DDL in `clients/sql/`).
//! - [`Error`]: one typed error; [`Backoff`]: delays between reconnections.
//!
//! # Example
//! Publish, subscribe, and work a durable consumer (this runs against a broker
//! started in-process for the doc test):
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut settings = eventbus_server::Settings::default();
//! # settings.server.grpc_addr = "127.0.0.1:0".parse()?;
//! # settings.server.http_addr = "127.0.0.1:0".parse()?;
//! # settings.durable.data_dir = String::new();
//! # let server = eventbus_server::Server::bind(settings).await?;
//! # let url = format!("http://{}", server.grpc_addr());
//! # let stop_server = tokio_util::sync::CancellationToken::new();
//! # tokio::spawn(server.run(stop_server.clone()));
//! use eventbus_client::{Client, ClientOptions, Delivery, Outcome, SubscribeOptions, SubscriptionItem, Worker, pb};
//! use tokio_util::sync::CancellationToken;
//!
//! let client = Client::connect(ClientOptions::new(url)).await?;
//!
//! // Core pub/sub: live subscribers get each event once, at most.
//! let mut orders = client.subscribe(SubscribeOptions::new(["orders.*"])).await?;
//! let publish = |payload: &str| pb::PublishRequest {
//!     channel: "orders.created".into(),
//!     payload: payload.as_bytes().to_vec().into(),
//!     ..Default::default()
//! };
//! client.publish(publish("first")).await?;
//! while let Some(item) = orders.next().await {
//!     if let SubscriptionItem::Events(events) = item? {
//!         assert_eq!(&events[0].payload[..], b"first");
//!         break;
//!     }
//! }
//!
//! // Durable: the consumer keeps events until a worker acks them.
//! client.create_consumer(pb::ConsumerConfig {
//!     name: "billing".into(),
//!     channels: vec!["orders.>".into()],
//!     ..Default::default()
//! }).await?;
//! client.publish(publish("invoice me")).await?;
//! let shutdown = CancellationToken::new();
//! let stop = shutdown.clone();
//! let worker = Worker::new(client.clone(), "billing").concurrency(4);
//! worker
//!     .run(
//!         move |d: Delivery| {
//!             let stop = stop.clone();
//!             async move {
//!                 assert_eq!(&d.event.payload[..], b"invoice me");
//!                 stop.cancel(); // one event is enough for this example
//!                 Outcome::Ack
//!             }
//!         },
//!         shutdown,
//!     )
//!     .await?;
//! assert_eq!(worker.stats().processed, 1);
//! # stop_server.cancel();
//! # Ok(()) }
//! ```

mod backoff;
mod client;
mod codec;
mod consume;
mod error;
#[cfg(feature = "postgres")]
pub mod inbox;
pub mod options;
#[cfg(feature = "postgres")]
pub mod outbox;
mod publish;
mod publisher;
mod subscribe;
mod worker;

pub use backoff::Backoff;
pub use client::Client;
pub use consume::{ConsumeMessage, ConsumeSender, ConsumeStream};
pub use error::Error;
/// The wire types (`eventbus.v1`), generated from `proto/eventbus/v1/eventbus.proto`.
pub use eventbus_proto::pb;
pub use options::ClientOptions;
pub use publish::{AckMode, PublishAnswer, PublishAnswers, PublishSender};
pub use subscribe::{SubscribeOptions, Subscription, SubscriptionItem};
pub use worker::{Delivery, Handler, IntoOutcome, Outcome, Worker, WorkerMetrics, WorkerStats};
/// The PostgreSQL crates the `postgres` feature is built on, for matching versions.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};
