//! Configuration (README "Configuration").
//!
//! Layers, lowest first: the shipped `config/default.yaml` (compiled in, the single
//! source of defaults), a file (`--config PATH`, else `./config/default.yaml` when
//! present), the seed's environment variables (`EVENTBUS_MODE`, `REDIS_HOST`, …),
//! `EVENTBUS__SECTION__KEY` variables, then command-line flags. Unknown keys and bad
//! values stop start-up with a message naming the key.
//!
//! The settings are built on the flat layout of `config/default.yaml`. The seed's
//! layout is accepted too: each layer is rewritten to the flat one before the layers are
//! merged, so `eventbus.common.max_batch` is another spelling of `eventbus.max_batch`
//! and takes part in the precedence like it. One layer spelling a setting both ways is
//! refused ([`ConfigError::DuplicateKey`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat, Map, Source, Value, ValueKind};
use eventbus_auth::AuthSettings;
use eventbus_core::durable::{Backoff, BackoffKind, ConsumerConfig};
use eventbus_core::{BusConfig, Overflow};
use eventbus_redis::{Envelope, RedisOptions};
use serde::Deserialize;
use tracing_subscriber::filter::ParseError;

pub use crate::tls::TlsSettings;

/// The shipped defaults, embedded so the binary runs from any directory.
pub const DEFAULT_YAML: &str = include_str!("../../../config/default.yaml");

/// File read when `--config` is not given, if it exists.
pub const IMPLICIT_FILE: &str = "config/default.yaml";

/// Seed variable names and the keys they stand for.
const ALIASES: &[(&str, &str)] = &[
    ("EVENTBUS_ENABLED", "eventbus.enabled"),
    ("EVENTBUS_MODE", "eventbus.mode"),
    ("EVENTBUS_QUEUE_CAPACITY", "eventbus.default_queue_capacity"),
    ("EVENTBUS_OFFER_TIMEOUT", "eventbus.offer_timeout_ms"),
    ("REDIS_HOST", "eventbus.redis.host"),
    ("REDIS_PORT", "eventbus.redis.port"),
    ("REDIS_PASSWORD", "eventbus.redis.password"),
    ("REDIS_DATABASE", "eventbus.redis.database"),
    ("EVENTBUS_REDIS_PREFIX", "eventbus.redis.prefix"),
    ("EVENTBUS_REDIS_POOL_MAX", "eventbus.redis.pool.max_total"),
    ("EVENTBUS_REDIS_POOL_MAX_IDLE", "eventbus.redis.pool.max_idle"),
    ("EVENTBUS_REDIS_POOL_MIN_IDLE", "eventbus.redis.pool.min_idle"),
    ("EVENTBUS_METRICS_ENABLED", "eventbus.metrics.enabled"),
];

/// The keys of the seed's `eventbus.common` section; each is a spelling of the flat
/// `eventbus.<key>`.
const COMMON_KEYS: &[&str] =
    &["default_queue_capacity", "max_queue_capacity", "offer_timeout_ms", "overflow", "max_batch", "max_payload_bytes"];

/// Why the configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A layer could not be read or parsed, or a key is unknown or of the wrong type.
    #[error(transparent)]
    Load(#[from] config::ConfigError),
    /// The file named by `--config` does not exist.
    #[error("config file {} does not exist", path.display())]
    MissingFile { path: PathBuf },
    /// One layer (a file, or the environment) sets a setting under both its flat key and
    /// its seed-shaped key: which one was meant cannot be told.
    #[error("`{flat}` and `{nested}` are the same setting, both set in {origin}: keep one")]
    DuplicateKey { flat: String, nested: String, origin: String },
    /// A seed-shaped section holds a key it does not have.
    #[error("unknown field `{key}` in {origin}, expected {}", one_of(expected))]
    UnknownSeedKey { key: String, origin: String, expected: &'static [&'static str] },
    /// A seed-shaped section is not a mapping.
    #[error("invalid type for key `{key}` in {origin}: expected a mapping of settings")]
    NotASection { key: &'static str, origin: String },
    /// `eventbus.enabled` is false. The seed's switch leaves the bus out of an
    /// application that has other work; eventbusd has none, so it does not start rather
    /// than run and serve nothing.
    #[error(
        "eventbus.enabled (EVENTBUS_ENABLED) is false: eventbusd is the event bus and has nothing \
         to run without it; remove the setting, or do not run eventbusd where no bus is wanted"
    )]
    Disabled,
    /// A number outside its range.
    #[error("invalid value for {key}: {value} must be between {min} and {max}")]
    OutOfRange { key: &'static str, value: u64, min: u64, max: u64 },
    /// A number below its minimum.
    #[error("invalid value for {key}: {value} must be at least {min}")]
    TooSmall { key: &'static str, value: u64, min: u64 },
    /// A number above another setting that bounds it.
    #[error("invalid value for {key}: {value} must not be above {limit_key} ({limit})")]
    AboveLimit { key: &'static str, value: u64, limit_key: &'static str, limit: u64 },
    /// A text value that parsed but cannot be used.
    #[error("invalid value for {key}: {value:?} {problem}")]
    Invalid { key: &'static str, value: String, problem: &'static str },
    /// `eventbus.redis.url` has another scheme. The URL is not repeated: it may hold a
    /// password.
    #[error("invalid value for eventbus.redis.url: must start with redis:// or rediss://")]
    RedisUrlScheme { scheme: Option<String> },
    /// The Redis settings do not make a client (redis mode).
    #[error("invalid value for eventbus.redis: cannot use these Redis settings: {source}")]
    Redis {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A consumer declared in `durable.consumers` is not a valid definition.
    #[error("invalid value for durable.consumers: {reason}")]
    Consumer { name: String, reason: eventbus_core::durable::ConfigError },
    /// `log.level` is neither a level nor filter directives.
    #[error("invalid value for log.level: {value:?}: {source}")]
    LogLevel {
        value: String,
        #[source]
        source: ParseError,
    },
    /// An error about a setting whose value was written the seed's way: the message
    /// names the flat key, this adds the key as written.
    #[error("{source} (set as `{nested}` in {origin})")]
    SeedSpelling {
        nested: String,
        origin: String,
        #[source]
        source: Box<ConfigError>,
    },
}

fn one_of(keys: &[&str]) -> String {
    if keys.is_empty() {
        return "none (the section takes no settings)".into();
    }
    let quoted: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    format!("one of {}", quoted.join(", "))
}

impl ConfigError {
    /// The key the error is about, when it names one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Load(config::ConfigError::Type { key, .. } | config::ConfigError::At { key, .. }) => key.as_deref(),
            Self::OutOfRange { key, .. }
            | Self::TooSmall { key, .. }
            | Self::AboveLimit { key, .. }
            | Self::Invalid { key, .. } => Some(key),
            Self::RedisUrlScheme { .. } => Some("eventbus.redis.url"),
            Self::Redis { .. } => Some("eventbus.redis"),
            Self::Consumer { .. } => Some("durable.consumers"),
            Self::LogLevel { .. } => Some("log.level"),
            Self::Disabled => Some("eventbus.enabled"),
            Self::DuplicateKey { flat, .. } => Some(flat),
            Self::UnknownSeedKey { key, .. } => Some(key),
            Self::NotASection { key, .. } => Some(key),
            Self::SeedSpelling { source, .. } => source.key(),
            Self::Load(_) | Self::MissingFile { .. } => None,
        }
    }
}

