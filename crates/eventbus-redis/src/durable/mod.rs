//! Durable consumers on Redis Streams (SPEC §9, redis mode): one consumer shared by
//! every instance, whichever instance a client or a publisher talks to.
//!
//! State lives in Redis, never only in an instance, and every change is one Lua script
//! (`scripts`), so instances never coordinate except through Redis:
//!
//! | key (`P` = prefix) | what |
//! |---|---|
//! | `P:durable:consumers` | hash: name → definition (JSON) |
//! | `P:durable:version` | bumped by every create/replace/delete |
//! | `P/durable/changes` | pub/sub notice of a bump (outside `P:*`, so no event subscriber sees it) |
//! | `P:durable:idem:{key}` | idempotency key → first event id, expires with the window |
//! | `P:durable:{name}:s` | stream of live events, consumer group `eventbus` |
//! | `P:durable:{name}:d` / `:r` | retries: due time (zset) / record (hash), also parked events |
//! | `P:durable:{name}:k` / `:q:{key}` | ordering key → its one live event / events waiting on it |
//! | `P:durable:{name}:l` | terminal log (stream, trimmed by count and age) |
//! | `P:durable:{name}:n` | counters: acked, dead_lettered, redelivered |
//! | `P:durable:{name}:c` | instance → clients attached through it and when that count expires |
//! | `P:durable:{name}:o` | outbox: dead letters recorded, publication not yet answered |
//! | `P:durable:{name}:lock` | the janitor's lock (expires) |
//!
//! - Capture: the publish script checks the consumer-set version this instance knows
//!   (a stale instance reloads and retries, so a consumer created on another instance
//!   a moment ago is never missed), the idempotency key, appends to every matching
//!   stream and PUBLISHes for ephemeral subscribers: all in one step. Publishes are
//!   group-committed: one script runs at a time and carries every publish that arrived
//!   while the previous one ran, in arrival order.
//! - Delivery: `consumer` runs one actor per consumer with local clients; it reads
//!   with a blocking XREADGROUP (nothing runs while idle) and spreads events to its
//!   clients.
//! - A failed attempt takes the event off the stream into the retry set; it is
//!   appended again when due, carrying its attempt count and failures. So the pending
//!   entries list holds exactly what is in flight, and XAUTOCLAIM with min-idle = the
//!   ack deadline finds precisely the events of clients (or instances) that vanished.
//! - Dead letters: the script that dead-letters an event also puts its letter in the
//!   outbox; the instance publishes it and then removes it, and a janitor publishes the
//!   ones left behind (at least once, never zero times).

