//! Why a configuration is refused.

use super::*;

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
    /// its Java-style key: which one was meant cannot be told.
    #[error("`{flat}` and `{nested}` are the same setting, both set in {origin}: keep one")]
    DuplicateKey { flat: String, nested: String, origin: String },
    /// A Java-style section holds a key it does not have.
    #[error("unknown field `{key}` in {origin}, expected {}", one_of(expected))]
    UnknownSeedKey { key: String, origin: String, expected: &'static [&'static str] },
    /// A Java-style section is not a mapping.
    #[error("invalid type for key `{key}` in {origin}: expected a mapping of settings")]
    NotASection { key: &'static str, origin: String },
    /// `eventbus.enabled` is false. In an application that embeds a bus, the switch leaves it out of an
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
    /// A single-Redis key is set beside `eventbus.redis.cluster_nodes`.
    #[error(
        "{key} is set together with eventbus.redis.cluster_nodes: a cluster is reached through its seed \
         nodes only, so leave {key} unset (or empty cluster_nodes for a single Redis)"
    )]
    ClusterMix { key: &'static str },
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
    #[error("invalid value for durable.consumers ({name:?}): {reason}")]
    Consumer { name: String, reason: eventbus_core::durable::ConfigError },
    /// `log.level` is neither a level nor filter directives.
    #[error("invalid value for log.level: {value:?}: {source} ({})", crate::telemetry::DIRECTIVES)]
    LogLevel {
        value: String,
        #[source]
        source: ParseError,
    },
    /// An unknown key set by `EVENTBUS__` environment variables: the message names them.
    #[error(
        "{source}, set by the environment variable {variables} (EVENTBUS__SECTION__KEY spells a key of \
         config/default.yaml, e.g. EVENTBUS__SERVER__GRPC_ADDR for server.grpc_addr)"
    )]
    UnknownVariable {
        variables: String,
        #[source]
        source: Box<ConfigError>,
    },
    /// An error about a setting whose value was written the Java-style way: the message
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
            Self::ClusterMix { key } => Some(key),
            Self::Redis { .. } => Some("eventbus.redis"),
            Self::Consumer { .. } => Some("durable.consumers"),
            Self::LogLevel { .. } => Some("log.level"),
            Self::Disabled => Some("eventbus.enabled"),
            Self::DuplicateKey { flat, .. } => Some(flat),
            Self::UnknownSeedKey { key, .. } => Some(key),
            Self::NotASection { key, .. } => Some(key),
            Self::SeedSpelling { source, .. } | Self::UnknownVariable { source, .. } => source.key(),
            Self::Load(_) | Self::MissingFile { .. } => None,
        }
    }
}
