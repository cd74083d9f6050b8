//! Access control at the edge (docs/security.md): who is calling ([`Caller`], decided
//! once per gRPC call or HTTP request by the same [`Access::authenticate`]), what each
//! operation needs ([`Operation`]), and the streams that stay open on a right: on
//! reload each is checked again and ended with `PERMISSION_DENIED` when its principal
//! lost the right it uses, the others untouched.
//!
//! Every refusal is counted (`auth_failures_total{reason}`,
//! `permission_denied_total{operation}`) and logged, rate-limited, with the principal
//! and the operation: never the credential.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use eventbus_auth::{AuthError, AuthFailure, Authenticator, Principal, RateLimiter};
use eventbus_core::durable::DurableBackend;
use futures::{Stream, StreamExt, stream};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use eventbus_core::durable::ConsumerConfig;

use crate::listener::PeerInfo;
use crate::metrics::EdgeCounters;
use crate::ops::{Refusal, Withdrawn};

/// What a request needs a right for; the `operation` label of
/// `permission_denied_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Publish,
    Subscribe,
    /// Attaching to a durable consumer (`Consume`).
    Consume,
    /// Creating or deleting a durable consumer.
    ManageConsumers,
    /// Reading a durable consumer's state or log.
    ReadConsumer,
    /// Closing a subscription: its owner or an admin.
    Unsubscribe,
    /// Every other admin call.
    Admin,
    /// Limits: `max_subscriptions`, `max_publish_rate`.
    Limit,
}

impl Operation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Publish => "publish",
            Self::Subscribe => "subscribe",
            Self::Consume => "consume",
            Self::ManageConsumers => "manage_consumers",
            Self::ReadConsumer => "read_consumer",
            Self::Unsubscribe => "unsubscribe",
            Self::Admin => "admin",
            Self::Limit => "limit",
        }
    }
}

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    principal: Arc<Principal>,
    /// Kept (in memory only) so an open stream can be checked again on reload.
    credential: Credential,
    limiter: Option<Arc<RateLimiter>>,
}

#[derive(Clone, Default)]
struct Credential {
    bearer: Option<Arc<str>>,
    cert_subjects: Arc<[String]>,
}

impl std::fmt::Debug for Credential {
    /// Never prints the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("cert_subjects", &self.cert_subjects)
            .finish()
    }
}

impl Caller {
    pub(crate) fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The principal's name: the `owner` of what it creates ("" with auth off).
    pub(crate) fn name(&self) -> &str {
        &self.principal.name
    }
}

/// Access control for both protocols. A cheap handle.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    inner: Arc<Inner>,
}

/// Bounds on durable consumers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConsumerLimits {
    /// Consumers a principal without `max_consumers` may own (0 = no bound).
    pub(crate) per_principal: u32,
    /// Consumers on the broker (0 = no bound).
    pub(crate) broker: usize,
    /// Bytes a principal without `max_queued_bytes` may have queued (0 = no bound).
    pub(crate) queued_bytes: u64,
    /// Open subscriptions of a principal without `max_subscriptions` (0 = no bound).
    pub(crate) subscriptions: u32,
}

#[derive(Debug)]
struct Inner {
    auth: Authenticator,
    limits: ConsumerLimits,
    counters: EdgeCounters,
    log: RefusalLog,
    streams: Mutex<Streams>,
    next_stream: AtomicU64,
    /// Bumped by every reload that changed the principals: an open publish stream
    /// refreshes its caller when it sees a new value (one atomic load per chunk).
    generation: AtomicU64,
    /// Told of every reload, for what acts on a principal's behalf without a stream
    /// of its own (push consumers).
    reloads: tokio::sync::watch::Sender<u64>,
    anonymous: Caller,
}

