//! A durable consumer's definition.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::durable::push::{PushConfig, PushError};
use crate::name::{MAX_NAME_BYTES, MAX_TOKENS, NameError, Pattern};

/// How retry delays grow with the attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKind {
    /// `initial × multiplier^(attempt−1)`.
    #[default]
    Exponential,
    /// `initial × attempt` .
    Linear,
}

/// Retry delays, capped at `max_ms`: `min(max, initial × multiplier^(attempt−1))`, or
/// `min(max, initial × attempt)` for [`BackoffKind::Linear`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
    /// Stored definitions written before linear backoff existed read as exponential.
    #[serde(default, skip_serializing_if = "is_exponential")]
    pub kind: BackoffKind,
}

fn is_exponential(kind: &BackoffKind) -> bool {
    *kind == BackoffKind::Exponential
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial_ms: 1_000, multiplier: 2.0, max_ms: 60_000, kind: BackoffKind::Exponential }
    }
}

impl Backoff {
    /// Delay before redelivering after the `attempt`-th failed attempt (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ms = match self.kind {
            BackoffKind::Exponential => {
                let factor = self.multiplier.powi(attempt.saturating_sub(1).min(1_000) as i32);
                (self.initial_ms as f64 * factor).min(self.max_ms as f64).max(0.0) as u64
            }
            BackoffKind::Linear => self.initial_ms.saturating_mul(u64::from(attempt.max(1))).min(self.max_ms),
        };
        Duration::from_millis(ms)
    }
}

/// A named server-side consumer: it keeps every event matching `channels` until a
/// client acknowledges it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerConfig {
    pub name: String,
    /// Exact channels and/or patterns.
    pub channels: Vec<String>,
    pub ack_deadline_ms: u64,
    /// Failed attempts before dead-lettering; 0 = unlimited.
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// Unacknowledged events one client may hold.
    pub max_in_flight: u32,
    /// Where dead letters go; `None` = `dlq.` + the event's channel.
    pub dead_letter_channel: Option<String>,
    /// Principal that created it (docs/security.md); "" with authentication off and
    /// for consumers declared in the configuration. Stored with the definition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// One attached client receives at a time; the next takes over when it leaves
    /// (docs/consumer-operations.md "Exclusive consumers").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// Most unfinished events kept; a capture beyond it is dropped for this consumer
    /// and counted (docs/limits.md). 0 = unlimited. Definitions stored before the
    /// limit existed read as the default.
    #[serde(default = "default_max_pending")]
    pub max_pending: u64,
    /// Served by the broker itself: its events are POSTed to an HTTP endpoint
    /// (docs/push.md) instead of waiting for clients to attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushConfig>,
}

/// [`ConsumerConfig::max_pending`] when not given.
pub const DEFAULT_MAX_PENDING: u64 = 1_000_000;

fn default_max_pending() -> u64 {
    DEFAULT_MAX_PENDING
}

impl ConsumerConfig {
    /// A consumer with the documented defaults (docs/durable.md).
    pub fn new(name: impl Into<String>, channels: Vec<String>) -> Self {
        Self {
            name: name.into(),
            channels,
            ack_deadline_ms: 30_000,
            max_attempts: 5,
            backoff: Backoff::default(),
            max_in_flight: 1_000,
            dead_letter_channel: None,
            owner: String::new(),
            exclusive: false,
            max_pending: DEFAULT_MAX_PENDING,
            push: None,
        }
    }

    /// The definition a client's `create_if_missing` gives for consumer `name`: an empty
    /// name takes `name`; another name is an error.
    pub fn named_for_attach(mut self, name: &str) -> Result<Self, ConfigError> {
        if self.name.is_empty() {
            self.name = name.to_owned();
        }
        if self.name != name {
            return Err(ConfigError::NameMismatch { given: self.name, attached: name.to_owned() });
        }
        Ok(self)
    }

    /// The definition as shown to callers and in messages: the push endpoint's
    /// credentials redacted ([`PushConfig::redacted`]).
    pub fn redacted(&self) -> Self {
        Self { push: self.push.as_ref().map(PushConfig::redacted), ..self.clone() }
    }

    pub fn ack_deadline(&self) -> Duration {
        Duration::from_millis(self.ack_deadline_ms)
    }

