//! The sections of the settings, one type per section, as `config/default.yaml` lays them out.

use super::*;

/// The `durable` section (docs/durable.md).
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
    /// One attached client receives at a time (docs/consumer-operations.md "Exclusive consumers").
    #[serde(default)]
    pub exclusive: bool,
    /// Most unfinished events kept (0 = unlimited).
    #[serde(default = "defaults::max_pending")]
    pub max_pending: u64,
    /// The broker POSTs the events to this endpoint (docs/push.md).
    #[serde(default)]
    pub push: Option<PushConfig>,
}

/// The `push` section: how push consumers reach their endpoints (docs/push.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSettings {
    /// Address ranges (CIDR or single addresses) not pushed to unless allowed.
    pub deny_networks: Vec<String>,
    /// Exceptions to `deny_networks`: ranges pushed to even though denied.
    pub allow_networks: Vec<String>,
    /// PEM file of CA certificates trusted for https:// endpoints beside the system's
    /// ("" = the system's only).
    pub ca_file: String,
}

impl PushSettings {
    /// The deny list, parsed; the error names the entry.
    pub fn denied(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        networks("push.deny_networks", &self.deny_networks)
    }

    /// The allow list, parsed; the error names the entry.
    pub fn allowed(&self) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        networks("push.allow_networks", &self.allow_networks)
    }
}

fn networks(key: &'static str, list: &[String]) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    list.iter()
        .map(|n| {
            let parsed = n.parse::<ipnet::IpNet>().or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
            parsed.map_err(|_| ConfigError::Invalid {
                key,
                value: n.clone(),
                problem: "not an address range like 10.0.0.0/8 or ::1/128, nor an address",
            })
        })
        .collect()
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
            // `dlq.<channel>`, the default as every view shows it, is the default.
            dead_letter_channel: (!self.dead_letter_channel.is_empty()
                && self.dead_letter_channel != eventbus_core::durable::DEFAULT_DEAD_LETTER_SHOWN)
                .then(|| self.dead_letter_channel.clone()),
            owner: String::new(),
            exclusive: self.exclusive,
            max_pending: self.max_pending,
            push: self.push.clone(),
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
    /// unread small DATA frames (docs/limits.md).
    pub grpc_connection_window_bytes: u32,
    /// The HTTP listener's own limits (docs/limits.md, "Security").
    pub http: HttpSettings,
    /// TLS on both listeners (docs/security.md).
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
    /// routes, the `/v1` routes and gRPC-Web, besides the broker's own; empty =
    /// same-origin only.
    pub allowed_origins: Vec<String>,
    /// Names (`host` or `host:port`) requests may be addressed to (`Host`), besides IP
    /// addresses and `localhost`, which a rebound DNS name cannot be; `*` admits any.
    pub allowed_hosts: Vec<String>,
    /// Comment lines sent on an idle Server-Sent Events stream this often, so proxies
    /// and browsers keep it open.
    pub sse_heartbeat_ms: u64,
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

        /// As the configuration spells it.
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $(Self::$variant => $text),+ })
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
    /// The Java-style switch; false refuses to start ([`ConfigError::Disabled`]).
    pub enabled: bool,
    pub mode: Mode,
    pub default_queue_capacity: usize,
    pub max_queue_capacity: usize,
    /// Byte bound of a subscription's queue when it asks for 0.
    pub default_queue_bytes: usize,
    /// Budget of bytes queued across all subscriptions (docs/concepts.md "Memory bounds").
    pub max_queued_bytes: usize,
    pub offer_timeout_ms: u64,
    pub overflow: OverflowSetting,
    pub max_batch: usize,
    pub max_payload_bytes: usize,
    /// Most events in one `PublishBatch` request.
    pub max_publish_batch: usize,
    pub max_tracked_channels: usize,
    /// Channels that keep a history, first matching rule applies (none by default).
    pub history: Vec<HistoryRuleSetting>,
    /// Bytes of history kept in memory across channels (`in_memory` mode).
    pub history_max_bytes: usize,
    /// Channels with a history kept in memory (`in_memory` mode).
    pub history_max_channels: usize,
    pub redis: RedisSettings,
    pub metrics: MetricsSettings,
}

/// One `eventbus.history` rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRuleSetting {
    /// Exact channel or pattern.
    pub channels: String,
    /// Most events kept per channel.
    #[serde(default = "default_history_size")]
    pub size: usize,
    /// Most bytes kept per channel.
    #[serde(default = "default_history_bytes")]
    pub max_bytes: usize,
    /// Oldest age kept, in milliseconds; 0 = no age bound.
    #[serde(default)]
    pub ttl_ms: u64,
}

fn default_history_size() -> usize {
    1000
}

fn default_history_bytes() -> usize {
    16 << 20
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
    /// Redis Cluster seed nodes (`host:port`, or `redis://`/`rediss://` URLs); non-empty
    /// selects cluster mode, where `url`, `host`, `port` and `database` stay unset.
    pub cluster_nodes: Vec<String>,
    /// Cluster mode: how many leading tokens of a channel choose its shard.
    pub shard_tokens: u32,
    /// Replicas that must confirm a durable capture before its publish is answered OK.
    pub min_replicas_acked: u32,
    /// How long a capture waits for them.
    pub replica_ack_timeout_ms: u64,
    /// How often the pub/sub and publishing connections are PINGed.
    pub health_check_interval_ms: u64,
    /// How long a PING may take before Redis counts as not answering.
    pub health_check_timeout_ms: u64,
    /// The Java-style connection pool sizes: accepted so Java-style settings start, but
    /// without effect (see [`Settings::without_effect`]).
    #[serde(default)]
    pub pool: RedisPoolSettings,
}

/// The Java-style `eventbus.redis.pool` (a Jedis pool). eventbusd keeps no pool: commands
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
    /// Its Java-style environment variable.
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

/// The broker's own spans, exported with OTLP.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// `service.name` of the exported spans.
    pub service_name: String,
    pub otlp: OtlpSettings,
    pub sampling: SamplingSettings,
}

/// Where spans go: an OTLP/gRPC receiver (a collector, Jaeger, Tempo).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSettings {
    /// `http://host:4317` (or `https://`); empty exports nothing and makes no span.
    pub endpoint: String,
    /// Longest wait for the receiver to take one batch.
    pub timeout_ms: u64,
    /// How often finished spans are sent (sooner when 512 are waiting).
    pub export_interval_ms: u64,
}

/// Which traces are kept: a publisher's decision is followed (parent-based); `ratio`
/// of the traces that start at the broker (events published without a context).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSettings {
    pub ratio: f64,
}
