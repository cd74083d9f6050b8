//! Access control at the edge (README "Security"): who is calling ([`Caller`], decided
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
use futures::{Stream, StreamExt, stream};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

use eventbus_core::durable::ConsumerConfig;

use crate::convert::EdgeError;
use crate::listener::PeerInfo;
use crate::metrics::EdgeCounters;

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

#[derive(Debug)]
struct Inner {
    auth: Authenticator,
    counters: EdgeCounters,
    log: RefusalLog,
    streams: Mutex<Streams>,
    next_stream: AtomicU64,
    anonymous: Caller,
}

impl Access {
    pub(crate) fn new(auth: Authenticator, counters: EdgeCounters) -> Self {
        let anonymous = Caller { principal: Principal::anonymous(), credential: Credential::default(), limiter: None };
        Self {
            inner: Arc::new(Inner {
                auth,
                counters,
                log: RefusalLog::default(),
                streams: Mutex::new(Streams::default()),
                next_stream: AtomicU64::new(1),
                anonymous,
            }),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.inner.auth.enabled()
    }

    pub(crate) fn protect_metrics(&self) -> bool {
        self.inner.auth.enabled() && self.inner.auth.protect_metrics()
    }

    /// Who sent a request with this `authorization` value (`None`: no such header)
    /// over a connection from `peer`. With auth off, everyone is the anonymous caller
    /// with every right.
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        peer: Option<&PeerInfo>,
    ) -> Result<Caller, EdgeError> {
        if !self.inner.auth.enabled() {
            return Ok(self.inner.anonymous.clone());
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

    fn unauthenticated(&self, failure: AuthFailure, peer: Option<&PeerInfo>) -> EdgeError {
        self.inner.counters.auth_failures.with_label_values(&[failure.reason()]).inc();
        if self.inner.log.admit() {
            let peer = peer.map(|p| p.addr.to_string()).unwrap_or_default();
            warn!(reason = failure.reason(), %peer, "request refused: {failure}");
        }
        EdgeError::Unauthenticated(failure.to_string())
    }

    /// Refuses `operation` unless `allowed`; `what` names what was refused (a channel,
    /// a consumer), never a credential.
    pub(crate) fn require(
        &self,
        caller: &Caller,
        operation: Operation,
        allowed: bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), EdgeError> {
        if allowed { Ok(()) } else { Err(self.denied(caller, operation, what())) }
    }

    pub(crate) fn denied(&self, caller: &Caller, operation: Operation, what: String) -> EdgeError {
        self.count_denied(caller.name(), operation, &what);
        EdgeError::PermissionDenied { principal: caller.name().to_owned(), operation: operation.as_str(), what }
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
    ) -> Result<(), EdgeError> {
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
    pub(crate) fn check_publish_right(&self, caller: &Caller, channel: &str) -> Result<(), EdgeError> {
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
    pub(crate) fn take_publish_rate(&self, caller: &Caller, count: u32) -> Result<(), EdgeError> {
        if let Some(limiter) = &caller.limiter
            && !limiter.try_acquire(count)
        {
            self.count_denied(caller.name(), Operation::Limit, "max_publish_rate");
            return Err(EdgeError::OverLimit { principal: caller.name().to_owned(), limit: "max_publish_rate" });
        }
        Ok(())
    }

    /// Subscribe (and a consumer's channels): each filter covered by an allow and
    /// overlapping no deny.
    pub(crate) fn check_subscribe<S: AsRef<str>>(&self, caller: &Caller, filters: &[S]) -> Result<(), EdgeError> {
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
    pub(crate) fn check_unsubscribe(
        &self,
        bus: &eventbus_core::Bus,
        caller: &Caller,
        id: &str,
    ) -> Result<(), EdgeError> {
        if caller.principal.permissions.is_admin() {
            return Ok(());
        }
        let owner = bus.subscription_owner(id);
        let allowed = owner.is_none_or(|owner| owner == caller.name());
        self.require(caller, Operation::Unsubscribe, allowed, || {
            format!("subscription {} of another principal", eventbus_core::quoted(id))
        })
    }

    /// Creating a consumer: the right to manage it, and to subscribe to its channels.
    pub(crate) fn check_create_consumer(&self, caller: &Caller, config: &ConsumerConfig) -> Result<(), EdgeError> {
        self.check_manage_consumer(caller, &config.name)?;
        self.check_subscribe(caller, &config.channels)
    }

    /// Deleting (or creating) a consumer.
    pub(crate) fn check_manage_consumer(&self, caller: &Caller, name: &str) -> Result<(), EdgeError> {
        let allowed = caller.principal.permissions.can_manage(name);
        self.require(caller, Operation::ManageConsumers, allowed, || {
            format!("consumer {}", eventbus_core::quoted(name))
        })
    }

    /// Attaching to a consumer (`Consume`).
    pub(crate) fn check_attach(&self, caller: &Caller, name: &str) -> Result<(), EdgeError> {
        let allowed = caller.principal.permissions.can_attach(name);
        self.require(caller, Operation::Consume, allowed, || format!("consumer {}", eventbus_core::quoted(name)))
    }

    /// Reading a consumer's state or log: admins, and whoever may attach to it or
    /// manage it.
    pub(crate) fn may_read_consumer(&self, caller: &Caller, name: &str) -> bool {
        let p = &caller.principal.permissions;
        p.is_admin() || p.can_attach(name) || p.can_manage(name)
    }

    pub(crate) fn check_read_consumer(&self, caller: &Caller, name: &str) -> Result<(), EdgeError> {
        let allowed = self.may_read_consumer(caller, name);
        self.require(caller, Operation::ReadConsumer, allowed, || format!("consumer {}", eventbus_core::quoted(name)))
    }

    /// Records an open stream that uses a right, so a reload can end it when the right
    /// is gone; a subscription also counts against `max_subscriptions`.
    pub(crate) fn open_stream(&self, caller: &Caller, uses: StreamUse) -> Result<StreamGuard, EdgeError> {
        let end = CancellationToken::new();
        let why = Arc::new(OnceLock::new());
        if !self.inner.auth.enabled() {
            // Nothing can be withdrawn, nothing is limited: no bookkeeping.
            return Ok(StreamGuard { access: self.clone(), id: None, end, why });
        }
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut streams = self.inner.streams.lock();
        if let StreamUse::Subscribe(_) = &uses {
            let open = streams.subscriptions.get(caller.name()).copied().unwrap_or(0);
            if let Some(max) = caller.principal.permissions.permissions().max_subscriptions
                && open >= max
            {
                drop(streams);
                self.count_denied(caller.name(), Operation::Limit, "max_subscriptions");
                return Err(EdgeError::OverLimit { principal: caller.name().to_owned(), limit: "max_subscriptions" });
            }
            *streams.subscriptions.entry(caller.name().to_owned()).or_default() += 1;
        }
        streams.open.insert(id, OpenStream { caller: caller.clone(), uses, end: end.clone(), why: why.clone() });
        Ok(StreamGuard { access: self.clone(), id: Some(id), end, why })
    }

    /// Re-reads the principals file and JWT keys; on success checks every open stream
    /// again. On error the previous configuration stays (the caller logs it).
    pub(crate) fn reload(&self) -> Result<usize, AuthError> {
        if !self.inner.auth.enabled() {
            return Ok(0);
        }
        self.inner.auth.reload()?;
        let streams = self.inner.streams.lock();
        let mut ended = 0;
        for stream in streams.open.values() {
            let Some(status) = self.recheck(stream) else { continue };
            if stream.why.set(status).is_ok() {
                stream.end.cancel();
                ended += 1;
            }
        }
        Ok(ended)
    }

    /// Why `stream` may no longer stay open, if it may not.
    fn recheck(&self, stream: &OpenStream) -> Option<Status> {
        let credential = &stream.caller.credential;
        let principal = match self.inner.auth.authenticate(credential.bearer.as_deref(), &credential.cert_subjects) {
            Ok(principal) => principal,
            Err(failure) => {
                self.inner.counters.auth_failures.with_label_values(&[failure.reason()]).inc();
                return Some(Status::unauthenticated(format!("credentials no longer accepted: {failure}")));
            }
        };
        let (operation, what) = match &stream.uses {
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
        Some(Status::permission_denied(format!(
            "principal {:?} lost the right to {} ({what})",
            principal.name,
            operation.as_str()
        )))
    }

    fn close_stream(&self, id: u64) {
        let mut streams = self.inner.streams.lock();
        if let Some(stream) = streams.open.remove(&id)
            && let StreamUse::Subscribe(_) = stream.uses
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
}

#[derive(Debug, Default)]
struct Streams {
    open: HashMap<u64, OpenStream>,
    /// Open subscriptions per principal, for `max_subscriptions`.
    subscriptions: HashMap<String, u32>,
}

#[derive(Debug)]
struct OpenStream {
    caller: Caller,
    uses: StreamUse,
    end: CancellationToken,
    why: Arc<OnceLock<Status>>,
}

/// An open stream's place in the registry; dropping it removes the stream.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    access: Access,
    /// `None` with authentication off: not registered.
    id: Option<u64>,
    end: CancellationToken,
    why: Arc<OnceLock<Status>>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.access.close_stream(id);
        }
    }
}

impl StreamGuard {
    /// `inner` until it ends, or until a reload withdraws the right it lives on: then
    /// one last item, the status saying why.
    pub(crate) fn guard<T, S>(self, inner: S) -> impl Stream<Item = Result<T, Status>> + Send + 'static
    where
        T: Send + 'static,
        S: Stream<Item = Result<T, Status>> + Send + 'static,
    {
        let end = self.end.clone();
        let last = stream::once(async move {
            let why = self.why.get().cloned();
            drop(self);
            why.map(Err)
        })
        .filter_map(std::future::ready);
        inner.take_until(end.cancelled_owned()).chain(last)
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