impl Access {
    pub(crate) fn new(auth: Authenticator, counters: EdgeCounters, limits: ConsumerLimits) -> Self {
        let anonymous = Caller { principal: Principal::anonymous(), credential: Credential::default(), limiter: None };
        Self {
            inner: Arc::new(Inner {
                auth,
                limits,
                counters,
                log: RefusalLog::default(),
                streams: Mutex::new(Streams::default()),
                next_stream: AtomicU64::new(1),
                generation: AtomicU64::new(0),
                reloads: tokio::sync::watch::Sender::new(0),
                anonymous,
            }),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.inner.auth.enabled()
    }

    /// A session token with `caller`'s name and rights (docs/web.md), accepted while
    /// the credential `caller` used is; `None` with authentication off.
    pub(crate) fn mint_session(
        &self,
        caller: &Caller,
        ttl: Option<std::time::Duration>,
    ) -> Option<(String, std::time::SystemTime)> {
        let credential = &caller.credential;
        self.inner.auth.mint_session(&caller.principal, credential.bearer.as_deref(), &credential.cert_subjects, ttl)
    }

    pub(crate) fn protect_metrics(&self) -> bool {
        self.inner.auth.enabled() && self.inner.auth.protect_metrics()
    }

    /// Who sent a request with this `authorization` value (`None`: no such header)
    /// over a connection from `peer`. With auth off, everyone is the anonymous caller
    /// with every right. A request with the header `repeated` is refused: which of two
    /// credentials counts is not for a proxy and the broker to disagree on.
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        repeated: bool,
        peer: Option<&PeerInfo>,
    ) -> Result<Caller, Refusal> {
        if !self.inner.auth.enabled() {
            return Ok(self.inner.anonymous.clone());
        }
        if repeated {
            return Err(self.unauthenticated(AuthFailure::Malformed, peer));
        }
        let bearer = match authorization {
            None => None,
            Some(value) => match bearer_token(value) {
                Some(token) => Some(token),
                None => return Err(self.unauthenticated(AuthFailure::Malformed, peer)),
            },
        };
        let cert_subjects: Arc<[String]> = peer.map(|p| p.cert_subjects.clone()).unwrap_or_else(|| Arc::new([]));
        match self.inner.auth.authenticate(bearer, &cert_subjects) {
            Ok(principal) => {
                let limiter = self.inner.auth.rate_limiter(&principal);
                let credential = Credential { bearer: bearer.map(Arc::from), cert_subjects };
                Ok(Caller { principal, credential, limiter })
            }
            Err(failure) => Err(self.unauthenticated(failure, peer)),
        }
    }

    fn unauthenticated(&self, failure: AuthFailure, peer: Option<&PeerInfo>) -> Refusal {
        self.inner.counters.auth_failures.with_label_values(&[failure.reason()]).inc();
        if self.inner.log.admit() {
            let peer = peer.map(|p| p.addr.to_string()).unwrap_or_default();
            warn!(reason = failure.reason(), %peer, "request refused: {failure}");
        }
        Refusal::Unauthenticated(failure.to_string())
    }

    /// Refuses `operation` unless `allowed`; `what` names what was refused (a channel,
    /// a consumer), never a credential.
    pub(crate) fn require(
        &self,
        caller: &Caller,
        operation: Operation,
        allowed: bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), Refusal> {
        if allowed { Ok(()) } else { Err(self.denied(caller, operation, what())) }
    }

    pub(crate) fn denied(&self, caller: &Caller, operation: Operation, what: String) -> Refusal {
        self.count_denied(caller.name(), operation, &what);
        Refusal::PermissionDenied { principal: caller.name().to_owned(), operation: operation.as_str(), what }
    }

    fn count_denied(&self, principal: &str, operation: Operation, what: &str) {
        self.inner.counters.permission_denied.with_label_values(&[operation.as_str()]).inc();
        if self.inner.log.admit() {
            warn!(principal, operation = operation.as_str(), what, "request refused: permission denied");
        }
    }

    /// Publish: a right for every channel, then room in the principal's rate.
    pub(crate) fn check_publish<'a>(
        &self,
        caller: &Caller,
        channels: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Refusal> {
        if !self.inner.auth.enabled() {
            return Ok(()); // The anonymous caller has every right: nothing to look at per event.
        }
        let mut count = 0u32;
        for channel in channels {
            count = count.saturating_add(1);
            self.check_publish_right(caller, channel)?;
        }
        self.take_publish_rate(caller, count)
    }

