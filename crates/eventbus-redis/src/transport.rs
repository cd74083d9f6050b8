//! The Redis Pub/Sub transport.
//!
//! One task owns the pub/sub connection: it connects (retrying with capped exponential
//! backoff), subscribes to what local subscriptions need, hands received events to the
//! local router, and on any connection loss clears the publisher (so publishes fail
//! fast with UNAVAILABLE instead of queueing) and starts over, restoring every Redis
//! subscription. Local demand is a set, not a queue of commands: the task reconciles
//! what Redis has with what is wanted, so nothing piles up while Redis is away.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventbus_core::history::HistoryRules;
use eventbus_core::name::validate_channel;
use eventbus_core::transport::{PublishAllFuture, PublishFuture};
use eventbus_core::{Event, Fanout, LocalFanout, Pattern, Supervisor, Transport, TransportError, TransportStatus};
use futures::StreamExt;
use parking_lot::RwLock;
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::dedup::Dedup;
use crate::demand::Demand;
use crate::envelope::{self, Envelope};
use crate::glob::{RedisFilter, event_channel, redis_channel, redis_filter};
use crate::groups::FleetGroups;
use crate::history::RedisHistory;

/// First reconnection delay; doubles up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Bound on connecting and on each command, so a hung Redis fails publishes instead of
/// stalling them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The [`Transport`] methods both Redis transports (single Redis and Cluster) serve
/// alike: subscriptions wanted (`demand`), status, consumer groups across the fleet
/// (`groups`) and channel histories (`history`, read through the transport's
/// `reader()` connection). Expanded inside each `impl Transport`, over those fields.
macro_rules! shared_transport_methods {
    () => {
        fn watch(&self, filter: &::eventbus_core::Pattern) {
            self.demand.watch(filter);
        }

        fn unwatch(&self, filter: &::eventbus_core::Pattern) {
            self.demand.unwatch(filter);
        }

        fn watched(&self) -> ::eventbus_core::transport::WatchedFuture<'_> {
            self.demand.watched(&self.status)
        }

        fn status(&self) -> ::tokio::sync::watch::Receiver<::eventbus_core::TransportStatus> {
            self.status.subscribe()
        }

        fn group_members(&self, group: &str, members: usize) {
            self.groups.set_members(group, members);
        }

        fn delivers_to_group(&self, group: &str, event: &::eventbus_core::Event) -> bool {
            self.groups.delivers(group, event)
        }

        fn read_history<'a>(
            &'a self,
            channel: &'a str,
            start: &'a ::eventbus_core::history::Start,
            take: ::eventbus_core::history::Take,
        ) -> ::eventbus_core::transport::HistoryFuture<'a, Option<::eventbus_core::history::Recovery>> {
            Box::pin(self.history.read(self.reader(), channel, start, take))
        }

        fn history_channels<'a>(
            &'a self,
            filter: &'a ::eventbus_core::Pattern,
        ) -> ::eventbus_core::transport::HistoryFuture<'a, Vec<String>> {
            Box::pin(self.history.channels(self.reader(), filter))
        }

        fn history_info<'a>(
            &'a self,
            channel: &'a str,
        ) -> ::eventbus_core::transport::HistoryFuture<'a, Option<::eventbus_core::history::HistoryInfo>> {
            Box::pin(self.history.info(self.reader(), channel))
        }
    };
}
pub(crate) use shared_transport_methods;

/// The PEM of `eventbus.redis.tls_ca_file`.
pub(crate) fn read_tls_ca(path: &std::path::Path) -> Result<Vec<u8>, redis::RedisError> {
    std::fs::read(path).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "cannot read tls_ca_file",
            format!("{}: {e}", path.display()),
        ))
    })
}

