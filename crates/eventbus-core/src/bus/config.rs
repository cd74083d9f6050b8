//! The engine's settings, its fixed limits, and what a subscriber asks for.

use std::time::Duration;

use crate::history::HistoryRules;
use crate::subscription::Overflow;

/// Most channels and patterns in one subscription.
pub const MAX_SUBSCRIBE_CHANNELS: usize = 64;
/// Longest `ordering_key` or `idempotency_key`, in bytes: each is kept per event (and,
/// for idempotency, for the whole dedup window), so a long one costs memory and disk.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest publisher-given `source`, in bytes: it travels with every copy of the event.
pub const MAX_SOURCE_BYTES: usize = 1024;
/// Largest `max_batch` a subscriber may ask for.
pub const MAX_BATCH_LIMIT: usize = 10_000;
/// Longest group or subscription name, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;
/// Approximate byte budget of one batch: keeps stream messages far below the 4 MiB
/// that gRPC clients accept by default (a single larger event still goes alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Engine settings (the `eventbus` section of the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct BusConfig {
    /// Queue capacity of a subscription that asks for 0.
    pub default_queue_capacity: usize,
    /// Largest queue capacity a subscription may ask for.
    pub max_queue_capacity: usize,
    /// Byte bound of a subscription's queue when it asks for 0.
    pub default_queue_bytes: usize,
    /// Budget of bytes queued across all subscriptions, each event counted once; also
    /// the largest `max_queue_bytes` a subscription may ask for.
    pub max_queued_bytes: usize,
    /// How long a DROP_NEWEST publish waits for room in a full queue.
    pub offer_timeout: Duration,
    /// Policy of a subscription that does not choose one.
    pub overflow: Overflow,
    /// Events per stream message for a subscription that asks for 0.
    pub max_batch: usize,
    /// Largest payload accepted.
    pub max_payload_bytes: usize,
    /// Channels tracked for stats before idle ones are forgotten.
    pub max_channels: usize,
    /// Channels counted under their own metrics label (the rest share `_other`);
    /// `None` keeps no label counters (metrics off).
    pub max_channel_labels: Option<usize>,
    /// Which channels keep a history, and how much (none by default).
    pub history: HistoryRules,
    /// Bytes of history kept in memory across channels (`in_memory` mode).
    pub history_max_bytes: usize,
    /// Channels with a history kept in memory (`in_memory` mode); past it, the least
    /// recently published lose theirs.
    pub history_max_channels: usize,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            default_queue_capacity: 10_000,
            max_queue_capacity: 1_000_000,
            default_queue_bytes: 64 << 20,
            max_queued_bytes: 512 << 20,
            offer_timeout: Duration::from_millis(100),
            overflow: Overflow::DropNewest,
            max_batch: 256,
            max_payload_bytes: 1 << 20,
            max_channels: 10_000,
            max_channel_labels: Some(1000),
            history: HistoryRules::default(),
            history_max_bytes: 256 << 20,
            history_max_channels: 10_000,
        }
    }
}

/// What a subscriber asks for (`SubscribeRequest`, wire-free).
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Exact channels and/or patterns.
    pub channels: Vec<String>,
    /// Group to join; empty means none.
    pub group: String,
    /// 0 means the default capacity.
    pub queue_capacity: usize,
    /// Byte bound of the queue; 0 means the default.
    pub max_queue_bytes: usize,
    /// `None` means the configured default.
    pub overflow: Option<Overflow>,
    /// 0 means the configured default.
    pub max_batch: usize,
    /// Free label.
    pub name: String,
    /// Client address.
    pub peer: String,
    /// Principal that opened it ("" with authentication off).
    pub owner: String,
    /// Most bytes queued across all of `owner`'s subscriptions (0 = no bound but the
    /// broker's `max_queued_bytes`).
    pub owner_max_queued_bytes: usize,
}
