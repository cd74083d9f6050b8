//! Redis Cluster mode: fan-out on sharded Pub/Sub (`SPUBLISH`/`SSUBSCRIBE`).
//!
//! Classic `PUBLISH` is broadcast to every node of a cluster, so it does not scale out;
//! sharded Pub/Sub sends a message only to the master (and replicas) owning the shard
//! channel's slot. Sharded Pub/Sub has no patterns, so channels are grouped into
//! [`BUCKETS`] shard channels. A channel's first `shard_tokens` tokens (its shard key)
//! choose its bucket: the 128-slot range its hash slot falls in, `CLUSTER KEYSLOT
//! <shard key>` / 128. Bucket `b`'s shard channel is `{prefix}:shard:<b>:{<n>}`, where
//! `n` is the smallest decimal number whose own hash slot lies in that range (the
//! braces are Redis's hash tag): a channel's traffic goes to the master owning its
//! shard key's slot, as a key of that name would, and masters owning equal slot ranges
//! carry equal shares of the buckets. A subscription whose shard tokens are
//! literal listens on one bucket; one with a wildcard there (`*.created`, `>`) on all
//! of them. The router re-checks every received event with token rules, as in single
//! Redis mode, so events of other channels sharing a bucket reach nobody.
//!
//! Each message carries its channel in the envelope (binary or JSON); a payload without
//! one cannot be routed and is counted as dropped. The topology (seed nodes, MOVED,
//! ASK, failovers) is the `redis` crate's cluster client's; this module adds the
//! buckets, re-subscribes a shard channel whose slot moved (Redis ends such
//! subscriptions with a `SUNSUBSCRIBE` push) and counts each interruption as a gap.

mod routes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventbus_core::history::{HistoryInfo, Recovery, Start, Take};
use eventbus_core::name::{Token, validate_channel};
use eventbus_core::transport::{HistoryFuture, PublishAllFuture, PublishFuture, WatchedFuture};
use eventbus_core::{Event, Fanout, LocalFanout, Pattern, Supervisor, Transport, TransportError, TransportStatus};
use parking_lot::RwLock;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::demand::Demand;
use crate::envelope::{self, Envelope};
use crate::groups::FleetGroups;
use crate::history::{RedisHistory, Sending, Shards};
use crate::transport::{RedisOptions, refuses_credentials};
use routes::{NodeAccess, Routes};

/// Shard channels per cluster: each covers 128 consecutive hash slots.
pub const BUCKETS: u16 = 128;
/// Hash slots per bucket.
const SLOTS_PER_BUCKET: u16 = (SLOTS / BUCKETS as u32) as u16;

const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Slots in a Redis Cluster.
const SLOTS: u32 = 16_384;

/// A seed node as the cluster client takes it: `host:port` becomes `redis://host:port`;
/// `redis://` and `rediss://` URLs are kept. The error says what is wrong.
pub fn node_url(node: &str) -> Result<String, &'static str> {
    let (url, address) = match node.split_once("://") {
        Some(("redis" | "rediss", rest)) => (node.to_owned(), rest),
        Some(_) => return Err("must be host:port, or a redis:// or rediss:// URL"),
        None => (format!("redis://{node}"), node),
    };
    let address = address.rsplit_once('@').map_or(address, |(_, a)| a).trim_end_matches('/');
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(url),
        _ => Err("must name a host and a port (host:port)"),
    }
}

/// The shard key of a channel: its first `shard_tokens` tokens.
pub(crate) fn shard_key(channel: &str, shard_tokens: usize) -> &str {
    match channel.match_indices('.').nth(shard_tokens.saturating_sub(1)) {
        Some((end, _)) => &channel[..end],
        None => channel,
    }
}

/// A key's hash slot, as `CLUSTER KEYSLOT` computes it (a `{tag}` hashes alone).
fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The bucket of a shard key: the slot range its hash slot falls in.
pub(crate) fn bucket_of(shard_key: &str) -> u16 {
    key_slot(shard_key.as_bytes()) / SLOTS_PER_BUCKET
}