/// Everything eventbusd can be configured with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub eventbus: EventBusSettings,
    pub durable: DurableSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
}

/// The `durable` section (README "Durable consumers (at-least-once)").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurableSettings {
    /// Store directory; empty = in memory.
    pub data_dir: String,
    pub fsync: FsyncSetting,
    pub dedup_window_ms: u64,
    pub log_max_entries: u64,
    pub log_max_age_ms: u64,
    /// Free disk space below which the embedded store refuses captures (0 = no check).
    pub min_free_disk_bytes: u64,
    /// Most durable consumers on the broker, however created (0 = no bound).
    pub max_consumers: usize,
    /// A publish matching more consumers than this is refused (0 = no bound).
    pub max_captures_per_publish: usize,
    pub consumers: Vec<ConsumerSetting>,
}

/// A consumer declared in the configuration file; omitted keys take the defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// One attached client receives at a time (README "Exclusive consumers").
    #[serde(default)]
    pub exclusive: bool,
    /// Most unfinished events kept (0 = unlimited).
    #[serde(default = "defaults::max_pending")]
    pub max_pending: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffSetting {
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
    /// `exponential` (the default) or `linear`.
    pub kind: BackoffKind,
}

impl Default for BackoffSetting {
    fn default() -> Self {
        let b = Backoff::default();
        Self { initial_ms: b.initial_ms, multiplier: b.multiplier, max_ms: b.max_ms, kind: b.kind }
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
    pub(super) fn max_pending() -> u64 {
        eventbus_core::durable::DEFAULT_MAX_PENDING
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
                kind: self.backoff.kind,
            },
            max_in_flight: self.max_in_flight,
            dead_letter_channel: (!self.dead_letter_channel.is_empty()).then(|| self.dead_letter_channel.clone()),
            owner: String::new(),
            exclusive: self.exclusive,
            max_pending: self.max_pending,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// gRPC listener address.
    pub grpc_addr: SocketAddr,
    /// HTTP listener address (metrics, probes, admin REST).
    pub http_addr: SocketAddr,
    /// Bound on the shutdown flush.
    pub shutdown_timeout_ms: u64,
    /// After the flush, how long open connections get to close before eventbusd exits.
    pub close_grace_ms: u64,
    /// Serve gRPC reflection (the schema, for grpcurl and similar tools).
    pub reflection: bool,
    /// Connections each listener serves at once; past it new ones are closed at once.
    pub max_connections: usize,
    /// HTTP/2 ping interval on gRPC connections (0 = none).
    pub keepalive_interval_ms: u64,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout_ms: u64,
    /// A connection (either listener) with no request in progress is closed after this
    /// long (0 = never): abandoned sockets give their descriptor back.
    pub idle_timeout_ms: u64,
    /// HTTP/2 flow-control window of each gRPC stream: what a client may send on one
    /// stream before the broker has read it.
    pub grpc_stream_window_bytes: u32,
    /// HTTP/2 flow-control window of each gRPC connection. Half of it is h2's budget for
    /// unread small DATA frames (README "Limits").
    pub grpc_connection_window_bytes: u32,
    /// The HTTP listener's own limits (README "Limits", "Security").
    pub http: HttpSettings,
    /// TLS on both listeners (README "Security").
    pub tls: TlsSettings,
}

/// Settings of the HTTP listener (`server.http`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// How long an HTTP/1 client has to send a request's headers (also the wait for the
    /// next request on a kept-alive connection).
    pub header_read_timeout_ms: u64,
    /// Origins (`scheme://host[:port]`) whose browser pages may call the admin REST
    /// routes, besides the broker's own; empty = same-origin only.
    pub allowed_origins: Vec<String>,
}

