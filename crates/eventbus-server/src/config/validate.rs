//! Range and consistency checks serde cannot express.

use super::*;

impl Settings {
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
        within("eventbus.redis.min_replicas_acked", e.redis.min_replicas_acked, 0, 16)?;
        within("eventbus.redis.replica_ack_timeout_ms", e.redis.replica_ack_timeout_ms, 1, 60_000)?;
        at_least("eventbus.max_tracked_channels", e.max_tracked_channels, 1)?;
        within("eventbus.offer_timeout_ms", e.offer_timeout_ms, 0, 60_000)?;
        for rule in &e.history {
            if let Err(err) = eventbus_core::Pattern::parse(&rule.channels) {
                return Err(ConfigError::Invalid {
                    key: "eventbus.history.channels",
                    value: format!("{} ({err})", rule.channels),
                    problem: "is not a channel or pattern",
                });
            }
            within("eventbus.history.size", rule.size, 1, MAX_HISTORY_SIZE)?;
            at_least("eventbus.history.max_bytes", rule.max_bytes, 1)?;
        }
        at_least("eventbus.history_max_bytes", e.history_max_bytes, 1)?;
        at_least("eventbus.history_max_channels", e.history_max_channels, 1)?;
        let url = &e.redis.url;
        if !(url.is_empty() || url.starts_with("redis://") || url.starts_with("rediss://")) {
            let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_owned());
            return Err(ConfigError::RedisUrlScheme { scheme });
        }
        self.push.denied()?;
        self.push.allowed()?;
        let invalid = |key, value: &str, problem| Err(ConfigError::Invalid { key, value: value.to_owned(), problem });
        let cluster = &e.redis.cluster_nodes;
        if !cluster.is_empty() {
            self.validate_cluster()?;
        }
        let tls = url.starts_with("rediss://") || cluster.iter().any(|node| node.starts_with("rediss://"));
        if !e.redis.tls_ca_file.is_empty() && !tls {
            return invalid(
                "eventbus.redis.tls_ca_file",
                &e.redis.tls_ca_file,
                "only applies to rediss:// (url or cluster_nodes)",
            );
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
        within("server.http.sse_heartbeat_ms", server.http.sse_heartbeat_ms, 1_000, 3_600_000)?;
        for origin in &server.http.allowed_origins {
            if !is_origin(origin) {
                return invalid(
                    "server.http.allowed_origins",
                    origin,
                    "is not an origin: scheme://host or scheme://host:port, without a path",
                );
            }
        }
        for host in &server.http.allowed_hosts {
            if !is_host(host) {
                return invalid(
                    "server.http.allowed_hosts",
                    host,
                    "is not a host name: name or name:port (no scheme, no path), or * alone for any",
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
        if let Err(source) = crate::telemetry::filter(&self.log.level) {
            return Err(ConfigError::LogLevel { value: self.log.level.clone(), source });
        }
        self.validate_telemetry()
    }

    /// The OTLP endpoint is an http(s) URL when set; the ratio a share.
    fn validate_telemetry(&self) -> Result<(), ConfigError> {
        let t = &self.telemetry;
        let invalid = |key, value: &str, problem| Err(ConfigError::Invalid { key, value: value.to_owned(), problem });
        let endpoint = t.otlp.endpoint.trim();
        if !endpoint.is_empty() {
            let parsed = url::Url::parse(endpoint);
            if !parsed.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()) {
                return invalid(
                    "telemetry.otlp.endpoint",
                    endpoint,
                    "is not an http:// or https:// URL of an OTLP/gRPC receiver (http://collector:4317)",
                );
            }
        }
        within("telemetry.otlp.timeout_ms", t.otlp.timeout_ms, 1, 600_000)?;
        within("telemetry.otlp.export_interval_ms", t.otlp.export_interval_ms, 10, 600_000)?;
        if !(0.0..=1.0).contains(&t.sampling.ratio) {
            return invalid("telemetry.sampling.ratio", &t.sampling.ratio.to_string(), "must be between 0 and 1");
        }
        if t.service_name.trim().is_empty() {
            return invalid("telemetry.service_name", "", "must not be empty");
        }
        Ok(())
    }
}

/// Defaults of the single-Redis keys a cluster configuration leaves alone.
const SINGLE_REDIS_DEFAULTS: (&str, u16, u32) = ("localhost", 6379, 0);

impl Settings {
    /// Cluster mode (`eventbus.redis.cluster_nodes` set): seed nodes that parse, one
    /// scheme for all, and none of the single-Redis keys beside them.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let r = &self.eventbus.redis;
        let (host, port, database) = SINGLE_REDIS_DEFAULTS;
        let single = [
            ("eventbus.redis.url", !r.url.is_empty()),
            ("eventbus.redis.host", r.host != host),
            ("eventbus.redis.port", r.port != port),
            ("eventbus.redis.database", r.database != database),
        ];
        if let Some((key, _)) = single.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::ClusterMix { key });
        }
        let mut tls = None;
        for node in &r.cluster_nodes {
            let url = eventbus_redis::cluster::node_url(node).map_err(|problem| ConfigError::Invalid {
                key: "eventbus.redis.cluster_nodes",
                value: node.clone(),
                problem,
            })?;
            let node_tls = url.starts_with("rediss://");
            if *tls.get_or_insert(node_tls) != node_tls {
                return Err(ConfigError::Invalid {
                    key: "eventbus.redis.cluster_nodes",
                    value: node.clone(),
                    problem: "mixes redis:// and rediss:// nodes: a cluster uses TLS on every node or on none",
                });
            }
        }
        within("eventbus.redis.shard_tokens", r.shard_tokens, 1, 16)?;
        if r.prefix.contains(['{', '}']) {
            return Err(ConfigError::Invalid {
                key: "eventbus.redis.prefix",
                value: r.prefix.clone(),
                problem: "must not hold '{' or '}' on Redis Cluster: the keys' own hash tags place them in slots",
            });
        }
        Ok(())
    }
}

/// Largest `max_publish_batch` accepted: a batch is answered in one message, and its
/// events are held together while they are published.
const MAX_PUBLISH_BATCH_LIMIT: usize = 100_000;
/// Most events one channel's history may keep.
const MAX_HISTORY_SIZE: usize = 1_000_000;

/// Largest `max_payload_bytes` accepted: gRPC messages stay well within what clients
/// can be configured to take.
pub const MAX_PAYLOAD_LIMIT: usize = 64 << 20;

/// `scheme://host[:port]` as browsers send it in `Origin` (no path, no trailing slash).
/// `*`, or a host as a `Host` header carries it: a name or address, with an optional
/// port.
fn is_host(s: &str) -> bool {
    if s == "*" {
        return true;
    }
    let host = match s.rsplit_once(':') {
        // An IPv6 address without a port: the colons are its own.
        Some((host, _)) if host.contains(':') && !host.ends_with(']') => s,
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        Some(_) => return false,
        None => s,
    };
    !host.is_empty() && url::Host::parse(host).is_ok() && !s.contains(['/', '@', '?', '#', '*'])
}

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
