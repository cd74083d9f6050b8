//! Configuration (docs/configuration.md).
//!
//! Layers, lowest first: the shipped `config/default.yaml` (compiled in, the single
//! source of defaults), a file (`--config PATH`, else `./config/default.yaml` when
//! present), the Java-style environment variables (`EVENTBUS_MODE`, `REDIS_HOST`, …),
//! `EVENTBUS__SECTION__KEY` variables, then command-line flags. Unknown keys and bad
//! values stop start-up with a message naming the key.
//!
//! The settings are built on the flat layout of `config/default.yaml`. The Java-style
//! layout is accepted too: each layer is rewritten to the flat one before the layers are
//! merged, so `eventbus.common.max_batch` is another spelling of `eventbus.max_batch`
//! and takes part in the precedence like it. One layer spelling a setting both ways is
//! refused ([`ConfigError::DuplicateKey`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, Map, Source, Value, ValueKind};
use eventbus_auth::AuthSettings;
use eventbus_core::durable::{Backoff, BackoffKind, ConsumerConfig, PushConfig};
use eventbus_core::history::{HistoryLimits, HistoryRule, HistoryRules};
use eventbus_core::{BusConfig, Overflow};
use eventbus_redis::{Envelope, RedisOptions};
use serde::Deserialize;
use tracing_subscriber::filter::ParseError;

pub use crate::tls::TlsSettings;
use yaml::YamlFile;

/// The shipped defaults, embedded so the binary runs from any directory.
pub const DEFAULT_YAML: &str = include_str!("../../config/default.yaml");

/// File read when `--config` is not given, if it exists.
pub const IMPLICIT_FILE: &str = "config/default.yaml";

mod error;
mod load;
mod sections;
mod validate;
mod yaml;

pub use error::ConfigError;
pub use load::Overrides;
pub use sections::*;
pub use validate::MAX_PAYLOAD_LIMIT;

/// Everything eventbusd can be configured with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub eventbus: EventBusSettings,
    pub durable: DurableSettings,
    pub push: PushSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
    pub telemetry: TelemetrySettings,
}

impl Default for Settings {
    /// The shipped defaults.
    fn default() -> Self {
        let config = Config::builder()
            .add_source(File::from_str(DEFAULT_YAML, YamlFile))
            .build()
            .and_then(Config::try_deserialize);
        // The embedded file is part of the binary; `shipped_defaults_parse` tests it.
        config.expect("the embedded config/default.yaml is valid")
    }
}

impl Settings {
    /// Settings accepted for the Java-style layout's sake that change nothing here. eventbusd logs
    /// each at start-up, so that nobody tunes them believing they act.
    pub fn without_effect(&self) -> Vec<WithoutEffect> {
        const NO_POOL: &str = "eventbusd keeps no Redis connection pool: commands share multiplexed \
                               connections, pub/sub and blocking reads hold their own";
        let pool = &self.eventbus.redis.pool;
        [
            ("eventbus.redis.pool.max_total", "EVENTBUS_REDIS_POOL_MAX", pool.max_total),
            ("eventbus.redis.pool.max_idle", "EVENTBUS_REDIS_POOL_MAX_IDLE", pool.max_idle),
            ("eventbus.redis.pool.min_idle", "EVENTBUS_REDIS_POOL_MIN_IDLE", pool.min_idle),
        ]
        .into_iter()
        .filter_map(|(key, variable, value)| {
            value.map(|value| WithoutEffect { key, variable, value: value.to_string(), reason: NO_POOL })
        })
        .collect()
    }

    /// The engine's settings.
    pub fn bus_config(&self) -> BusConfig {
        let e = &self.eventbus;
        BusConfig {
            default_queue_capacity: e.default_queue_capacity,
            max_queue_capacity: e.max_queue_capacity,
            default_queue_bytes: e.default_queue_bytes,
            max_queued_bytes: e.max_queued_bytes,
            offer_timeout: Duration::from_millis(e.offer_timeout_ms),
            overflow: e.overflow.into(),
            max_batch: e.max_batch,
            max_payload_bytes: e.max_payload_bytes,
            max_channels: e.max_tracked_channels,
            max_channel_labels: e.metrics.enabled.then_some(e.metrics.max_channel_labels),
            history: self.history_rules(),
            history_max_bytes: e.history_max_bytes,
            history_max_channels: e.history_max_channels,
        }
    }

    /// The `eventbus.history` rules (validated: a rule that does not parse is left out
    /// here and refused by [`Settings::validate`]).
    pub fn history_rules(&self) -> HistoryRules {
        let rules = self.eventbus.history.iter().filter_map(|r| {
            let channels = eventbus_core::Pattern::parse(&r.channels).ok()?;
            let ttl = (r.ttl_ms > 0).then(|| Duration::from_millis(r.ttl_ms));
            Some(HistoryRule { channels, limits: HistoryLimits { size: r.size, max_bytes: r.max_bytes, ttl } })
        });
        HistoryRules::new(rules.collect())
    }

    /// Where Redis is, for the redis mode.
    pub fn redis_settings(&self) -> RedisOptions {
        let r = &self.eventbus.redis;
        RedisOptions {
            url: (!r.url.is_empty()).then(|| r.url.clone()),
            host: r.host.clone(),
            port: r.port,
            username: (!r.username.is_empty()).then(|| r.username.clone()),
            password: (!r.password.is_empty()).then(|| r.password.clone()),
            database: i64::from(r.database),
            prefix: r.prefix.clone(),
            envelope: match r.envelope {
                EnvelopeSetting::Binary => Envelope::Binary,
                EnvelopeSetting::Json => Envelope::Json,
            },
            tls_ca_file: (!r.tls_ca_file.is_empty()).then(|| PathBuf::from(&r.tls_ca_file)),
            cluster_nodes: r.cluster_nodes.clone(),
            shard_tokens: r.shard_tokens as usize,
            health_check_interval: Duration::from_millis(r.health_check_interval_ms),
            health_check_timeout: Duration::from_millis(r.health_check_timeout_ms),
            history: self.history_rules(),
            min_replicas_acked: r.min_replicas_acked,
            replica_ack_timeout: Duration::from_millis(r.replica_ack_timeout_ms),
        }
    }

    /// Terminal log bounds.
    pub fn retention(&self) -> eventbus_core::durable::Retention {
        eventbus_core::durable::Retention {
            max_entries: self.durable.log_max_entries,
            max_age_ms: self.durable.log_max_age_ms,
        }
    }

    /// Bound on the shutdown flush.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.server.shutdown_timeout_ms)
    }
}

#[cfg(test)]
mod tests;