    /// One event of a batch: the right to publish on `channel` (the rate is taken for
    /// the whole batch by [`Access::take_publish_rate`]).
    pub(crate) fn check_publish_right(&self, caller: &Caller, channel: &str) -> Result<(), Refusal> {
        if !self.inner.auth.enabled() {
            return Ok(());
        }
        // An invalid channel is the bus's to refuse (INVALID_ARGUMENT, naming the
        // problem): a right cannot be judged on it.
        if !caller.principal.permissions.can_publish(channel) && eventbus_core::name::validate_channel(channel).is_ok()
        {
            return Err(self.denied(caller, Operation::Publish, format!("channel {}", eventbus_core::quoted(channel))));
        }
        Ok(())
    }

    /// Room for `count` events in the principal's `max_publish_rate`, taken all at once
    /// or not at all.
    pub(crate) fn take_publish_rate(&self, caller: &Caller, count: u32) -> Result<(), Refusal> {
        if let Some(limiter) = &caller.limiter
            && !limiter.try_acquire(count)
        {
            self.count_denied(caller.name(), Operation::Limit, "max_publish_rate");
            return Err(Refusal::OverLimit { principal: caller.name().to_owned(), limit: "max_publish_rate" });
        }
        Ok(())
    }

    /// Subscribe (and a consumer's channels): each filter covered by an allow and
    /// overlapping no deny.
    pub(crate) fn check_subscribe<S: AsRef<str>>(&self, caller: &Caller, filters: &[S]) -> Result<(), Refusal> {
        if !self.inner.auth.enabled() {
            return Ok(());
        }
        for filter in filters {
            // An invalid filter is the bus's (or the engine's) to refuse with
            // INVALID_ARGUMENT naming the problem.
            if eventbus_core::Pattern::parse(filter.as_ref()).is_err() {
                continue;
            }
            if let Err(refusal) = caller.principal.permissions.check_subscribe(filter.as_ref()) {
                return Err(self.denied(caller, Operation::Subscribe, refusal.to_string()));
            }
        }
        Ok(())
    }

    /// Unsubscribe: the subscription's owner or an admin. An unknown id passes, for the
    /// bus to answer NOT_FOUND.
    pub(crate) fn check_unsubscribe(&self, bus: &eventbus_core::Bus, caller: &Caller, id: &str) -> Result<(), Refusal> {
        if caller.principal.permissions.is_admin() {
            return Ok(());
        }
        let owner = bus.subscription_owner(id);
        let allowed = owner.is_none_or(|owner| owner == caller.name());
        self.require(caller, Operation::Unsubscribe, allowed, || {
            format!("subscription {} of another principal", eventbus_core::quoted(id))
        })
    }

    /// Creating a consumer: the right to manage it, to subscribe to its channels, and to
    /// publish on the dead-letter channel it names (its dead letters carry payloads the
    /// creator chose, so that channel is one it publishes to). The default, `dlq.` and
    /// the event's channel, is the broker's own: it needs no right (docs/security.md).
    pub(crate) fn check_create_consumer(&self, caller: &Caller, config: &ConsumerConfig) -> Result<(), Refusal> {
        self.check_manage_consumer(caller, &config.name)?;
        self.check_subscribe(caller, &config.channels)?;
        match config.dead_letter_channel.as_deref().filter(|c| !c.is_empty()) {
            Some(channel) => self.check_publish_right(caller, channel),
            None => Ok(()),
        }
    }

    /// The most bytes `caller`'s subscriptions may hold queued together (0 = no bound of
    /// its own: authentication off, or none configured).
    pub(crate) fn max_queued_bytes(&self, caller: &Caller) -> usize {
        if !self.inner.auth.enabled() {
            return 0;
        }
        let max = caller.principal.permissions.permissions().max_queued_bytes.unwrap_or(self.inner.limits.queued_bytes);
        usize::try_from(max).unwrap_or(usize::MAX)
    }