/// The shard channels of every bucket, in bucket order: bucket `b`'s hash tag is the
/// smallest decimal number whose hash slot is in `b`'s range.
pub fn shard_channels(prefix: &str) -> Vec<String> {
    let mut tags: Vec<Option<u32>> = vec![None; usize::from(BUCKETS)];
    let mut missing = tags.len();
    let mut n = 0u32;
    while missing > 0 {
        let bucket = usize::from(key_slot(n.to_string().as_bytes()) / SLOTS_PER_BUCKET);
        if tags[bucket].is_none() {
            tags[bucket] = Some(n);
            missing -= 1;
        }
        n += 1;
    }
    tags.iter().enumerate().map(|(b, tag)| format!("{prefix}:shard:{b}:{{{}}}", tag.unwrap_or_default())).collect()
}

/// The hash tag (`{17}`) of each bucket's shard channel, in bucket order: a channel's
/// history keys carry its bucket's, so they live where the channel is published.
fn shard_tags(prefix: &str) -> Vec<String> {
    shard_channels(prefix)
        .iter()
        .map(|c| c.rfind('{').map_or_else(String::new, |at| format!("{}:", &c[at..])))
        .collect()
}

/// The buckets a filter needs: one when its shard tokens are literal, all otherwise.
fn buckets_of(filter: &Pattern, shard_tokens: usize) -> Option<u16> {
    if filter.is_exact() {
        return Some(bucket_of(shard_key(filter.as_str(), shard_tokens)));
    }
    let literal = filter.tokens().take(shard_tokens).all(|t| matches!(t, Token::Literal(_)));
    // A trailing `>` after the shard tokens (`orders.>` with 1) keeps them literal.
    literal.then(|| bucket_of(shard_key(filter.as_str(), shard_tokens)))
}

/// The client for a cluster's seed nodes, with the credentials and TLS of
/// `eventbus.redis`; pushes (subscribed messages) go to `pushes`, if any.
fn client(
    settings: &RedisOptions,
    pushes: Option<mpsc::UnboundedSender<PushInfo>>,
) -> Result<(ClusterClient, NodeAccess), redis::RedisError> {
    let nodes: Vec<String> = settings
        .cluster_nodes
        .iter()
        .map(|n| {
            node_url(n).map_err(|problem| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "bad cluster node",
                    format!("{n}: {problem}"),
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(COMMAND_TIMEOUT)
        // Bounded (a slot without a master fails its commands within about a second),
        // with room for a failover's stale route, MOVED and slot refresh.
        .retries(6)
        .min_retry_wait(20)
        .max_retry_wait(200);
    if let Some(pushes) = pushes {
        builder = builder.use_protocol(ProtocolVersion::RESP3).push_sender(pushes);
    }
    if let Some(username) = &settings.username {
        builder = builder.username(username);
    }
    if let Some(password) = &settings.password {
        builder = builder.password(password);
    }
    let mut ca_pem = None;
    if let Some(path) = &settings.tls_ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "cannot read tls_ca_file",
                format!("{}: {e}", path.display()),
            ))
        })?;
        builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) });
        ca_pem = Some(pem);
    }
    Ok((builder.build()?, NodeAccess::new(settings, ca_pem)))
}

/// What the durable engine reaches a cluster through: a cluster client (no pushes),
/// and a client for each seed node, with the same credentials and TLS.
pub(crate) fn durable_clients(settings: &RedisOptions) -> Result<(ClusterClient, Vec<Client>), redis::RedisError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (cluster, access) = client(settings, None)?;
    let mut seeds = Vec::with_capacity(settings.cluster_nodes.len());
    for node in &settings.cluster_nodes {
        let url = node_url(node).map_err(|problem| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "bad cluster node",
                format!("{node}: {problem}"),
            ))
        })?;
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?;
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => (host, *port),
            _ => continue,
        };
        seeds.push(access.client(host, port)?);
    }
    Ok((cluster, seeds))
}

/// A cluster client and the channel its pushes (subscribed messages) arrive on.
pub struct ClusterSetup {
    client: ClusterClient,
    access: NodeAccess,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
}

impl std::fmt::Debug for ClusterSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSetup").finish_non_exhaustive()
    }
}