/// Bounds of the gRPC flow-control windows: the HTTP/2 minimum and maximum.
pub const MIN_WINDOW: u32 = 65_535;
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Declares a configuration enum spelled in snake_case, whose parse error lists the
/// accepted values (serde's own message names the Rust type instead).
macro_rules! choice {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(try_from = "String")]
        pub enum $name { $($variant),+ }

        impl TryFrom<String> for $name {
            type Error = ChoiceError;
            fn try_from(value: String) -> Result<Self, ChoiceError> {
                match value.as_str() {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(ChoiceError { value, expected: &[$($text),+] }),
                }
            }
        }
    };
}

/// A value that is none of a configuration enum's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not one of: {}", expected.join(", "))]
pub struct ChoiceError {
    pub value: String,
    pub expected: &'static [&'static str],
}

choice!(
    /// Fan-out mode.
    Mode { InMemory = "in_memory", Redis = "redis" }
);

choice!(
    /// Overflow policy as spelled in configuration.
    OverflowSetting {
        DropNewest = "drop_newest",
        DropOldest = "drop_oldest",
        Disconnect = "disconnect",
        DeadLetter = "dead_letter"
    }
);

impl From<OverflowSetting> for Overflow {
    fn from(o: OverflowSetting) -> Self {
        match o {
            OverflowSetting::DropNewest => Overflow::DropNewest,
            OverflowSetting::DropOldest => Overflow::DropOldest,
            OverflowSetting::Disconnect => Overflow::Disconnect,
            OverflowSetting::DeadLetter => Overflow::DeadLetter,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBusSettings {
    /// The seed's switch; false refuses to start ([`ConfigError::Disabled`]).
    pub enabled: bool,
    pub mode: Mode,
    pub default_queue_capacity: usize,
    pub max_queue_capacity: usize,
    /// Byte bound of a subscription's queue when it asks for 0.
    pub default_queue_bytes: usize,
    /// Budget of bytes queued across all subscriptions (README "Memory bounds").
    pub max_queued_bytes: usize,
    pub offer_timeout_ms: u64,
    pub overflow: OverflowSetting,
    pub max_batch: usize,
    pub max_payload_bytes: usize,
    /// Most events in one `PublishBatch` request.
    pub max_publish_batch: usize,
    pub max_tracked_channels: usize,
    pub redis: RedisSettings,
    pub metrics: MetricsSettings,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://` or `rediss://` URL; empty means use host/port/username/password/database.
    pub url: String,
    pub host: String,
    pub port: u16,
    /// Redis ACL user (`AUTH username password`); empty = the default user.
    pub username: String,
    pub password: String,
    pub database: u32,
    pub prefix: String,
    /// How the events this instance publishes to Redis are encoded (it reads both).
    pub envelope: EnvelopeSetting,
    /// PEM CA file for `rediss://` with a private CA; empty = system roots.
    pub tls_ca_file: String,
    /// How often the pub/sub and publishing connections are PINGed.
    pub health_check_interval_ms: u64,
    /// How long a PING may take before Redis counts as not answering.
    pub health_check_timeout_ms: u64,
    /// The seed's connection pool sizes: accepted so seed-shaped settings start, but
    /// without effect (see [`Settings::without_effect`]).
    #[serde(default)]
    pub pool: RedisPoolSettings,
}

/// The seed's `eventbus.redis.pool` (a Jedis pool). eventbusd keeps no pool: commands
/// share multiplexed connections, and pub/sub and blocking stream reads each hold their
/// own, so these numbers have nothing to size.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisPoolSettings {
    pub max_total: Option<u32>,
    pub max_idle: Option<u32>,
    pub min_idle: Option<u32>,
}

/// A setting that was given but changes nothing here, reported at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithoutEffect {
    /// The flat key.
    pub key: &'static str,
    /// The seed's environment variable for it.
    pub variable: &'static str,
    pub value: String,
    /// Why it has no effect.
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub enabled: bool,
    pub prefix: String,
    pub max_channel_labels: usize,
    /// Subscriptions with their own `subscription` label on the queue gauges (the
    /// fullest ones); the rest are summed under `subscription="_other"`.
    pub max_subscription_labels: usize,
    /// Durable consumers with their own `consumer` label (the first by name); the rest
    /// share `consumer="_other"`.
    pub max_consumer_labels: usize,
}

choice!(
    /// Encoding of the events published to Redis.
    EnvelopeSetting { Binary = "binary", Json = "json" }
);

choice!(
    /// When captures reach the disk.
    FsyncSetting { Always = "always", Batch = "batch" }
);

choice!(
    /// Log output format.
    LogFormat { Text = "text", Json = "json" }
);

#[derive(Debug, Clone, PartialEq, Deserialize)]
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
        let mut layers = Layers::default();
        layers.add(&File::from_str(DEFAULT_YAML, FileFormat::Yaml), "the built-in defaults")?;
        match &overrides.config_file {
            Some(path) if !path.exists() => return Err(ConfigError::MissingFile { path: path.clone() }),
            Some(path) => {
                layers.add(&File::from(path.as_path()).format(FileFormat::Yaml), &path.display().to_string())?;
            }
            None if Path::new(IMPLICIT_FILE).exists() => {
                layers.add(&File::new(IMPLICIT_FILE, FileFormat::Yaml), IMPLICIT_FILE)?;
            }
            None => {}
        }
        let aliases: Map<String, Value> = ALIASES
            .iter()
            .filter_map(|(var, key)| {
                env.get(*var).map(|v| (key.to_string(), Value::new(Some(&var.to_string()), v.clone())))
            })
            .collect();
        layers.add(&Layer(typed_like_env(aliases)), "the seed's environment variables")?;
        let environment = Environment::with_prefix("EVENTBUS")
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .source(Some(env.clone().into_iter().collect()));
        layers.add(&environment, "the EVENTBUS__ environment variables")?;
        let mut builder = layers.builder;
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
        let spellings = layers.seed_spelled;
        let settings = builder
            .build()
            .and_then(Config::try_deserialize::<Settings>)
            .map_err(ConfigError::from)
            .and_then(|settings| settings.validate().map(|()| settings));
        settings.map_err(|err| match err.key().and_then(|key| spellings.get(key)) {
            Some((nested, origin)) => {
                ConfigError::SeedSpelling { nested: nested.clone(), origin: origin.clone(), source: Box::new(err) }
            }
            None => err,
        })
    }

    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = &self.eventbus;
        if !e.enabled {
            return Err(ConfigError::Disabled);
        }
        at_least("eventbus.max_queue_capacity", e.max_queue_capacity, 1)?;
        at_least("eventbus.default_queue_capacity", e.default_queue_capacity, 1)?;
        if e.default_queue_capacity > e.max_queue_capacity {
            return Err(ConfigError::AboveLimit {
                key: "eventbus.default_queue_capacity",
                value: widen(e.default_queue_capacity),
                limit_key: "eventbus.max_queue_capacity",
                limit: widen(e.max_queue_capacity),
            });
        }
        within("eventbus.max_batch", e.max_batch, 1, eventbus_core::bus::MAX_BATCH_LIMIT)?;
        within("eventbus.max_payload_bytes", e.max_payload_bytes, 1, MAX_PAYLOAD_LIMIT)?;
        within("eventbus.max_publish_batch", e.max_publish_batch, 1, MAX_PUBLISH_BATCH_LIMIT)?;
        // The budget must hold at least one event of the largest payload.
        at_least("eventbus.max_queued_bytes", e.max_queued_bytes, e.max_payload_bytes)?;
        at_least("eventbus.default_queue_bytes", e.default_queue_bytes, 1)?;
        if e.default_queue_bytes > e.max_queued_bytes {
            return Err(ConfigError::AboveLimit {
                key: "eventbus.default_queue_bytes",
                value: widen(e.default_queue_bytes),
                limit_key: "eventbus.max_queued_bytes",
                limit: widen(e.max_queued_bytes),
            });
        }
        within("eventbus.redis.health_check_interval_ms", e.redis.health_check_interval_ms, 100, 60_000)?;
        within("eventbus.redis.health_check_timeout_ms", e.redis.health_check_timeout_ms, 10, 60_000)?;
        at_least("eventbus.max_tracked_channels", e.max_tracked_channels, 1)?;
        within("eventbus.offer_timeout_ms", e.offer_timeout_ms, 0, 60_000)?;
        let url = &e.redis.url;
        if !(url.is_empty() || url.starts_with("redis://") || url.starts_with("rediss://")) {
            let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_owned());
            return Err(ConfigError::RedisUrlScheme { scheme });
        }
        let invalid = |key, value: &str, problem| Err(ConfigError::Invalid { key, value: value.to_owned(), problem });
        if !e.redis.tls_ca_file.is_empty() && !url.starts_with("rediss://") {
            return invalid("eventbus.redis.tls_ca_file", &e.redis.tls_ca_file, "only applies to a rediss:// url");
        }
        if !e.redis.username.is_empty() && e.redis.password.is_empty() {
            // Without a password no AUTH is sent, and the user would silently be `default`.
            return invalid(
                "eventbus.redis.username",
                &e.redis.username,
                "needs eventbus.redis.password (for a `nopass` user, any password)",
            );
        }
        if e.redis.prefix.is_empty() {
            return invalid("eventbus.redis.prefix", &e.redis.prefix, "must not be empty");
        }
        if !is_metric_name(&e.metrics.prefix) {
            return invalid(
                "eventbus.metrics.prefix",
                &e.metrics.prefix,
                "is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
            );
        }
        if e.mode == Mode::Redis
            && let Err(err) = self.redis_settings().client()
        {
            return Err(ConfigError::Redis { source: Box::new(err) });
        }
        for consumer in &self.durable.consumers {
            if let Err(reason) = consumer.to_config().validate() {
                return Err(ConfigError::Consumer { name: consumer.name.clone(), reason });
            }
        }
        at_least("durable.log_max_entries", self.durable.log_max_entries, 1)?;
        at_least("server.max_connections", self.server.max_connections, 1)?;
        let server = &self.server;
        within("server.grpc_stream_window_bytes", server.grpc_stream_window_bytes, MIN_WINDOW, MAX_WINDOW)?;
        within("server.grpc_connection_window_bytes", server.grpc_connection_window_bytes, MIN_WINDOW, MAX_WINDOW)?;
        if server.grpc_stream_window_bytes > server.grpc_connection_window_bytes {
            return Err(ConfigError::AboveLimit {
                key: "server.grpc_stream_window_bytes",
                value: server.grpc_stream_window_bytes.into(),
                limit_key: "server.grpc_connection_window_bytes",
                limit: server.grpc_connection_window_bytes.into(),
            });
        }
        at_least("server.http.header_read_timeout_ms", server.http.header_read_timeout_ms, 1)?;
        for origin in &server.http.allowed_origins {
            if !is_origin(origin) {
                return invalid(
                    "server.http.allowed_origins",
                    origin,
                    "is not an origin: scheme://host or scheme://host:port, without a path",
                );
            }
        }
        let tls = &self.server.tls;
        if tls.cert_file.is_empty() != tls.key_file.is_empty() {
            let (key, value) = if tls.key_file.is_empty() {
                ("server.tls.key_file", &tls.key_file)
            } else {
                ("server.tls.cert_file", &tls.cert_file)
            };
            return invalid(key, value, "must be set too: server.tls.cert_file and key_file go together");
        }
        if tls.mutual() && !tls.enabled() {
            return invalid(
                "server.tls.client_ca_file",
                &tls.client_ca_file,
                "needs server.tls.cert_file and key_file (mTLS is part of TLS)",
            );
        }
        let auth = &self.auth;
        if auth.enabled && auth.principals_file.is_empty() && !auth.jwt.configured() {
            return invalid(
                "auth.enabled",
                "true",
                "but no credential can be checked: set auth.principals_file, auth.jwt.hs256_secret_file or \
                 auth.jwt.public_key_file",
            );
        }
        if let Err(source) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(ConfigError::LogLevel { value: self.log.level.clone(), source });
        }
        Ok(())
    }

    /// Settings accepted for the seed's sake that change nothing here. eventbusd logs
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
        }
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
            health_check_interval: Duration::from_millis(r.health_check_interval_ms),
            health_check_timeout: Duration::from_millis(r.health_check_timeout_ms),
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

