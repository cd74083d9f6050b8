//! Configuration (SPEC §7).
//!
//! Layers, lowest first: the shipped `config/default.yaml` (compiled in, the single
//! source of defaults), a file (`--config PATH`, else `./config/default.yaml` when
//! present), the seed's environment aliases (`EVENTBUS_MODE`, `REDIS_HOST`, …),
//! `EVENTBUS__SECTION__KEY` variables, then command-line flags. Unknown keys and bad
//! values stop start-up with a message naming the key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat, Map, Source, Value, ValueKind};
use eventbus_core::durable::{Backoff, ConsumerConfig};
use eventbus_core::{BusConfig, Overflow};
use eventbus_redis::RedisOptions;
use serde::Deserialize;

/// The shipped defaults, embedded so the binary runs from any directory.
pub const DEFAULT_YAML: &str = include_str!("../../../config/default.yaml");

/// File read when `--config` is not given, if it exists.
pub const IMPLICIT_FILE: &str = "config/default.yaml";

/// Seed variable names and the keys they stand for.
const ALIASES: &[(&str, &str)] = &[
    ("EVENTBUS_MODE", "eventbus.mode"),
    ("EVENTBUS_QUEUE_CAPACITY", "eventbus.default_queue_capacity"),
    ("EVENTBUS_OFFER_TIMEOUT", "eventbus.offer_timeout_ms"),
    ("REDIS_HOST", "eventbus.redis.host"),
    ("REDIS_PORT", "eventbus.redis.port"),
    ("REDIS_PASSWORD", "eventbus.redis.password"),
    ("REDIS_DATABASE", "eventbus.redis.database"),
    ("EVENTBUS_REDIS_PREFIX", "eventbus.redis.prefix"),
    ("EVENTBUS_METRICS_ENABLED", "eventbus.metrics.enabled"),
];

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read or parsed, or a key is unknown or of the wrong type.
    #[error("{0}")]
    Load(#[from] config::ConfigError),
    /// A value parsed but is out of range.
    #[error("invalid value for {key}: {message}")]
    Invalid { key: &'static str, message: String },
    /// The file named by `--config` does not exist.
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
}

/// Everything eventbusd can be configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub eventbus: EventBusSettings,
    pub durable: DurableSettings,
    pub log: LogSettings,
}

/// The `durable` section (SPEC §9).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurableSettings {
    /// Store directory; empty = in memory.
    pub data_dir: String,
    pub fsync: FsyncSetting,
    pub dedup_window_ms: u64,
    pub log_max_entries: u64,
    pub log_max_age_ms: u64,
    pub consumers: Vec<ConsumerSetting>,
}

/// A consumer declared in the configuration file; omitted keys take the defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSetting {
    pub name: String,
    pub channels: Vec<String>,
    #[serde(default = "defaults::ack_deadline_ms")]
    pub ack_deadline_ms: u64,
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: BackoffSetting,
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: u32,
    #[serde(default)]
    pub dead_letter_channel: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffSetting {
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
}

impl Default for BackoffSetting {
    fn default() -> Self {
        let b = Backoff::default();
        Self { initial_ms: b.initial_ms, multiplier: b.multiplier, max_ms: b.max_ms }
    }
}

mod defaults {
    pub(super) fn ack_deadline_ms() -> u64 {
        30_000
    }
    pub(super) fn max_attempts() -> u32 {
        5
    }
    pub(super) fn max_in_flight() -> u32 {
        1_000
    }
}

impl ConsumerSetting {
    /// The engine's definition.
    pub fn to_config(&self) -> ConsumerConfig {
        ConsumerConfig {
            name: self.name.clone(),
            channels: self.channels.clone(),
            ack_deadline_ms: self.ack_deadline_ms,
            max_attempts: self.max_attempts,
            backoff: Backoff {
                initial_ms: self.backoff.initial_ms,
                multiplier: self.backoff.multiplier,
                max_ms: self.backoff.max_ms,
            },
            max_in_flight: self.max_in_flight,
            dead_letter_channel: (!self.dead_letter_channel.is_empty()).then(|| self.dead_letter_channel.clone()),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// gRPC listener address.
    pub grpc_addr: SocketAddr,
    /// HTTP listener address (metrics, probes, admin REST).
    pub http_addr: SocketAddr,
    /// Bound on the shutdown flush.
    pub shutdown_timeout_ms: u64,
}

/// Declares a configuration enum spelled in snake_case, whose parse error lists the
/// accepted values (serde's own message names the Rust type instead).
macro_rules! choice {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(try_from = "String")]
        pub enum $name { $($variant),+ }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                match s.as_str() {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(format!("{s:?} is not one of: {}", [$($text),+].join(", "))),
                }
            }
        }
    };
}

choice!(
    /// Fan-out mode.
    Mode { InMemory = "in_memory", Redis = "redis" }
);