/// MOVED or ASK: the node did not run the command (a pipeline of one bucket's
/// commands, all in one slot, is redirected as a whole).
fn is_redirect(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(err.kind(), ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask))
}

/// One connection to the cluster, its topology discovered from the seed nodes.
async fn connect(client: &ClusterClient) -> Result<ClusterConnection, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Publishes to and receives from a Redis Cluster for one broker instance.
pub struct ClusterTransport {
    prefix: String,
    shard_tokens: usize,
    envelope: Envelope,
    /// The shard channel of each bucket, built once (no formatting per event).
    channels: Vec<String>,
    target: String,
    health_interval: Duration,
    connection: RwLock<Option<ClusterConnection>>,
    /// Filters local subscriptions need; their buckets are subscribed.
    demand: Demand,
    status: watch::Sender<TransportStatus>,
    groups: Arc<FleetGroups>,
    /// Each bucket's master, for publishing straight to it.
    routes: RwLock<Routes>,
    /// A publish found `routes` out of date (a redirection, a failed node).
    routes_stale: Notify,
    /// Channel histories, each on its channel's shard.
    history: RedisHistory,
}

impl std::fmt::Debug for ClusterTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTransport")
            .field("nodes", &self.target)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl ClusterTransport {
    /// The cluster client for `settings`, not connected yet: where a bad seed node or
    /// an unreadable CA file is reported.
    pub fn client(settings: &RedisOptions) -> Result<ClusterSetup, redis::RedisError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (tx, pushes) = mpsc::unbounded_channel();
        let (client, access) = client(settings, Some(tx))?;
        Ok(ClusterSetup { client, access, pushes })
    }

    /// Connects once to learn whether the cluster accepts eventbusd. Wrong credentials,
    /// or nodes that are not a cluster (`cluster support disabled`), are settings to fix,
    /// so start-up reports them; unreachable nodes are an outage the transport rides
    /// out, so that passes here.
    pub async fn check_access(settings: &RedisOptions) -> Result<(), redis::RedisError> {
        let (client, _) = client(settings, None)?;
        let refused =
            |err: &redis::RedisError| refuses_credentials(err) || err.to_string().contains("cluster support disabled");
        match connect(&client).await {
            Ok(mut conn) => {
                let cmd = redis::cmd("CLUSTER").arg("INFO").clone();
                match conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)).await {
                    Err(err) if refused(&err) => Err(err),
                    _ => Ok(()),
                }
            }
            Err(_) => match client.get_async_connection().await {
                Err(err) if refused(&err) => Err(err),
                _ => Ok(()),
            },
        }
    }

    /// Creates the transport and starts its task, which runs until `shutdown`. Returns
    /// at once: the cluster may come up later.
    pub fn start(
        setup: ClusterSetup,
        settings: &RedisOptions,
        local: LocalFanout,
        shutdown: CancellationToken,
        supervisor: &Supervisor,
    ) -> Arc<Self> {
        let ClusterSetup { client, access, pushes } = setup;
        let transport = Arc::new(Self {
            prefix: settings.prefix.clone(),
            shard_tokens: settings.shard_tokens.max(1),
            envelope: settings.envelope,
            channels: shard_channels(&settings.prefix),
            target: settings.cluster_nodes.join(","),
            health_interval: settings.health_check_interval,
            connection: RwLock::new(None),
            demand: Demand::new(),
            status: watch::Sender::new(TransportStatus::default()),
            groups: FleetGroups::new(&settings.prefix),
            routes: RwLock::default(),
            routes_stale: Notify::new(),
            history: RedisHistory::new(
                &settings.prefix,
                settings.history.clone(),
                Some(Shards { shard_tokens: settings.shard_tokens.max(1), tags: shard_tags(&settings.prefix) }),
            ),
        });
        let connection = Arc::clone(&transport);
        let groups = Arc::clone(&transport.groups).run(move || connection.connection.read().clone(), shutdown.clone());
        supervisor.spawn("redis group membership", groups).detach();
        let task = Arc::clone(&transport).run(client, access, pushes, local, shutdown);
        supervisor.spawn("redis cluster transport", task).detach();
        transport
    }

    fn unavailable(&self, reason: impl Into<String>) -> TransportError {
        TransportError { transport: "redis", reason: reason.into() }
    }

    fn wanted_buckets(&self) -> (BTreeSet<u16>, u64) {
        self.demand.read(|filters| {
            let buckets: Option<BTreeSet<u16>> = filters.iter().map(|f| buckets_of(f, self.shard_tokens)).collect();
            // A filter with a wildcard shard token needs every bucket.
            buckets.unwrap_or_else(|| (0..BUCKETS).collect())
        })
    }

    async fn run(
        self: Arc<Self>,
        client: ClusterClient,
        access: NodeAccess,
        mut pushes: mpsc::UnboundedReceiver<PushInfo>,
        local: LocalFanout,
        shutdown: CancellationToken,
    ) {
        let mut backoff = INITIAL_BACKOFF;
        let mut conn = loop {
            let outcome = tokio::select! {
                () = shutdown.cancelled() => return,
                outcome = connect(&client) => outcome,
            };
            match outcome {
                Ok(conn) => break conn,
                Err(err) => {
                    warn!(nodes = %self.target, error = %err, retry_in = ?backoff, "cannot reach the Redis Cluster; retrying")
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
        info!(nodes = %self.target, "connected to the Redis Cluster");
        *self.connection.write() = Some(conn.clone());
        self.refresh_routes(&mut conn, &access).await;
        let mut active: BTreeSet<u16> = BTreeSet::new();
        let mut epoch = None;
        let mut health = tokio::time::interval_at(Instant::now(), self.health_interval);
        health.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = health.tick() => {
                    let now = self.check(&mut conn).await;
                    if let (Some(before), Some(now)) = (epoch, now)
                        && before != now
                    {
                        // A failover or a slot migration. A shard channel may have moved
                        // without a push saying so (its node vanished), and the client
                        // keeps routing to a dead master until something makes it
                        // refresh: start over on a fresh connection, which discovers
                        // the topology as it is now, and subscribe there again.
                        match connect(&client).await {
                            Ok(fresh) => {
                                info!(nodes = %self.target, epoch = now, "the cluster's topology changed; connected afresh");
                                if !active.is_empty() {
                                    self.gap("every shard channel (the cluster's topology changed)");
                                }
                                conn = fresh;
                                *self.connection.write() = Some(conn.clone());
                                self.refresh_routes(&mut conn, &access).await;
                                active.clear();
                                epoch = Some(now);
                            }
                            // The old connection serves meanwhile; tried again next tick.
                            Err(err) => warn!(nodes = %self.target, error = %err, "cannot reconnect after a topology change; retrying"),
                        }
                    } else {
                        epoch = now.or(epoch);
                    }
                    // A subscription a failed command left out is retried here.
                    self.reconcile(&mut conn, &mut active).await;
                }
                () = self.demand.changed.notified() => self.reconcile(&mut conn, &mut active).await,
                () = self.routes_stale.notified() => self.refresh_routes(&mut conn, &access).await,
                push = pushes.recv() => match push {
                    Some(push) => {
                        if let Some(bucket) = self.receive(push, &active, &local).await {
                            active.remove(&bucket);
                            self.reconcile(&mut conn, &mut active).await;
                        }
                    }
                    None => break,
                },
            }
        }
        *self.connection.write() = None;
        self.status.send_modify(|s| s.connected = false);
    }

    /// Maps each bucket to its master again (`CLUSTER SLOTS`), keeping the connections
    /// to nodes that are still masters. On failure the old map stays; publishes it
    /// cannot route go through the cluster client.
    async fn refresh_routes(&self, conn: &mut ClusterConnection, access: &NodeAccess) {
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let ask = conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random));
        let previous = self.routes.read().clone();
        let built = match tokio::time::timeout(COMMAND_TIMEOUT, ask).await {
            Ok(Ok(slots)) => Routes::build(slots, &self.channels, access, &previous).await,
            Ok(Err(err)) => Err(format!("CLUSTER SLOTS failed: {err}")),
            Err(_) => Err("no answer to CLUSTER SLOTS".to_owned()),
        };
        match built {
            Ok(routes) => *self.routes.write() = routes,
            Err(reason) => warn!(
                nodes = %self.target,
                %reason,
                "cannot map the shard channels to their masters; publishing through the cluster client meanwhile"
            ),
        }
    }

    /// Asks one node how the cluster is: the slots without a serving master, and
    /// whether the cluster answers at all. Returns the cluster's current epoch, which
    /// changes with every failover and slot migration.
    async fn check(&self, conn: &mut ClusterConnection) -> Option<u64> {
        // A random node each time: one that just died must not make the cluster look
        // down, so a failed ask is tried on other nodes first.
        let mut info = Err("no node asked".to_owned());
        for _ in 0..3 {
            let cmd = redis::cmd("CLUSTER").arg("INFO").clone();
            let ask = conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random));
            info = match tokio::time::timeout(COMMAND_TIMEOUT, ask).await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(err)) => Err(format!("CLUSTER INFO failed: {err}")),
                Err(_) => Err("no answer to CLUSTER INFO".to_owned()),
            };
            if info.is_ok() {
                break;
            }
        }
        let text = match info {
            Ok(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(Value::VerbatimString { text, .. }) => text,
            Ok(Value::SimpleString(text)) => text,
            Ok(other) => format!("{other:?}"),
            Err(reason) => {
                self.set_health(false, SLOTS, &reason);
                return None;
            }
        };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).map(str::to_owned)
        };
        let ok: u32 = field("cluster_slots_ok").and_then(|v| v.parse().ok()).unwrap_or(0);
        let state = field("cluster_state").unwrap_or_default();
        let degraded = SLOTS.saturating_sub(ok);
        self.set_health(ok > 0, degraded, &format!("cluster_state {state}, {ok} slots served"));
        field("cluster_current_epoch").and_then(|v| v.parse().ok())
    }

    fn set_health(&self, connected: bool, degraded_slots: u32, detail: &str) {
        let before = *self.status.borrow();
        if before.connected != connected || before.degraded_slots != degraded_slots {
            match (connected, degraded_slots) {
                (false, _) => {
                    warn!(nodes = %self.target, detail, "the Redis Cluster is not serving; refusing publishes")
                }
                (true, 0) => info!(nodes = %self.target, detail, "the Redis Cluster serves every slot"),
                (true, n) => {
                    warn!(nodes = %self.target, slots_without_master = n, detail, "the Redis Cluster is degraded: publishes to the channels of those slots fail")
                }
            }
        }
        self.status.send_modify(|s| {
            if !s.connected && connected && before.degraded_slots == SLOTS {
                s.reconnects += 1;
            }
            s.connected = connected;
            s.stalled = !connected;
            s.degraded_slots = degraded_slots;
        });
    }

    /// Brings the sharded subscriptions in line with local demand. A failed command is
    /// logged and retried on the next health tick (one shard down must not stop the
    /// others from being subscribed).
    async fn reconcile(&self, conn: &mut ClusterConnection, active: &mut BTreeSet<u16>) {
        let (wanted, version) = self.wanted_buckets();
        let mut complete = true;
        // All at once: each goes to its own shard, and a slow one (a node just lost)
        // must not hold up the others.
        let missing: Vec<u16> = wanted.difference(active).copied().collect();
        let results = futures::future::join_all(missing.iter().map(|&bucket| {
            let mut conn = conn.clone();
            let channel = &self.channels[usize::from(bucket)];
            async move { tokio::time::timeout(COMMAND_TIMEOUT, conn.ssubscribe(channel)).await }
        }))
        .await;
        for (bucket, result) in missing.into_iter().zip(results) {
            let channel = &self.channels[usize::from(bucket)];
            match result {
                Ok(Ok(())) => {
                    active.insert(bucket);
                    debug!(channel, "shard channel subscribed");
                }
                Ok(Err(err)) => {
                    complete = false;
                    warn!(channel, error = %err, "SSUBSCRIBE failed; retrying");
                }
                Err(_) => {
                    complete = false;
                    warn!(channel, "SSUBSCRIBE timed out; retrying");
                }
            }
        }
        for &bucket in active.clone().difference(&wanted) {
            let channel = &self.channels[usize::from(bucket)];
            // Removed from `active` either way: a shard that cannot be told keeps
            // sending until its connection goes, and those events reach nobody here.
            active.remove(&bucket);
            if let Ok(Err(err)) = tokio::time::timeout(COMMAND_TIMEOUT, conn.sunsubscribe(channel)).await {
                debug!(channel, error = %err, "SUNSUBSCRIBE failed");
            }
        }
        if complete {
            self.demand.applied(version);
        }
    }

    /// Handles one push; returns the bucket whose subscription Redis ended, if it did.
    /// (A node connection that drops is restored by the client, which subscribes again
    /// to what it tracked; a failover behind it shows as a topology change.)
    async fn receive(&self, push: PushInfo, active: &BTreeSet<u16>, local: &LocalFanout) -> Option<u16> {
        match push.kind {
            PushKind::SMessage => {
                let Some(Value::BulkString(message)) = push.data.into_iter().nth(1) else { return None };
                match envelope::decode_enveloped(Bytes::from(message)) {
                    Some(event) if validate_channel(&event.channel).is_ok() => {
                        local.dispatch(event).await;
                    }
                    _ => {
                        let mut first = false;
                        self.status.send_modify(|s| {
                            first = s.unroutable == 0;
                            s.unroutable += 1;
                        });
                        if first {
                            warn!(
                                "dropped a message on a shard channel that names no routable channel (counted in \
                                 _redis_unroutable_total): in a cluster, producers SPUBLISH an eventbus envelope \
                                 (eventbus.redis.envelope json shows its form)"
                            );
                        }
                    }
                }
                None
            }
            // Redis ends a shard channel's subscriptions when its slot moves (failover,
            // migration): the subscription is made again on the slot's new owner.
            PushKind::SUnsubscribe => {
                let Some(Value::BulkString(channel)) = push.data.first() else { return None };
                let bucket = self
                    .channels
                    .iter()
                    .position(|c| c.as_bytes() == channel.as_slice())
                    .and_then(|b| u16::try_from(b).ok())
                    .filter(|b| active.contains(b) && self.wanted_buckets().0.contains(b));
                if bucket.is_some() {
                    self.gap(&String::from_utf8_lossy(channel));
                }
                bucket
            }
            PushKind::Disconnection => {
                debug!("a cluster node connection dropped; the client restores it");
                None
            }
            _ => None,
        }
    }

    fn gap(&self, what: &str) {
        self.status.send_modify(|s| s.gaps += 1);
        warn!(
            subscription = what,
            "a sharded subscription was interrupted (failover, slot migration or a lost node connection); events \
             published meanwhile were missed; subscribing again"
        );
    }
}