    /// Room for one more consumer named `name`: under the broker's `durable.max_consumers`
    /// and, with authentication on, the caller's `max_consumers` (or
    /// `auth.default_max_consumers`). A consumer that exists already takes no room.
    pub(crate) async fn check_consumer_room(
        &self,
        durable: &dyn DurableBackend,
        caller: &Caller,
        name: &str,
    ) -> Result<(), Refusal> {
        let ConsumerLimits { per_principal, broker, .. } = self.inner.limits;
        let own_limit = match self.inner.auth.enabled() {
            true => caller.principal.permissions.permissions().max_consumers.unwrap_or(per_principal) as usize,
            false => 0,
        };
        if broker == 0 && own_limit == 0 {
            return Ok(());
        }
        let consumers = durable.list_consumers().await?;
        if consumers.iter().any(|c| c.config.name == name) {
            return Ok(());
        }
        let over = |limit: &'static str| {
            self.count_denied(caller.name(), Operation::Limit, limit);
            Refusal::OverLimit { principal: caller.name().to_owned(), limit }
        };
        if broker != 0 && consumers.len() >= broker {
            return Err(over("durable.max_consumers"));
        }
        let owned = consumers.iter().filter(|c| c.config.owner == caller.name()).count();
        if own_limit != 0 && owned >= own_limit {
            return Err(over("max_consumers"));
        }
        Ok(())
    }

    /// Deleting (or creating) a consumer.
    pub(crate) fn check_manage_consumer(&self, caller: &Caller, name: &str) -> Result<(), Refusal> {
        let allowed = caller.principal.permissions.can_manage(name);
        self.require(caller, Operation::ManageConsumers, allowed, || {
            format!("consumer {}", eventbus_core::quoted(name))
        })
    }

    /// Attaching to a consumer (`Consume`).
    pub(crate) fn check_attach(&self, caller: &Caller, name: &str) -> Result<(), Refusal> {
        let allowed = caller.principal.permissions.can_attach(name);
        self.require(caller, Operation::Consume, allowed, || format!("consumer {}", eventbus_core::quoted(name)))
    }

    /// Reading a consumer's state or log: admins, and whoever may attach to it or
    /// manage it.
    pub(crate) fn may_read_consumer(&self, caller: &Caller, name: &str) -> bool {
        let p = &caller.principal.permissions;
        p.is_admin() || p.can_attach(name) || p.can_manage(name)
    }

    pub(crate) fn check_read_consumer(&self, caller: &Caller, name: &str) -> Result<(), Refusal> {
        let allowed = self.may_read_consumer(caller, name);
        self.require(caller, Operation::ReadConsumer, allowed, || format!("consumer {}", eventbus_core::quoted(name)))
    }

    /// Records an open stream that uses a right, so a reload can end it when the right
    /// (or the principal) is gone, and its credential's expiry ends it; a subscription
    /// also counts against `max_subscriptions`.
    pub(crate) fn open_stream(&self, caller: &Caller, uses: StreamUse) -> Result<StreamGuard, Refusal> {
        let end = CancellationToken::new();
        let why = Arc::new(OnceLock::new());
        let closed = CancellationToken::new();
        if !self.inner.auth.enabled() {
            // Nothing can be withdrawn, nothing is limited: no bookkeeping.
            return Ok(StreamGuard { access: self.clone(), id: None, end, why, _closed: closed.drop_guard() });
        }
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut streams = self.inner.streams.lock();
        // Subscriptions and Consume streams alike hold a queue: both count.
        if let StreamUse::Subscribe(_) | StreamUse::Consume(_) = &uses {
            let open = streams.subscriptions.get(caller.name()).copied().unwrap_or(0);
            let default = self.inner.limits.subscriptions;
            let max = caller.principal.permissions.permissions().max_subscriptions;
            if let Some(max) = max.or((default > 0).then_some(default))
                && open >= max
            {
                drop(streams);
                self.count_denied(caller.name(), Operation::Limit, "max_subscriptions");
                return Err(Refusal::OverLimit { principal: caller.name().to_owned(), limit: "max_subscriptions" });
            }
            *streams.subscriptions.entry(caller.name().to_owned()).or_default() += 1;
        }
        streams.open.insert(id, OpenStream { caller: caller.clone(), uses, end: end.clone(), why: why.clone() });
        drop(streams);
        if let Some(at) = caller.principal.expires_at {
            self.end_at_expiry(caller, at, end.clone(), why.clone(), closed.clone());
        }
        Ok(StreamGuard { access: self.clone(), id: Some(id), end, why, _closed: closed.drop_guard() })
    }

    /// Ends a stream when its credential expires (a timer, not a poll): a JWT's stream
    /// lives no longer than the JWT. The timer goes with the stream.
    fn end_at_expiry(
        &self,
        caller: &Caller,
        at: std::time::SystemTime,
        end: CancellationToken,
        why: Arc<OnceLock<Withdrawn>>,
        closed: CancellationToken,
    ) {
        let counters = self.inner.counters.clone();
        let principal = caller.name().to_owned();
        let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
        tokio::spawn(async move {
            tokio::select! {
                () = closed.cancelled() => {}
                () = tokio::time::sleep(left) => {
                    counters.auth_failures.with_label_values(&[AuthFailure::Expired.reason()]).inc();
                    info!(%principal, "stream ended: its credential expired");
                    if why.set(Withdrawn::Credential("the credential expired".into())).is_ok() {
                        end.cancel();
                    }
                }
            }
        });
    }

    /// The stream `id`'s caller as the last reload left it; `None` once it is closed.
    fn current_caller(&self, id: u64) -> Option<Caller> {
        self.inner.streams.lock().open.get(&id).map(|s| s.caller.clone())
    }

    /// Re-reads the principals file and JWT keys; on success checks every open stream
    /// again. On error the previous configuration stays (the caller logs it).
    pub(crate) fn reload(&self) -> Result<usize, AuthError> {
        if !self.inner.auth.enabled() {
            return Ok(0);
        }
        self.inner.auth.reload()?;
        let mut streams = self.inner.streams.lock();
        let mut ended = 0;
        for stream in streams.open.values_mut() {
            let Some(why) = self.recheck(stream) else { continue };
            if stream.why.set(why).is_ok() {
                stream.end.cancel();
                ended += 1;
            }
        }
        drop(streams);
        let generation = self.inner.generation.fetch_add(1, Ordering::Release) + 1;
        self.inner.reloads.send_replace(generation);
        Ok(ended)
    }

    /// Changes with every reload of the principals.
    pub(crate) fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.reloads.subscribe()
    }

    /// Why `owner` may not receive the events of a consumer of `channels` now, if it
    /// may not: it is no longer a principal, or lost the right to subscribe to one of
    /// them. What the broker does on a principal's behalf (a push consumer) is judged
    /// as an open stream of that principal is. With authentication off, for a
    /// consumer of the broker's own (no owner: declared in the configuration or
    /// created with authentication off) and for a JWT subject (whose rights exist
    /// only in its tokens), nothing is withdrawn.
    pub(crate) fn owner_refusal(&self, owner: &str, channels: &[String]) -> Option<String> {
        if !self.inner.auth.enabled() || owner.is_empty() || owner.starts_with(eventbus_auth::JWT_PREFIX) {
            return None;
        }
        let Some(principal) = self.inner.auth.principal_named(owner) else {
            return Some(format!("its owner {} is no longer a principal", eventbus_core::quoted(owner)));
        };
        let refused = channels.iter().find_map(|c| principal.permissions.check_subscribe(c).err())?;
        Some(format!("its owner {} lost a right: {refused}", eventbus_core::quoted(owner)))
    }

    /// Why `stream` may no longer stay open, if it may not; else the stream goes on as
    /// the principal its credential names now (with its current rights and limits).
    fn recheck(&self, stream: &mut OpenStream) -> Option<Withdrawn> {
        let credential = &stream.caller.credential;
        let principal = match self.inner.auth.authenticate(credential.bearer.as_deref(), &credential.cert_subjects) {
            Ok(principal) => principal,
            Err(failure) => {
                self.inner.counters.auth_failures.with_label_values(&[failure.reason()]).inc();
                return Some(Withdrawn::Credential(format!("credentials no longer accepted: {failure}")));
            }
        };
        stream.caller = Caller {
            limiter: self.inner.auth.rate_limiter(&principal),
            principal: Arc::clone(&principal),
            credential: stream.caller.credential.clone(),
        };
        let (operation, what) = match &stream.uses {
            // Each publish is checked against the refreshed caller.
            StreamUse::Publish => return None,
            StreamUse::Subscribe(filters) => {
                let refused = filters.iter().find_map(|f| principal.permissions.check_subscribe(f).err())?;
                (Operation::Subscribe, refused.to_string())
            }
            StreamUse::Consume(consumer) => {
                if principal.permissions.can_attach(consumer) {
                    return None;
                }
                (Operation::Consume, format!("consumer {}", eventbus_core::quoted(consumer)))
            }
        };
        self.count_denied(&principal.name, operation, &what);
        info!(principal = %principal.name, operation = operation.as_str(), what, "stream ended: right withdrawn");
        Some(Withdrawn::Right(format!(
            "principal {:?} lost the right to {} ({what})",
            principal.name,
            operation.as_str()
        )))
    }

    fn close_stream(&self, id: u64) {
        let mut streams = self.inner.streams.lock();
        if let Some(stream) = streams.open.remove(&id)
            && let StreamUse::Subscribe(_) | StreamUse::Consume(_) = stream.uses
            && let Some(open) = streams.subscriptions.get_mut(stream.caller.name())
        {
            *open -= 1;
            if *open == 0 {
                streams.subscriptions.remove(stream.caller.name());
            }
        }
    }
}