choice!(
    /// Overflow policy as spelled in configuration.
    OverflowSetting { DropNewest = "drop_newest", DropOldest = "drop_oldest", Disconnect = "disconnect" }
);

impl From<OverflowSetting> for Overflow {
    fn from(o: OverflowSetting) -> Self {
        match o {
            OverflowSetting::DropNewest => Overflow::DropNewest,
            OverflowSetting::DropOldest => Overflow::DropOldest,
            OverflowSetting::Disconnect => Overflow::Disconnect,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBusSettings {
    pub mode: Mode,
    pub default_queue_capacity: usize,
    pub max_queue_capacity: usize,
    pub offer_timeout_ms: u64,
    pub overflow: OverflowSetting,
    pub max_batch: usize,
    pub max_payload_bytes: usize,
    pub max_tracked_channels: usize,
    pub redis: RedisSettings,
    pub metrics: MetricsSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://` or `rediss://` URL; empty means use host/port/password/database.
    pub url: String,
    pub host: String,
    pub port: u16,
    pub password: String,
    pub database: u32,
    pub prefix: String,
    /// PEM CA file for `rediss://` with a private CA; empty = system roots.
    pub tls_ca_file: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub enabled: bool,
    pub prefix: String,
    pub max_channel_labels: usize,
}

choice!(
    /// When captures reach the disk.
    FsyncSetting { Always = "always", Batch = "batch" }
);

choice!(
    /// Log output format.
    LogFormat { Text = "text", Json = "json" }
);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// Level (`info`) or filter directives (`info,eventbus_core=debug`).
    pub level: String,
    pub format: LogFormat,
}

/// Command-line values, the top layer. `None` leaves the lower layers alone.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub grpc_addr: Option<String>,
    pub http_addr: Option<String>,
    pub mode: Option<String>,
    pub log_level: Option<String>,
    pub log_format: Option<String>,
}

impl Default for Settings {
    /// The shipped defaults.
    fn default() -> Self {
        let config = Config::builder()
            .add_source(File::from_str(DEFAULT_YAML, FileFormat::Yaml))
            .build()
            .and_then(Config::try_deserialize);
        // The embedded file is part of the binary; `shipped_defaults_parse` tests it.
        config.expect("the embedded config/default.yaml is valid")
    }
}

impl Settings {
    /// Loads every layer. `env` is the process environment (a map, for tests).
    pub fn load(overrides: &Overrides, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULT_YAML, FileFormat::Yaml));
        match &overrides.config_file {
            Some(path) if !path.exists() => return Err(ConfigError::MissingFile(path.clone())),
            Some(path) => builder = builder.add_source(File::from(path.as_path()).format(FileFormat::Yaml)),
            None if Path::new(IMPLICIT_FILE).exists() => {
                builder = builder.add_source(File::new(IMPLICIT_FILE, FileFormat::Yaml));
            }
            None => {}
        }
        let aliases: Map<String, Value> = ALIASES
            .iter()
            .filter_map(|(var, key)| {
                env.get(*var).map(|v| (key.to_string(), Value::new(Some(&var.to_string()), v.clone())))
            })
            .collect();
        builder = builder.add_source(Aliases(aliases)).add_source(
            Environment::with_prefix("EVENTBUS")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(env.clone().into_iter().collect())),
        );
        let flags = [
            ("server.grpc_addr", &overrides.grpc_addr),
            ("server.http_addr", &overrides.http_addr),
            ("eventbus.mode", &overrides.mode),
            ("log.level", &overrides.log_level),
            ("log.format", &overrides.log_format),
        ];
        for (key, value) in flags {
            if let Some(value) = value {
                builder = builder.set_override(key, value.as_str())?;
            }
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = &self.eventbus;
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        if e.max_queue_capacity == 0 {
            return invalid("eventbus.max_queue_capacity", "must be at least 1".into());
        }
        if e.default_queue_capacity == 0 || e.default_queue_capacity > e.max_queue_capacity {
            return invalid(
                "eventbus.default_queue_capacity",
                format!(
                    "{} must be between 1 and max_queue_capacity ({})",
                    e.default_queue_capacity, e.max_queue_capacity
                ),
            );
        }
        if !(1..=eventbus_core::bus::MAX_BATCH_LIMIT).contains(&e.max_batch) {
            return invalid(
                "eventbus.max_batch",
                format!("{} must be between 1 and {}", e.max_batch, eventbus_core::bus::MAX_BATCH_LIMIT),
            );
        }
        if !(1..=MAX_PAYLOAD_LIMIT).contains(&e.max_payload_bytes) {
            return invalid(
                "eventbus.max_payload_bytes",
                format!("{} must be between 1 and {MAX_PAYLOAD_LIMIT}", e.max_payload_bytes),
            );
        }
        if e.max_tracked_channels == 0 {
            return invalid("eventbus.max_tracked_channels", "must be at least 1".into());
        }
        if e.offer_timeout_ms > 60_000 {
            return invalid("eventbus.offer_timeout_ms", format!("{} is above 60000", e.offer_timeout_ms));
        }
        let url = &e.redis.url;
        if !(url.is_empty() || url.starts_with("redis://") || url.starts_with("rediss://")) {
            return invalid("eventbus.redis.url", "must start with redis:// or rediss://".into());
        }
        if !e.redis.tls_ca_file.is_empty() && !url.starts_with("rediss://") {
            return invalid("eventbus.redis.tls_ca_file", "only applies to a rediss:// url".into());
        }
        if e.redis.prefix.is_empty() {
            return invalid("eventbus.redis.prefix", "must not be empty".into());
        }
        if !is_metric_name(&e.metrics.prefix) {
            return invalid(
                "eventbus.metrics.prefix",
                format!("{:?} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", e.metrics.prefix),
            );
        }
        if e.mode == Mode::Redis
            && let Err(err) = self.redis_settings().client()
        {
            return invalid("eventbus.redis", format!("cannot use these Redis settings: {err}"));
        }
        for consumer in &self.durable.consumers {
            if let Err(message) = consumer.to_config().validate() {
                return invalid("durable.consumers", message.to_string());
            }
        }
        if self.durable.log_max_entries == 0 {
            return invalid("durable.log_max_entries", "must be at least 1".into());
        }
        if let Err(err) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return invalid("log.level", format!("{:?}: {err}", self.log.level));
        }
        Ok(())
    }

    /// The engine's settings.
    pub fn bus_config(&self) -> BusConfig {
        let e = &self.eventbus;
        BusConfig {
            default_queue_capacity: e.default_queue_capacity,
            max_queue_capacity: e.max_queue_capacity,
            offer_timeout: Duration::from_millis(e.offer_timeout_ms),
            overflow: e.overflow.into(),
            max_batch: e.max_batch,
            max_payload_bytes: e.max_payload_bytes,
            max_channels: e.max_tracked_channels,
            max_channel_labels: e.metrics.enabled.then_some(e.metrics.max_channel_labels),
        }
    }

    /// Where Redis is, for the redis mode.
    pub fn redis_settings(&self) -> RedisOptions {
        let r = &self.eventbus.redis;
        RedisOptions {
            url: (!r.url.is_empty()).then(|| r.url.clone()),
            host: r.host.clone(),
            port: r.port,
            password: (!r.password.is_empty()).then(|| r.password.clone()),
            database: i64::from(r.database),
            prefix: r.prefix.clone(),
            tls_ca_file: (!r.tls_ca_file.is_empty()).then(|| PathBuf::from(&r.tls_ca_file)),
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

/// Largest `max_payload_bytes` accepted: gRPC messages stay well within what clients
/// can be configured to take.
pub const MAX_PAYLOAD_LIMIT: usize = 64 << 20;

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The seed's environment variables, already mapped to their keys.
#[derive(Debug, Clone)]
struct Aliases(Map<String, Value>);

impl Source for Aliases {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        // Parse like the EVENTBUS__ variables do, so numbers and booleans deserialize.
        Ok(self
            .0
            .iter()
            .map(|(k, v)| {
                let raw = v.clone().into_string().unwrap_or_default();
                let kind = if let Ok(b) = raw.to_ascii_lowercase().parse::<bool>() {
                    ValueKind::Boolean(b)
                } else if let Ok(i) = raw.parse::<i64>() {
                    ValueKind::I64(i)
                } else {
                    ValueKind::String(raw)
                };
                (k.clone(), Value::new(v.origin().map(str::to_owned).as_ref(), kind))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)], overrides: Overrides) -> Result<Settings, ConfigError> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::load(&overrides, &env)
    }

    fn error(env: &[(&str, &str)], overrides: Overrides) -> String {
        match load(env, overrides) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn shipped_defaults_parse_and_validate() {
        let s = Settings::default();
        s.validate().unwrap();
        assert_eq!(s.server.grpc_addr.port(), 50051);
        assert_eq!(s.server.http_addr.port(), 8080);
        assert_eq!(s.bus_config(), BusConfig { max_channels: 10_000, ..BusConfig::default() });
        assert_eq!(s.eventbus.redis.prefix, "socle:eventbus");
        assert_eq!(s.eventbus.metrics.max_channel_labels, 1000);
    }

    #[test]
    fn precedence_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eb.yaml");
        std::fs::write(&file, "eventbus:\n  max_batch: 7\n  offer_timeout_ms: 5\nserver:\n  shutdown_timeout_ms: 9\n")
            .unwrap();
        let overrides =
            Overrides { config_file: Some(file), grpc_addr: Some("127.0.0.1:1".into()), ..Default::default() };
        let s = load(
            &[
                ("EVENTBUS__EVENTBUS__MAX_BATCH", "8"),
                ("EVENTBUS__SERVER__GRPC_ADDR", "127.0.0.1:2"),
                ("EVENTBUS_QUEUE_CAPACITY", "42"),
            ],
            overrides,
        )
        .unwrap();
        assert_eq!(s.server.shutdown_timeout_ms, 9, "file over defaults");
        assert_eq!(s.eventbus.offer_timeout_ms, 5, "file over defaults");
        assert_eq!(s.eventbus.max_batch, 8, "env over file");
        assert_eq!(s.server.grpc_addr.port(), 1, "flag over env");
        assert_eq!(s.eventbus.default_queue_capacity, 42, "seed alias");
    }

    #[test]
    fn canonical_variable_wins_over_alias() {
        let s = load(
            &[("EVENTBUS_QUEUE_CAPACITY", "42"), ("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "43")],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.eventbus.default_queue_capacity, 43);
        let s = load(&[("EVENTBUS_METRICS_ENABLED", "false"), ("REDIS_PORT", "6380")], Overrides::default()).unwrap();
        assert!(!s.eventbus.metrics.enabled);
        assert_eq!(s.eventbus.redis.port, 6380);
    }

    #[test]
    fn unknown_keys_are_named() {
        let msg = error(&[("EVENTBUS__SERVER__GRPC_ADRR", "x")], Overrides::default());
        assert!(msg.contains("grpc_adrr"), "{msg}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eb.yaml");
        std::fs::write(&file, "eventbus:\n  queue_size: 3\n").unwrap();
        let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
        assert!(msg.contains("queue_size"), "{msg}");
    }

    #[test]
    fn bad_values_are_named() {
        let msg = error(&[("EVENTBUS__EVENTBUS__MAX_BATCH", "lots")], Overrides::default());
        assert!(msg.contains("max_batch"), "{msg}");
        let msg = error(&[("EVENTBUS__EVENTBUS__OVERFLOW", "explode")], Overrides::default());
        assert!(msg.contains("overflow"), "{msg}");
        let msg = error(&[], Overrides { grpc_addr: Some("nowhere".into()), ..Default::default() });
        assert!(msg.contains("grpc_addr"), "{msg}");
        let msg = error(&[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "0")], Overrides::default());
        assert!(msg.contains("eventbus.default_queue_capacity"), "{msg}");
        let msg = error(&[("EVENTBUS__EVENTBUS__METRICS__PREFIX", "9bad")], Overrides::default());
        assert!(msg.contains("eventbus.metrics.prefix"), "{msg}");
        let msg = error(&[], Overrides { config_file: Some("/nonexistent.yaml".into()), ..Default::default() });
        assert!(msg.contains("/nonexistent.yaml"), "{msg}");
        let msg = error(&[("EVENTBUS__LOG__FORMAT", "xml")], Overrides::default());
        assert!(msg.contains("format"), "{msg}");
    }

    #[test]
    fn consumers_declared_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eb.yaml");
        let yaml = "durable:\n  data_dir: ''\n  consumers:\n    - name: billing\n      channels: ['orders.>']\n      max_attempts: 3\n";
        std::fs::write(&file, yaml).unwrap();
        let s = load(&[], Overrides { config_file: Some(file.clone()), ..Default::default() }).unwrap();
        let c = s.durable.consumers[0].to_config();
        assert_eq!(
            (c.name.as_str(), c.max_attempts, c.ack_deadline_ms, c.backoff),
            ("billing", 3, 30_000, Backoff::default())
        );
        std::fs::write(&file, "durable:\n  consumers:\n    - name: bad name\n      channels: ['a']\n").unwrap();
        let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
        assert!(msg.contains("durable.consumers") && msg.contains("bad name"), "{msg}");
    }

    #[test]
    fn redis_tls_settings_are_checked() {
        let msg = error(&[("EVENTBUS__EVENTBUS__REDIS__TLS_CA_FILE", "/ca.pem")], Overrides::default());
        assert!(msg.contains("eventbus.redis.tls_ca_file") && msg.contains("rediss://"), "{msg}");
        let env = [
            ("EVENTBUS_MODE", "redis"),
            ("EVENTBUS__EVENTBUS__REDIS__URL", "rediss://cache:6380/"),
            ("EVENTBUS__EVENTBUS__REDIS__TLS_CA_FILE", "/nonexistent/ca.pem"),
        ];
        let msg = error(&env, Overrides::default());
        assert!(msg.contains("eventbus.redis") && msg.contains("/nonexistent/ca.pem"), "{msg}");
        let msg = error(&[("EVENTBUS__EVENTBUS__REDIS__URL", "http://cache")], Overrides::default());
        assert!(msg.contains("eventbus.redis.url"), "{msg}");
    }
}