/// Largest `max_publish_batch` accepted: a batch is answered in one message, and its
/// events are held together while they are published.
const MAX_PUBLISH_BATCH_LIMIT: usize = 100_000;

/// Largest `max_payload_bytes` accepted: gRPC messages stay well within what clients
/// can be configured to take.
pub const MAX_PAYLOAD_LIMIT: usize = 64 << 20;

/// `scheme://host[:port]` as browsers send it in `Origin` (no path, no trailing slash).
fn is_origin(s: &str) -> bool {
    let Some((scheme, authority)) = s.split_once("://") else { return false };
    !scheme.is_empty()
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !authority.is_empty()
        && !authority.contains(['/', '?', '#', '@', ' '])
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn at_least<N: Copy + PartialOrd + TryInto<u64>>(key: &'static str, value: N, min: N) -> Result<(), ConfigError> {
    if value < min {
        return Err(ConfigError::TooSmall { key, value: widen(value), min: widen(min) });
    }
    Ok(())
}

fn within<N: Copy + PartialOrd + TryInto<u64>>(key: &'static str, value: N, min: N, max: N) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange { key, value: widen(value), min: widen(min), max: widen(max) });
    }
    Ok(())
}

/// A count for an error message (`usize` is at most 64 bits where eventbusd runs).
fn widen<N: TryInto<u64>>(n: N) -> u64 {
    n.try_into().unwrap_or(u64::MAX)
}