/// The token of an `authorization` value: `Bearer <token>` (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The right an open stream lives on.
#[derive(Debug, Clone)]
pub(crate) enum StreamUse {
    /// Its filters.
    Subscribe(Vec<String>),
    /// Its consumer's name.
    Consume(String),
    /// A `PublishStream`: each publish is checked against the principal's rights of the
    /// moment.
    Publish,
}

#[derive(Debug, Default)]
struct Streams {
    open: HashMap<u64, OpenStream>,
    /// Open Subscribe and Consume streams per principal, for `max_subscriptions`.
    subscriptions: HashMap<String, u32>,
}

#[derive(Debug)]
struct OpenStream {
    caller: Caller,
    uses: StreamUse,
    end: CancellationToken,
    why: Arc<OnceLock<Withdrawn>>,
}

/// An open stream's place in the registry; dropping it removes the stream.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    access: Access,
    /// `None` with authentication off: not registered.
    id: Option<u64>,
    end: CancellationToken,
    why: Arc<OnceLock<Withdrawn>>,
    /// Stops the expiry timer with the stream.
    _closed: tokio_util::sync::DropGuard,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.access.close_stream(id);
        }
    }
}

impl StreamGuard {
    /// What keeps a copy of the stream's caller current across reloads.
    pub(crate) fn watch(&self, caller: Caller) -> CallerWatch {
        let seen = self.access.inner.generation.load(Ordering::Acquire);
        CallerWatch { access: self.access.clone(), id: self.id, seen, caller }
    }

