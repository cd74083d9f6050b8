//! Durable consumers on Redis Streams (docs/redis.md "Durable consumers in redis mode"): one consumer shared by
//! every instance, whichever instance a client or a publisher talks to.
//!
//! State lives in Redis, never only in an instance, and every change is one Lua script
//! (`scripts`), so instances never coordinate except through Redis:
//!
//! | key (`P` = prefix) | what |
//! |---|---|
//! | `P:durable:consumers` | hash: name → definition (JSON) |
//! | `P:durable:paused` | hash: paused consumer → since (ms) |
//! | `P:durable:version` | bumped by every create/replace/delete |
//! | `P/durable/changes` | pub/sub notice of a bump (outside `P:*`, so no event subscriber sees it) |
//! | `P:durable:idem:{key}` | idempotency key → first event id, expires with the window |
//! | `P:durable:log_format` | `2`: terminal-log lines may be packed several to an entry (see `scripts`) |
//! | `P:durable:{name}:s` | stream of live events, consumer group `eventbus` |
//! | `P:durable:{name}:d` / `:r` | retries: due time (zset) / record (hash), also parked events |
//! | `P:durable:{name}:y` | ids of the events in `:r` (zset, all scored 0: paged by id) |
//! | `P:durable:{name}:v` / `:w` | dead letters kept for redrive: record (hash) / when (zset) |
//! | `P:durable:{name}:x` | an exclusive consumer's lease: the instance whose clients receive |
//! | `P:durable:{name}:k` / `:q:{key}` | ordering key → its one live event / events waiting on it |
//! | `P:durable:{name}:l` | terminal log (stream: one entry of lines per script, trimmed by line count and age) |
//! | `P:durable:{name}:n` | counters: acked, dead_lettered, redelivered, redriven, dropped; `logged`: lines in `:l` |
//! | `P:durable:{name}:c` | instance → clients attached through it and when that count expires |
//! | `P:durable:{name}:o` | outbox: dead letters recorded, publication not yet answered |
//! | `P:durable:{name}:lock` | the janitor's lock (expires) |
//!
//! On a Redis Cluster (`conn`: the cluster client routes every command by its first
//! key) each script must run in one slot: a consumer's keys carry its name as hash tag
//! (`P:durable:{<name>}:s`…, literal braces), plus `P:durable:{<name>}:f`, its own log
//! format (always `2`), and `:e`, the ids of events with an idempotency key it stored
//! within the window; the definitions, paused set and version share the tag
//! `{durable}` (`P:{durable}:consumers`…). Creating and deleting then take two scripts
//! (the definitions, then the consumer's keys: `INIT`, `PURGE`), and a capture one
//! script per consumer with the version read beside them (`capture`).
//!
//! - Capture: the publish script checks the consumer-set version this instance knows
//!   (a stale instance reloads and retries, so a consumer created on another instance
//!   a moment ago is never missed), the idempotency key, appends to every matching
//!   stream and PUBLISHes for ephemeral subscribers: all in one step. Publishes are
//!   group-committed: one script runs at a time and carries every publish that arrived
//!   while the previous one ran, in arrival order.
//! - Delivery: `runtime` starts one `actor` per consumer with local clients; it reads
//!   with a blocking XREADGROUP (nothing runs while idle) and spreads events to its
//!   clients.
//! - A failed attempt takes the event off the stream into the retry set; it is
//!   appended again when due, carrying its attempt count and failures. So the pending
//!   entries list holds exactly what is in flight, and XAUTOCLAIM with min-idle = the
//!   ack deadline finds precisely the events of clients (or instances) that vanished.
//! - Dead letters: the script that dead-letters an event also puts its letter in the
//!   outbox; the instance publishes it and then removes it, and a janitor publishes the
//!   ones left behind (at least once, never zero times).
//!
//! Files: `capture` (group-committed capture), `follow` (the consumer set, kept in step
//! with Redis), `runtime` (one consumer on this instance, its client handles), `actor`
//! (delivery, acks and failures; its `janitor` and dead-letter `outbox`), `reply`
//! (reading Redis replies), `scripts` (the Lua scripts).

