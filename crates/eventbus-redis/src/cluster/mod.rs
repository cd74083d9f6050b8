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
//!
//! Files: `slots` (shard keys, hash slots, buckets and their shard channels), `client`
//! (the cluster client for the seed nodes), `topology` (the transport's task: health,
//! topology changes, subscriptions, received messages), `publish` (each bucket's
//! pipeline), `routes` (each bucket's master, for publishing straight to it).

mod client;
mod publish;
mod routes;
mod slots;
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use eventbus_core::transport::{PublishAllFuture, PublishFuture};
use eventbus_core::{Event, Fanout, LocalFanout, Supervisor, Transport, TransportError, TransportStatus};
use parking_lot::RwLock;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::demand::Demand;
use crate::envelope::Envelope;
use crate::groups::FleetGroups;
use crate::history::{RedisHistory, Shards};
use crate::transport::{RedisOptions, refuses_credentials};
pub use client::ClusterSetup;
pub(crate) use client::durable_clients;
use client::{client, connect};
use routes::Routes;
pub use slots::{BUCKETS, node_url, shard_channels};
pub(crate) use slots::{bucket_of, key_slot, shard_key};
use slots::{buckets_of, shard_tags};

const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// Per bucket, the SUNSUBSCRIBEs this instance sent whose confirmation has not come
    /// back: that push is the end it asked for, not Redis ending the subscription.
    own_unsubscribes: parking_lot::Mutex<std::collections::HashMap<u16, u32>>,
    /// Channel histories, each on its channel's shard.
    history: RedisHistory,
    /// Replicas that must have what a history script kept before its publish is
    /// answered OK, and how long a publish waits for them.
    min_replicas_acked: u32,
    replica_ack_timeout: Duration,
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
            own_unsubscribes: parking_lot::Mutex::default(),
            history: RedisHistory::new(
                &settings.prefix,
                settings.history.clone(),
                Some(Shards { shard_tokens: settings.shard_tokens.max(1), tags: shard_tags(&settings.prefix) }),
            ),
            min_replicas_acked: settings.min_replicas_acked,
            replica_ack_timeout: settings.replica_ack_timeout,
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

    crate::transport::shared_transport_methods!();
}