/// Where Redis is (`eventbus.redis` configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://` or `rediss://` URL; wins over the fields below when set.
    pub url: Option<String>,
    pub host: String,
    pub port: u16,
    /// Redis ACL user; `None` authenticates as `default` (with `password` alone).
    pub username: Option<String>,
    pub password: Option<String>,
    pub database: i64,
    /// Redis channel of event channel `C` is `{prefix}:C`.
    pub prefix: String,
    /// How the events this instance publishes are encoded (it reads both).
    pub envelope: Envelope,
    /// PEM file of the CA that signed Redis's TLS certificate (`rediss://` URLs), for a
    /// private CA; `None` trusts the system's root certificates.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Redis Cluster seed nodes; non-empty selects cluster mode (see [`crate::cluster`]).
    pub cluster_nodes: Vec<String>,
    /// Cluster mode: how many leading tokens of a channel choose its shard.
    pub shard_tokens: usize,
    /// How often the transport PINGs Redis on both of its connections.
    pub health_check_interval: Duration,
    /// How long a PING may take before Redis counts as not answering.
    pub health_check_timeout: Duration,
    /// Channels that keep a history (in Redis, shared by the instances).
    pub history: HistoryRules,
    /// Replicas that must have an event kept in a history before its publish is
    /// answered OK (`eventbus.redis.min_replicas_acked`; 0 = the master's word is
    /// enough). One Redis keeps history in the durable engine's capture script, which
    /// waits for them; a cluster's transport waits after its history scripts.
    pub min_replicas_acked: u32,
    /// How long a publish waits for them (`eventbus.redis.replica_ack_timeout_ms`).
    pub replica_ack_timeout: Duration,
}

impl RedisOptions {
    /// How long a command may take to be answered: a `WAIT` for replicas
    /// (`min_replicas_acked`) may take up to its timeout on top.
    pub(crate) fn response_timeout(&self, command: Duration) -> Duration {
        match self.min_replicas_acked {
            0 => command,
            _ => command + self.replica_ack_timeout,
        }
    }

    /// The client for these settings (no connection is made yet).
    pub fn client(&self) -> Result<Client, redis::RedisError> {
        if let Some(url) = &self.url {
            return match &self.tls_ca_file {
                Some(path) => {
                    let pem = read_tls_ca(path)?;
                    let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem) };
                    Client::build_with_tls(url.as_str(), certs)
                }
                None => Client::open(url.as_str()),
            };
        }
        let mut redis = RedisConnectionInfo::default().set_db(self.database);
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        let info = ConnectionAddr::Tcp(self.host.clone(), self.port).into_connection_info()?.set_redis_settings(redis);
        Client::open(info)
    }

    /// Connects once to learn whether Redis accepts the credentials. A refusal is a
    /// setting to fix, so start-up reports it; an unreachable Redis is an outage the
    /// transport rides out (it connects once Redis is up), so that passes here.
    pub async fn check_credentials(&self) -> Result<(), redis::RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        let outcome = async {
            let mut conn = self.client()?.get_multiplexed_async_connection_with_config(&config).await?;
            // Without credentials nothing was checked yet: a Redis that wants some says
            // so on the first command.
            redis::cmd("PING").query_async::<()>(&mut conn).await
        };
        match outcome.await {
            Err(err) if refuses_credentials(&err) => Err(err),
            _ => Ok(()),
        }
    }

    /// Where it connects, without the password, for logs.
    pub fn display_target(&self) -> String {
        match &self.url {
            Some(url) => match url.split_once('@') {
                Some((scheme_user, host)) => {
                    let scheme = scheme_user.split("://").next().unwrap_or("redis");
                    format!("{scheme}://***@{host}")
                }
                None => url.clone(),
            },
            None => format!("{}:{}/{}", self.host, self.port, self.database),
        }
    }
}