impl ClusterTransport {
    /// Sends one bucket's pipeline to its master, or through the cluster client when
    /// the map has no master for it or the master redirects (then nothing ran there).
    /// `build` makes the pipeline for the way it goes: scripts by hash to a master
    /// (after a `SCRIPT LOAD`, so a new master has it), with their text through the
    /// cluster client (which routes each command by its keys).
    async fn send_pipeline(
        &self,
        bucket: usize,
        build: impl Fn(Sending) -> redis::Pipeline,
    ) -> Result<Vec<i64>, String> {
        let channel = &self.channels[bucket];
        let direct = self.routes.read().by_bucket.get(bucket).cloned().flatten();
        if let Some(mut node) = direct {
            match build(Sending::Hash).query_async::<Vec<i64>>(&mut node).await {
                Ok(receivers) => return Ok(receivers),
                Err(err) if is_redirect(&err) => self.routes_stale.notify_one(),
                // Perhaps run, perhaps not: not sent again (at most once).
                Err(err) => {
                    self.routes_stale.notify_one();
                    return Err(format!("SPUBLISH to {channel} failed: {err}"));
                }
            }
        }
        let Some(mut conn) = self.connection.read().clone() else {
            return Err(format!("not connected to the Redis Cluster at {}", self.target));
        };
        build(Sending::Text)
            .query_async::<Vec<i64>>(&mut conn)
            .await
            .map_err(|e| format!("SPUBLISH to {channel} failed: {e}"))
    }