/// The layers merged so far, each rewritten to the flat layout.
#[derive(Debug, Default)]
struct Layers {
    builder: config::ConfigBuilder<config::builder::DefaultState>,
    /// Flat key → (seed-shaped key, layer) for the settings whose current value was
    /// written the seed's way, so that an error about one can say how it was written.
    seed_spelled: HashMap<String, (String, String)>,
}

impl Layers {
    /// Adds `source` above the layers before it. `origin` names it in errors.
    fn add(&mut self, source: &dyn Source, origin: &str) -> Result<(), ConfigError> {
        let mut cache = Value::new(None, Map::<String, Value>::new());
        source.collect_to(&mut cache)?;
        let ValueKind::Table(mut tree) = cache.kind else {
            return Ok(());
        };
        let moved = flatten_seed_layout(&mut tree, origin)?;
        if let Some(ValueKind::Table(eventbus)) = tree.get("eventbus").map(|v| &v.kind) {
            for key in COMMON_KEYS.iter().filter(|key| eventbus.contains_key(**key)) {
                let flat = format!("eventbus.{key}");
                if moved.contains(key) {
                    self.seed_spelled.insert(flat, (format!("eventbus.common.{key}"), origin.to_owned()));
                } else {
                    self.seed_spelled.remove(&flat);
                }
            }
        }
        self.builder = std::mem::take(&mut self.builder).add_source(Layer(tree));
        Ok(())
    }
}

