//! # Socle EventBus core
//!
//! Everything about routing events, nothing about the wire (no gRPC, no Redis):
//!
//! - [`name`]: channel and pattern rules (docs/concepts.md) and their error messages.
//! - [`trie`]: the token trie that matches a channel against every filter at once.
//! - `router`: subscriptions, groups and the per-channel routing result.
//! - [`subscription`]: bounded queues and the overflow policies (docs/concepts.md).
//! - [`bus`]: the engine that ties them together — publish, subscribe, stats, shutdown.
//! - [`stats`]: counters per bus, channel and subscription; the bounded channel table.
//! - [`transport`]: the seam a distributed fan-out (Redis) plugs into.
//! - [`tasks`]: the supervisor of background tasks: one that stops while needed is loud.
//! - [`event`]: the event envelope and publish-time checks.
//! - [`history`]: per-channel history and positions, for subscribers that recover.
//! - [`durable`]: the durable-consumer seam ([`durable::DurableBackend`]) and its types;
//!   the engines are in `eventbus-durable` (embedded) and `eventbus-redis`.
//! - [`error`]: what a call can be refused for.
//! - [`token`]: static bearer tokens: minting one, and the SHA-256 digest a principals
//!   file keeps (shared by the broker's authentication and the command-line client).

pub mod bus;
pub mod durable;
pub mod error;
pub mod event;
pub mod history;
pub mod name;
pub mod stats;
pub mod subscription;
pub mod tasks;
pub mod token;
pub mod transport;

pub mod trie;

mod router;

pub use bus::{Bus, BusConfig, CaptureTiming, Published, Since, SubscribeOptions, SubscriptionHandle};
pub use error::{Error, ErrorKind, chain as error_chain, quoted};
pub use event::{Event, PublishInput};
pub use name::{NameError, Pattern};
pub use stats::{BusStats, ChannelStats, LabelStats, OTHER_LABEL, QueueLevel, SubscriptionInfo};
pub use subscription::{CloseReason, DropReason, Overflow};
pub use tasks::{Supervisor, TaskFailure, TaskHandle};
pub use transport::{Fanout, LocalFanout, Transport, TransportError, TransportStatus};