    /// Checks names and ranges; returns the parsed filters.
    pub fn validate(&self) -> Result<Vec<Pattern>, ConfigError> {
        // "." and ".." would read as paths in logs, URLs and file names: a name has at
        // least one character that is not a dot.
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && self.name.bytes().any(|b| b != b'.');
        if !name_ok {
            return Err(ConfigError::BadName { name: self.name.clone() });
        }
        if self.channels.is_empty() {
            return Err(ConfigError::NoChannels { name: self.name.clone() });
        }
        // The same bound as a Subscribe: a consumer is a subscription that persists.
        if self.channels.len() > crate::bus::MAX_SUBSCRIBE_CHANNELS {
            return Err(ConfigError::TooManyChannels {
                count: self.channels.len(),
                limit: crate::bus::MAX_SUBSCRIBE_CHANNELS,
            });
        }
        let filters = self.channels.iter().map(|c| Pattern::parse(c)).collect::<Result<Vec<_>, _>>()?;
        if self.ack_deadline_ms == 0 {
            return Err(ConfigError::NotPositive { field: "ack_deadline_ms" });
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::NotPositive { field: "max_in_flight" });
        }
        let b = &self.backoff;
        if !(b.multiplier.is_finite() && b.multiplier >= 1.0) || b.initial_ms == 0 || b.max_ms < b.initial_ms {
            return Err(ConfigError::Backoff);
        }
        if let Some(dlq) = &self.dead_letter_channel {
            crate::name::validate_channel(dlq).map_err(ConfigError::DeadLetterChannel)?;
        }
        if let Some(push) = &self.push {
            push.validate(self.ack_deadline_ms, self.max_in_flight)?;
        }
        Ok(filters)
    }

    /// The channel a dead letter of an event on `channel` is published on: the
    /// configured one, else [`default_dead_letter_channel`].
    pub fn dead_letter_channel_for(&self, channel: &str) -> String {
        match &self.dead_letter_channel {
            Some(dlq) => dlq.clone(),
            None => default_dead_letter_channel(channel),
        }
    }
}

/// `dlq.` + `channel` when that is a valid channel. A channel too long for the prefix
/// (16 tokens, or over 252 bytes) gets a shortened one instead (docs/durable.md "Dead letters"):
/// `dlq.`, then as many of its leading tokens as fit in 14 tokens and the byte limit,
/// then `h` and 16 hex digits of the FNV-1a 64 hash of the whole channel. Stable across
/// versions and instances, so both engines agree and `dlq.<prefix>.>` still matches.
pub fn default_dead_letter_channel(channel: &str) -> String {
    let plain = format!("{DLQ_PREFIX}{channel}");
    if crate::name::validate_channel(&plain).is_ok() {
        return plain;
    }
    let hash = format!("h{:016x}", fnv1a64(channel.as_bytes()));
    let budget = MAX_NAME_BYTES - DLQ_PREFIX.len() - hash.len() - 1;
    let mut out = String::from(DLQ_PREFIX);
    let mut used = 0;
    for token in channel.split('.').take(MAX_TOKENS - 2) {
        if used + token.len() + 1 > budget {
            break;
        }
        out.push_str(token);
        out.push('.');
        used += token.len() + 1;
    }
    out.push_str(&hash);
    out
}

/// What every dead-letter channel starts with.
pub const DLQ_PREFIX: &str = "dlq.";

/// How a consumer without a dead-letter channel of its own shows where its dead letters
/// go (`dlq.` + each event's channel), the same in every view (CLI, REST, console).
/// Given back as a definition's `dead_letter_channel`, it means that default.
pub const DEFAULT_DEAD_LETTER_SHOWN: &str = "dlq.<channel>";

/// FNV-1a, 64 bits: a fixed, documented hash (std's hasher may change between releases).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// `name` quoted, cut after 64 bytes: an error message must stay small whatever a client
/// sent (it travels in a gRPC header).
fn shown(name: &str) -> String {
    const SHOWN: usize = 64;
    if name.len() <= SHOWN {
        return format!("{name:?}");
    }
    let mut end = SHOWN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &name[..end], name.len())
}

