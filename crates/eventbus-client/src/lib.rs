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
//! - [`Publish`] and [`Message`] (`message`): an event to publish, built without the wire
//!   type — `client.publish("orders.created", payload).content_type(..).await`;
//!   [`ConsumerBuilder`] (`consumer`): a durable consumer's definition. The raw
//!   [`pb`] forms are accepted wherever these are
//!   ([`publish_request`](Client::publish_request), `create_consumer(pb::ConsumerConfig)`).
//! - [`Subscription`] (`subscribe`): a subscribe stream that reconnects with backoff,
//!   recovers what it missed on channels that keep a history, and reports each
//!   [`Gap`](SubscriptionItem::Gap) history could not fill (core pub/sub is at most once);
//!   read one [`Event`] at a time ([`next_event`](Subscription::next_event),
//!   [`events`](Subscription::events)) or by items, batches as the broker sent them.
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
//! use std::time::Duration;
//!
//! use eventbus_client::{Client, ClientOptions, ConsumerBuilder, Delivery, Outcome, Worker};
//! use tokio_util::sync::CancellationToken;
//!
//! let client = Client::connect(ClientOptions::new(url)).await?;
//!
//! // Core pub/sub: live subscribers get each event once, at most.
//! let mut orders = client.subscribe("orders.*").await?;
//! client.publish("orders.created", r#"{"id":42}"#).content_type("application/json").await?;
//! let event = orders.next_event().await.ok_or("the subscription ended")??;
//! assert_eq!((&*event.channel, &event.payload[..]), ("orders.created", &br#"{"id":42}"#[..]));
//!
//! // Durable: the consumer keeps events until a worker acks them.
//! let billing = ConsumerBuilder::new("billing", ["orders.>"]).ack_deadline(Duration::from_secs(30)).max_attempts(5);
//! client.create_consumer(billing).await?;
//! client.publish("orders.created", "invoice me").ordering_key("customer-7").await?;
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
mod consumer;
mod error;
#[cfg(feature = "postgres")]
pub mod inbox;
mod message;
pub mod options;
#[cfg(feature = "postgres")]
pub mod outbox;
mod publish;
mod publisher;
mod subscribe;
mod trace;
mod worker;

pub use backoff::Backoff;
pub use client::Client;
pub use consume::{ConsumeMessage, ConsumeSender, ConsumeStream};
pub use consumer::ConsumerBuilder;
pub use error::Error;
/// The wire types (`eventbus.v1`), generated from `proto/eventbus/v1/eventbus.proto`.
pub use eventbus_proto::pb;
/// An event as subscribers and workers receive it.
pub use eventbus_proto::pb::Event;
pub use message::{Message, Publish};
pub use options::ClientOptions;
pub use publish::{AckMode, PublishAnswer, PublishAnswers, PublishSender};
pub use subscribe::{Events, SubscribeOptions, Subscription, SubscriptionItem};
pub use worker::{Delivery, Handler, IntoOutcome, Outcome, Worker, WorkerMetrics, WorkerStats};
/// The PostgreSQL crates the `postgres` feature is built on, for matching versions.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};
