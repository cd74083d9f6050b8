//! One consumer as seen from one instance: its local clients and the actor serving
//! them.
//!
//! The actor owns everything local (clients, what each holds, timers), so it needs no
//! lock: clients talk to it through a bounded channel. It reads the consumer's stream
//! with a blocking XREADGROUP (as this instance, for as many events as its clients have
//! room for), hands events out round-robin in batches, and turns acks, nacks, terms,
//! expired deadlines and disconnects into batched scripts. While clients are attached it
//! also runs the janitor: due retries back onto the stream, XAUTOCLAIM of events held
//! past the ack deadline by instances that went away.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventbus_core::durable::{
    BoxFuture, ClientOptions, ConsumerClient, ConsumerConfig, Delivery, DurableError, Failure, LogEntry, LogStatus,
    PublishedDeadLetter, REASON_DEADLINE, REASON_DISCONNECT, REASON_TERM, next_with_room,
};
use eventbus_core::{ErrorKind, Event, TaskHandle};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parking_lot::{Mutex, RwLock};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{AsyncCommands, AsyncConnectionConfig, RedisResult, Script, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::scripts::Scripts;
use super::{CONNECT_TIMEOUT, GROUP, Shared, now_ms};
use crate::envelope;

/// Commands queued per consumer actor before clients wait.
const COMMAND_QUEUE: usize = 1024;
/// Most events one read asks for.
const READ_BATCH: usize = 1024;
/// Scripts in flight per actor before it stops taking commands.
const MAX_OPS: usize = 64;
/// Entries one janitor run handles.
const JANITOR_BATCH: usize = 256;
/// How long a dead letter may wait in the outbox for its publication before a janitor
/// hands it out again (its publisher died, or Redis failed under the publish).
const OUTBOX_GRACE: Duration = Duration::from_secs(10);
/// Orphaned entries listed per XPENDING page.
const ORPHAN_PAGE: usize = 1000;
/// How often an instance with clients attached renews its count of them in Redis.
const PRESENCE_EVERY: Duration = Duration::from_secs(5);
/// How long a count stands without renewal: an instance that died stops counting
/// after this.
const PRESENCE_TTL: Duration = Duration::from_secs(15);

/// Why an actor stops.
#[derive(Debug, Clone)]
pub(crate) enum StopReason {
    /// The consumer was deleted: client streams end normally.
    Deleted,
    /// The broker is stopping: held events count a failed attempt and are released.
    Shutdown,
    /// Redis failed under us: client streams end with UNAVAILABLE.
    Lost(String),
}

pub(crate) enum Command {
    Attach(Client),
    Detach(u64),
    Ack(u64, Vec<String>),
    Nack(u64, String, String, Option<Duration>),
    Extend(u64, Vec<String>, Duration),
    Term(u64, String, String),
    Stop(StopReason),
}

/// A consumer known to this instance.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) name: Arc<str>,
    /// `{prefix}:durable:{name}`.
    pub(crate) base: String,
    config: RwLock<Arc<ConsumerConfig>>,
    actor: Mutex<Option<ActorSlot>>,
    clients: std::sync::atomic::AtomicU32,
}

impl Runtime {
    pub(crate) fn new(name: Arc<str>, base: String, config: ConsumerConfig) -> Self {
        Self {
            name,
            base,
            config: RwLock::new(Arc::new(config)),
            actor: Mutex::new(None),
            clients: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub(crate) fn config(&self) -> Arc<ConsumerConfig> {
        Arc::clone(&self.config.read())
    }

    pub(crate) fn set_config(&self, config: ConsumerConfig) {
        let mut current = self.config.write();
        if **current != config {
            *current = Arc::new(config);
        }
    }

    pub(crate) fn local_clients(&self) -> u32 {
        self.clients.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The running actor, started on first use.
    fn actor(self: &Arc<Self>, shared: &Arc<Shared>) -> mpsc::Sender<Command> {
        let mut slot = self.actor.lock();
        if let Some(running) = slot.as_ref().filter(|a| !a.tx.is_closed()) {
            return running.tx.clone();
        }
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let actor = Actor::new(Arc::clone(self), Arc::clone(shared), rx);
        let task = shared.options.supervisor.spawn("durable consumer actor (redis)", actor.run()).without_abort();
        *slot = Some(ActorSlot { task, tx: tx.clone() });
        tx
    }

    pub(crate) async fn attach(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        id: u64,
        options: ClientOptions,
    ) -> Result<(mpsc::Receiver<Vec<Delivery>>, RedisClient), DurableError> {
        let (max_in_flight, max_batch) = options.resolve(self.config().max_in_flight);
        // One message per batch; a batch holds at least one in-flight event.
        let (tx, rx) = mpsc::channel(max_in_flight.max(1) as usize);
        let closed = Arc::new(Mutex::new(None));
        let client = Client { id, max_in_flight, max_batch, in_flight: 0, tx, closed: Arc::clone(&closed) };
        let actor = self.actor(shared);
        actor.send(Command::Attach(client)).await.map_err(|_| DurableError::unavailable("the consumer was stopped"))?;
        Ok((rx, RedisClient { actor, id, closed }))
    }

    /// Stops the actor, if one runs; the next attach starts a new one.
    pub(crate) fn stop(&self, reason: StopReason) {
        let Some(ActorSlot { task: _retired, tx }) = self.actor.lock().take() else { return };
        if let Err(mpsc::error::TrySendError::Full(cmd)) = tx.try_send(Command::Stop(reason)) {
            tokio::spawn(async move {
                let _ = tx.send(cmd).await;
            });
        }
    }
}

/// A running actor: its queue, and its task, retired (not aborted: it drains what is
/// queued) when the slot is emptied or dropped.
#[derive(Debug)]
struct ActorSlot {
    task: TaskHandle,
    tx: mpsc::Sender<Command>,
}

/// An attached client's handle.
#[derive(Debug)]
pub(crate) struct RedisClient {
    actor: mpsc::Sender<Command>,
    id: u64,
    closed: Arc<Mutex<Option<String>>>,
}

impl RedisClient {
    fn send(&self, cmd: Command) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // A stopped actor has already ended this client's stream.
            let _ = self.actor.send(cmd).await;
        })
    }
}

