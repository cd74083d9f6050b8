//! Capture in redis mode, group-committed: one capture script at a time, carrying every
//! publish that arrived while the previous one ran (bounded in count and bytes), in
//! arrival order. The script checks the consumer-set version, each idempotency key,
//! appends to every matching stream and PUBLISHes for subscribers: all in one step.

use std::sync::Arc;

use eventbus_core::durable::{CaptureRequest, Captured, DurableError};
use eventbus_core::{Event, Fanout, TransportError};
use std::collections::{HashMap, HashSet};

use futures::future::join_all;
use redis::{FromRedisValue, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::*;

/// How long a capture waits for the definitions' version once it could not be read
/// (their slot has no master): the next captures are not held up by each failing
/// read's retries, and its first answer once the slot serves again is taken.
const UNREAD_VERSION_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A publish waiting for the next capture script.
pub(super) struct PendingCapture {
    pub(super) event: Arc<Event>,
    /// Stored for the consumers (always the binary envelope).
    pub(super) envelope: Vec<u8>,
    /// Published for subscribers when it differs from `envelope` (the JSON one); empty
    /// = the envelope.
    pub(super) published: Vec<u8>,
    /// "" = none.
    pub(super) ordering_key: String,
    /// The full Redis key; "" = none.
    pub(super) idem: String,
    pub(super) reply: oneshot::Sender<Result<Captured, DurableError>>,
}

/// Group commit: one capture script at a time, carrying every publish that arrived
/// while the previous one ran (bounded in count and bytes). One queue and one script
/// in flight keep the capture order the publish order, and a busy broker pays one
/// Redis round trip per batch instead of per event.
pub(super) async fn run_captures(shared: std::sync::Weak<Shared>, mut queue: mpsc::Receiver<PendingCapture>) {
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

impl Shared {
    /// How many consumers a publish on `channel` matches now.
    fn matching(&self, channel: &str) -> usize {
        let registry = self.registry.read();
        let mut names = Vec::new();
        registry.trie.collect(channel, &mut names);
        names.sort_unstable();
        names.dedup();
        names.iter().filter(|n| registry.by_name.contains_key(*n)).count()
    }

    /// Queues publishes for the next capture script, in order, then waits for their
    /// outcomes. Answers stop at the first error.
    pub(super) async fn capture_many(&self, batch: &[CaptureRequest<'_>]) -> Vec<Result<Captured, DurableError>> {
        let gone = || DurableError::unavailable("the durable engine is shutting down");
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut outcomes_refused = None;
        let limit = self.options.max_captures_per_publish;
        for r in batch {
            if limit != 0 {
                let matched = self.matching(&r.event.channel);
                if matched > limit {
                    let channel = r.event.channel.to_string();
                    outcomes_refused = Some(DurableError::TooManyCaptures { channel, matched, limit });
                    break;
                }
            }
            let (reply, outcome) = oneshot::channel();
            let capture = PendingCapture {
                envelope: envelope::encode(r.event),
                published: match self.envelope {
                    Envelope::Binary => Vec::new(),
                    json => envelope::encode_as(json, r.event),
                },
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
        if let Some(refused) = outcomes_refused {
            out.push(Err(refused));
            return out;
        }
        if out.len() < batch.len() {
            out.push(Err(gone()));
        }
        out
    }

    /// Runs the capture script; with `min_replicas_acked`, `WAIT`s for that many
    /// replicas in the same round trip, on the captures' own connection, and fails
    /// when fewer confirm in time. (The capture then stands on the master: a retry
    /// with the same idempotency key is answered as a duplicate, not stored twice.)
    async fn run_capture<T: FromRedisValue>(&self, call: &redis::ScriptInvocation<'_>) -> Result<T, String> {
        if self.min_replicas_acked == 0 {
            return call.invoke_async(&mut self.conn()).await.map_err(|err| format!("Redis: {err}"));
        }
        let timeout_ms = self.replica_ack_timeout.as_millis().max(1) as u64;
        let mut pipe = redis::pipe();
        pipe.invoke_script(call).cmd("WAIT").arg(self.min_replicas_acked).arg(timeout_ms);
        let mut conn = self.capture_conn.clone();
        let mut result = pipe.query_async::<(T, u32)>(&mut conn).await;
        if let Err(err) = &result
            && err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            // Redis lost its script cache (restarted, SCRIPT FLUSH): load it, once.
            result = match call.load_async(&mut conn).await {
                Ok(_) => pipe.query_async(&mut conn).await,
                Err(err) => Err(err),
            };
        }
        match result {
            Ok((reply, acked)) if acked >= self.min_replicas_acked => Ok(reply),
            Ok((_, acked)) => Err(format!(
                "{acked} of the {} replicas eventbus.redis.min_replicas_acked asks for confirmed the capture within \
                 {timeout_ms} ms (it stands on the master: retry with the same idempotency key)",
                self.min_replicas_acked
            )),
            Err(err) => Err(format!("Redis: {err}")),
        }
    }

    /// Runs one capture script for `batch`, in order, and answers each publish. A
    /// batch that finds the consumer set changed reloads it and runs again, before
    /// any later batch, so publish order holds.
    pub(super) async fn capture_batch(self: &Arc<Self>, batch: &mut Vec<PendingCapture>) {
        if self.is_cluster() {
            return self.capture_batch_cluster(batch).await;
        }
        let window_ms = self.options.dedup_window.as_millis().max(1) as u64;
        let mut names = Vec::new();
        let mut consumers = Vec::with_capacity(batch.len());
        let mut failure = "durable consumer definitions keep changing; try again".to_owned();
        for _ in 0..STALE_RETRIES {
            let mut call = self.scripts.publish.key(&self.keys.version);
            consumers.clear();
            {
                let registry = self.registry.read();
                call.arg(&*registry.version)
                    .arg(window_ms)
                    .arg(&self.keys.pubsub)
                    .arg(&self.keys.history_stream)
                    .arg(&self.keys.history_meta)
                    .arg(&self.keys.history_index)
                    .arg(crate::history::kind(self.envelope))
                    .arg(now_ms());
                for p in batch.iter() {
                    names.clear();
                    registry.trie.collect(&p.event.channel, &mut names);
                    names.sort_unstable();
                    names.dedup();
                    names.retain(|n| registry.by_name.contains_key(n));
                    call.arg(&*p.event.id)
                        .arg(&p.envelope)
                        .arg(&p.published)
                        .arg(&p.event.channel)
                        .arg(&p.ordering_key)
                        .arg(&p.idem)
                        .arg(&crate::history::bounds(self.history.limits(&p.event.channel), &p.event)[..])
                        .arg(names.len());
                    for rt in names.iter().filter_map(|n| registry.by_name.get(n)) {
                        call.arg(&*rt.base).arg(rt.config().max_pending);
                    }
                    consumers.push(names.len());
                }
            }
            let reply: Vec<Value> = match self.run_capture(&call).await {
                Ok(reply) => reply,
                Err(err) => {
                    failure = err;
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
}

impl Shared {
    /// [`Shared::capture_batch`] on a cluster, where each consumer's keys are in a slot
    /// of their own: each idempotency key is claimed first (`SET NX GET`, in its own
    /// slot), then one script per matching consumer stores its events of the batch, in
    /// order, all at once, with the consumer-set version read beside them. A version
    /// that moved meanwhile reloads the set and stores the batch for the consumers it
    /// did not know (each consumer is written once per batch: nothing twice). A version
    /// that cannot be read (its slot has no master, during a failover) holds up
    /// nothing: the batch stands with the definitions this instance holds. A publish
    /// is answered OK when every consumer it matches has it, else UNAVAILABLE.
    ///
    /// An event with an idempotency key is stored by each consumer once per event id
    /// (the script keeps the ids it stored within the window): a publish whose key was
    /// claimed before is stored again under the first event's id, so the retry of a
    /// publish that reached only some consumers completes it and duplicates nothing,
    /// and is answered as a duplicate once every consumer has it. Subscribers get the
    /// new events through the transport given to [`RedisDurable::publish_through`],
    /// sent beside the stores (so a publish answered UNAVAILABLE because a consumer's
    /// store failed may have reached subscribers), or else from the bus afterwards
    /// ([`Captured::Stored`]).
    async fn capture_batch_cluster(self: &Arc<Self>, batch: &mut Vec<PendingCapture>) {
        let n = batch.len();
        let window_ms = self.options.dedup_window.as_millis().max(1) as u64;
        let mut failed: Vec<Option<String>> = vec![None; n];
        // The first event's id, for a repeated idempotency key; its envelope under that id.
        let mut duplicate: Vec<Option<String>> = vec![None; n];
        let claims = batch.iter().enumerate().filter(|(_, p)| !p.idem.is_empty()).map(|(i, p)| {
            let mut conn = self.conn();
            let mut cmd = redis::cmd("SET");
            cmd.arg(&p.idem).arg(&*p.event.id).arg("NX").arg("GET").arg("PX").arg(window_ms);
            async move { (i, cmd.query_async::<Option<String>>(&mut conn).await) }
        });
        for (i, claim) in join_all(claims).await {
            match claim {
                Ok(None) => {}
                Ok(Some(first)) => {
                    let p = &mut batch[i];
                    let mut event = Event::clone(&p.event);
                    event.id = Arc::from(first.as_str());
                    p.envelope = envelope::encode(&event);
                    duplicate[i] = Some(first);
                }
                Err(err) => failed[i] = Some(format!("Redis: {err}")),
            }
        }

        let mut stored = vec![0usize; n];
        // What sending each event to subscribers answered (`publish_through`).
        let mut fanouts: Vec<Option<Result<Fanout, TransportError>>> = (0..n).map(|_| None).collect();
        let mut written: HashSet<Arc<str>> = HashSet::new();
        let mut failure = None;
        let mut names = Vec::new();
        for round in 1..=STALE_RETRIES {
            let (version, work) = {
                let registry = self.registry.read();
                let mut work: Vec<(Arc<Runtime>, Vec<usize>)> = Vec::new();
                let mut slot_of: HashMap<Arc<str>, usize> = HashMap::new();
                for (i, p) in batch.iter().enumerate() {
                    if failed[i].is_some() {
                        continue;
                    }
                    names.clear();
                    registry.trie.collect(&p.event.channel, &mut names);
                    names.sort_unstable();
                    names.dedup();
                    for name in &names {
                        let Some(rt) = registry.by_name.get(name) else { continue };
                        if written.contains(name) {
                            continue;
                        }
                        let slot = *slot_of.entry(Arc::clone(name)).or_insert_with(|| {
                            work.push((Arc::clone(rt), Vec::new()));
                            work.len() - 1
                        });
                        work[slot].1.push(i);
                    }
                }
                (Arc::clone(&registry.version), work)
            };
            let now = now_ms();
            let stores = work.iter().map(|(rt, events)| {
                let mut call = self.scripts.capture.key(&rt.stream);
                call.arg(&rt.base).arg(rt.config().max_pending).arg(now).arg(window_ms);
                for &i in events {
                    let p = &batch[i];
                    let id = duplicate[i].as_deref().unwrap_or(&p.event.id);
                    let once = u8::from(!p.idem.is_empty());
                    call.arg(id).arg(&p.envelope).arg(&p.event.channel).arg(&p.ordering_key).arg(once);
                }
                async move { self.run_capture::<i64>(&call).await }
            });
            let mut conn = self.conn();
            let mut read_version = redis::cmd("GET");
            read_version.arg(&self.keys.version);
            let version_now = async {
                let read = read_version.query_async::<Option<String>>(&mut conn);
                if !self.definitions_unread.load(Ordering::Relaxed) {
                    return read.await;
                }
                // Unreadable a moment ago: not waited on for the client's retries.
                let timed_out = || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
                tokio::time::timeout(UNREAD_VERSION_WAIT, read).await.unwrap_or_else(|_| Err(timed_out()))
            };
            // The first round also sends the events to subscribers, beside their
            // capture (not again when a changed consumer set stores them once more),
            // once this instance has read the definitions: until then a capture may
            // yet be refused, and the bus sends what was stored afterwards.
            let publish = async {
                match (round, self.publisher.get()) {
                    (1, Some(transport)) if !version.is_empty() => {
                        let sent: Vec<usize> =
                            (0..n).filter(|&i| failed[i].is_none() && duplicate[i].is_none()).collect();
                        let events = sent.iter().map(|&i| Arc::clone(&batch[i].event)).collect();
                        Some((sent, transport.publish_all(events).await))
                    }
                    _ => None,
                }
            };
            let (results, version_now, published) = tokio::join!(join_all(stores), version_now, publish);
            if let Some((sent, answers)) = published {
                let mut answers = answers.into_iter();
                for i in sent {
                    fanouts[i] = Some(answers.next().unwrap_or_else(|| {
                        Err(TransportError {
                            transport: "redis",
                            reason: "the transport answered fewer events than it was given".to_owned(),
                        })
                    }));
                }
            }
            for ((rt, events), result) in work.iter().zip(results) {
                written.insert(Arc::clone(&rt.name));
                match result {
                    Ok(1) => events.iter().for_each(|&i| stored[i] += 1),
                    // Deleted while these were published: nothing to store.
                    Ok(_) => {}
                    Err(err) => {
                        for &i in events {
                            failed[i].get_or_insert_with(|| err.clone());
                        }
                    }
                }
            }
            match version_now {
                Ok(now) if now.as_deref().unwrap_or("0") == &*version => {
                    self.definitions_read_again();
                    break;
                }
                Ok(_) if round == STALE_RETRIES => {
                    failure = Some("durable consumer definitions keep changing; try again".to_owned());
                }
                Ok(_) => {
                    if let Err(err) = self.reload().await {
                        failure = Some(err.to_string());
                        break;
                    }
                }
                // The definitions' slot is not serving (a failover under way): each
                // consumer's own slot answered for itself, with the definitions this
                // instance holds; a change made meanwhile is read once the slot serves.
                Err(err) if !version.is_empty() => {
                    self.definitions_unreadable(&err);
                    break;
                }
                Err(err) => {
                    failure = Some(format!("Redis: {err}"));
                    break;
                }
            }
        }

        let mut lost = 0usize;
        let mut reason = None;
        for (i, p) in batch.drain(..).enumerate() {
            let answer = match (failed[i].take().or_else(|| failure.clone()), duplicate[i].take()) {
                (Some(err), _) => {
                    lost += 1;
                    reason.get_or_insert_with(|| err.clone());
                    let retry = match p.idem.is_empty() {
                        true => "",
                        false => " (a retry with the same idempotency key stores it for the consumers that lack it)",
                    };
                    Err(DurableError::unavailable(format!("{err}{retry}")))
                }
                (None, Some(first)) => Ok(Captured::Duplicate(first)),
                (None, None) => match fanouts[i].take() {
                    None => Ok(Captured::Stored(stored[i])),
                    Some(Ok(fanout)) => Ok(Captured::Forwarded { consumers: stored[i], fanout }),
                    Some(Err(err)) => Err(DurableError::unavailable(format!(
                        "stored for its durable consumers, but not sent to subscribers: {}",
                        err.reason
                    ))),
                },
            };
            let _ = p.reply.send(answer);
        }
        if let Some(reason) = reason {
            warn!(events = lost, %reason, "durable capture failed on the cluster; publishes answered UNAVAILABLE");
        }
    }
}

impl Shared {
    /// The consumer-set version could not be read: said once per outage.
    fn definitions_unreadable(&self, err: &redis::RedisError) {
        if !self.definitions_unread.swap(true, Ordering::Relaxed) {
            warn!(
                error = %err,
                "cannot read the durable consumer definitions' version (their slot has no master?); capturing with \
                 the definitions this instance holds until it can"
            );
        }
    }

    fn definitions_read_again(&self) {
        if self.definitions_unread.load(Ordering::Relaxed) && self.definitions_unread.swap(false, Ordering::Relaxed) {
            info!("the durable consumer definitions' version is readable again");
        }
    }
}