/// Rewrites one layer's seed-shaped keys to the flat layout: `eventbus.common.<key>`
/// becomes `eventbus.<key>`, and the seed's empty `eventbus.in_memory` section goes.
/// Returns the keys moved.
fn flatten_seed_layout(tree: &mut Map<String, Value>, origin: &str) -> Result<Vec<&'static str>, ConfigError> {
    let Some(ValueKind::Table(eventbus)) = tree.get_mut("eventbus").map(|v| &mut v.kind) else {
        // Absent, or not a mapping: deserialization names the problem.
        return Ok(Vec::new());
    };
    let section = |key: &'static str, value: Value| match value.kind {
        ValueKind::Nil => Ok(Map::new()),
        ValueKind::Table(table) => Ok(table),
        _ => Err(ConfigError::NotASection { key, origin: origin.to_owned() }),
    };
    if let Some(in_memory) = eventbus.remove("in_memory")
        && let Some(key) = section("eventbus.in_memory", in_memory)?.keys().next()
    {
        let key = format!("eventbus.in_memory.{key}");
        return Err(ConfigError::UnknownSeedKey { key, origin: origin.to_owned(), expected: &[] });
    }
    let Some(common) = eventbus.remove("common") else {
        return Ok(Vec::new());
    };
    let mut moved = Vec::new();
    for (key, value) in section("eventbus.common", common)? {
        let Some(known) = COMMON_KEYS.iter().copied().find(|k| *k == key) else {
            let key = format!("eventbus.common.{key}");
            return Err(ConfigError::UnknownSeedKey { key, origin: origin.to_owned(), expected: COMMON_KEYS });
        };
        if eventbus.contains_key(known) {
            return Err(ConfigError::DuplicateKey {
                flat: format!("eventbus.{known}"),
                nested: format!("eventbus.common.{known}"),
                origin: origin.to_owned(),
            });
        }
        eventbus.insert(key, value);
        moved.push(known);
    }
    Ok(moved)
}

/// One layer, already collected and flattened.
#[derive(Debug, Clone)]
struct Layer(Map<String, Value>);

impl Source for Layer {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self.0.clone())
    }
}

/// The seed's environment variables, already mapped to their keys, typed the way the
/// EVENTBUS__ variables are parsed, so numbers and booleans deserialize.
fn typed_like_env(aliases: Map<String, Value>) -> Map<String, Value> {
    aliases
        .into_iter()
        .map(|(k, v)| {
            let origin = v.origin().map(str::to_owned);
            let raw = v.into_string().unwrap_or_default();
            let kind = if let Ok(b) = raw.to_ascii_lowercase().parse::<bool>() {
                ValueKind::Boolean(b)
            } else if let Ok(i) = raw.parse::<i64>() {
                ValueKind::I64(i)
            } else {
                ValueKind::String(raw)
            };
            (k, Value::new(origin.as_ref(), kind))
        })
        .collect()
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
        assert_eq!((s.server.idle_timeout_ms, s.server.http.header_read_timeout_ms), (300_000, 10_000));
        assert!(s.server.http.allowed_origins.is_empty());
    }

    #[test]
    fn edge_limits_are_checked() {
        let check = |tweak: &dyn Fn(&mut Settings)| {
            let mut s = Settings::default();
            tweak(&mut s);
            s.validate()
        };
        let err = check(&|s| s.server.grpc_stream_window_bytes = 1000).unwrap_err();
        assert!(matches!(err, ConfigError::OutOfRange { key: "server.grpc_stream_window_bytes", .. }), "{err:?}");
        let err = check(&|s| s.server.grpc_connection_window_bytes = u32::MAX).unwrap_err();
        assert!(matches!(err, ConfigError::OutOfRange { key: "server.grpc_connection_window_bytes", .. }), "{err:?}");
        let err = check(&|s| {
            s.server.grpc_stream_window_bytes = 1 << 20;
            s.server.grpc_connection_window_bytes = 1 << 19;
        })
        .unwrap_err();
        assert!(matches!(err, ConfigError::AboveLimit { key: "server.grpc_stream_window_bytes", .. }), "{err:?}");
        let err = check(&|s| s.server.http.header_read_timeout_ms = 0).unwrap_err();
        assert!(matches!(err, ConfigError::TooSmall { key: "server.http.header_read_timeout_ms", .. }), "{err:?}");
        for bad in ["console.example", "https://console.example/", "https://a.example/path", "null", "https://"] {
            let err = check(&|s| s.server.http.allowed_origins = vec![bad.into()]).unwrap_err();
            assert!(matches!(err, ConfigError::Invalid { key: "server.http.allowed_origins", .. }), "{bad}: {err:?}");
        }
        let good = check(&|s| {
            s.server.http.allowed_origins = vec!["https://console.example".into(), "http://127.0.0.1:3000".into()];
            s.server.idle_timeout_ms = 0;
        });
        assert!(good.is_ok(), "{good:?}");
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

    /// README "Consumer operations": `exclusive` and `backoff.kind` in `durable.consumers`;
    /// a partial `backoff` keeps the other defaults.
    #[test]
    fn declared_consumers_take_exclusive_and_linear_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eb.yaml");
        let yaml = "durable:\n  consumers:\n    - name: runner\n      channels: ['jobs.>']\n      exclusive: true\n      \
                    backoff: { kind: linear }\n";
        std::fs::write(&file, yaml).unwrap();
        let s = load(&[], Overrides { config_file: Some(file.clone()), ..Default::default() }).unwrap();
        let c = s.durable.consumers[0].to_config();
        assert!(c.exclusive);
        assert_eq!(c.backoff, Backoff { kind: BackoffKind::Linear, ..Backoff::default() });
        std::fs::write(
            &file,
            "durable:\n  consumers:\n    - name: r\n      channels: ['a']\n      backoff: { kind: cubic }\n",
        )
        .unwrap();
        let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
        assert!(msg.contains("cubic") && msg.contains("backoff.kind"), "{msg}");
    }

    /// The seed's `application.yml` with its defaults written in, minus the
    /// Spring `socle:` root, and in redis mode so that every section matters.
    const SEED_SHAPED: &str = "\
eventbus:
  enabled: true
  mode: redis
  common:
    default_queue_capacity: 5000
    max_queue_capacity: 20000
    offer_timeout_ms: 250
    overflow: drop_oldest
    max_batch: 64
    max_payload_bytes: 65536
  in_memory:
  redis:
    host: cache
    port: 6380
    password: secret
    database: 2
    prefix: app:bus
    pool:
      max_total: 16
      max_idle: 8
      min_idle: 2
  metrics:
    enabled: false
    prefix: app_bus
