//! A durable consumer's definition.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::name::Pattern;

/// Retry delays: `min(max, initial × multiplier^(attempt−1))`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial_ms: 1_000, multiplier: 2.0, max_ms: 60_000 }
    }
}

impl Backoff {
    /// Delay before redelivering after the `attempt`-th failed attempt (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.saturating_sub(1).min(1_000) as i32);
        let ms = (self.initial_ms as f64 * factor).min(self.max_ms as f64);
        Duration::from_millis(ms.max(0.0) as u64)
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
}

impl ConsumerConfig {
    /// A consumer with the SPEC defaults.
    pub fn new(name: impl Into<String>, channels: Vec<String>) -> Self {
        Self {
            name: name.into(),
            channels,
            ack_deadline_ms: 30_000,
            max_attempts: 5,
            backoff: Backoff::default(),
            max_in_flight: 1_000,
            dead_letter_channel: None,
        }
    }

    /// The definition a client's `create_if_missing` gives for consumer `name`: an empty
    /// name takes `name`; another name is an error.
    pub fn named_for_attach(mut self, name: &str) -> Result<Self, String> {
        if self.name.is_empty() {
            self.name = name.to_owned();
        }
        if self.name != name {
            return Err(format!("create_if_missing names {:?}, not {name:?}", self.name));
        }
        Ok(self)
    }

    pub fn ack_deadline(&self) -> Duration {
        Duration::from_millis(self.ack_deadline_ms)
    }

    /// Checks names and ranges; returns the parsed filters.
    pub fn validate(&self) -> Result<Vec<Pattern>, String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(format!(
                "consumer name {:?} must be 1 to 128 characters of letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        if self.channels.is_empty() {
            return Err(format!("consumer {:?} needs at least one channel or pattern", self.name));
        }
        let filters = self
            .channels
            .iter()
            .map(|c| Pattern::parse(c).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        if self.ack_deadline_ms == 0 {
            return Err("ack_deadline_ms must be positive".into());
        }
        if self.max_in_flight == 0 {
            return Err("max_in_flight must be positive".into());
        }
        let b = &self.backoff;
        if !(b.multiplier.is_finite() && b.multiplier >= 1.0) || b.initial_ms == 0 || b.max_ms < b.initial_ms {
            return Err("backoff needs initial_ms > 0, multiplier >= 1 and max_ms >= initial_ms".into());
        }
        if let Some(dlq) = &self.dead_letter_channel {
            crate::name::validate_channel(dlq).map_err(|e| format!("dead_letter_channel: {e}"))?;
        }
        Ok(filters)
    }

    /// The channel a dead letter of an event on `channel` is published on.
    pub fn dead_letter_channel_for(&self, channel: &str) -> String {
        self.dead_letter_channel.clone().unwrap_or_else(|| format!("dlq.{channel}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_schedule() {
        let b = Backoff { initial_ms: 1_000, multiplier: 2.0, max_ms: 5_000 };
        let delays: Vec<u64> = (1..=5).map(|a| b.delay(a).as_millis() as u64).collect();
        assert_eq!(delays, vec![1_000, 2_000, 4_000, 5_000, 5_000]);
    }

    #[test]
    fn validation_names_the_problem() {
        let ok = ConsumerConfig::new("billing", vec!["orders.>".into()]);
        assert!(ok.validate().is_ok());
        let bad = ConsumerConfig::new("has space", vec!["a".into()]);
        assert!(bad.validate().unwrap_err().contains("has space"));
        let bad = ConsumerConfig::new("x", vec!["a.>.b".into()]);
        assert!(bad.validate().unwrap_err().contains("a.>.b"));
        let bad = ConsumerConfig { backoff: Backoff { multiplier: 0.5, ..Backoff::default() }, ..ok.clone() };
        assert!(bad.validate().unwrap_err().contains("multiplier"));
        assert_eq!(ok.dead_letter_channel_for("orders.created"), "dlq.orders.created");
    }
}