/// Wrong or missing credentials, or a user without the right to connect.
pub(crate) fn refuses_credentials(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

/// A live connection pair, subscribed to what was wanted when it opened.
struct Session {
    publisher: MultiplexedConnection,
    sink: PubSubSink,
    stream: PubSubStream,
    active: BTreeSet<Pattern>,
}

/// Health checks in a row without an answer before the connections are dropped and
/// made again (a half-open TCP connection never answers, even once Redis is back).
const STALLED_CHECKS_BEFORE_RECONNECT: u32 = 5;

/// Publishes to and receives from Redis for one broker instance.
#[derive(Debug)]
pub struct RedisTransport {
    prefix: String,
    envelope: Envelope,
    target: String,
    health_interval: Duration,
    health_timeout: Duration,
    /// Set while connected; cloned per publish (a cheap handle).
    publisher: RwLock<Option<MultiplexedConnection>>,
    /// Filters local subscriptions need.
    demand: Demand,
    status: watch::Sender<TransportStatus>,
    groups: Arc<FleetGroups>,
    history: RedisHistory,
}

impl RedisTransport {
    /// Creates the transport and starts its connection task, which runs until
    /// `shutdown`. Returns at once: Redis may come up later. `client` comes from
    /// [`RedisOptions::client`], which is where a bad URL is reported.
    pub fn start(
        client: Client,
        settings: &RedisOptions,
        local: LocalFanout,
        shutdown: CancellationToken,
        supervisor: &Supervisor,
    ) -> Arc<Self> {
        // rediss:// needs a TLS crypto provider; an error means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let transport = Arc::new(Self {
            prefix: settings.prefix.clone(),
            envelope: settings.envelope,
            target: settings.display_target(),
            health_interval: settings.health_check_interval,
            health_timeout: settings.health_check_timeout,
            publisher: RwLock::new(None),
            demand: Demand::new(),
            status: watch::Sender::new(TransportStatus::default()),
            groups: FleetGroups::new(&settings.prefix),
            history: RedisHistory::new(&settings.prefix, settings.history.clone(), None),
        });
        let publisher = Arc::clone(&transport);
        let groups = Arc::clone(&transport.groups).run(move || publisher.publisher.read().clone(), shutdown.clone());
        supervisor.spawn("redis group membership", groups).detach();
        // Runs until `shutdown` (it holds the transport, so no owner's drop retires it).
        supervisor.spawn("redis transport", Arc::clone(&transport).run(client, local, shutdown)).detach();
        transport
    }

    fn unavailable(&self, reason: impl Into<String>) -> TransportError {
        TransportError { transport: "redis", reason: reason.into() }
    }

    /// The publishing connection, for a history read (bounded in time).
    fn reader(&self) -> Result<MultiplexedConnection, TransportError> {
        self.publisher
            .read()
            .clone()
            .ok_or_else(|| self.unavailable(format!("not connected to Redis at {}", self.target)))
    }

    async fn run(self: Arc<Self>, client: Client, local: LocalFanout, shutdown: CancellationToken) {
        let mut backoff = INITIAL_BACKOFF;
        let mut connected_before = false;
        loop {
            let session = tokio::select! {
                () = shutdown.cancelled() => return,
                session = self.connect(&client) => session,
            };
            match session {
                Ok(session) => {
                    // Subscriptions are restored before anyone is told we are back.
                    *self.publisher.write() = Some(session.publisher.clone());
                    local.set_status(&self.status, |s| {
                        s.connected = true;
                        if connected_before {
                            s.reconnects += 1;
                        }
                    });
                    info!(target = %self.target, "connected to Redis");
                    connected_before = true;
                    backoff = INITIAL_BACKOFF;
                    let lost = self.serve(session, &local, &shutdown).await;
                    *self.publisher.write() = None;
                    local.set_status(&self.status, |s| {
                        s.connected = false;
                        s.stalled = false;
                    });
                    match lost {
                        None => return,
                        Some(reason) => {
                            warn!(target = %self.target, %reason, "lost the Redis connection; reconnecting")
                        }
                    }
                }
                Err(err) => {
                    warn!(target = %self.target, error = %err, retry_in = ?backoff, "cannot connect to Redis; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Opens the publishing and receiving connections and subscribes to what is wanted.
    async fn connect(&self, client: &Client) -> Result<Session, String> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        let publisher =
            client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| e.to_string())?;
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
            .await
            .map_err(|_| "timed out connecting the pub/sub connection".to_owned())?
            .map_err(|e| e.to_string())?;
        let (mut sink, stream) = pubsub.split();
        let mut active = BTreeSet::new();
        tokio::time::timeout(COMMAND_TIMEOUT, self.reconcile(&mut sink, &mut active))
            .await
            .map_err(|_| "timed out subscribing".to_owned())?
            .map_err(|e| format!("subscribing failed: {e}"))?;
        Ok(Session { publisher, sink, stream, active })
    }

    /// Receives until the connection is lost (returns why) or shutdown (returns None),
    /// checking every `health_interval` that Redis answers on both connections.
    async fn serve(&self, session: Session, local: &LocalFanout, shutdown: &CancellationToken) -> Option<String> {
        let Session { mut publisher, mut sink, mut stream, mut active } = session;
        let mut dedup = Dedup::default();
        let mut health = tokio::time::interval_at(Instant::now() + self.health_interval, self.health_interval);
        health.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut unanswered = 0u32;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return None,
                _ = health.tick() => match self.check(&mut publisher, &mut sink).await {
                    Ok(()) if unanswered > 0 => {
                        unanswered = 0;
                        local.set_status(&self.status, |s| {
                            s.connected = true;
                            s.stalled = false;
                        });
                        info!(target = %self.target, "Redis answers again");
                    }
                    Ok(()) => {}
                    Err(reason) => {
                        unanswered += 1;
                        if unanswered == 1 {
                            // Known down: readiness off, publishes refused at once.
                            local.set_status(&self.status, |s| {
                                s.connected = false;
                                s.stalled = true;
                            });
                            warn!(target = %self.target, %reason, "Redis is not answering; refusing publishes until it does");
                        }
                        if unanswered >= STALLED_CHECKS_BEFORE_RECONNECT {
                            return Some(format!("no answer to {unanswered} health checks in a row ({reason})"));
                        }
                    }
                },
                () = self.demand.changed.notified() => {
                    // Bounded: a hung Redis must not stop this loop (and its health checks).
                    match tokio::time::timeout(COMMAND_TIMEOUT, self.reconcile(&mut sink, &mut active)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => return Some(format!("subscribing failed: {err}")),
                        Err(_) => return Some("timed out subscribing".to_owned()),
                    }
                }
                msg = stream.next() => match msg {
                    Some(msg) => self.receive(&msg, &mut dedup, local).await,
                    None => return Some("connection closed".to_owned()),
                },
            }
        }
    }

    /// PINGs Redis on the publishing and the pub/sub connection at once, within
    /// `health_timeout`.
    async fn check(&self, publisher: &mut MultiplexedConnection, sink: &mut PubSubSink) -> Result<(), String> {
        let ping = redis::cmd("PING");
        let pings = async {
            let (a, b) = tokio::join!(ping.query_async::<redis::Value>(publisher), sink.ping::<redis::Value>());
            a.and(b)
        };
        match tokio::time::timeout(self.health_timeout, pings).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(format!("PING failed: {err}")),
            Err(_) => Err(format!("no PING reply within {} ms", self.health_timeout.as_millis())),
        }
    }

    /// Brings the Redis subscriptions in line with what local subscriptions want.
    async fn reconcile(&self, sink: &mut PubSubSink, active: &mut BTreeSet<Pattern>) -> redis::RedisResult<()> {
        let (wanted, version) = self.demand.read(Clone::clone);
        for filter in wanted.difference(active) {
            match redis_filter(&self.prefix, filter) {
                RedisFilter::Channel(c) => sink.subscribe(&c).await?,
                RedisFilter::Glob(g) => sink.psubscribe(&g).await?,
            }
            debug!(%filter, "redis subscription added");
        }
        for filter in active.difference(&wanted) {
            match redis_filter(&self.prefix, filter) {
                RedisFilter::Channel(c) => sink.unsubscribe(&c).await?,
                RedisFilter::Glob(g) => sink.punsubscribe(&g).await?,
            }
            debug!(%filter, "redis subscription removed");
        }
        *active = wanted;
        self.demand.applied(version);
        Ok(())
    }

    async fn receive(&self, msg: &redis::Msg, dedup: &mut Dedup, local: &LocalFanout) {
        let redis_channel = msg.get_channel_name();
        let Some(channel) = event_channel(&self.prefix, redis_channel) else { return };
        let source: Option<String> = msg.get_pattern().ok();
        let payload = Bytes::copy_from_slice(msg.get_payload_bytes());
        if !dedup.is_new(redis_channel, &payload, source.as_deref()) {
            return;
        }
        if let Err(err) = validate_channel(channel) {
            warn!(redis_channel, %err, "ignoring a Redis message on a channel the broker cannot route");
            return;
        }
        let event: Event = envelope::decode(channel, payload);
        local.dispatch(event).await;
    }
}

