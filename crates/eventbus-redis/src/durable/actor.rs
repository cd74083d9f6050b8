//! The actor serving one consumer's local clients.
//!
//! The actor owns everything local (clients, what each holds, timers), so it needs no
//! lock: clients talk to it through a bounded channel. It reads the consumer's stream
//! with a blocking XREADGROUP (as this instance, for as many events as its clients have
//! room for), hands events out round-robin in batches, and turns acks, nacks, terms,
//! expired deadlines and disconnects into batched scripts ([`write`]). While clients are attached it
//! also runs the janitor ([`janitor`]) and publishes dead letters from the consumer's
//! outbox ([`outbox`]).

mod janitor;
mod outbox;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::durable::{
    BoxFuture, ConsumerConfig, Delivery, Failure, REASON_DEADLINE, REASON_DISCONNECT, REASON_TERM, next_with_room,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use redis::{RedisResult, Script, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::conn::{Conn, READ_BLOCK};
use super::reply::{entries_of, is_missing_stream, outcome_of};
use super::runtime::{Command, Runtime, StopReason};
use super::scripts::Scripts;
use super::{GROUP, Shared, now_ms};
use crate::envelope;
use write::{AckItem, Args, FailItem};

/// Most events one read asks for.
const READ_BATCH: usize = 1024;

/// Scripts in flight per actor before it stops taking commands.
const MAX_OPS: usize = 64;

/// How often an instance with clients attached renews its count of them in Redis.
const PRESENCE_EVERY: Duration = Duration::from_secs(5);

/// How long a count stands without renewal: an instance that died stops counting
/// after this.
const PRESENCE_TTL: Duration = Duration::from_secs(15);

/// How often an exclusive consumer's instance with clients renews its lease, or tries
/// to take it (docs/consumer-operations.md "Exclusive consumers").
pub(crate) const LEASE_EVERY: Duration = Duration::from_secs(1);

/// How long a lease stands without renewal: an instance that died gives it up after
/// this.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(5);

pub(crate) struct Client {
    pub(crate) id: u64,
    pub(crate) max_in_flight: u32,
    pub(crate) max_batch: u32,
    pub(crate) in_flight: u32,
    pub(crate) tx: mpsc::Sender<Vec<Delivery>>,
    pub(crate) closed: Arc<Mutex<Option<String>>>,
    /// Stopping: takes no more deliveries.
    pub(crate) draining: bool,
}

impl Client {
    /// Events this client can take now (0 when it has left or is stopping).
    fn room(&self) -> usize {
        self.free().min(self.max_batch as usize)
    }

    /// Events this client can hold beyond those it holds.
    fn free(&self) -> usize {
        if self.draining || self.tx.is_closed() {
            return 0;
        }
        self.max_in_flight.saturating_sub(self.in_flight) as usize
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
    /// Renews (or tries to take) an exclusive consumer's lease.
    Lease,
}

/// A dead letter to publish, as a script hands it back; it stays in the consumer's
/// outbox until its publication is answered.
pub(crate) struct DeadLetter {
    pub(crate) envelope: Bytes,
    pub(crate) attempts: u32,
    /// JSON `[{"at_ms":…,"reason":…}]`.
    pub(crate) failures: String,
    pub(crate) event_id: String,
}

/// What a script run tells the actor.
#[derive(Default)]
pub(crate) struct Outcome {
    /// Earliest retry due (ms since the epoch).
    pub(crate) next_due: Option<u64>,
    /// More work waits (run the janitor again now).
    pub(crate) more: bool,
    pub(crate) dead: Vec<DeadLetter>,
    pub(crate) error: Option<String>,
    /// An exclusive consumer's lease: held (after taking or renewing it) or not.
    pub(crate) lease: Option<bool>,
}

/// A blocking read and, right after it on the same connection, whether the consumer is
/// paused now.
type ReadFuture = BoxFuture<'static, (Option<Conn>, RedisResult<(Value, bool)>)>;

/// How soon a read on a cluster asks again after a failure.
const CLUSTER_READ_RETRY: Duration = Duration::from_millis(100);
/// Failed reads in a row on a cluster before the clients are told Redis is lost: a
/// failover, or a slot moving, passes within them; a deleted consumer's actor is
/// stopped by the change notice first.
const CLUSTER_READ_RETRIES: u32 = 100;
pub(crate) struct Actor {
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
    idle_conn: Option<Conn>,
    /// The last read failed on a cluster (no stream: deleted, or moved away meanwhile;
    /// or its node failed): the next one waits a moment.
    read_failed: bool,
    /// Reads failed in a row on a cluster.
    read_retries: u32,
    ops: FuturesUnordered<BoxFuture<'static, Outcome>>,
    acks: Vec<AckItem>,
    /// The log lines of the held ones among `acks`, joined by '\n'.
    ack_lines: Vec<u8>,
    fails: Vec<FailItem>,
    touches: Vec<String>,
    requeue: Vec<String>,
    /// The client count changed or is due for renewal in Redis.
    presence_due: bool,
    /// A `Timer::Presence` is set.
    presence_timer: bool,
    /// This instance holds the exclusive consumer's lease: its clients may receive.
    lease: bool,
    /// Take or renew (`true`) or give up (`false`) the lease at the next flush.
    want_lease: Option<bool>,
    /// A `Timer::Lease` is set.
    lease_timer: bool,
}

impl Actor {
    pub(crate) fn new(rt: Arc<Runtime>, shared: Arc<Shared>, rx: mpsc::Receiver<Command>) -> Self {
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
            read_failed: false,
            read_retries: 0,
            ops: FuturesUnordered::new(),
            acks: Vec::new(),
            ack_lines: Vec::new(),
            fails: Vec::new(),
            touches: Vec::new(),
            requeue: Vec::new(),
            presence_due: false,
            presence_timer: false,
            lease: false,
            want_lease: None,
            lease_timer: false,
        }
    }

    /// Whether events may go out now: not paused, and for an exclusive consumer only
    /// through the instance holding the lease.
    fn may_deliver(&self) -> bool {
        !self.rt.is_paused() && (!self.config.exclusive || self.lease)
    }

    /// Clients that receive: all of them, or the oldest one of an exclusive consumer.
    fn receivers(&self) -> usize {
        if self.config.exclusive { self.clients.len().min(1) } else { self.clients.len() }
    }

    pub(crate) async fn run(mut self) {
        self.release_orphans().await;
        let stop = loop {
            self.config = self.rt.config();
            if !self.may_deliver() && !self.buffer.is_empty() {
                // Read before a pause or the loss of the lease: back on the stream.
                self.requeue.extend(self.buffer.drain(..).map(|r| r.sid));
            }
            self.dispatch();
            if !self.buffer.is_empty() {
                // Read here but no client here has room for it now (handed back by a
                // client, or its room gone with it): back on the stream, where the
                // clients of every instance may take it (this one's read it again).
                self.requeue.extend(self.buffer.drain(..).map(|r| r.sid));
            }
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
                        Ok((value, paused)) => {
                            self.idle_conn = conn;
                            self.read_retries = 0;
                            // Paused through another instance whose notice has not
                            // arrived yet: what was just read goes back (loop top).
                            if paused {
                                self.rt.paused.store(true, std::sync::atomic::Ordering::Release);
                            }
                            if let Err(err) = self.take_read(value) {
                                break StopReason::Lost(format!("unreadable stream entry: {err}"));
                            }
                        }
                        // On a cluster the stream may have moved to another node (a
                        // slot migration deletes it on the old one): read again; a real
                        // deletion stops the actor when its notice is followed.
                        // A failover takes a moment too: the clients stay attached while it
                        // lasts (reads retried for up to about CLUSTER_READ_RETRIES / 10 s).
                        Err(err) if self.shared.is_cluster() && self.read_retries < CLUSTER_READ_RETRIES => {
                            debug!(consumer = %self.rt.name, %err, "a read on the cluster failed; reading again");
                            self.idle_conn = None;
                            self.read_retries += 1;
                            self.read_failed = true;
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
                if self.config.exclusive && !self.lease {
                    self.want_lease = Some(true);
                }
                if self.config.exclusive && !self.lease_timer {
                    self.lease_timer = true;
                    self.add_timer(Instant::now() + LEASE_EVERY, Timer::Lease);
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
                            let now = now_ms();
                            self.acks.push(AckItem::held(key, held, &mut self.ack_lines, now));
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
            Command::Release(id, event_ids, drain) => self.release_unstarted(id, event_ids, drain),
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
            Command::Wake(done) => {
                if !self.may_deliver() && self.read.is_some() {
                    // Stop the blocked read (closing its connection cancels it), so
                    // nothing more is taken off the stream while paused.
                    self.read = None;
                    self.idle_conn = None;
                }
                if let Some(done) = done {
                    let _ = done.send(());
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

    /// Events a client hands back unstarted: to the next client here with room, with
    /// the attempt number they had (none counted), or back on the stream for any
    /// instance's clients when none has room (see `run`). With `drain`, the client
    /// takes no more and hears so; when no client here takes events any more, the read
    /// stops.
    fn release_unstarted(&mut self, id: u64, event_ids: Vec<String>, drain: bool) {
        let mut released = 0usize;
        for event_id in event_ids {
            if let Some((_, held)) = self.release(id, &event_id) {
                self.buffer.push_front(held.entry);
                released += 1;
            }
        }
        if drain && let Some(client) = self.clients.iter_mut().find(|c| c.id == id && !c.draining) {
            client.draining = true;
            // After every batch sent to it (sent at once, in order): the client's
            // channel has room for this one beyond its batches.
            let _ = client.tx.try_send(Vec::new());
        }
        // A client that leaves holding nothing unstarted (every clean exit) is not news.
        if released > 0 {
            tracing::info!(consumer = %self.rt.name, client = id, released, drain, "events released unstarted by a client");
        } else if drain {
            tracing::debug!(consumer = %self.rt.name, client = id, "client draining, nothing unstarted to release");
        }
        if self.clients.iter().all(|c| c.draining) {
            self.read = None;
            self.idle_conn = None;
        }
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
            if self.lease {
                // Another instance's clients may take over once the events released
                // above are recorded.
                self.lease = false;
                self.want_lease = Some(false);
            }
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
                Timer::Lease => {
                    self.lease_timer = self.config.exclusive && !self.clients.is_empty();
                    if self.lease_timer {
                        self.want_lease = Some(true);
                        self.add_timer(now + LEASE_EVERY, Timer::Lease);
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
        if let Some(held) = outcome.lease {
            self.lease = held && !self.clients.is_empty();
        }
        for dead in outcome.dead {
            self.publish_dead_letter(dead);
        }
        None
    }

    /// Room the receiving clients have for more events than already read.
    fn room(&self) -> usize {
        let receivers = &self.clients[..self.receivers()];
        let room: usize = receivers.iter().map(Client::free).sum();
        room.saturating_sub(self.buffer.len())
    }

    fn start_read(&mut self) {
        if !self.may_deliver() {
            return;
        }
        let count = self.room().min(READ_BATCH);
        if count == 0 {
            return;
        }
        let conn = self.idle_conn.take();
        let backend = self.shared.backend.clone();
        let shared_conn = self.shared.conn();
        let consumer = self.shared.instance.clone();
        let stream = self.stream.clone();
        let paused_key = self.shared.keys.paused.clone();
        let name = Arc::clone(&self.rt.name);
        let after_failure = std::mem::take(&mut self.read_failed);
        self.read = Some(Box::pin(async move {
            if after_failure {
                // On a cluster the stream may have moved to another node under the
                // read: ask again shortly (MOVED then routes the read to it).
                tokio::time::sleep(CLUSTER_READ_RETRY).await;
            }
            let mut conn = match conn {
                Some(c) => c,
                // Its own connection: a blocked read must not hold up other commands.
                None => match backend.reader().await {
                    Ok(c) => c,
                    Err(err) => return (None, Err(err)),
                },
            };
            let mut read = redis::cmd("XREADGROUP");
            read.arg("GROUP").arg(GROUP).arg(&consumer).arg("COUNT").arg(count).arg("BLOCK");
            read.arg(READ_BLOCK.as_millis() as u64).arg("STREAMS").arg(&stream).arg(">");
            let mut paused = redis::cmd("HEXISTS");
            paused.arg(&paused_key).arg(&*name);
            // The pause check runs after the read returns, so it sees a pause made
            // before the events read were published (docs/consumer-operations.md):
            // in the same pipeline on one Redis, right after it on a cluster (the
            // definitions are in another slot, whose outage must not hold up delivery).
            let result = if backend.is_cluster() {
                match read.query_async::<Value>(&mut conn).await {
                    Ok(events) => match paused.query_async::<bool>(&mut shared_conn.clone()).await {
                        Ok(paused) => Ok((events, paused)),
                        // The definitions' slot is not serving (a failover): the events
                        // read are delivered, as the pause this instance knows allows.
                        Err(_) => Ok((events, false)),
                    },
                    Err(err) => Err(err),
                }
            } else {
                redis::pipe().add_command(read).add_command(paused).query_async(&mut conn).await
            };
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

    /// Hands read events to clients with room, round-robin, in batches (an exclusive
    /// consumer: to its oldest client only).
    fn dispatch(&mut self) {
        if !self.may_deliver() {
            return;
        }
        let deadline_in = self.config.ack_deadline();
        let receivers = self.receivers();
        while !self.buffer.is_empty() {
            let clients = &self.clients;
            let Some((i, room)) = next_with_room(receivers, &mut self.next_client, |i| clients[i].room()) else {
                break;
            };
            let (now, wall) = (Instant::now(), SystemTime::now());
            let (id, deadline) = (self.clients[i].id, now + deadline_in);
            let take = room.min(self.buffer.len());
            let mut batch = Vec::with_capacity(take);
            for ready in self.buffer.drain(..take) {
                let key: Arc<str> = Arc::clone(&ready.event.id);
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