    /// Adds the publish of `event` to a bucket's pipeline: a plain `SPUBLISH`, or for a
    /// channel with history the script that keeps it and publishes it.
    fn add_publish(&self, pipe: &mut redis::Pipeline, sending: Sending, bucket: usize, event: &Event) {
        match self.history.limits(&event.channel) {
            Some(limits) => {
                pipe.add_command(self.history.command(
                    sending,
                    "SPUBLISH",
                    &self.channels[bucket],
                    self.envelope,
                    event,
                    limits,
                ));
            }
            None => {
                pipe.cmd("SPUBLISH").arg(&self.channels[bucket]).arg(envelope::encode_as(self.envelope, event));
            }
        }
    }

    /// A bucket's pipeline for `events`: the script loaded first (its answer ignored)
    /// when one of them is sent by hash.
    fn pipeline<'a>(
        &self,
        sending: Sending,
        bucket: usize,
        events: impl Iterator<Item = &'a Arc<Event>>,
    ) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        let mut loaded = false;
        for event in events {
            if sending == Sending::Hash && !loaded && self.history.limits(&event.channel).is_some() {
                pipe.add_command(self.history.load()).ignore();
                loaded = true;
            }
            self.add_publish(&mut pipe, sending, bucket, event);
        }
        pipe
    }

    /// The cluster connection, for a history read (the cluster client routes by key).
    fn reader(&self) -> Result<ClusterConnection, TransportError> {
        self.connection
            .read()
            .clone()
            .ok_or_else(|| self.unavailable(format!("not connected to the Redis Cluster at {}", self.target)))
    }
}

