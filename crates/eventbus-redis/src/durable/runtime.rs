//! One consumer as seen from one instance: its definition, the actor serving its local
//! clients (started on first attach), and each client's handle, which talks to the
//! actor through a bounded channel.

use std::sync::Arc;
use std::time::Duration;

use eventbus_core::TaskHandle;
use eventbus_core::durable::{BoxFuture, ClientOptions, ConsumerClient, ConsumerConfig, Delivery, DurableError};
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;

use super::Shared;
use super::actor::{Actor, Client};

/// Commands queued per consumer actor before clients wait.
const COMMAND_QUEUE: usize = 1024;

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
    /// Events handed back unstarted; `true`: the client is draining.
    Release(u64, Vec<String>, bool),
    /// Something the actor reads outside its commands changed (paused or resumed); the
    /// sender, if any, hears once the actor has acted on it.
    Wake(Option<tokio::sync::oneshot::Sender<()>>),
    Stop(StopReason),
}

/// A consumer known to this instance.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) name: Arc<str>,
    /// What its keys start with: `{prefix}:durable:{name}` (on a cluster the name is
    /// the hash tag: `{prefix}:durable:{{name}}`).
    pub(crate) base: String,
    /// Its stream (`{base}:s`): the key that routes its scripts on a cluster.
    pub(crate) stream: String,
    /// The key holding its terminal log's format: KEYS[1] of the scripts that log.
    pub(crate) log_key: String,
    pub(crate) config: RwLock<Arc<ConsumerConfig>>,
    pub(crate) actor: Mutex<Option<ActorSlot>>,
    pub(crate) clients: std::sync::atomic::AtomicU32,
    /// Paused by an operator (as last read from Redis): the actor delivers nothing.
    pub(crate) paused: std::sync::atomic::AtomicBool,
}

impl Runtime {
    pub(crate) fn new(name: Arc<str>, base: String, log_key: String, config: ConsumerConfig) -> Self {
        Self {
            name,
            stream: format!("{base}:s"),
            log_key,
            base,
            config: RwLock::new(Arc::new(config)),
            actor: Mutex::new(None),
            clients: std::sync::atomic::AtomicU32::new(0),
            paused: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records the paused state read from Redis; a running actor is woken to act on it.
    pub(crate) fn set_paused(&self, paused: bool) {
        if self.paused.swap(paused, std::sync::atomic::Ordering::AcqRel) == paused {
            return;
        }
        if let Some(slot) = self.actor.lock().as_ref() {
            // Full: the actor is busy and re-reads the flag on its next turn anyway.
            let _ = slot.tx.try_send(Command::Wake(None));
        }
    }

    /// Waits (briefly) until the running actor, if any, has acted on the paused state:
    /// after a pause it has stopped reading.
    pub(crate) async fn settled(&self) {
        let Some(tx) = self.actor.lock().as_ref().map(|slot| slot.tx.clone()) else { return };
        let (done, settled) = tokio::sync::oneshot::channel();
        if tx.send(Command::Wake(Some(done))).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), settled).await;
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
        // One message per batch (a batch holds at least one in-flight event), and the
        // drain's empty batch.
        let (tx, rx) = mpsc::channel(max_in_flight.max(1) as usize + 1);
        let closed = Arc::new(Mutex::new(None));
        let client =
            Client { id, max_in_flight, max_batch, in_flight: 0, tx, closed: Arc::clone(&closed), draining: false };
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
pub(crate) struct ActorSlot {
    task: TaskHandle,
    pub(crate) tx: mpsc::Sender<Command>,
}

/// An attached client's handle.
#[derive(Debug)]
pub(crate) struct RedisClient {
    pub(crate) actor: mpsc::Sender<Command>,
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

    fn release(&self, event_ids: Vec<String>, drain: bool) -> BoxFuture<'_, ()> {
        self.send(Command::Release(self.id, event_ids, drain))
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