mod consumer;
mod scripts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use eventbus_core::durable::{
    Attachment, BoxFuture, CaptureRequest, Captured, ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink,
    DurableBackend, DurableError, DurableOptions, LogEntry, LogSlice, LogStatus, Retention,
};
use eventbus_core::trie::Trie;
use eventbus_core::{Event, Fanout, TaskHandle};
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};
use redis::aio::ConnectionManager;
use redis::{Client, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::envelope;
use crate::glob::redis_channel;
use consumer::Runtime;
use scripts::Scripts;

/// Consumer group every instance reads through.
const GROUP: &str = "eventbus";
/// Publish retries when the consumer set changed under it.
const STALE_RETRIES: usize = 5;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Most publishes in one capture script, and about the most bytes of envelopes.
const MAX_CAPTURE_BATCH: usize = 512;
const MAX_CAPTURE_BYTES: usize = 4 << 20;
/// Publishes queued for the capture script, beyond which publishers wait.
const CAPTURE_QUEUE: usize = 8192;

/// Settings of the Redis durable engine.
#[derive(Debug, Clone)]
pub struct RedisDurableSettings {
    /// Key prefix (`eventbus.redis.prefix`).
    pub prefix: String,
    /// This instance's name in consumer groups: unique per process.
    pub instance_id: String,
    /// Terminal log bounds.
    pub retention: Retention,
}

/// Durable consumers on Redis Streams. A cheap handle.
#[derive(Debug, Clone)]
pub struct RedisDurable {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Registry {
    /// Version of the consumer set this registry reflects ("" = never loaded).
    version: Arc<str>,
    by_name: HashMap<Arc<str>, Arc<Runtime>>,
    trie: Trie<Arc<str>>,
}

/// Keys outside any one consumer.
#[derive(Debug)]
struct GlobalKeys {
    consumers: String,
    version: String,
    notify: String,
    idem: String,
    /// What precedes an event channel in its Redis Pub/Sub channel (`{prefix}:`).
    pubsub: String,
}

pub(crate) struct Shared {
    /// First, so they are retired before the queues they read close.
    tasks: OnceLock<[TaskHandle; 2]>,
    client: Client,
    conn: ConnectionManager,
    prefix: String,
    instance: String,
    retention: Retention,
    options: DurableOptions,
    sink: OnceLock<DeadLetterSink>,
    keys: GlobalKeys,
    scripts: Scripts,
    captures: mpsc::Sender<PendingCapture>,
    registry: RwLock<Registry>,
    /// One reload at a time (a burst of stale publishes triggers one).
    reloading: tokio::sync::Mutex<()>,
    /// Consumers declared in the configuration: declared again should Redis lose its
    /// data (restarted without persistence).
    declared: Mutex<Vec<ConsumerConfig>>,
    snapshot: Mutex<Vec<ConsumerInfo>>,
    next_client: AtomicU64,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDurable").field("prefix", &self.prefix).field("instance", &self.instance).finish()
    }
}

pub(crate) fn unavailable(err: redis::RedisError) -> DurableError {
    DurableError::unavailable_because(format!("Redis: {err}"), err)
}

/// Redis answered something the engine cannot read: not a "try again".
fn corrupt(what: impl std::fmt::Display) -> DurableError {
    DurableError::internal("an unreadable Redis reply", what.to_string())
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    eventbus_core::durable::epoch_ms(std::time::SystemTime::now())
}

impl RedisDurable {
    /// Creates the engine and starts following consumer definitions in Redis (until
    /// `shutdown`). Returns at once: Redis may come up later; calls answer
    /// UNAVAILABLE until it does.
    pub fn start(
        client: Client,
        settings: RedisDurableSettings,
        options: DurableOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, DurableError> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(MAX_BACKOFF);
        let conn = client.get_connection_manager_lazy(config).map_err(unavailable)?;
        let p = &settings.prefix;
        let keys = GlobalKeys {
            consumers: format!("{p}:durable:consumers"),
            version: format!("{p}:durable:version"),
            notify: format!("{p}/durable/changes"),
            idem: format!("{p}:durable:idem:"),
            pubsub: redis_channel(p, ""),
        };
        let (captures, capture_queue) = mpsc::channel(CAPTURE_QUEUE);
        let shared = Arc::new(Shared {
            tasks: OnceLock::new(),
            client,
            conn,
            prefix: settings.prefix,
            instance: settings.instance_id,
            retention: settings.retention,
            options,
            sink: OnceLock::new(),
            keys,
            scripts: Scripts::new(),
            captures,
            registry: RwLock::default(),
            reloading: tokio::sync::Mutex::new(()),
            declared: Mutex::default(),
            snapshot: Mutex::default(),
            next_client: AtomicU64::new(1),
            shutdown,
        });
        let supervisor = &shared.options.supervisor;
        let follower = supervisor.spawn("durable consumer follower (redis)", follow_changes(Arc::downgrade(&shared)));
        let writer =
            supervisor.spawn("durable capture writer (redis)", run_captures(Arc::downgrade(&shared), capture_queue));
        let _ = shared.tasks.set([follower, writer]);
        Ok(Self { shared })
    }
}

/// A publish waiting for the next capture script.
struct PendingCapture {
    event: Arc<Event>,
    envelope: Vec<u8>,
    /// "" = none.
    ordering_key: String,
    /// The full Redis key; "" = none.
    idem: String,
    reply: oneshot::Sender<Result<Captured, DurableError>>,
}

/// Group commit: one capture script at a time, carrying every publish that arrived
/// while the previous one ran (bounded in count and bytes). One queue and one script
/// in flight keep the capture order the publish order, and a busy broker pays one
/// Redis round trip per batch instead of per event.
async fn run_captures(shared: std::sync::Weak<Shared>, mut queue: mpsc::Receiver<PendingCapture>) {
    let mut batch = Vec::with_capacity(MAX_CAPTURE_BATCH);
    while let Some(first) = queue.recv().await {
        let mut bytes = first.envelope.len();
        batch.push(first);
        while batch.len() < MAX_CAPTURE_BATCH && bytes < MAX_CAPTURE_BYTES {
            match queue.try_recv() {
                Ok(next) => {
                    bytes += next.envelope.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let Some(s) = shared.upgrade() else { return owner_gone().await };
        s.capture_batch(&mut batch).await;
    }
}

/// The engine is being dropped, and its drop aborts the calling task: wait for that
/// rather than end first (an end before it is reported as a failure).
async fn owner_gone() {
    std::future::pending().await
}

/// Reloads the consumer set on every change notice, and after every reconnection
/// (a notice may have been missed while away).
async fn follow_changes(shared: std::sync::Weak<Shared>) {
    let mut backoff = INITIAL_BACKOFF;
    loop {
        let Some(s) = shared.upgrade() else { return owner_gone().await };
        let (client, channel, stop) = (s.client.clone(), s.keys.notify.clone(), s.shutdown.clone());
        drop(s);
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(CONNECT_TIMEOUT, subscribed) => r,
        };
        match pubsub {
            Ok(Ok(pubsub)) => {
                let mut messages = pubsub.into_on_message();
                let Some(s) = shared.upgrade() else { return owner_gone().await };
                if let Err(err) = s.reload().await {
                    warn!(%err, "cannot load durable consumer definitions");
                }
                drop(s);
                backoff = INITIAL_BACKOFF;
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        msg = messages.next() => match msg {
                            Some(_) => {
                                let Some(s) = shared.upgrade() else { return owner_gone().await };
                                if let Err(err) = s.reload().await {
                                    warn!(%err, "cannot reload durable consumer definitions");
                                }
                            }
                            None => break,
                        },
                    }
                }
                warn!("lost the Redis connection that follows durable consumer changes; reconnecting");
            }
            Ok(Err(err)) => debug!(%err, retry_in = ?backoff, "cannot follow durable consumer changes yet"),
            Err(_) => debug!(retry_in = ?backoff, "timed out following durable consumer changes"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Writes the consumers declared in the configuration again (identical definitions are
/// a no-op, so every instance may do it).
/// (Boxed: `define` reloads, and a reload may start this.)
fn redeclare(shared: std::sync::Weak<Shared>) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let Some(shared) = shared.upgrade() else { return };
        let declared = shared.declared.lock().clone();
        for config in declared {
            match shared.define(&config, true).await {
                Ok(_) => info!(consumer = %config.name, "durable consumer declared again"),
                Err(err) => warn!(consumer = %config.name, %err, "cannot declare the durable consumer again"),
            }
        }
    })
}

impl Shared {
    fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    fn base(&self, name: &str) -> String {
        format!("{}:durable:{name}", self.prefix)
    }

    fn runtime(&self, name: &str) -> Option<Arc<Runtime>> {
        self.registry.read().by_name.get(name).cloned()
    }

    /// Reads every definition and the version in one transaction and brings the local
    /// registry in line: new consumers appear, changed ones take their new definition,
    /// deleted ones detach their local clients.
    async fn reload(self: &Arc<Self>) -> Result<(), DurableError> {
        let _one_at_a_time = self.reloading.lock().await;
        let (version, defs): (Option<String>, HashMap<String, String>) = redis::pipe()
            .atomic()
            .get(&self.keys.version)
            .hgetall(&self.keys.consumers)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if version.is_none() && !matches!(&*self.registry.read().version, "" | "0") {
            // The definitions this instance knew are gone with the version counter
            // itself: not a delete (that bumps it) but a Redis that lost its data.
            warn!(
                "Redis has lost the durable consumer definitions (restarted without persistence?); declaring the configured consumers again"
            );
            tokio::spawn(redeclare(Arc::downgrade(self)));
        }
        let version = version.unwrap_or_else(|| "0".into());
        let mut fresh = Registry { version: version.as_str().into(), ..Registry::default() };
        let mut removed = Vec::new();
        {
            let mut registry = self.registry.write();
            for (name, json) in defs {
                let config: ConsumerConfig = match serde_json::from_str(&json) {
                    Ok(c) => c,
                    Err(err) => {
                        warn!(consumer = %name, %err, "ignoring an unreadable durable consumer definition in Redis");
                        continue;
                    }
                };
                let filters = match config.validate() {
                    Ok(f) => f,
                    Err(err) => {
                        warn!(consumer = %name, %err, "ignoring an invalid durable consumer definition in Redis");
                        continue;
                    }
                };
                let name: Arc<str> = name.into();
                let runtime = match registry.by_name.get(&name) {
                    Some(rt) => {
                        rt.set_config(config);
                        Arc::clone(rt)
                    }
                    None => Arc::new(Runtime::new(Arc::clone(&name), self.base(&name), config)),
                };
                for f in &filters {
                    fresh.trie.insert(f, Arc::clone(&name));
                }
                fresh.by_name.insert(name, runtime);
            }
            for (name, rt) in registry.by_name.drain() {
                if !fresh.by_name.contains_key(&name) {
                    removed.push(rt);
                }
            }
            *registry = fresh;
        }
        for rt in removed {
            info!(consumer = %rt.name, "durable consumer deleted; detaching its local clients");
            rt.stop(consumer::StopReason::Deleted);
        }
        debug!(%version, "durable consumer definitions loaded");
        Ok(())
    }

    /// The consumer, reloading once when this instance does not know it yet.
    async fn find(self: &Arc<Self>, name: &str) -> Result<Option<Arc<Runtime>>, DurableError> {
        if let Some(rt) = self.runtime(name) {
            return Ok(Some(rt));
        }
        self.reload().await?;
        Ok(self.runtime(name))
    }

    /// A consumer's state. A consumer whose stream is gone (deleted a moment ago, or
    /// lost with a Redis that kept nothing) is reported unknown after a reload.
    async fn info(self: &Arc<Self>, rt: &Runtime) -> Result<ConsumerInfo, DurableError> {
        match self.try_info(rt).await {
            Err(err) if consumer::is_missing_stream(&err) => {
                self.reload().await?;
                Err(DurableError::UnknownConsumer(rt.name.to_string()))
            }
            other => other.map_err(unavailable),
        }
    }

    async fn try_info(&self, rt: &Runtime) -> Result<ConsumerInfo, redis::RedisError> {
        let stream = format!("{}:s", rt.base);
        type Counters = (Option<u64>, Option<u64>, Option<u64>);
        type Presence = HashMap<String, String>;
        let (len, pel, waiting, counters, presence): (u64, Value, u64, Counters, Presence) = redis::pipe()
            .cmd("XLEN")
            .arg(&stream)
            .cmd("XPENDING")
            .arg(&stream)
            .arg(GROUP)
            .cmd("HLEN")
            .arg(format!("{}:r", rt.base))
            .cmd("HMGET")
            .arg(format!("{}:n", rt.base))
            .arg("acked")
            .arg("dead_lettered")
            .arg("redelivered")
            .cmd("HGETALL")
            .arg(format!("{}:c", rt.base))
            .query_async(&mut self.conn())
            .await?;
        let in_flight = match pel {
            Value::Array(items) => match items.first() {
                Some(Value::Int(n)) => *n as u64,
                _ => 0,
            },
            _ => 0,
        };
        Ok(ConsumerInfo {
            config: rt.config().as_ref().clone(),
            pending: len.saturating_sub(in_flight) + waiting,
            in_flight,
            clients: cluster_clients(rt.local_clients(), &self.instance, &presence, now_ms()),
            acked: counters.0.unwrap_or(0),
            dead_lettered: counters.1.unwrap_or(0),
            redelivered: counters.2.unwrap_or(0),
        })
    }

    /// Writes a definition; `replace` overwrites a different one.
    async fn define(self: &Arc<Self>, config: &ConsumerConfig, replace: bool) -> Result<Option<String>, DurableError> {
        let json =
            serde_json::to_string(config).map_err(|e| DurableError::internal("encoding a consumer definition", e))?;
        let (kind, value): (String, String) = self
            .scripts
            .define
            .key(&self.keys.consumers)
            .key(&self.keys.version)
            .arg(&config.name)
            .arg(&json)
            .arg(self.base(&config.name))
            .arg(GROUP)
            .arg(&self.keys.notify)
            .arg(u8::from(replace))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        self.reload().await?;
        Ok((kind == "exists").then_some(value))
    }

    /// Queues publishes for the next capture script, in order, then waits for their
    /// outcomes. Answers stop at the first error.
    async fn capture_many(&self, batch: &[CaptureRequest<'_>]) -> Vec<Result<Captured, DurableError>> {
        let gone = || DurableError::unavailable("the durable engine is shutting down");
        let mut outcomes = Vec::with_capacity(batch.len());
        for r in batch {
            let (reply, outcome) = oneshot::channel();
            let capture = PendingCapture {
                envelope: envelope::encode(r.event),
                ordering_key: r.ordering_key.unwrap_or("").to_owned(),
                idem: r.idempotency_key.map(|k| format!("{}{k}", self.keys.idem)).unwrap_or_default(),
                event: Arc::clone(r.event),
                reply,
            };
            if self.captures.send(capture).await.is_err() {
                break;
            }
            outcomes.push(outcome);
        }
        let mut out = Vec::with_capacity(batch.len());
        for outcome in outcomes {
            let captured = outcome.await.unwrap_or_else(|_| Err(gone()));
            let failed = captured.is_err();
            out.push(captured);
            if failed {
                return out;
            }
        }
        if out.len() < batch.len() {
            out.push(Err(gone()));
        }
        out
    }

    /// Runs one capture script for `batch`, in order, and answers each publish. A
    /// batch that finds the consumer set changed reloads it and runs again, before
    /// any later batch, so publish order holds.
    async fn capture_batch(self: &Arc<Self>, batch: &mut Vec<PendingCapture>) {
        let window_ms = self.options.dedup_window.as_millis().max(1) as u64;
        let mut names = Vec::new();
        let mut consumers = Vec::with_capacity(batch.len());
        let mut failure = "durable consumer definitions keep changing; try again".to_owned();
        for _ in 0..STALE_RETRIES {
            let mut call = self.scripts.publish.key(&self.keys.version);
            consumers.clear();
            {
                let registry = self.registry.read();
                call.arg(&*registry.version).arg(window_ms).arg(&self.keys.pubsub);
                for p in batch.iter() {
                    names.clear();
                    registry.trie.collect(&p.event.channel, &mut names);
                    names.sort_unstable();
                    names.dedup();
                    names.retain(|n| registry.by_name.contains_key(n));
                    call.arg(&p.event.id)
                        .arg(&p.envelope)
                        .arg(&p.event.channel)
                        .arg(&p.ordering_key)
                        .arg(&p.idem)
                        .arg(names.len());
                    for rt in names.iter().filter_map(|n| registry.by_name.get(n)) {
                        call.arg(&*rt.base);
                    }
                    consumers.push(names.len());
                }
            }
            let reply: Vec<Value> = match call.invoke_async(&mut self.conn()).await {
                Ok(reply) => reply,
                Err(err) => {
                    failure = format!("Redis: {err}");
                    break;
                }
            };
            let mut reply = reply.into_iter();
            match reply.next() {
                Some(Value::BulkString(kind)) if kind == b"ok" && reply.len() == batch.len() => {
                    for ((p, value), consumers) in batch.drain(..).zip(reply).zip(&consumers) {
                        let captured = match value {
                            Value::Int(n) => Ok(Captured::Forwarded {
                                consumers: *consumers,
                                fanout: Fanout { delivered: u32::try_from(n).unwrap_or(u32::MAX), failed: 0 },
                            }),
                            other => redis::from_redis_value(other).map(Captured::Duplicate).map_err(corrupt),
                        };
                        let _ = p.reply.send(captured);
                    }
                    return;
                }
                Some(Value::BulkString(kind)) if kind == b"stale" => {
                    if let Err(err) = self.reload().await {
                        failure = err.to_string();
                        break;
                    }
                }
                other => {
                    let what = format!("unexpected reply to the capture script: {other:?}");
                    for p in batch.drain(..) {
                        let _ = p.reply.send(Err(corrupt(&what)));
                    }
                    return;
                }
            }
        }
        warn!(events = batch.len(), reason = %failure, "durable capture failed; publishes answered UNAVAILABLE");
        for p in batch.drain(..) {
            let _ = p.reply.send(Err(DurableError::unavailable(failure.clone())));
        }
    }

    async fn log(
        &self,
        rt: &Runtime,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &str,
    ) -> Result<LogSlice, DurableError> {
        if !page_token.is_empty() && !is_stream_id(page_token) {
            return Err(DurableError::bad_page_token(page_token));
        }
        let limit = limit.clamp(1, 1000);
        let key = format!("{}:l", rt.base);
        let mut start = if page_token.is_empty() { "-".to_owned() } else { format!("({page_token}") };
        let mut page = LogSlice::default();
        let mut last_scanned = String::new();
        loop {
            let rows: Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(limit.max(100))
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            let rows = consumer::entries_of(rows).map_err(corrupt)?;
            if rows.is_empty() {
                return Ok(page);
            }
            for row in rows {
                if page.entries.len() == limit {
                    page.next_page_token = last_scanned;
                    return Ok(page);
                }
                let entry = log_entry(&row).map_err(corrupt)?;
                if status.is_none_or(|s| s == entry.status) {
                    page.entries.push(entry);
                }
                last_scanned.clone_from(&row.id);
            }
            start = format!("({last_scanned}");
        }
    }
}

/// Clients attached across the cluster: this instance's own, live, plus the counts the
/// other instances recorded in `:c` (`"{clients} {expires at ms}"`) that have not expired.
fn cluster_clients(local: u32, instance: &str, presence: &HashMap<String, String>, now: u64) -> u32 {
    let others = presence.iter().filter(|(name, _)| name.as_str() != instance).filter_map(|(_, value)| {
        let (clients, expires) = value.split_once(' ')?;
        let (clients, expires) = (clients.parse::<u32>().ok()?, expires.parse::<u64>().ok()?);
        (expires >= now).then_some(clients)
    });
    others.fold(local, u32::saturating_add)
}

fn is_stream_id(s: &str) -> bool {
    let mut parts = s.splitn(2, '-');
    let ms = parts.next().unwrap_or("");
    let seq = parts.next().unwrap_or("");
    !ms.is_empty()
        && !seq.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
        && seq.bytes().all(|b| b.is_ascii_digit())
}

fn log_entry(row: &consumer::Entry) -> Result<LogEntry, String> {
    let line = row.get("j").ok_or("log line without its entry")?;
    serde_json::from_slice(line).map_err(|e| format!("log line: {e}"))
}

impl DurableBackend for RedisDurable {
    fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        let _ = self.shared.sink.set(sink);
    }

    fn capture_many<'a>(
        &'a self,
        batch: &'a [CaptureRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Captured, DurableError>>> {
        Box::pin(self.shared.capture_many(batch))
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            config.validate().map_err(DurableError::InvalidConfig)?;
            if let Some(existing) = self.shared.define(&config, false).await? {
                let same = serde_json::from_str::<ConsumerConfig>(&existing).is_ok_and(|e| e == config);
                if !same {
                    return Err(DurableError::AlreadyExists(config.name));
                }
            }
            let rt =
                self.shared.runtime(&config.name).ok_or_else(|| DurableError::UnknownConsumer(config.name.clone()))?;
            self.shared.info(&rt).await
        })
    }

    fn declare_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(async move {
            config.validate().map_err(DurableError::InvalidConfig)?;
            {
                let mut declared = self.shared.declared.lock();
                declared.retain(|c| c.name != config.name);
                declared.push(config.clone());
            }
            self.shared.define(&config, true).await.map(|_| ())
        })
    }

    fn get_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find(name).await?.ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?;
            self.shared.info(&rt).await
        })
    }

    fn list_consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, DurableError>> {
        Box::pin(async move {
            self.shared.reload().await?;
            let runtimes: Vec<Arc<Runtime>> = self.shared.registry.read().by_name.values().cloned().collect();
            let mut out = Vec::with_capacity(runtimes.len());
            for rt in runtimes {
                out.push(self.shared.info(&rt).await?);
            }
            out.sort_by(|a, b| a.config.name.cmp(&b.config.name));
            self.shared.snapshot.lock().clone_from(&out);
            Ok(out)
        })
    }

    fn consumers_snapshot(&self) -> Vec<ConsumerInfo> {
        self.shared.snapshot.lock().clone()
    }

    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>> {
        Box::pin(async move {
            let deleted: i64 = self
                .shared
                .scripts
                .delete
                .key(&self.shared.keys.consumers)
                .key(&self.shared.keys.version)
                .arg(name)
                .arg(self.shared.base(name))
                .arg(&self.shared.keys.notify)
                .invoke_async(&mut self.shared.conn())
                .await
                .map_err(unavailable)?;
            self.shared.reload().await?;
            match deleted {
                0 => Err(DurableError::UnknownConsumer(name.to_owned())),
                _ => Ok(()),
            }
        })
    }

    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find(name).await?.ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?;
            self.shared.log(&rt, status, limit, page_token).await
        })
    }

    fn attach<'a>(
        &'a self,
        name: &'a str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> BoxFuture<'a, Result<Attachment, DurableError>> {
        Box::pin(async move {
            match self.attach_once(name, options, create_if_missing.clone()).await {
                // Known here, gone from Redis: reloaded; try once more (it may be
                // created from `create_if_missing` now).
                Err(DurableError::UnknownConsumer(_)) => self.attach_once(name, options, create_if_missing).await,
                other => other,
            }
        })
    }

    fn detach_all(&self) {
        let runtimes: Vec<Arc<Runtime>> = self.shared.registry.read().by_name.values().cloned().collect();
        for rt in runtimes {
            rt.stop(consumer::StopReason::Shutdown);
        }
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>> {
        // Every change is applied by the time its script returns.
        Box::pin(std::future::ready(Ok(())))
    }
}