mod actor;
mod capture;
mod conn;
mod follow;
mod reply;
mod runtime;
mod scripts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use eventbus_core::TaskHandle;
use eventbus_core::durable::{
    Attachment, BoxFuture, CaptureRequest, Captured, ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink,
    DurableBackend, DurableError, DurableOptions, LogEntry, LogSlice, LogStatus, MAX_REDRIVE, PendingEntry,
    PendingSlice, PendingState, Redriven, Retention,
};
use eventbus_core::trie::Trie;
use parking_lot::{Mutex, RwLock};
use redis::{Client, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::envelope::{self, Envelope};
use crate::glob::redis_channel;
use capture::{PendingCapture, run_captures};
use conn::{Backend, Conn};
use follow::follow_changes;
use runtime::Runtime;
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
    /// How captured events are published to subscribers (`eventbus.redis.envelope`);
    /// consumers' streams always keep the binary envelope.
    pub envelope: Envelope,
    /// Replicas that must have a capture before its publish is answered OK
    /// (`eventbus.redis.min_replicas_acked`; 0 = the master's word is enough).
    pub min_replicas_acked: u32,
    /// How long a capture waits for them (`eventbus.redis.replica_ack_timeout_ms`).
    pub replica_ack_timeout: Duration,
    /// Channels that keep a history: their captured events are kept in it by the
    /// capture script that publishes them (single Redis).
    pub history: eventbus_core::history::HistoryRules,
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
    /// hash: paused consumer → since (ms).
    paused: String,
    version: String,
    notify: String,
    idem: String,
    /// The terminal log's format across the fleet: `2` once lines may be packed.
    log_format: String,
    /// What precedes an event channel in its Redis Pub/Sub channel (`{prefix}:`).
    pubsub: String,
    /// What precedes an event channel in the keys of its history stream and hash.
    history_stream: String,
    history_meta: String,
    history_index: String,
}