/// What is wrong with a consumer definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "consumer name {} must be 1 to 128 characters of letters, digits, '-', '_' or '.', not only dots",
        shown(name)
    )]
    BadName { name: String },
    #[error("a consumer has at most {limit} channels or patterns, not {count}")]
    TooManyChannels { count: usize, limit: usize },
    #[error("consumer {} needs at least one channel or pattern", crate::error::quoted(name))]
    NoChannels { name: String },
    #[error(transparent)]
    Filter(#[from] NameError),
    #[error("{field} must be positive")]
    NotPositive { field: &'static str },
    #[error("backoff needs initial_ms > 0, multiplier >= 1 and max_ms >= initial_ms")]
    Backoff,
    #[error("dead_letter_channel: {0}")]
    DeadLetterChannel(NameError),
    #[error(transparent)]
    Push(#[from] PushError),
    #[error("create_if_missing names {}, not {}", crate::error::quoted(given), crate::error::quoted(attached))]
    NameMismatch { given: String, attached: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_schedule() {
        let b = Backoff { initial_ms: 1_000, multiplier: 2.0, max_ms: 5_000, kind: BackoffKind::Exponential };
        let delays: Vec<u64> = (1..=5).map(|a| b.delay(a).as_millis() as u64).collect();
        assert_eq!(delays, vec![1_000, 2_000, 4_000, 5_000, 5_000]);
        let linear = Backoff { kind: BackoffKind::Linear, max_ms: 3_500, ..b };
        let delays: Vec<u64> = (1..=5).map(|a| linear.delay(a).as_millis() as u64).collect();
        assert_eq!(delays, vec![1_000, 2_000, 3_000, 3_500, 3_500]);
        assert_eq!(linear.delay(u32::MAX).as_millis(), 3_500, "no overflow");
    }

    #[test]
    fn validation_names_the_problem() {
        let ok = ConsumerConfig::new("billing", vec!["orders.>".into()]);
        assert!(ok.validate().is_ok());
        let bad = ConsumerConfig::new("has space", vec!["a".into()]);
        assert!(bad.validate().unwrap_err().to_string().contains("has space"));
        let bad = ConsumerConfig::new("x", vec!["a.>.b".into()]);
        assert!(bad.validate().unwrap_err().to_string().contains("a.>.b"));
        let bad = ConsumerConfig { backoff: Backoff { multiplier: 0.5, ..Backoff::default() }, ..ok.clone() };
        assert!(bad.validate().unwrap_err().to_string().contains("multiplier"));
        assert_eq!(ok.dead_letter_channel_for("orders.created"), "dlq.orders.created");
    }

    #[test]
    fn dots_alone_are_no_name_and_channels_are_capped_like_a_subscribe() {
        for name in [".", "..", "..."] {
            let bad = ConsumerConfig::new(name, vec!["a".into()]);
            assert!(matches!(bad.validate(), Err(ConfigError::BadName { .. })), "{name:?}");
        }
        assert!(ConsumerConfig::new("v1.billing", vec!["a".into()]).validate().is_ok());
        let channels = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
        assert!(ConsumerConfig::new("wide", channels(64)).validate().is_ok());
        let err = ConsumerConfig::new("wide", channels(65)).validate().unwrap_err();
        assert_eq!(err, ConfigError::TooManyChannels { count: 65, limit: 64 });
    }

    #[test]
    fn a_huge_bad_name_is_cut_in_the_message() {
        let huge = "é".repeat(100_000);
        let message = ConsumerConfig::new(huge, vec!["a".into()]).validate().unwrap_err().to_string();
        assert!(message.len() < 300, "{} bytes", message.len());
        assert!(message.contains("(200000 bytes)"), "{message}");
    }

    #[test]
    fn channels_too_long_for_the_prefix_get_a_shortened_valid_dead_letter_channel() {
        let sixteen = (1..=16).map(|i| format!("t{i}")).collect::<Vec<_>>().join(".");
        let short = default_dead_letter_channel(&sixteen);
        assert!(crate::name::validate_channel(&short).is_ok(), "{short}");
        assert!(short.starts_with("dlq.t1.t2.") && short.contains(".t14.h"), "{short}");
        assert_eq!(short, default_dead_letter_channel(&sixteen), "stable");
        assert_ne!(short, default_dead_letter_channel(&format!("{sixteen}x")), "distinct channels stay distinct");
        let long = format!("a.{}", "b".repeat(253));
        let short = default_dead_letter_channel(&long);
        assert!(crate::name::validate_channel(&short).is_ok(), "{short}");
        assert!(short.starts_with("dlq.a.h"), "{short}");
        let huge_token = "c".repeat(256);
        assert!(crate::name::validate_channel(&default_dead_letter_channel(&huge_token)).is_ok());
    }
}