impl RedisDurable {
    async fn attach_once(
        &self,
        name: &str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> Result<Attachment, DurableError> {
        let rt = match (self.shared.find(name).await?, create_if_missing) {
            (Some(rt), _) => rt,
            (None, Some(config)) => {
                self.create_consumer(config.named_for_attach(name).map_err(DurableError::InvalidConfig)?).await?;
                self.shared.runtime(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?
            }
            (None, None) => return Err(DurableError::UnknownConsumer(name.to_owned())),
        };
        // Also proves Redis is reachable before the client is told it is attached.
        let info = self.shared.info(&rt).await?;
        let id = self.shared.next_client.fetch_add(1, Ordering::Relaxed);
        let (deliveries, client) = rt.attach(&self.shared, id, options).await?;
        let info = ConsumerInfo { clients: info.clients + 1, ..info };
        Ok(Attachment { info, deliveries, client: Box::new(client) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_clients_adds_the_live_counts_of_other_instances() {
        let presence: HashMap<String, String> = [
            ("me", "7 2000"), // this instance: its live count is used instead
            ("b", "2 2000"),  // live
            ("c", "3 999"),   // expired: an instance that died
            ("d", "garbage"), // unreadable: ignored
            ("e", "4 1000"),  // expires exactly now: still counts
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(cluster_clients(1, "me", &presence, 1000), 1 + 2 + 4);
        assert_eq!(cluster_clients(0, "me", &HashMap::new(), 1000), 0);
    }
}