impl ConsumerClient for RedisClient {
    fn ack(&self, event_ids: Vec<String>) -> BoxFuture<'_, ()> {
        self.send(Command::Ack(self.id, event_ids))
    }

    fn nack(&self, event_id: String, reason: String, delay: Option<Duration>) -> BoxFuture<'_, ()> {
        self.send(Command::Nack(self.id, event_id, reason, delay))
    }

    fn extend(&self, event_ids: Vec<String>, by: Duration) -> BoxFuture<'_, ()> {
        self.send(Command::Extend(self.id, event_ids, by))
    }

    fn term(&self, event_id: String, reason: String) -> BoxFuture<'_, ()> {
        self.send(Command::Term(self.id, event_id, reason))
    }

    fn closed_reason(&self) -> Option<DurableError> {
        self.closed.lock().clone().map(DurableError::unavailable)
    }
}

impl Drop for RedisClient {
    fn drop(&mut self) {
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.actor.try_send(Command::Detach(self.id)) {
            let actor = self.actor.clone();
            tokio::spawn(async move {
                let _ = actor.send(cmd).await;
            });
        }
    }
}

pub(crate) struct Client {
    id: u64,
    max_in_flight: u32,
    max_batch: u32,
    in_flight: u32,
    tx: mpsc::Sender<Vec<Delivery>>,
    closed: Arc<Mutex<Option<String>>>,
}

impl Client {
    /// Events this client can take now (0 when it has left).
    fn room(&self) -> usize {
        if self.tx.is_closed() {
            return 0;
        }
        self.max_in_flight.saturating_sub(self.in_flight).min(self.max_batch) as usize
    }
}

/// An event a local client holds.
struct Held {
    client: u64,
    deadline: Instant,
    first_ms: u64,
    since: Instant,
    /// The entry as read (stream id, and what the ack's log line needs, so the ack
    /// script does not read it back).
    entry: Ready,
}

/// Read from the stream, not yet handed to a client.
struct Ready {
    sid: String,
    event: Arc<Event>,
    attempt: u32,
    first_ms: Option<u64>,
    ordering_key: Option<String>,
    /// Earlier failed attempts (empty on a first delivery).
    failures: Vec<Failure>,
}

#[derive(Debug, Clone)]
enum Timer {
    Deadline(Arc<str>),
    /// Keeps an extended event's idle time under the ack deadline, so no janitor
    /// reclaims it.
    Touch(Arc<str>),
    /// Janitor run (retries due, reclaim of abandoned events).
    Janitor,
    /// Renews this instance's count of attached clients in Redis.
    Presence,
}

/// One failed attempt to report.
struct FailItem {
    sid: String,
    reason: String,
    delay_ms: i64,
    term: bool,
    first_ms: u64,
}

/// One ack to apply.
struct AckItem {
    /// Empty for a late ack (the event is not held here).
    sid: String,
    event_id: String,
    ordering_key: String,
    /// The terminal-log line (JSON `LogEntry`), empty for a late ack.
    log_line: String,
}

impl AckItem {
    fn held(event_id: Arc<str>, held: Held) -> Self {
        let Ready { sid, event, attempt, ordering_key, failures, .. } = held.entry;
        let line = LogEntry {
            event_id: event_id.to_string(),
            channel: event.channel.clone(),
            status: LogStatus::Completed,
            attempts: attempt,
            first_delivered_ms: Some(held.first_ms),
            finished_ms: now_ms(),
            failures,
        };
        // A struct of strings and numbers always serialises.
        let log_line = serde_json::to_string(&line).unwrap_or_default();
        Self { sid, event_id: event_id.to_string(), ordering_key: ordering_key.unwrap_or_default(), log_line }
    }

