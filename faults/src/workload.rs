//! The clients of a run and what they saw: durable publishers (an ordering key each,
//! an idempotency key per event, retried until answered OK), a worker per instance
//! (acking, nacking some first attempts), core subscribers of a channel with a
//! history, and a group spread over instances. Everything a client saw is recorded
//! with its time; the checker reads only these records.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use eventbus_client::{Client, ClientOptions, Outcome, SubscribeOptions, SubscriptionItem, Worker};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The durable consumer every instance declares.
pub(crate) const CONSUMER: &str = "faults-work";
/// The push consumer every instance declares.
const PUSH_CONSUMER: &str = "faults-push";
const TICKS: &str = "faults.ticks";
const JOBS: &str = "faults.jobs";
const GROUP: &str = "faults-g";
/// Durable publishers (one ordering key each).
pub(crate) const PUBLISHERS: u32 = 4;
/// How long a publish may take before it counts as unanswered (and is retried).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How a durable publish ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Answer {
    /// Answered OK: `captured` consumers stored it, or it was a duplicate of one that was.
    Ok { captured: u32, duplicate: bool },
    /// Never answered OK before the publishers stopped: it may or may not exist.
    Unknown,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Published {
    pub(crate) key: u32,
    pub(crate) seq: u64,
    pub(crate) at: f64,
    pub(crate) answer: Answer,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Delivered {
    pub(crate) key: u32,
    pub(crate) seq: u64,
    pub(crate) at: f64,
    pub(crate) acked: bool,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) enum TickItem {
    Event { seq: u64, at: f64 },
    Gap,
    Started { recovered: bool },
}

/// Everything the clients saw, with times in seconds since the run's start.
#[derive(Debug)]
pub(crate) struct Records {
    start: Instant,
    pub(crate) published: Mutex<Vec<Published>>,
    pub(crate) delivered: Mutex<Vec<Delivered>>,
    /// What the push consumer's endpoint received.
    pub(crate) pushed: Mutex<Vec<Delivered>>,
    pub(crate) ticks_ok: Mutex<Vec<(u64, f64)>>,
    pub(crate) tick_items: Vec<Mutex<Vec<TickItem>>>,
    pub(crate) jobs_ok: Mutex<Vec<(u64, f64)>>,
    pub(crate) jobs_received: Mutex<Vec<(u64, usize, f64)>>,
    /// Publish errors by kind (`UNAVAILABLE`, `timeout`, …).
    pub(crate) errors: Mutex<BTreeMap<String, u64>>,
}

/// Locks a record list (a panicking client task does not lose the others' records).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Records {
    pub(crate) fn new(start: Instant, subscribers: usize) -> Self {
        Self {
            start,
            published: Mutex::default(),
            delivered: Mutex::default(),
            pushed: Mutex::default(),
            ticks_ok: Mutex::default(),
            tick_items: (0..subscribers).map(|_| Mutex::default()).collect(),
            jobs_ok: Mutex::default(),
            jobs_received: Mutex::default(),
            errors: Mutex::default(),
        }
    }

    pub(crate) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Everything recorded, as JSON (written beside the report, for reading a finding).
    pub(crate) fn dump(&self) -> serde_json::Value {
        let ticks: Vec<Vec<TickItem>> = self.tick_items.iter().map(|items| lock(items).clone()).collect();
        serde_json::json!({
            "published": *lock(&self.published),
            "delivered": *lock(&self.delivered),
            "pushed": *lock(&self.pushed),
            "ticks_ok": *lock(&self.ticks_ok),
            "tick_items": ticks,
            "jobs_ok": *lock(&self.jobs_ok),
            "jobs_received": *lock(&self.jobs_received),
        })
    }

    fn error(&self, kind: String) {
        *lock(&self.errors).entry(kind).or_default() += 1;
    }
}

fn error_kind(err: &eventbus_client::Error) -> String {
    match err.status() {
        Some(status) => format!("{:?}", status.code()),
        None => "transport".to_owned(),
    }
}

/// The running clients.
#[derive(Debug)]
pub(crate) struct Workload {
    pub(crate) records: Arc<Records>,
    durable_stop: CancellationToken,
    core_stop: CancellationToken,
    stop: CancellationToken,
    tasks: JoinSet<()>,
    clients: Vec<Client>,
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let options = ClientOptions::new(url).connect_timeout(Duration::from_secs(2));
    Ok(Client::connect(options).await?)
}

