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
//!   with a blocking XREADGROUP (one every 10 s while idle) and spreads events to its
//!   clients.
//! - A failed attempt takes the event off the stream into the retry set; it is
//!   appended again when due, carrying its attempt count and failures. So the pending
//!   entries list holds exactly what is in flight, and XAUTOCLAIM with min-idle = the
//!   ack deadline finds precisely the events of clients (or instances) that vanished.
//! - Dead letters: the script that dead-letters an event also puts its letter in the
//!   outbox; the instance publishes it and then removes it, and a janitor publishes the
//!   ones left behind (at least once, never zero times).
//!
//! Files: `consumers` (the engine's operations: definitions, operator actions,
//! attaching), `inspect` (a consumer's counts, log and pending events), `capture`
//! (group-committed capture), `follow` (the consumer set, kept in step with Redis),
//! `runtime` (one consumer on this instance, its client handles), `actor` (delivery,
//! acks and failures; its `janitor` and dead-letter `outbox`), `conn` (where commands
//! go), `reply` (reading Redis replies), `scripts` (the Lua scripts, files in `lua/`).

mod actor;
mod capture;
mod conn;
mod consumers;
mod follow;
mod inspect;
mod reply;
mod runtime;
mod scripts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use eventbus_core::durable::{
    Attachment, BoxFuture, CaptureRequest, Captured, ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink,
    DurableBackend, DurableError, DurableOptions, LogEntry, LogSlice, LogStatus, MAX_REDRIVE, PendingEntry,
    PendingSlice, PendingState, Redriven, Retention,
};
use eventbus_core::trie::Trie;
use eventbus_core::{TaskHandle, Transport};
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
    /// On a cluster, the last capture could not read the definitions' version.
    definitions_unread: AtomicBool,
    /// On a cluster, where captured events go to subscribers (the transport), sent in
    /// the same round trip as their capture; unset, they are left to the bus.
    publisher: OnceLock<Arc<dyn Transport>>,
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

    /// On a Redis Cluster, sends the events a capture stores to subscribers through
    /// `transport` (the bus's), at the same time as it stores them: a publish costs one
    /// round trip instead of the capture's and then the `SPUBLISH`'s, and is answered
    /// as fanned out ([`Captured::Forwarded`]). An event whose idempotency key was
    /// claimed before is a duplicate and goes to no subscriber; the claims are made
    /// first. Set once; on one Redis the capture script publishes by itself.
    pub fn publish_through(&self, transport: Arc<dyn Transport>) {
        let _ = self.shared.publisher.set(transport);
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
            definitions_unread: AtomicBool::new(false),
            publisher: OnceLock::new(),
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
}