impl Transport for RedisTransport {
    fn mode(&self) -> &'static str {
        "redis"
    }

    fn publish(&self, event: Arc<Event>) -> PublishFuture<'_> {
        Box::pin(async move {
            let Some(mut conn) = self.publisher.read().clone() else {
                return Err(self.unavailable(format!("not connected to Redis at {}", self.target)));
            };
            let key = redis_channel(&self.prefix, &event.channel);
            if self.history.limits(&event.channel).is_some() {
                let receivers = self
                    .history
                    .publish(&mut conn, self.envelope, std::iter::once((key.as_str(), &*event)))
                    .await
                    .map_err(|e| self.unavailable(format!("PUBLISH with history failed: {e}")))?;
                let receivers = receivers.first().copied().unwrap_or(0);
                return Ok(Fanout { delivered: u32::try_from(receivers).unwrap_or(u32::MAX), failed: 0 });
            }
            let receivers: i64 = redis::cmd("PUBLISH")
                .arg(key)
                .arg(envelope::encode_as(self.envelope, &event))
                .query_async(&mut conn)
                .await
                .map_err(|e| self.unavailable(format!("PUBLISH failed: {e}")))?;
            Ok(Fanout { delivered: u32::try_from(receivers).unwrap_or(u32::MAX), failed: 0 })
        })
    }

    /// All at once: one script when one of them keeps a history (each channel's hash
    /// read and written once, its stream trimmed once), else one pipeline of
    /// `PUBLISH`es; in order, on the one connection, in one round trip.
    fn publish_all(&self, events: Vec<Arc<Event>>) -> PublishAllFuture<'_> {
        Box::pin(async move {
            let Some(mut conn) = self.publisher.read().clone() else {
                let reason = format!("not connected to Redis at {}", self.target);
                return events.iter().map(|_| Err(self.unavailable(reason.clone()))).collect();
            };
            let keys: Vec<String> = events.iter().map(|e| redis_channel(&self.prefix, &e.channel)).collect();
            let answers: redis::RedisResult<Vec<i64>> =
                match events.iter().any(|e| self.history.limits(&e.channel).is_some()) {
                    true => {
                        let pairs = keys.iter().map(String::as_str).zip(events.iter().map(|e| &**e));
                        self.history.publish(&mut conn, self.envelope, pairs).await
                    }
                    false => {
                        let mut pipe = redis::pipe();
                        for (key, event) in keys.iter().zip(&events) {
                            pipe.cmd("PUBLISH").arg(key).arg(envelope::encode_as(self.envelope, event));
                        }
                        pipe.query_async(&mut conn).await
                    }
                };
            match answers {
                Ok(answers) if answers.len() == events.len() => answers
                    .into_iter()
                    .map(|n| Ok(Fanout { delivered: u32::try_from(n).unwrap_or(u32::MAX), failed: 0 }))
                    .collect(),
                Ok(_) => {
                    let reason = "PUBLISH was answered for fewer events than were sent";
                    events.iter().map(|_| Err(self.unavailable(reason))).collect()
                }
                Err(err) => {
                    let reason = format!("PUBLISH failed: {err}");
                    events.iter().map(|_| Err(self.unavailable(reason.clone()))).collect()
                }
            }
        })
    }

    crate::transport::shared_transport_methods!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_hides_the_password() {
        let s = RedisOptions {
            url: Some("redis://:secret@cache:6380/2".into()),
            host: String::new(),
            port: 0,
            username: None,
            password: None,
            database: 0,
            prefix: "p".into(),
            envelope: Envelope::Binary,
            tls_ca_file: None,
            cluster_nodes: Vec::new(),
            shard_tokens: 1,
            health_check_interval: Duration::from_secs(1),
            health_check_timeout: Duration::from_millis(500),
            history: HistoryRules::default(),
            min_replicas_acked: 0,
            replica_ack_timeout: Duration::from_secs(1),
        };
        assert_eq!(s.display_target(), "redis://***@cache:6380/2");
        let s = RedisOptions { url: None, host: "cache".into(), port: 6379, password: Some("x".into()), ..s };
        assert_eq!(s.display_target(), "cache:6379/0");
        assert!(s.client().is_ok());
    }
}