impl Workload {
    /// Connects to every instance and starts every client.
    pub(crate) async fn start(urls: &[String], start: Instant) -> anyhow::Result<Self> {
        let mut clients = Vec::new();
        for url in urls {
            clients.push(connect(url).await?);
        }
        let n = clients.len();
        // Two subscribers of the ticks, on the first and the last instance.
        let subscribers = [0, n - 1];
        let records = Arc::new(Records::new(start, subscribers.len()));
        let stop = CancellationToken::new();
        let durable_stop = stop.child_token();
        let core_stop = stop.child_token();
        let mut tasks = JoinSet::new();

        for key in 0..PUBLISHERS {
            tasks.spawn(durable_publisher(key, clients.clone(), records.clone(), durable_stop.clone()));
        }
        for client in &clients {
            tasks.spawn(worker(client.clone(), records.clone(), stop.clone()));
        }
        for (index, at) in subscribers.into_iter().enumerate() {
            let subscription = clients[at].subscribe(SubscribeOptions::new([TICKS])).await?;
            tasks.spawn(tick_subscriber(index, subscription, records.clone(), stop.clone()));
        }
        let listener = tokio::net::TcpListener::bind((crate::net::CLIENT.ip, crate::fleet::PUSH_PORT)).await?;
        tasks.spawn(push_endpoint(listener, records.clone(), stop.clone()));
        for (member, at) in [0, 1 % n].into_iter().enumerate() {
            let subscription = clients[at].subscribe(SubscribeOptions::new([JOBS]).group(GROUP)).await?;
            tasks.spawn(group_member(member, subscription, records.clone(), stop.clone()));
        }
        tasks.spawn(core_publisher(TICKS, clients.clone(), records.clone(), core_stop.clone()));
        tasks.spawn(core_publisher(JOBS, clients.clone(), records.clone(), core_stop.clone()));
        Ok(Self { records, durable_stop, core_stop, stop, tasks, clients })
    }

    /// Stops the durable publishers (an event still being retried stays unknown).
    pub(crate) fn stop_publishing(&self) {
        self.durable_stop.cancel();
    }

    /// Whether both durable consumers have nothing left to deliver, as the first
    /// instance that answers sees them.
    pub(crate) async fn drained(&self) -> bool {
        for client in &self.clients {
            let mut left = Vec::new();
            for name in [CONSUMER, PUSH_CONSUMER] {
                match tokio::time::timeout(Duration::from_secs(1), client.consumer(name)).await {
                    Ok(Ok(info)) => left.push(info.pending + info.in_flight),
                    _ => break,
                }
            }
            if left.len() == 2 {
                return left.iter().all(|n| *n == 0);
            }
        }
        false
    }

    /// Stops every client: the core publishers first, and the subscribers once each
    /// has the last tick answered OK and the group the last job (or after 5 s), so
    /// that an event published just before is not counted as lost.
    pub(crate) async fn stop(mut self) -> Arc<Records> {
        self.core_stop.cancel();
        let records = &self.records;
        let caught_up = || {
            let last_tick = lock(&records.ticks_ok).last().map(|(seq, _)| *seq);
            let last_job = lock(&records.jobs_ok).last().map(|(seq, _)| *seq);
            let ticks = records.tick_items.iter().all(|items| {
                last_tick.is_none_or(|last| {
                    lock(items).iter().any(|item| matches!(item, TickItem::Event { seq, .. } if *seq >= last))
                })
            });
            let jobs = last_job.is_none_or(|last| lock(&records.jobs_received).iter().any(|(seq, _, _)| *seq >= last));
            ticks && jobs
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !caught_up() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.cancel();
        let deadline = tokio::time::sleep(Duration::from_secs(15));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = self.tasks.join_next() => if next.is_none() { break },
                () = &mut deadline => { self.tasks.abort_all(); break }
            }
        }
        self.records
    }
}