pub(crate) struct Shared {
    /// First, so they are retired before the queues they read close.
    tasks: OnceLock<[TaskHandle; 2]>,
    backend: Backend,
    conn: Conn,
    /// Captures only, when they wait for replicas: `WAIT` holds its connection, so it
    /// must not hold the one acks and reads share.
    capture_conn: Conn,
    min_replicas_acked: u32,
    replica_ack_timeout: Duration,
    prefix: String,
    instance: String,
    retention: Retention,
    envelope: Envelope,
    history: eventbus_core::history::HistoryRules,
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
    /// Bumped by every reload of the definitions.
    definitions: tokio::sync::watch::Sender<u64>,
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
        Self::start_on(Backend::Single(Box::new(client)), settings, options, shutdown)
    }

    /// [`RedisDurable::start`] on a Redis Cluster (`redis.cluster_nodes`): each
    /// consumer's keys carry its name as hash tag (`{prefix}:durable:{<name>}:…`), so
    /// every script about one consumer runs in that consumer's slot, and consumers
    /// spread over the masters; the definitions are in one slot of their own
    /// (`{prefix}:{durable}:…`).
    pub fn start_cluster(
        redis: &crate::RedisOptions,
        settings: RedisDurableSettings,
        options: DurableOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, DurableError> {
        let (client, seeds) = crate::cluster::durable_clients(redis).map_err(unavailable)?;
        Self::start_on(Backend::Cluster { client: Box::new(client), seeds }, settings, options, shutdown)
    }

    fn start_on(
        backend: Backend,
        settings: RedisDurableSettings,
        options: DurableOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, DurableError> {
        let conn = backend.shared_conn().map_err(unavailable)?;
        let capture_conn = backend.shared_conn().map_err(unavailable)?;
        let keys = GlobalKeys::new(&settings.prefix, backend.is_cluster());
        let (captures, capture_queue) = mpsc::channel(CAPTURE_QUEUE);
        let shared = Arc::new(Shared {
            tasks: OnceLock::new(),
            backend,
            conn,
            capture_conn,
            min_replicas_acked: settings.min_replicas_acked,
            replica_ack_timeout: settings.replica_ack_timeout,
            prefix: settings.prefix,
            instance: settings.instance_id,
            retention: settings.retention,
            envelope: settings.envelope,
            history: settings.history,
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
            definitions: tokio::sync::watch::Sender::new(0),
        });
        let supervisor = &shared.options.supervisor;
        let follower = supervisor.spawn("durable consumer follower (redis)", follow_changes(Arc::downgrade(&shared)));
        let writer =
            supervisor.spawn("durable capture writer (redis)", run_captures(Arc::downgrade(&shared), capture_queue));
        let _ = shared.tasks.set([follower, writer]);
        Ok(Self { shared })
    }
}

/// The engine is being dropped, and its drop aborts the calling task: wait for that
/// rather than end first (an end before it is reported as a failure).
async fn owner_gone() {
    std::future::pending().await
}

impl GlobalKeys {
    /// On a cluster, the keys every instance shares are in one slot (hash tag
    /// `{durable}`), so that the scripts changing them run there.
    fn new(p: &str, cluster: bool) -> Self {
        let shared = if cluster { format!("{p}:{{durable}}") } else { format!("{p}:durable") };
        Self {
            consumers: format!("{shared}:consumers"),
            paused: format!("{shared}:paused"),
            version: format!("{shared}:version"),
            notify: format!("{p}/durable/changes"),
            idem: format!("{p}:durable:idem:"),
            log_format: format!("{shared}:log_format"),
            pubsub: redis_channel(p, ""),
            history_stream: crate::history::stream_prefix(p),
            history_meta: crate::history::meta_prefix(p),
            history_index: crate::history::index_key(p),
        }
    }
}

impl Shared {
    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    fn is_cluster(&self) -> bool {
        self.backend.is_cluster()
    }

    /// What every key of consumer `name` starts with: on a cluster its name is the
    /// hash tag, so all of them are in one slot.
    fn base(&self, name: &str) -> String {
        match self.is_cluster() {
            true => format!("{}:durable:{{{name}}}", self.prefix),
            false => format!("{}:durable:{name}", self.prefix),
        }
    }

    /// A consumer at `base`, as this instance knows it.
    fn new_runtime(&self, name: Arc<str>, base: String, config: ConsumerConfig) -> Runtime {
        // The terminal log's format: the fleet's on one Redis, the consumer's own on a
        // cluster (a key in its slot, which also routes the scripts that log).
        let log_key = match self.is_cluster() {
            true => format!("{base}:f"),
            false => self.keys.log_format.clone(),
        };
        Runtime::new(name, base, log_key, config)
    }

    fn runtime(&self, name: &str) -> Option<Arc<Runtime>> {
        self.registry.read().by_name.get(name).cloned()
    }

    /// The consumer, reloading once when this instance does not know it yet.
    async fn find(self: &Arc<Self>, name: &str) -> Result<Option<Arc<Runtime>>, DurableError> {
        if let Some(rt) = self.runtime(name) {
            return Ok(Some(rt));
        }
        self.reload().await?;
        Ok(self.runtime(name))
    }

    /// [`Self::find`], a consumer unknown even after the reload being an error.
    async fn find_known(self: &Arc<Self>, name: &str) -> Result<Arc<Runtime>, DurableError> {
        self.find(name).await?.ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))
    }

    /// A consumer's state. A consumer whose stream is gone (deleted a moment ago, or
    /// lost with a Redis that kept nothing) is reported unknown after a reload.
    async fn info(self: &Arc<Self>, rt: &Runtime) -> Result<ConsumerInfo, DurableError> {
        match self.try_info(rt).await {
            Err(err) if reply::is_missing_stream(&err) => {
                self.reload().await?;
                Err(DurableError::UnknownConsumer(rt.name.to_string()))
            }
            other => other.map_err(unavailable),
        }
    }

    async fn try_info(&self, rt: &Runtime) -> Result<ConsumerInfo, redis::RedisError> {
        let stream = format!("{}:s", rt.base);
        type Counters = (Option<u64>, Option<u64>, Option<u64>, Option<u64>, Option<u64>);
        type Presence = HashMap<String, String>;
        type Row = (u64, Value, u64, Counters, Presence, u64);
        // The consumer's keys in one pipeline (one slot on a cluster); whether it is
        // paused beside it (the definitions' slot).
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN")
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
            .arg("redriven")
            .arg("dropped")
            .cmd("HGETALL")
            .arg(format!("{}:c", rt.base))
            .cmd("ZCARD")
            .arg(format!("{}:w", rt.base));
        let mut paused = redis::cmd("HEXISTS");
        paused.arg(&self.keys.paused).arg(&*rt.name);
        let (mut conn, mut paused_conn) = (self.conn(), self.conn());
        let keys = pipe.query_async::<Row>(&mut conn);
        let paused = paused.query_async::<bool>(&mut paused_conn);
        let ((len, pel, waiting, counters, presence, redrivable), paused) = tokio::try_join!(keys, paused)?;
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
            redriven: counters.3.unwrap_or(0),
            dropped: counters.4.unwrap_or(0),
            paused,
            redrivable,
        })
    }

    /// Writes a definition; `replace` overwrites a different one.
    async fn define(self: &Arc<Self>, config: &ConsumerConfig, replace: bool) -> Result<Option<String>, DurableError> {
        let json =
            serde_json::to_string(config).map_err(|e| DurableError::internal("encoding a consumer definition", e))?;
        let base = self.base(&config.name);
        let reply: Vec<String> = self
            .scripts
            .define
            .key(&self.keys.consumers)
            .key(&self.keys.version)
            .key(&self.keys.log_format)
            .arg(&config.name)
            .arg(&json)
            .arg(&base)
            .arg(GROUP)
            .arg(&self.keys.notify)
            .arg(u8::from(replace))
            .arg(u8::from(!self.is_cluster()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let exists = match reply.as_slice() {
            [kind, json] if kind == "exists" => Some(json.clone()),
            [_, _, new] if self.is_cluster() => {
                // The consumer's own keys are in its slot: made now (a new consumer
                // first loses whatever an earlier one of its name may have left
                // behind), before the creation is answered.
                if new == "1" {
                    self.purge(&base).await?;
                }
                let stream = format!("{base}:s");
                let _: i64 = self
                    .scripts
                    .init
                    .key(&stream)
                    .key(format!("{base}:f"))
                    .arg(GROUP)
                    .invoke_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
                None
            }
            _ => None,
        };
        self.reload().await?;
        Ok(exists)
    }

    /// Deletes every key of the consumer at `base` (on a cluster, where they are in a
    /// slot of their own).
    async fn purge(&self, base: &str) -> Result<(), DurableError> {
        let _: i64 = self
            .scripts
            .purge
            .key(format!("{base}:s"))
            .arg(base)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn log(
        &self,
        rt: &Runtime,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &str,
    ) -> Result<LogSlice, DurableError> {
        let Some((after, line)) = log_token(page_token) else {
            return Err(DurableError::bad_page_token(page_token));
        };
        let limit = limit.clamp(1, 1000);
        let key = format!("{}:l", rt.base);
        // With `line` n: resume inside entry `after`, from its line n.
        let mut start = match (after, line) {
            ("", _) => "-".to_owned(),
            (id, None) => format!("({id}"),
            (id, Some(_)) => id.to_owned(),
        };
        let mut skip = line.unwrap_or(0);
        let mut page = LogSlice::default();
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
            let rows = reply::entries_of(rows).map_err(corrupt)?;
            let Some(last) = rows.last() else { return Ok(page) };
            start = format!("({}", last.id);
            for row in &rows {
                if skip > 0 && row.id != after {
                    skip = 0; // that entry went (trimmed) meanwhile: what follows is all unread
                }
                for (i, line) in log_lines(row).map_err(corrupt)?.enumerate().skip(skip) {
                    if page.entries.len() == limit {
                        page.next_page_token = format!("{}.{i}", row.id);
                        return Ok(page);
                    }
                    let entry: LogEntry =
                        serde_json::from_slice(line).map_err(|e| corrupt(format!("log line: {e}")))?;
                    if status.is_none_or(|s| s == entry.status) {
                        page.entries.push(entry);
                    }
                }
                skip = 0;
            }
        }
    }
}

impl Shared {
    /// One page of the consumer's pending events (the `PENDING` script's order).
    async fn pending(&self, rt: &Runtime, limit: usize, page_token: &str) -> Result<PendingSlice, DurableError> {
        let well_formed = page_token.is_empty()
            || page_token.strip_prefix("s:").is_some_and(is_stream_id)
            || page_token.strip_prefix("r:").is_some_and(|id| !id.is_empty());
        if !well_formed {
            return Err(DurableError::bad_page_token(page_token));
        }
        let config = rt.config();
        let reply: Vec<Value> = self
            .scripts
            .pending
            .key(&rt.stream)
            .arg(&rt.base)
            .arg(GROUP)
            .arg(now_ms())
            .arg(config.ack_deadline_ms)
            .arg(limit.clamp(1, 1000))
            .arg(page_token)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut reply = reply.into_iter();
        let next_page_token = match reply.next() {
            Some(Value::BulkString(token)) => String::from_utf8(token).map_err(corrupt)?,
            _ => String::new(),
        };
        let entries = reply.map(|row| pending_entry(row).map_err(corrupt)).collect::<Result<_, _>>()?;
        Ok(PendingSlice { entries, next_page_token })
    }
}

/// A row of the `PENDING` script: `{envelope, attempt, next delivery ms or '', failures
/// JSON, state}`.
fn pending_entry(row: Value) -> Result<PendingEntry, String> {
    let Value::Array(parts) = row else { return Err("a pending row that is not a list".into()) };
    let mut parts = parts.into_iter();
    let (Some(Value::BulkString(env)), Some(attempt), Some(next), Some(failures), Some(Value::Int(state))) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a pending row without its five fields".into());
    };
    let text = |v: Value| match v {
        Value::BulkString(b) => String::from_utf8(b).map_err(|e| e.to_string()),
        Value::Int(n) => Ok(n.to_string()),
        _ => Err("a pending field that is not text".to_owned()),
    };
    let event = envelope::decode_own(bytes::Bytes::from(env)).ok_or("a pending row without an event")?;
    let next = text(next)?;
    let state = match state {
        1 => PendingState::Ready,
        2 => PendingState::Delayed,
        3 => PendingState::InFlight,
        4 => PendingState::BlockedByOrderingKey,
        other => return Err(format!("unknown pending state {other}")),
    };
    Ok(PendingEntry {
        event: Arc::new(event),
        attempt: text(attempt)?.parse().map_err(|e| format!("pending attempt: {e}"))?,
        // Redis scores read back as floats ("1732...0" or "1.7e12" style): parse as f64.
        next_delivery_ms: if next.is_empty() {
            None
        } else {
            Some(next.parse::<f64>().map_err(|e| format!("pending due time: {e}"))? as u64)
        },
        failures: serde_json::from_str(&text(failures)?).map_err(|e| format!("pending failures: {e}"))?,
        state,
    })
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

/// A ListEventLog page token: `""` (from the start: `("", None)`), a log entry id (past
/// that entry, `(id, None)`: every token before lines were packed) or `"{entry id}.{n}"`
/// (that entry from its line `n` on, `(id, Some(n))`). None when malformed.
fn log_token(token: &str) -> Option<(&str, Option<usize>)> {
    if token.is_empty() {
        return Some(("", None));
    }
    match token.split_once('.') {
        None => is_stream_id(token).then_some((token, None)),
        Some((id, n)) => {
            let n = n.bytes().all(|b| b.is_ascii_digit()).then(|| n.parse().ok()).flatten()?;
            is_stream_id(id).then_some((id, Some(n)))
        }
    }
}

/// The lines of a terminal-log entry: `j` one line (the only format before lines were
/// packed), or `m` several joined by '\n' (one entry per script that finished events).
fn log_lines(row: &reply::Entry) -> Result<impl Iterator<Item = &[u8]>, String> {
    // `split` of a lone line (`j`, never holding a '\n'): the line itself.
    let lines = row.get("m").or_else(|| row.get("j")).ok_or_else(|| format!("log entry {} holds no line", row.id))?;
    Ok(lines.split(|&b| b == b'\n'))
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
                match serde_json::from_str::<ConsumerConfig>(&existing) {
                    Ok(existing) if existing == config => {}
                    Ok(existing) => return Err(DurableError::already_exists(&existing, config)),
                    Err(_) => {
                        let differences = "the existing definition is unreadable".to_owned();
                        return Err(DurableError::AlreadyExists { name: config.name, differences });
                    }
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
            let rt = self.shared.find_known(name).await?;
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

    fn definitions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.definitions.subscribe()
    }

    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>> {
        Box::pin(async move {
            let base = self.shared.base(name);
            let deleted: i64 = self
                .shared
                .scripts
                .delete
                .key(&self.shared.keys.consumers)
                .key(&self.shared.keys.version)
                .key(&self.shared.keys.paused)
                .arg(name)
                .arg(&base)
                .arg(&self.shared.keys.notify)
                .arg(u8::from(!self.shared.is_cluster()))
                .invoke_async(&mut self.shared.conn())
                .await
                .map_err(unavailable)?;
            if deleted != 0 && self.shared.is_cluster() {
                // Gone from the definitions (every instance stops using it); its keys next.
                self.shared.purge(&base).await?;
            }
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
            let rt = self.shared.find_known(name).await?;
            self.shared.log(&rt, status, limit, page_token).await
        })
    }

    fn list_pending<'a>(
        &'a self,
        name: &'a str,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<PendingSlice, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            self.shared.pending(&rt, limit, page_token).await
        })
    }

    fn redrive<'a>(
        &'a self,
        name: &'a str,
        event_ids: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Redriven, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            let limit = if limit == 0 { MAX_REDRIVE } else { limit.min(MAX_REDRIVE) };
            let mut call = self.shared.scripts.redrive.prepare_invoke();
            call.key(&rt.log_key).arg(&rt.base).arg(now_ms()).arg(self.shared.retention.max_entries.max(1)).arg(limit);
            for id in event_ids.iter().take(MAX_REDRIVE) {
                call.arg(id);
            }
            let (redriven, remaining): (i64, u64) =
                call.invoke_async(&mut self.shared.conn()).await.map_err(unavailable)?;
            let Ok(redriven) = u64::try_from(redriven) else {
                self.shared.reload().await?;
                return Err(DurableError::UnknownConsumer(name.to_owned()));
            };
            tracing::info!(consumer = %rt.name, redriven, remaining, "dead letters redriven");
            Ok(Redriven { redriven, remaining })
        })
    }

    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            let found: i64 = self
                .shared
                .scripts
                .pause
                .key(&self.shared.keys.consumers)
                .key(&self.shared.keys.paused)
                .key(&self.shared.keys.version)
                .arg(name)
                .arg(u8::from(paused))
                .arg(now_ms())
                .arg(&self.shared.keys.notify)
                .invoke_async(&mut self.shared.conn())
                .await
                .map_err(unavailable)?;
            // Every instance reloads on the notice; this one before it answers.
            self.shared.reload().await?;
            let rt = match (found, self.shared.runtime(name)) {
                (1, Some(rt)) => rt,
                _ => return Err(DurableError::UnknownConsumer(name.to_owned())),
            };
            rt.settled().await;
            tracing::info!(consumer = %rt.name, paused, "durable consumer {}", if paused { "paused" } else { "resumed" });
            self.shared.info(&rt).await
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
            rt.stop(runtime::StopReason::Shutdown);
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

    #[test]
    fn log_tokens_are_entry_ids_with_an_optional_line() {
        assert_eq!(log_token(""), Some(("", None)));
        assert_eq!(log_token("17-3"), Some(("17-3", None)), "a token from before lines were packed");
        assert_eq!(log_token("17-3.0"), Some(("17-3", Some(0))));
        assert_eq!(log_token("17-3.12"), Some(("17-3", Some(12))));
        for bad in ["x", "17", "17-", "17-3.", "17-3.x", "17-3.-1", ".3", "17-3.1.2", "17-3.99999999999999999999999"] {
            assert_eq!(log_token(bad), None, "{bad}");
        }
    }
}
