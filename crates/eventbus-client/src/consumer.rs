//! [`ConsumerBuilder`]: a durable consumer's definition without the wire type.

use std::time::Duration;

use eventbus_proto::pb;

/// A durable consumer's definition, for [`Client::create_consumer`](crate::Client::create_consumer)
/// (which takes a raw [`pb::ConsumerConfig`] too). What is not set takes the broker's
/// defaults: a 30 s ack deadline, 5 attempts, exponential backoff from 1 s to 60 s,
/// 1,000 events in flight per client, dead letters to `dlq.<channel>`.
///
/// ```
/// use std::time::Duration;
/// use eventbus_client::{ConsumerBuilder, pb};
///
/// let config: pb::ConsumerConfig = ConsumerBuilder::new("billing", ["orders.>"])
///     .ack_deadline(Duration::from_secs(60))
///     .max_attempts(10)
///     .backoff(Duration::from_millis(500), Duration::from_secs(30))
///     .dead_letter_channel("billing.failed")
///     .into();
/// assert_eq!((config.ack_deadline_ms, config.max_attempts), (60_000, Some(10)));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use]
pub struct ConsumerBuilder {
    config: pb::ConsumerConfig,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ConsumerBuilder {
    /// A consumer named `name` (1 to 128 letters, digits, `-`, `_` or `.`) keeping the
    /// events of these exact channels and/or patterns (`orders.*`, `orders.>`).
    pub fn new<S: Into<String>>(name: impl Into<String>, channels: impl IntoIterator<Item = S>) -> Self {
        Self {
            config: pb::ConsumerConfig {
                name: name.into(),
                channels: channels.into_iter().map(Into::into).collect(),
                ..Default::default()
            },
        }
    }

    /// Time a client has to ack a delivery before it counts as a failed attempt
    /// (millisecond precision).
    pub fn ack_deadline(mut self, deadline: Duration) -> Self {
        self.config.ack_deadline_ms = millis(deadline);
        self
    }

    /// Failed attempts before an event is dead-lettered (0: never).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = Some(attempts);
        self
    }

    /// Redelivery delays growing exponentially: `initial`, doubled after each failed
    /// attempt, at most `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.backoff = Some(pb::Backoff {
            initial_ms: millis(initial),
            max_ms: millis(max),
            multiplier: 2.0,
            kind: pb::BackoffKind::Exponential.into(),
        });
        self
    }

    /// Redelivery delays growing linearly: `step` × the number of failed attempts, at
    /// most `max`.
    pub fn linear_backoff(mut self, step: Duration, max: Duration) -> Self {
        self.config.backoff = Some(pb::Backoff {
            initial_ms: millis(step),
            max_ms: millis(max),
            multiplier: 0.0,
            kind: pb::BackoffKind::Linear.into(),
        });
        self
    }

    /// Unacknowledged events one client may hold.
    pub fn max_in_flight(mut self, events: u32) -> Self {
        self.config.max_in_flight = events;
        self
    }

    /// Where dead letters are published (default: `dlq.` + the event's channel).
    pub fn dead_letter_channel(mut self, channel: impl Into<String>) -> Self {
        self.config.dead_letter_channel = channel.into();
        self
    }

    /// One attached client receives at a time; the next takes over when it leaves.
    pub fn exclusive(mut self) -> Self {
        self.config.exclusive = true;
        self
    }

    /// Most unfinished events kept (0: unlimited); publishes beyond it are not
    /// captured for this consumer and are counted as `dropped`.
    pub fn max_pending(mut self, events: u64) -> Self {
        self.config.max_pending = Some(events);
        self
    }

    /// The broker POSTs the events to an HTTP endpoint itself (a push consumer).
    pub fn push(mut self, push: pb::PushConfig) -> Self {
        self.config.push = Some(push);
        self
    }

    /// The wire definition.
    pub fn build(self) -> pb::ConsumerConfig {
        self.config
    }
}

impl From<ConsumerBuilder> for pb::ConsumerConfig {
    fn from(builder: ConsumerBuilder) -> Self {
        builder.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_keep_the_brokers_defaults() {
        let config = ConsumerBuilder::new("c", ["a.*", "b"]).build();
        assert_eq!(
            config,
            pb::ConsumerConfig { name: "c".into(), channels: vec!["a.*".into(), "b".into()], ..Default::default() }
        );
        let config = ConsumerBuilder::new("c", Vec::<String>::new())
            .linear_backoff(Duration::from_secs(2), Duration::from_secs(10))
            .max_in_flight(8)
            .exclusive()
            .max_pending(0)
            .max_attempts(0)
            .build();
        let backoff = config.backoff.unwrap_or_default();
        assert_eq!((backoff.initial_ms, backoff.max_ms, backoff.kind()), (2_000, 10_000, pb::BackoffKind::Linear));
        assert_eq!((config.max_in_flight, config.exclusive), (8, true));
        assert_eq!((config.max_pending, config.max_attempts), (Some(0), Some(0)), "0 is unlimited, not unset");
    }
}