async fn durable_publisher(key: u32, clients: Vec<Client>, records: Arc<Records>, stop: CancellationToken) {
    let channel = format!("faults.orders.{key}");
    let ordering_key = format!("k{key}");
    let mut target = key as usize % clients.len();
    for seq in 0.. {
        if stop.is_cancelled() {
            return;
        }
        let payload = format!("{key}:{seq}");
        let idempotency_key = format!("faults-{key}-{seq}");
        let at = records.now();
        let answer = loop {
            let publish = clients[target]
                .publish(channel.clone(), payload.clone().into_bytes())
                .ordering_key(ordering_key.clone())
                .idempotency_key(idempotency_key.clone())
                .send();
            match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
                Ok(Ok(response)) => {
                    break Answer::Ok { captured: response.captured_count, duplicate: response.duplicate };
                }
                Ok(Err(err)) => records.error(error_kind(&err)),
                Err(_) => records.error("timeout".to_owned()),
            }
            target = (target + 1) % clients.len();
            if stop.is_cancelled() {
                break Answer::Unknown;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        lock(&records.published).push(Published { key, seq, at, answer });
        if answer == Answer::Unknown {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parses a durable payload, `key:seq`.
fn parse(payload: &[u8]) -> Option<(u32, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (key, seq) = text.split_once(':')?;
    Some((key.parse().ok()?, seq.parse().ok()?))
}

/// Whether the harness fails this delivery: one first attempt in 16, chosen by
/// sequence number (the same events for the worker and the push endpoint).
fn refused(seq: u64, attempt: u32) -> bool {
    attempt == 1 && (seq.wrapping_mul(2_654_435_761) >> 7).is_multiple_of(16)
}

/// The push consumer's endpoint: records each request, answers 500 to the first
/// attempts the harness fails, 200 to the others.
async fn push_endpoint(listener: tokio::net::TcpListener, records: Arc<Records>, stop: CancellationToken) {
    use axum::http::{HeaderMap, StatusCode};
    let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
        let records = records.clone();
        async move {
            let attempt =
                headers.get("eventbus-attempt").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(1);
            let Some((key, seq)) = parse(&body) else { return StatusCode::BAD_REQUEST };
            let acked = !refused(seq, attempt);
            lock(&records.pushed).push(Delivered { key, seq, at: records.now(), acked });
            if acked { StatusCode::OK } else { StatusCode::INTERNAL_SERVER_ERROR }
        }
    };
    let app = axum::Router::new().route("/push", axum::routing::post(handler));
    if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        eprintln!("faults: the push endpoint stopped: {err}");
    }
}

async fn worker(client: Client, records: Arc<Records>, stop: CancellationToken) {
    let worker = Worker::new(client, CONSUMER).concurrency(8);
    let handler = move |delivery: eventbus_client::Delivery| {
        let records = records.clone();
        async move {
            let Some((key, seq)) = parse(&delivery.event.payload) else {
                return Outcome::term("not a harness payload");
            };
            // Some first attempts fail: the event comes back after the backoff.
            let acked = !refused(seq, delivery.attempt);
            lock(&records.delivered).push(Delivered { key, seq, at: records.now(), acked });
            if acked { Outcome::Ack } else { Outcome::retry("the harness nacks this first attempt") }
        }
    };
    if let Err(err) = worker.run(handler, stop).await {
        eprintln!("faults: worker on {} stopped: {err}", worker.consumer());
    }
}

async fn tick_subscriber(
    index: usize,
    mut subscription: eventbus_client::Subscription,
    records: Arc<Records>,
    stop: CancellationToken,
) {
    loop {
        let item = tokio::select! {
            item = subscription.next() => item,
            () = stop.cancelled() => return,
        };
        let at = records.now();
        let recorded = match item {
            Some(Ok(SubscriptionItem::Events(events))) => {
                events.iter().filter_map(|e| tick_seq(&e.payload)).map(|seq| TickItem::Event { seq, at }).collect()
            }
            Some(Ok(SubscriptionItem::Gap { .. })) => vec![TickItem::Gap],
            Some(Ok(SubscriptionItem::Started { recovered, .. })) => vec![TickItem::Started { recovered }],
            Some(Ok(_)) => vec![],
            Some(Err(err)) => {
                eprintln!("faults: tick subscriber {index} ended: {err}");
                return;
            }
            None => return,
        };
        lock(&records.tick_items[index]).extend(recorded);
    }
}

fn tick_seq(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload).ok()?.parse().ok()
}

async fn group_member(
    member: usize,
    mut subscription: eventbus_client::Subscription,
    records: Arc<Records>,
    stop: CancellationToken,
) {
    loop {
        let item = tokio::select! {
            item = subscription.next() => item,
            () = stop.cancelled() => return,
        };
        match item {
            Some(Ok(SubscriptionItem::Events(events))) => {
                let at = records.now();
                let mut received = lock(&records.jobs_received);
                received.extend(events.iter().filter_map(|e| tick_seq(&e.payload)).map(|seq| (seq, member, at)));
            }
            Some(Ok(_)) => {}
            Some(Err(err)) => {
                eprintln!("faults: group member {member} ended: {err}");
                return;
            }
            None => return,
        }
    }
}

/// Publishes 1, 2, 3… on a core channel, about 100 a second, moving to the next
/// instance after a failure; records those answered OK.
async fn core_publisher(channel: &'static str, clients: Vec<Client>, records: Arc<Records>, stop: CancellationToken) {
    let mut target = clients.len() - 1;
    for seq in 1u64.. {
        if stop.is_cancelled() {
            return;
        }
        let publish = clients[target].publish(channel, seq.to_string().into_bytes()).send();
        match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
            Ok(Ok(_)) => {
                let list = if channel == TICKS { &records.ticks_ok } else { &records.jobs_ok };
                lock(list).push((seq, records.now()));
            }
            Ok(Err(_)) | Err(_) => target = (target + 1) % clients.len(),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