    fn late(event_id: String) -> Self {
        Self { sid: String::new(), event_id, ordering_key: String::new(), log_line: String::new() }
    }
}

impl FailItem {
    /// `delay_ms` -1 = the backoff; `term` dead-letters at once.
    fn of(held: Held, reason: String, delay_ms: i64, term: bool) -> Self {
        Self { sid: held.entry.sid, reason, delay_ms, term, first_ms: held.first_ms }
    }
}

/// What a script run tells the actor.
#[derive(Default)]
struct Outcome {
    /// Earliest retry due (ms since the epoch).
    next_due: Option<u64>,
    /// More work waits (run the janitor again now).
    more: bool,
    dead: Vec<DeadLetter>,
    error: Option<String>,
}

/// A dead letter to publish, as a script hands it back; it stays in the consumer's
/// outbox until its publication is answered.
struct DeadLetter {
    envelope: Bytes,
    attempts: u32,
    /// JSON `[{"at_ms":…,"reason":…}]`.
    failures: String,
    event_id: String,
}

type ReadFuture = BoxFuture<'static, (Option<MultiplexedConnection>, RedisResult<Value>)>;

struct Actor {
    rt: Arc<Runtime>,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Command>,
    config: Arc<ConsumerConfig>,
    stream: String,
    clients: Vec<Client>,
    next_client: usize,
    held: HashMap<Arc<str>, Held>,
    buffer: VecDeque<Ready>,
    timers: BTreeMap<(Instant, u64), Timer>,
    timer_seq: u64,
    janitor_at: BTreeSet<Instant>,
    read: Option<ReadFuture>,
    idle_conn: Option<MultiplexedConnection>,
    ops: FuturesUnordered<BoxFuture<'static, Outcome>>,
    acks: Vec<AckItem>,
    fails: Vec<FailItem>,
    touches: Vec<String>,
    requeue: Vec<String>,
    /// The client count changed or is due for renewal in Redis.
    presence_due: bool,
    /// A `Timer::Presence` is set.
    presence_timer: bool,
}

impl Actor {
    fn new(rt: Arc<Runtime>, shared: Arc<Shared>, rx: mpsc::Receiver<Command>) -> Self {
        let config = rt.config();
        let stream = format!("{}:s", rt.base);
        Self {
            rt,
            shared,
            rx,
            config,
            stream,
            clients: Vec::new(),
            next_client: 0,
            held: HashMap::new(),
            buffer: VecDeque::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            janitor_at: BTreeSet::new(),
            read: None,
            idle_conn: None,
            ops: FuturesUnordered::new(),
            acks: Vec::new(),
            fails: Vec::new(),
            touches: Vec::new(),
            requeue: Vec::new(),
            presence_due: false,
            presence_timer: false,
        }
    }

    async fn run(mut self) {
        self.release_orphans().await;
        let stop = loop {
            self.config = self.rt.config();
            self.dispatch();
            self.flush();
            if self.read.is_none() {
                self.start_read();
            }
            let next_timer = self.timers.first_key_value().map(|(k, _)| k.0);
            tokio::select! {
                cmd = self.rx.recv(), if self.ops.len() < MAX_OPS => match cmd {
                    None => break StopReason::Deleted,
                    Some(Command::Stop(reason)) => break reason,
                    Some(cmd) => {
                        if let Some(reason) = self.handle(cmd) {
                            break reason;
                        }
                        // Take everything already queued: one script for a burst of acks.
                        let mut stop = None;
                        while let Ok(cmd) = self.rx.try_recv() {
                            if let Some(reason) = self.handle(cmd) {
                                stop = Some(reason);
                                break;
                            }
                        }
                        if let Some(reason) = stop {
                            break reason;
                        }
                    }
                },
                (conn, result) = async { self.read.as_mut().expect("guarded").await }, if self.read.is_some() => {
                    self.read = None;
                    match result {
                        Ok(value) => {
                            self.idle_conn = conn;
                            if let Err(err) = self.take_read(value) {
                                break StopReason::Lost(format!("unreadable stream entry: {err}"));
                            }
                        }
                        // The stream went away under the read: the consumer was deleted
                        // (the change notice follows); client streams end normally.
                        Err(err) if is_missing_stream(&err) => break StopReason::Deleted,
                        Err(err) => break StopReason::Lost(format!("redis: reading consumer {:?} failed: {err}", &*self.rt.name)),
                    }
                },
                Some(outcome) = self.ops.next(), if !self.ops.is_empty() => {
                    if let Some(reason) = self.take_outcome(outcome) {
                        break reason;
                    }
                },
                () = sleep_until(next_timer), if next_timer.is_some() => self.fire_timers(),
                () = self.shared.shutdown.cancelled() => break StopReason::Shutdown,
            }
        };
        self.finish(stop).await;
    }

