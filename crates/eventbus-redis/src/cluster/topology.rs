//! Following the cluster: the transport's task connects, watches the cluster's
//! health and epoch, keeps the shard channels subscribed as local demand and the
//! topology change, and hands received messages to the local fan-out.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use eventbus_core::LocalFanout;
use eventbus_core::name::validate_channel;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::connect;
use super::routes::{NodeAccess, Routes};
use super::slots::SLOTS;
use super::{COMMAND_TIMEOUT, ClusterTransport, INITIAL_BACKOFF, MAX_BACKOFF};
use crate::envelope;

impl ClusterTransport {
    pub(super) async fn run(
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
                    let now = self.check(&mut conn, &local).await;
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
                                    self.gap(&local, "every shard channel (the cluster's topology changed)");
                                }
                                conn = fresh;
                                *self.connection.write() = Some(conn.clone());
                                self.refresh_routes(&mut conn, &access).await;
                                active.clear();
                                // Confirmations due on the old connection never come.
                                self.own_unsubscribes.lock().clear();
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
        local.set_status(&self.status, |s| s.connected = false);
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
    async fn check(&self, conn: &mut ClusterConnection, local: &LocalFanout) -> Option<u64> {
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
                self.set_health(local, false, SLOTS, &reason);
                return None;
            }
        };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).map(str::to_owned)
        };
        let ok: u32 = field("cluster_slots_ok").and_then(|v| v.parse().ok()).unwrap_or(0);
        let state = field("cluster_state").unwrap_or_default();
        let degraded = SLOTS.saturating_sub(ok);
        self.set_health(local, ok > 0, degraded, &format!("cluster_state {state}, {ok} slots served"));
        field("cluster_current_epoch").and_then(|v| v.parse().ok())
    }

    fn set_health(&self, local: &LocalFanout, connected: bool, degraded_slots: u32, detail: &str) {
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
        local.set_status(&self.status, |s| {
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
            *self.own_unsubscribes.lock().entry(bucket).or_default() += 1;
            if let Ok(Err(err)) = tokio::time::timeout(COMMAND_TIMEOUT, conn.sunsubscribe(channel)).await {
                debug!(channel, error = %err, "SUNSUBSCRIBE failed");
                Self::confirmed(&mut self.own_unsubscribes.lock(), bucket);
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
                    .and_then(|b| u16::try_from(b).ok())?;
                // The confirmation of an unsubscribe of ours (the bucket may be wanted
                // and subscribed again since): not an interruption.
                if Self::confirmed(&mut self.own_unsubscribes.lock(), bucket) {
                    return None;
                }
                let bucket = Some(bucket).filter(|b| active.contains(b) && self.wanted_buckets().0.contains(b));
                if bucket.is_some() {
                    self.gap(local, &String::from_utf8_lossy(channel));
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

    /// Takes one of our own unsubscribes of `bucket` off the count; false when none was
    /// waiting for its confirmation.
    fn confirmed(own: &mut std::collections::HashMap<u16, u32>, bucket: u16) -> bool {
        match own.get_mut(&bucket) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                own.remove(&bucket);
                true
            }
            None => false,
        }
    }

    fn gap(&self, local: &LocalFanout, what: &str) {
        local.set_status(&self.status, |s| s.gaps += 1);
        warn!(
            subscription = what,
            "a sharded subscription was interrupted (failover, slot migration or a lost node connection); events \
             published meanwhile were missed; subscribing again"
        );
    }
}