    /// `inner` until it ends, or until a reload withdraws the right it lives on: then
    /// one last item, the error saying why.
    pub(crate) fn guard<T, E, S>(self, inner: S) -> impl Stream<Item = Result<T, E>> + Send + 'static
    where
        T: Send + 'static,
        E: From<Withdrawn> + Send + 'static,
        S: Stream<Item = Result<T, E>> + Send + 'static,
    {
        let end = self.end.clone();
        let last = stream::once(async move {
            let why = self.why.get().cloned();
            drop(self);
            why.map(|why| Err(E::from(why)))
        })
        .filter_map(std::future::ready);
        inner.take_until(end.cancelled_owned()).chain(last)
    }
}

/// An open stream's caller, refreshed after each reload: a stream is judged by the
/// rights its principal has now, not those it had when it opened.
#[derive(Debug)]
pub(crate) struct CallerWatch {
    access: Access,
    id: Option<u64>,
    seen: u64,
    caller: Caller,
}

impl CallerWatch {
    /// The caller as of the last reload (one atomic load when nothing changed).
    pub(crate) fn current(&mut self) -> &Caller {
        if let Some(id) = self.id {
            let now = self.access.inner.generation.load(Ordering::Acquire);
            if now != self.seen {
                self.seen = now;
                if let Some(caller) = self.access.current_caller(id) {
                    self.caller = caller;
                }
            }
        }
        &self.caller
    }
}

/// At most a few refusal lines per second: a client hammering with a bad token must not
/// flood the log (the counters keep the full count).
#[derive(Debug)]
struct RefusalLog {
    window: Mutex<(Instant, u32)>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self { window: Mutex::new((Instant::now(), 0)) }
    }
}

impl RefusalLog {
    const PER_SECOND: u32 = 10;

    fn admit(&self) -> bool {
        let mut window = self.window.lock();
        if window.0.elapsed() >= Duration::from_secs(1) {
            *window = (Instant::now(), 0);
        }
        window.1 += 1;
        window.1 <= Self::PER_SECOND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_values() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer  abc "), Some("abc"));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(&[0xff, 0x20, 0x61]), None);
    }
}