    /// Releases the entries an earlier actor of this instance left in flight: it lost
    /// Redis and its clients were told to reconnect, so nobody holds them any more.
    /// Each counts a failed attempt ("consumer disconnected", as for any client that
    /// leaves) and comes back after its backoff, instead of only once its ack
    /// deadline has passed. Runs before the first read: everything this instance has
    /// pending then is an orphan. When Redis does not answer, the janitors reclaim
    /// them after the deadline as before.
    async fn release_orphans(&mut self) {
        let mut start = "-".to_owned();
        loop {
            let page: RedisResult<Vec<(String, String, u64, u64)>> = redis::cmd("XPENDING")
                .arg(&self.stream)
                .arg(GROUP)
                .arg(&start)
                .arg("+")
                .arg(ORPHAN_PAGE)
                .arg(&self.shared.instance)
                .query_async(&mut self.shared.conn())
                .await;
            let page = match page {
                Ok(page) => page,
                Err(err) => {
                    if !is_missing_stream(&err) {
                        warn!(consumer = %self.rt.name, %err, "cannot list the events an earlier reader left in flight; they come back after their ack deadline");
                    }
                    return;
                }
            };
            let now = now_ms();
            for (sid, _, idle_ms, _) in &page {
                let first_ms = now.saturating_sub(*idle_ms);
                self.fails.push(FailItem {
                    sid: sid.clone(),
                    reason: REASON_DISCONNECT.to_owned(),
                    delay_ms: -1,
                    term: false,
                    first_ms,
                });
            }
            let Some((last, ..)) = page.last() else { break };
            if page.len() < ORPHAN_PAGE {
                break;
            }
            start = format!("({last}");
        }
        if self.fails.is_empty() {
            return;
        }
        debug!(consumer = %self.rt.name, events = self.fails.len(), "releasing events an earlier reader left in flight");
        self.flush();
        while let Some(outcome) = self.ops.next().await {
            if let Some(StopReason::Lost(err)) = self.take_outcome(outcome) {
                warn!(consumer = %self.rt.name, %err, "releasing the events an earlier reader left in flight failed; they come back after their ack deadline");
            }
        }
    }

    /// Applies one command; returns a reason to stop.
    fn handle(&mut self, cmd: Command) -> Option<StopReason> {
        match cmd {
            Command::Attach(client) => {
                self.clients.push(client);
                self.clients_changed();
                if !self.presence_timer {
                    self.presence_timer = true;
                    self.add_timer(Instant::now() + PRESENCE_EVERY, Timer::Presence);
                }
                if self.janitor_at.is_empty() {
                    self.schedule_janitor(Instant::now());
                }
            }
            Command::Detach(id) => self.detach(id),
            Command::Ack(id, event_ids) => {
                for event_id in event_ids {
                    match self.release(id, &event_id) {
                        Some((key, held)) => {
                            if let Some(on_ack) = &self.shared.options.on_ack {
                                on_ack(&self.rt.name, held.since.elapsed());
                            }
                            self.acks.push(AckItem::held(key, held));
                        }
                        // Not held here: perhaps waiting for its retry (a late ack).
                        None => self.acks.push(AckItem::late(event_id)),
                    }
                }
            }
            Command::Nack(id, event_id, reason, delay) => {
                if let Some((_, held)) = self.release(id, &event_id) {
                    let reason = if reason.is_empty() { "nacked".to_owned() } else { reason };
                    let delay_ms = delay.map_or(-1, |d| d.as_millis() as i64);
                    self.fails.push(FailItem::of(held, reason, delay_ms, false));
                }
            }
            Command::Term(id, event_id, reason) => {
                if let Some((_, held)) = self.release(id, &event_id) {
                    let reason = if reason.is_empty() { REASON_TERM.to_owned() } else { reason };
                    self.fails.push(FailItem::of(held, reason, -1, true));
                }
            }
            Command::Extend(id, event_ids, by) => {
                let deadline_in = self.config.ack_deadline();
                let by = if by.is_zero() { deadline_in } else { by };
                let now = Instant::now();
                for event_id in event_ids {
                    let Some((key, _)) = self.held.get_key_value(event_id.as_str()) else { continue };
                    let key = Arc::clone(key);
                    let Some(held) = self.held.get_mut(&key).filter(|h| h.client == id) else { continue };
                    held.deadline = now + by;
                    let deadline = held.deadline;
                    self.touches.push(held.entry.sid.clone());
                    self.add_timer(deadline, Timer::Deadline(Arc::clone(&key)));
                    if by > deadline_in / 2 {
                        self.add_timer(now + deadline_in / 2, Timer::Touch(key));
                    }
                }
            }
            Command::Stop(reason) => return Some(reason),
        }
        None
    }