";

    /// The same settings in the built (flat) layout.
    const FLAT: &str = "\
eventbus:
  mode: redis
  default_queue_capacity: 5000
  max_queue_capacity: 20000
  offer_timeout_ms: 250
  overflow: drop_oldest
  max_batch: 64
  max_payload_bytes: 65536
  redis:
    host: cache
    port: 6380
    password: secret
    database: 2
    prefix: app:bus
  metrics:
    enabled: false
    prefix: app_bus
";

    fn load_file(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eventbus.yaml");
        std::fs::write(&file, text).unwrap();
        load(env, Overrides { config_file: Some(file), ..Default::default() })
    }

    #[test]
    fn seed_shaped_file_gives_the_same_settings_as_the_flat_one() {
        let mut seed = load_file(SEED_SHAPED, &[]).unwrap();
        let flat = load_file(FLAT, &[]).unwrap();
        assert_ne!(flat, Settings::default(), "the files change something");
        assert_eq!(
            seed.eventbus.redis.pool,
            RedisPoolSettings { max_total: Some(16), max_idle: Some(8), min_idle: Some(2) }
        );
        seed.eventbus.redis.pool = RedisPoolSettings::default();
        assert_eq!(seed, flat);
        assert!(flat.without_effect().is_empty());
    }

    #[test]
    fn seed_layout_takes_part_in_the_precedence() {
        // A nested key in the file is overridden by the flat variable, and by the seed's.
        let s = load_file(SEED_SHAPED, &[("EVENTBUS__EVENTBUS__MAX_BATCH", "9"), ("EVENTBUS_QUEUE_CAPACITY", "7")])
            .unwrap();
        assert_eq!((s.eventbus.max_batch, s.eventbus.default_queue_capacity), (9, 7));
        // The nested spelling works in EVENTBUS__ variables too, over a flat file.
        let s = load_file(FLAT, &[("EVENTBUS__EVENTBUS__COMMON__MAX_BATCH", "10")]).unwrap();
        assert_eq!(s.eventbus.max_batch, 10);
        // An empty common section, or in_memory: {}, is harmless.
        let s = load_file("eventbus:\n  common:\n  in_memory: {}\n", &[]).unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn seed_variables_are_aliases() {
        let env = [
            ("EVENTBUS_ENABLED", "true"),
            ("EVENTBUS_REDIS_POOL_MAX", "32"),
            ("EVENTBUS_REDIS_POOL_MIN_IDLE", "4"),
            ("EVENTBUS_OFFER_TIMEOUT", "50"),
        ];
        let s = load(&env, Overrides::default()).unwrap();
        assert_eq!(s.eventbus.offer_timeout_ms, 50);
        assert_eq!(s.eventbus.redis.pool, RedisPoolSettings { max_total: Some(32), max_idle: None, min_idle: Some(4) });
        let ignored = s.without_effect();
        let names: Vec<_> = ignored.iter().map(|i| (i.key, i.variable, i.value.as_str())).collect();
        assert_eq!(
            names,
            [
                ("eventbus.redis.pool.max_total", "EVENTBUS_REDIS_POOL_MAX", "32"),
                ("eventbus.redis.pool.min_idle", "EVENTBUS_REDIS_POOL_MIN_IDLE", "4"),
            ]
        );
        assert!(ignored[0].reason.contains("no Redis connection pool"));

        let msg = error(&[("EVENTBUS_REDIS_POOL_MAX_IDLE", "-1")], Overrides::default());
        assert!(msg.contains("eventbus.redis.pool.max_idle"), "{msg}");
    }

    #[test]
    fn eventbus_enabled_false_refuses_to_start() {
        for (env, file) in [(&[("EVENTBUS_ENABLED", "false")][..], ""), (&[][..], "eventbus:\n  enabled: off\n")] {
            let err = load_file(file, env).unwrap_err();
            assert!(matches!(err, ConfigError::Disabled), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("eventbus.enabled") && msg.contains("EVENTBUS_ENABLED"), "{msg}");
        }
        // The canonical variable wins over the seed's, as for every alias.
        let env = [("EVENTBUS_ENABLED", "false"), ("EVENTBUS__EVENTBUS__ENABLED", "true")];
        assert!(load(&env, Overrides::default()).unwrap().eventbus.enabled);
    }

    #[test]
    fn a_setting_given_both_ways_in_one_layer_is_refused() {
        let err = load_file("eventbus:\n  max_batch: 5\n  common:\n    max_batch: 6\n", &[]).unwrap_err();
        let ConfigError::DuplicateKey { flat, nested, origin } = &err else { panic!("{err:?}") };
        assert_eq!((flat.as_str(), nested.as_str()), ("eventbus.max_batch", "eventbus.common.max_batch"));
        assert!(origin.ends_with("eventbus.yaml"), "{origin}");
        let msg = err.to_string();
        assert!(msg.contains("`eventbus.max_batch`") && msg.contains("`eventbus.common.max_batch`"), "{msg}");

        let env =
            [("EVENTBUS__EVENTBUS__OVERFLOW", "disconnect"), ("EVENTBUS__EVENTBUS__COMMON__OVERFLOW", "drop_oldest")];
        let msg = error(&env, Overrides::default());
        assert!(msg.contains("eventbus.overflow") && msg.contains("eventbus.common.overflow"), "{msg}");
        assert!(msg.contains("EVENTBUS__"), "names the layer: {msg}");
    }

    #[test]
    fn seed_sections_are_checked() {
        let msg = load_file("eventbus:\n  common:\n    queue_size: 3\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("eventbus.common.queue_size") && msg.contains("`max_batch`"), "{msg}");
        // Keys that only exist flat are not in common.
        let msg = load_file("eventbus:\n  common:\n    max_tracked_channels: 3\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("eventbus.common.max_tracked_channels"), "{msg}");
        let msg = load_file("eventbus:\n  in_memory:\n    shards: 3\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("eventbus.in_memory.shards") && msg.contains("takes no settings"), "{msg}");
        let msg = load_file("eventbus:\n  common: 3\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("eventbus.common") && msg.contains("mapping"), "{msg}");
        let msg = load_file("eventbus:\n  redis:\n    pool:\n      max_wait: 3\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("max_wait"), "{msg}");
    }

    #[test]
    fn errors_about_a_seed_shaped_key_name_it_as_written() {
        // Refused by validate(): the winning value came from the file's common section.
        let err = load_file("eventbus:\n  common:\n    max_batch: 0\n", &[]).unwrap_err();
        assert_eq!(err.key(), Some("eventbus.max_batch"));
        let msg = err.to_string();
        assert!(msg.contains("eventbus.max_batch") && msg.contains("set as `eventbus.common.max_batch`"), "{msg}");
        // Refused by deserialization.
        let msg = load_file("eventbus:\n  common:\n    max_batch: lots\n", &[]).unwrap_err().to_string();
        assert!(msg.contains("max_batch") && msg.contains("eventbus.common.max_batch"), "{msg}");
        // A flat variable over the nested file value: the error is the variable's.
        let msg = load_file("eventbus:\n  common:\n    max_batch: 5\n", &[("EVENTBUS__EVENTBUS__MAX_BATCH", "0")])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("eventbus.max_batch") && !msg.contains("common"), "{msg}");
    }

    #[test]
    fn byte_bounds_are_checked_against_each_other() {
        let err = load(&[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_BYTES", "1073741824")], Overrides::default()).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::AboveLimit {
                    key: "eventbus.default_queue_bytes",
                    limit_key: "eventbus.max_queued_bytes",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = load(&[("EVENTBUS__EVENTBUS__MAX_QUEUED_BYTES", "1000")], Overrides::default()).unwrap_err();
        assert!(matches!(err, ConfigError::TooSmall { key: "eventbus.max_queued_bytes", .. }), "{err:?}");
        let s = load(&[], Overrides::default()).unwrap();
        assert_eq!((s.bus_config().default_queue_bytes, s.bus_config().max_queued_bytes), (64 << 20, 512 << 20));
        let redis = s.redis_settings();
        assert_eq!(redis.health_check_interval, Duration::from_secs(1));
        assert_eq!(redis.health_check_timeout, Duration::from_millis(500));
    }

    #[test]
    fn errors_carry_the_key_and_the_value() {
        let err = load(&[("EVENTBUS__EVENTBUS__MAX_BATCH", "0")], Overrides::default()).unwrap_err();
        assert!(
            matches!(err, ConfigError::OutOfRange { key: "eventbus.max_batch", value: 0, min: 1, max: 10_000 }),
            "{err:?}"
        );
        let err = load(
            &[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "11")],
            Overrides { config_file: None, ..Default::default() },
        )
        .and_then(|mut s| {
            s.eventbus.max_queue_capacity = 10;
            s.validate().map(|()| s)
        })
        .unwrap_err();
        assert!(
            matches!(err, ConfigError::AboveLimit { key: "eventbus.default_queue_capacity", value: 11, limit: 10, .. }),
            "{err:?}"
        );
        let err = load(&[("EVENTBUS__LOG__LEVEL", "info,=[")], Overrides::default()).unwrap_err();
        let ConfigError::LogLevel { value, .. } = &err else { panic!("{err:?}") };
        assert_eq!(value, "info,=[");
        assert!(std::error::Error::source(&err).is_some(), "the parse error is the source");
        let err =
            load(&[("EVENTBUS__EVENTBUS__REDIS__URL", "http://:secret@cache")], Overrides::default()).unwrap_err();
        assert!(matches!(&err, ConfigError::RedisUrlScheme { scheme: Some(s) } if s == "http"), "{err:?}");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(
            Mode::try_from("clustered".to_owned()),
            Err(ChoiceError { value: "clustered".into(), expected: &["in_memory", "redis"] })
        );
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