impl Transport for ClusterTransport {
    fn mode(&self) -> &'static str {
        "redis"
    }

    fn publish(&self, event: Arc<Event>) -> PublishFuture<'_> {
        Box::pin(async move {
            if !self.status.borrow().connected {
                return Err(self.unavailable(format!("the Redis Cluster at {} is not serving", self.target)));
            }
            let bucket = usize::from(bucket_of(shard_key(&event.channel, self.shard_tokens)));
            let build = |sending| self.pipeline(sending, bucket, std::iter::once(&event));
            let receivers = self.send_pipeline(bucket, build).await.map_err(|reason| self.unavailable(reason))?;
            let receivers = receivers.first().copied().unwrap_or(0);
            Ok(Fanout { delivered: u32::try_from(receivers).unwrap_or(u32::MAX), failed: 0 })
        })
    }

    /// One pipeline per bucket, all sent at once: a bucket's events keep their order
    /// on its master's connection, and a chunk costs one round trip.
    fn publish_all(&self, events: Vec<Arc<Event>>) -> PublishAllFuture<'_> {
        Box::pin(async move {
            if !self.status.borrow().connected {
                let refused = || Err(self.unavailable(format!("the Redis Cluster at {} is not serving", self.target)));
                return events.iter().map(|_| refused()).collect();
            }
            let mut by_bucket: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (i, event) in events.iter().enumerate() {
                by_bucket
                    .entry(usize::from(bucket_of(shard_key(&event.channel, self.shard_tokens))))
                    .or_default()
                    .push(i);
            }
            let events = &events;
            let sends = by_bucket.into_iter().map(|(bucket, members)| async move {
                let build = |sending| self.pipeline(sending, bucket, members.iter().map(|&i| &events[i]));
                let answer = self.send_pipeline(bucket, build).await;
                (members, answer)
            });
            let mut out: Vec<Option<Result<Fanout, TransportError>>> = events.iter().map(|_| None).collect();
            for (members, answer) in futures::future::join_all(sends).await {
                match answer {
                    Ok(receivers) if receivers.len() == members.len() => {
                        for (i, n) in members.into_iter().zip(receivers) {
                            out[i] = Some(Ok(Fanout { delivered: u32::try_from(n).unwrap_or(u32::MAX), failed: 0 }));
                        }
                    }
                    Ok(_) => {
                        let reason = "the SPUBLISH pipeline was answered for fewer events than it held";
                        members.into_iter().for_each(|i| out[i] = Some(Err(self.unavailable(reason))));
                    }
                    Err(reason) => {
                        members.into_iter().for_each(|i| out[i] = Some(Err(self.unavailable(reason.clone()))))
                    }
                }
            }
            out.into_iter().flatten().collect()
        })
    }

    fn watch(&self, filter: &Pattern) {
        self.demand.watch(filter);
    }

    fn unwatch(&self, filter: &Pattern) {
        self.demand.unwatch(filter);
    }

    fn watched(&self) -> WatchedFuture<'_> {
        self.demand.watched(&self.status)
    }

    fn status(&self) -> watch::Receiver<TransportStatus> {
        self.status.subscribe()
    }

    fn group_members(&self, group: &str, members: usize) {
        self.groups.set_members(group, members);
    }

    fn delivers_to_group(&self, group: &str, event: &Event) -> bool {
        self.groups.delivers(group, event)
    }

    fn read_history<'a>(
        &'a self,
        channel: &'a str,
        start: &'a Start,
        take: Take,
    ) -> HistoryFuture<'a, Option<Recovery>> {
        Box::pin(self.history.read(self.reader(), channel, start, take))
    }

    fn history_channels<'a>(&'a self, filter: &'a Pattern) -> HistoryFuture<'a, Vec<String>> {
        Box::pin(self.history.channels(self.reader(), filter))
    }

    fn history_info<'a>(&'a self, channel: &'a str) -> HistoryFuture<'a, Option<HistoryInfo>> {
        Box::pin(self.history.info(self.reader(), channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_nodes_parse_or_say_what_is_wrong() {
        assert_eq!(node_url("10.0.0.1:7000"), Ok("redis://10.0.0.1:7000".to_owned()));
        assert_eq!(node_url("rediss://u:p@cache:7000"), Ok("rediss://u:p@cache:7000".to_owned()));
        assert!(node_url("cache").is_err());
        assert!(node_url("cache:0").is_err());
        assert!(node_url(":7000").is_err());
        assert!(node_url("http://cache:7000").is_err());
    }

    #[test]
    fn the_shard_key_is_the_leading_tokens() {
        assert_eq!(shard_key("orders.eu.created", 1), "orders");
        assert_eq!(shard_key("orders.eu.created", 2), "orders.eu");
        assert_eq!(shard_key("orders", 2), "orders");
    }

    #[test]
    fn literal_shard_tokens_need_one_bucket_and_wildcards_all() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        let orders = bucket_of("orders");
        assert_eq!(buckets_of(&p("orders.created"), 1), Some(orders));
        assert_eq!(buckets_of(&p("orders.*"), 1), Some(orders));
        assert_eq!(buckets_of(&p("orders.>"), 1), Some(orders));
        assert_eq!(buckets_of(&p("*.created"), 1), None);
        assert_eq!(buckets_of(&p(">"), 1), None);
        assert_eq!(buckets_of(&p("orders.*"), 2), None);
        assert_eq!(buckets_of(&p("orders.eu.*"), 2), Some(bucket_of("orders.eu")));
        // The bucket is the key's hash slot / 128, as `CLUSTER KEYSLOT` gives it.
        assert_eq!(key_slot(b"orders") / 128, orders);
    }

    #[test]
    fn each_shard_channel_hashes_into_its_buckets_slot_range() {
        let channels = shard_channels("socle:eventbus");
        assert_eq!(channels.len(), 128);
        for (b, channel) in channels.iter().enumerate() {
            assert!(channel.starts_with(&format!("socle:eventbus:shard:{b}:{{")), "{channel}");
            assert_eq!(usize::from(key_slot(channel.as_bytes()) / 128), b, "{channel}");
        }
        assert_eq!(channels[0], "socle:eventbus:shard:0:{14}", "as docs/redis.md gives it");
        // Known slots (redis-cli CLUSTER KEYSLOT): "foo" 12182, "{user1000}.following" 3443.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
    }
}