    /// Takes an event off a client: it no longer counts against its room.
    fn release(&mut self, client: u64, event_id: &str) -> Option<(Arc<str>, Held)> {
        if self.held.get(event_id).is_none_or(|h| h.client != client) {
            return None;
        }
        let (key, held) = self.held.remove_entry(event_id)?;
        if let Some(c) = self.clients.iter_mut().find(|c| c.id == client) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        Some((key, held))
    }

    fn detach(&mut self, id: u64) {
        self.clients.retain(|c| c.id != id);
        self.clients_changed();
        let held: Vec<Arc<str>> =
            self.held.iter().filter(|(_, h)| h.client == id).map(|(k, _)| Arc::clone(k)).collect();
        for key in held {
            if let Some(h) = self.held.remove(&key) {
                self.fails.push(FailItem::of(h, REASON_DISCONNECT.to_owned(), -1, false));
            }
        }
        if self.clients.is_empty() {
            // Nobody to read for: stop blocking on the stream (closing the connection
            // cancels the XREADGROUP) and give back what was read but not handed out.
            self.read = None;
            self.idle_conn = None;
            self.requeue.extend(self.buffer.drain(..).map(|r| r.sid));
        }
    }

    /// Publishes the local client count: to this process now, to Redis at the next flush.
    fn clients_changed(&mut self) {
        self.rt.clients.store(self.clients.len() as u32, std::sync::atomic::Ordering::Relaxed);
        self.presence_due = true;
    }

    fn add_timer(&mut self, at: Instant, timer: Timer) {
        self.timer_seq += 1;
        self.timers.insert((at, self.timer_seq), timer);
    }

    fn schedule_janitor(&mut self, at: Instant) {
        let slack = Duration::from_millis(5);
        if self.janitor_at.range(at.checked_sub(slack).unwrap_or(at)..=at + slack).next().is_some() {
            return;
        }
        self.janitor_at.insert(at);
        self.add_timer(at, Timer::Janitor);
    }

    /// How often the janitor runs while clients are attached.
    fn janitor_every(&self) -> Duration {
        (self.config.ack_deadline() / 2).clamp(Duration::from_millis(100), Duration::from_secs(15))
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((at, _), timer) = entry.remove_entry();
            match timer {
                Timer::Deadline(key) => {
                    let expired = self.held.get(&key).filter(|h| h.deadline <= now).map(|h| h.client);
                    if let Some(client) = expired
                        && let Some((_, h)) = self.release(client, &key)
                    {
                        self.fails.push(FailItem::of(h, REASON_DEADLINE.to_owned(), -1, false));
                    }
                }
                Timer::Touch(key) => {
                    let half = self.config.ack_deadline() / 2;
                    if let Some(h) = self.held.get(&key)
                        && h.deadline > now
                    {
                        self.touches.push(h.entry.sid.clone());
                        if h.deadline > now + half {
                            self.add_timer(now + half, Timer::Touch(key));
                        }
                    }
                }
                Timer::Presence => {
                    self.presence_timer = !self.clients.is_empty();
                    if self.presence_timer {
                        self.presence_due = true;
                        self.add_timer(now + PRESENCE_EVERY, Timer::Presence);
                    }
                }
                Timer::Janitor => {
                    self.janitor_at.remove(&at);
                    self.run_janitor();
                    if !self.clients.is_empty() {
                        let every = self.janitor_every();
                        self.schedule_janitor(now + every);
                    }
                }
            }
        }
    }

    fn take_outcome(&mut self, outcome: Outcome) -> Option<StopReason> {
        if let Some(err) = outcome.error {
            return Some(StopReason::Lost(err));
        }
        if let Some(due) = outcome.next_due {
            let wait = Duration::from_millis(due.saturating_sub(now_ms()));
            self.schedule_janitor(Instant::now() + wait);
        }
        if outcome.more {
            self.schedule_janitor(Instant::now());
        }
        for dead in outcome.dead {
            self.publish_dead_letter(dead);
        }
        None
    }

    /// Publishes a dead letter, then takes it out of the outbox. Should the publish
    /// fail for now (Redis away, shutting down), it stays there and a janitor hands it
    /// out again after [`OUTBOX_GRACE`]; a dead letter that can never be published is
    /// dropped from the outbox with an error.
    fn publish_dead_letter(&self, dead: DeadLetter) {
        let outbox = format!("{}:o", self.rt.base);
        let Some(event) = envelope::decode_own(dead.envelope) else {
            error!(consumer = %self.rt.name, event = %dead.event_id, "dead letter with an unreadable event; dropped");
            tokio::spawn(leave_outbox(self.shared.conn(), outbox, dead.event_id));
            return;
        };
        let failures: Vec<Failure> = serde_json::from_str(&dead.failures).unwrap_or_else(|err| {
            warn!(consumer = %self.rt.name, %err, "unreadable failure list of a dead letter");
            Vec::new()
        });
        let dl = PublishedDeadLetter {
            channel: self.config.dead_letter_channel_for(&event.channel),
            event: Arc::new(event),
            consumer: self.rt.name.to_string(),
            attempts: dead.attempts,
            failures,
        };
        let (payload, content_type) = (self.shared.options.dead_letter_encoder)(&dl);
        let Some(sink) = self.shared.sink.get() else {
            warn!(consumer = %dl.consumer, event = %dl.event.id, "dead letter not published: no sink; kept in the outbox");
            return;
        };
        let published = sink(dl.channel.clone(), payload, content_type);
        let conn = self.shared.conn();
        tokio::spawn(async move {
            let (channel, consumer, event) = (&dl.channel, &dl.consumer, &dl.event.id);
            match published.await {
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::Unavailable => {
                    warn!(%channel, %consumer, %event, %err, "dead letter not published yet; a janitor retries it");
                    return;
                }
                Err(err) => error!(%channel, %consumer, %event, %err, "cannot publish a dead letter; dropped"),
            }
            leave_outbox(conn, outbox, dl.event.id.clone()).await;
        });
    }

    /// Room the clients have for more events than already read.
    fn room(&self) -> usize {
        let room: usize = self.clients.iter().map(|c| c.max_in_flight.saturating_sub(c.in_flight) as usize).sum();
        room.saturating_sub(self.buffer.len())
    }

    fn start_read(&mut self) {
        let count = self.room().min(READ_BATCH);
        if count == 0 {
            return;
        }
        let conn = self.idle_conn.take();
        let client = self.shared.client.clone();
        let consumer = self.shared.instance.clone();
        let stream = self.stream.clone();
        self.read = Some(Box::pin(async move {
            let mut conn = match conn {
                Some(c) => c,
                None => {
                    // Its own connection: a blocked read must not hold up other commands.
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(None);
                    match client.get_multiplexed_async_connection_with_config(&config).await {
                        Ok(c) => c,
                        Err(err) => return (None, Err(err)),
                    }
                }
            };
            let result = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&consumer)
                .arg("COUNT")
                .arg(count)
                .arg("BLOCK")
                .arg(0)
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query_async(&mut conn)
                .await;
            (Some(conn), result)
        }));
    }

    fn take_read(&mut self, value: Value) -> Result<(), String> {
        // XREADGROUP: [[stream, [[id, [field, value, ...]], ...]]] or nil.
        let Value::Array(streams) = value else { return Ok(()) };
        for s in streams {
            let Value::Array(mut pair) = s else { continue };
            let Some(entries) = pair.pop() else { continue };
            for mut entry in entries_of(entries)? {
                // Owned out of the reply: the payload is not copied again.
                let envelope = Bytes::from(entry.take("e").ok_or("entry without an event")?);
                let sid = std::mem::take(&mut entry.id);
                let text = |name: &str| entry.text(name);
                let event = envelope::decode_own(envelope).ok_or_else(|| format!("entry {sid} holds no event"))?;
                let failed: u32 = text("a").and_then(|a| a.parse().ok()).unwrap_or(0);
                let first_ms = text("f").and_then(|f| f.parse().ok());
                let ordering_key = text("k").map(str::to_owned);
                let failures = match text("x") {
                    Some(x) => serde_json::from_str(x).map_err(|e| format!("failures of {sid}: {e}"))?,
                    None => Vec::new(),
                };
                let event = Arc::new(event);
                self.buffer.push_back(Ready { sid, event, attempt: failed + 1, first_ms, ordering_key, failures });
            }
        }
        if self.clients.is_empty() {
            self.requeue.extend(self.buffer.drain(..).map(|r| r.sid));
        }
        Ok(())
    }

    /// Hands read events to clients with room, round-robin, in batches.
    fn dispatch(&mut self) {
        let deadline_in = self.config.ack_deadline();
        while !self.buffer.is_empty() {
            let clients = &self.clients;
            let Some((i, room)) = next_with_room(clients.len(), &mut self.next_client, |i| clients[i].room()) else {
                break;
            };
            let (now, wall) = (Instant::now(), SystemTime::now());
            let (id, deadline) = (self.clients[i].id, now + deadline_in);
            let take = room.min(self.buffer.len());
            let mut batch = Vec::with_capacity(take);
            for ready in self.buffer.drain(..take) {
                let key: Arc<str> = ready.event.id.as_str().into();
                let first_ms = ready.first_ms.unwrap_or_else(now_ms);
                let delivery =
                    Delivery { event: Arc::clone(&ready.event), attempt: ready.attempt, deadline: wall + deadline_in };
                self.held.insert(Arc::clone(&key), Held { client: id, deadline, first_ms, since: now, entry: ready });
                self.timer_seq += 1;
                self.timers.insert((deadline, self.timer_seq), Timer::Deadline(key));
                batch.push(delivery);
            }
            let client = &mut self.clients[i];
            client.in_flight += take as u32;
            // Capacity covers max_in_flight batches; a failure means the client left,
            // and its detach releases the events.
            let _ = client.tx.try_send(batch);
        }
    }

    /// Sends the changes collected so far, one script per kind.
    fn flush(&mut self) {
        let base = self.rt.base.clone();
        let maxlen = self.shared.retention.max_entries.max(1);
        if !self.acks.is_empty() {
            let mut args = Args::default();
            args.push(&base).push(GROUP).push(maxlen).push(now_ms());
            for a in self.acks.drain(..) {
                args.push(a.sid).push(a.event_id).push(a.ordering_key).push(a.log_line);
            }
            self.script(|s| &s.ack, args, "ack failed", |_| Outcome::default());
        }
        if !self.fails.is_empty() {
            let mut args = Args::default();
            args.push(&base).push(GROUP).push(now_ms()).push(maxlen).push(&self.shared.instance);
            args.retry_config(&self.config);
            for f in self.fails.drain(..) {
                args.push(f.sid).push(f.reason).push(f.delay_ms).push(u8::from(f.term)).push(f.first_ms);
            }
            self.script(|s| &s.fail, args, "recording a failed attempt failed", |v| outcome_of(v, false));
        }
        if !self.requeue.is_empty() {
            let mut args = Args::default();
            args.push(&base).push(GROUP).push(&self.shared.instance);
            for sid in self.requeue.drain(..) {
                args.push(sid);
            }
            self.script(|s| &s.requeue, args, "requeue failed", |_| Outcome::default());
        }
        if std::mem::take(&mut self.presence_due) {
            let now = now_ms();
            let mut args = Args::default();
            args.push(&base)
                .push(&self.shared.instance)
                .push(self.clients.len())
                .push(now)
                .push(now + PRESENCE_TTL.as_millis() as u64);
            self.script(|s| &s.presence, args, "recording attached clients failed", |_| Outcome::default());
        }
        if !self.touches.is_empty() {
            let mut cmd = redis::cmd("XCLAIM");
            cmd.arg(&self.stream).arg(GROUP).arg(&self.shared.instance).arg(0);
            for sid in self.touches.drain(..) {
                cmd.arg(sid);
            }
            cmd.arg("JUSTID");
            let mut conn = self.shared.conn();
            self.ops.push(Box::pin(async move {
                match cmd.query_async::<Value>(&mut conn).await {
                    Ok(_) => Outcome::default(),
                    Err(err) => Outcome {
                        error: Some(format!("redis: extending deadlines failed: {err}")),
                        ..Outcome::default()
                    },
                }
            }));
        }
    }

    /// Runs a script in the background; its outcome comes back through `ops`.
    fn script(&mut self, pick: fn(&Scripts) -> &Script, args: Args, what: &'static str, parse: fn(Value) -> Outcome) {
        let shared = Arc::clone(&self.shared);
        self.ops.push(Box::pin(async move {
            let mut call = pick(&shared.scripts).prepare_invoke();
            for arg in &args.0 {
                call.arg(arg);
            }
            match call.invoke_async::<Value>(&mut shared.conn()).await {
                Ok(value) => parse(value),
                Err(err) => Outcome { error: Some(format!("redis: {what}: {err}")), ..Outcome::default() },
            }
        }));
    }

    fn run_janitor(&mut self) {
        let now = now_ms();
        let lock_ms = self.janitor_every().as_millis().max(50) as u64;
        let oldest = now.saturating_sub(self.shared.retention.max_age_ms);
        let mut args = Args::default();
        args.push(&self.rt.base)
            .push(GROUP)
            .push(now)
            .push(self.shared.retention.max_entries.max(1))
            .push(&self.shared.instance)
            .push(lock_ms)
            .push(self.config.ack_deadline_ms)
            .push(JANITOR_BATCH)
            .push(format!("{oldest}-0"));
        args.retry_config(&self.config);
        args.push(OUTBOX_GRACE.as_millis() as u64);
        self.script(|s| &s.tick, args, "janitor failed", |v| outcome_of(v, true));
    }

    /// Ends the actor: clients detached (their streams end), held events released.
    async fn finish(mut self, reason: StopReason) {
        debug!(consumer = %self.rt.name, ?reason, "durable consumer actor stopping");
        // Once closed, every sender of this actor reports closed; a newer actor's does not.
        self.rx.close();
        {
            let mut slot = self.rt.actor.lock();
            if slot.as_ref().is_some_and(|a| a.tx.is_closed()) {
                *slot = None;
            }
        }
        self.read = None;
        match &reason {
            StopReason::Deleted => {}
            StopReason::Shutdown => {
                let ids: Vec<u64> = self.clients.iter().map(|c| c.id).collect();
                for id in ids {
                    self.detach(id);
                }
                self.requeue.extend(self.buffer.drain(..).map(|r| r.sid));
                self.flush();
                let drain = async { while self.ops.next().await.is_some() {} };
                if tokio::time::timeout(Duration::from_secs(2), drain).await.is_err() {
                    warn!(consumer = %self.rt.name, "stopped before Redis confirmed the released events; they come back after their ack deadline");
                }
            }
            StopReason::Lost(err) => {
                warn!(consumer = %self.rt.name, %err, "durable consumer lost Redis; detaching its clients (they reconnect; the events they held come back when one reattaches here, or after their ack deadline)");
                for c in &self.clients {
                    *c.closed.lock() = Some(err.clone());
                }
            }
        }
        self.clients.clear();
        self.rt.clients.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Script arguments, owned (the script runs after the actor moves on).
#[derive(Default)]
struct Args(Vec<Vec<u8>>);

impl Args {
    fn push(&mut self, value: impl redis::ToRedisArgs) -> &mut Self {
        self.0.extend(value.to_redis_args());
        self
    }

    fn retry_config(&mut self, config: &ConsumerConfig) -> &mut Self {
        self.push(config.max_attempts)
            .push(config.backoff.initial_ms)
            .push(config.backoff.multiplier)
            .push(config.backoff.max_ms)
    }
}

/// NOGROUP, or a blocked read whose stream was deleted.
pub(crate) fn is_missing_stream(err: &redis::RedisError) -> bool {
    // Inside a pipeline the server's code is only in the text.
    let text = err.to_string();
    text.contains("NOGROUP") || (text.contains("UNBLOCKED") && text.contains("no longer exists"))
}

/// Takes a dead letter out of its consumer's outbox. Should that fail, a janitor will
/// publish it once more (at least once, as documented).
async fn leave_outbox(mut conn: ConnectionManager, outbox: String, event_id: String) {
    let done: RedisResult<i64> = conn.hdel(&outbox, &event_id).await;
    if let Err(err) = done {
        warn!(%outbox, event = %event_id, %err, "a dead letter is done but still in the outbox: it may be published twice");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// FAIL: `{next due, dead...}`; TICK: `{next due, more, dead...}`.
fn outcome_of(value: Value, with_more: bool) -> Outcome {
    let mut out = Outcome::default();
    let Value::Array(items) = value else { return out };
    let mut items = items.into_iter();
    out.next_due = items.next().and_then(|v| text(&v)).and_then(|s| s.parse::<f64>().ok()).map(|f| f as u64);
    if with_more {
        out.more = matches!(items.next(), Some(Value::Int(1)));
    }
    for dead in items {
        let Value::Array(parts) = dead else { continue };
        let mut parts = parts.into_iter();
        let (Some(Value::BulkString(env)), Some(attempts), Some(failures), Some(id)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        out.dead.push(DeadLetter {
            envelope: Bytes::from(env),
            attempts: text(&attempts).and_then(|a| a.parse().ok()).unwrap_or(0),
            failures: text(&failures).unwrap_or_default(),
            event_id: text(&id).unwrap_or_default(),
        });
    }
    out
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A stream entry: its id and fields, moved out of the reply (no copies).
pub(crate) struct Entry {
    pub(crate) id: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.as_slice())
    }

    fn take(&mut self, name: &str) -> Option<Vec<u8>> {
        let at = self.fields.iter().position(|(k, _)| k == name.as_bytes())?;
        Some(self.fields.swap_remove(at).1)
    }

    fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// Stream entries `[[id, [field, value, ...]], ...]`.
pub(crate) fn entries_of(value: Value) -> Result<Vec<Entry>, String> {
    let Value::Array(rows) = value else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Value::Array(row) = row else { return Err("stream entry is not an array".into()) };
        let mut row = row.into_iter();
        let (Some(Value::BulkString(id)), Some(Value::Array(kv))) = (row.next(), row.next()) else {
            // A deleted entry still in the pending list comes back as [id, nil].
            continue;
        };
        let id = String::from_utf8(id).map_err(|_| "stream entry id is not text")?;
        let mut fields = Vec::with_capacity(kv.len() / 2);
        let mut kv = kv.into_iter();
        while let (Some(Value::BulkString(k)), Some(Value::BulkString(v))) = (kv.next(), kv.next()) {
            fields.push((k, v));
        }
        out.push(Entry { id, fields });
    }
    Ok(out)
}
