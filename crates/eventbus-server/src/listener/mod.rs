//! Accepting connections for both listeners: TCP accept, `TCP_NODELAY`, the TLS
//! handshake (when on) in its own task under a deadline, then the connection is handed
//! to the gRPC or HTTP server with what is known of its peer ([`PeerInfo`]).
//!
//! Handshakes run beside the accept loop, and a socket takes no handshake slot before
//! its first byte: one that says nothing is closed after [`FIRST_BYTE_TIMEOUT`], and
//! while it waits it sits in a bounded pool of silent sockets ([`Silent`]) from which
//! the oldest is evicted when a newer one needs the room (overall, and per source
//! address). So no number of silent sockets, from one address or many, keeps a fresh
//! client from its handshake. Accept
//! errors (out of file descriptors, say) are logged, counted and backed off instead of
//! retried at once. Each listener serves at most `server.max_connections` connections:
//! past it, a new one is closed at once and counted (docs/operations.md).
//!
//! A connection with no request in progress for `server.idle_timeout_ms` is closed
//! ([`Activity`]): the servers mark each request (a gRPC stream, an HTTP request) from
//! its start to the end of its response, and the connection reads end-of-file once none
//! has been in progress for that long. Bytes alone (pings, a client that sends half a
//! request) do not keep a connection alive.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http;
use futures::task::AtomicWaker;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

mod head;

use self::head::{HeadDeadline, Verdict};
use crate::metrics::EdgeCounters;
use crate::tls::{Protocols, Tls, certificate_subjects};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS client has to send its first byte (the ClientHello follows the TCP
/// handshake at once): far shorter than [`HANDSHAKE_TIMEOUT`], so silent sockets go fast.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes in progress at once per listener; past it, a connection that has spoken
/// waits for a slot (within its handshake deadline).
const MAX_HANDSHAKES: usize = 256;
/// Silent sockets (no first byte yet) kept per listener; a newer one evicts the oldest.
const MAX_SILENT: usize = 1024;
/// Silent sockets kept per source address; a newer one evicts that source's oldest.
const MAX_SILENT_PER_SOURCE: usize = 64;
/// Accepted connections waiting for the server to take them.
const QUEUE: usize = 64;
/// Longest pause after repeated accept errors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Who is at the other end of a connection, as far as the transport can tell.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub addr: SocketAddr,
    /// Names vouched for by a client certificate the server verified (mTLS): its
    /// common names and DNS alternative names. Empty without one.
    pub cert_subjects: Arc<[String]>,
    /// `addr` as text, formatted once per connection: it is every publish's default
    /// source, and `SocketAddr`'s `Display` cost ~1,900 instructions per unary call.
    pub(crate) addr_text: Arc<str>,
    /// Requests in progress on the connection, for its idle timeout.
    pub(crate) activity: Arc<Activity>,
}

impl PeerInfo {
    fn new(addr: SocketAddr, cert_subjects: Arc<[String]>) -> Self {
        Self { addr, cert_subjects, addr_text: addr.to_string().into(), activity: Activity::new() }
    }

    /// The peer's address as text (`ip:port`).
    pub fn addr_text(&self) -> &str {
        &self.addr_text
    }
}

/// The requests in progress on one connection, and since when there has been none: what
/// its idle timeout watches.
#[derive(Debug)]
pub(crate) struct Activity {
    in_progress: AtomicUsize,
    /// When the last request ended (or the connection opened).
    idle_since: parking_lot::Mutex<tokio::time::Instant>,
    /// The connection's reader, woken when the last request ends so that it arms the
    /// idle timer.
    reader: AtomicWaker,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            in_progress: AtomicUsize::new(0),
            idle_since: parking_lot::Mutex::new(tokio::time::Instant::now()),
            reader: AtomicWaker::new(),
        })
    }

    /// Marks a request in progress until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }
}

/// One request in progress on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub(crate) struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        if self.0.in_progress.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock() = tokio::time::Instant::now();
            self.0.reader.wake();
        }
    }
}

/// The idle timer of one connection.
#[derive(Debug)]
struct IdleTimer {
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Once it fired, the connection only reads end-of-file.
    fired: bool,
    closed: prometheus::IntCounter,
}

/// An accepted connection, plain or TLS. Its place under the listener's connection
/// limit is given back when it is dropped (the connection closed).
#[derive(Debug)]
pub(crate) struct Conn {
    io: Io,
    peer: PeerInfo,
    idle: Option<IdleTimer>,
    /// The gRPC listener's deadline for HTTP/1 request headers (`None` once the
    /// connection speaks HTTP/2, and on the HTTP listener, where hyper keeps it).
    head: Option<HeadDeadline>,
    _slot: Slot,
}

/// A place under `server.max_connections`, with the open-connections gauge.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Connections accepted on one listener, ready to serve.
#[derive(Debug)]
pub(crate) struct Incoming {
    rx: mpsc::Receiver<Conn>,
}

impl Incoming {
    /// Starts accepting on `listener` until `stop` is cancelled (or the server drops
    /// this).
    pub(crate) fn start(
        what: &'static str,
        listener: TcpListener,
        tls: Option<(Arc<Tls>, Protocols)>,
        limits: ConnectionLimits,
        counters: EdgeCounters,
        stop: CancellationToken,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let limits = Limits { slots: Arc::new(Semaphore::new(limits.max_connections)), limits };
        tokio::spawn(accept_loop(what, listener, tls, limits, counters, tx, stop));
        Ok(Self { rx })
    }

    pub(crate) async fn next(&mut self) -> Option<Conn> {
        self.rx.recv().await
    }

    /// For tonic's `serve_with_incoming_shutdown`.
    pub(crate) fn into_stream(self) -> impl futures::Stream<Item = io::Result<Conn>> + Send + 'static {
        futures::stream::unfold(self, |mut incoming| async move {
            let conn = incoming.next().await?;
            Some((Ok(conn), incoming))
        })
    }
}

/// What one listener's connections are held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// `server.max_connections`.
    pub(crate) max_connections: usize,
    /// `server.idle_timeout_ms`, unless 0.
    pub(crate) idle_timeout: Option<Duration>,
    /// `server.http.header_read_timeout_ms` for HTTP/1 requests, when the server that
    /// takes the connections does not enforce it itself (see [`head`]).
    pub(crate) header_read_timeout: Option<Duration>,
}

/// The connection limit of one listener, with its slots.
struct Limits {
    slots: Arc<Semaphore>,
    limits: ConnectionLimits,
}

async fn accept_loop(
    what: &'static str,
    listener: TcpListener,
    tls: Option<(Arc<Tls>, Protocols)>,
    limits: Limits,
    counters: EdgeCounters,
    tx: mpsc::Sender<Conn>,
    stop: CancellationToken,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let silent = Arc::new(Silent::default());
    let mut backoff = Duration::ZERO;
    let mut last_warning: Option<Instant> = None;
    let mut unreported = 0u64;
    let mut last_full_warning: Option<Instant> = None;
    let open = counters.connections_open.with_label_values(&[what]);
    let refused = counters.connections_refused.with_label_values(&[what]);
    let idle_closed = counters.connections_idle_closed.with_label_values(&[what]);
    let idle_timer = |timeout| IdleTimer {
        timeout,
        sleep: Box::pin(tokio::time::sleep(timeout)),
        fired: false,
        closed: idle_closed.clone(),
    };
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, addr) = match accepted {
            Ok(accepted) => {
                backoff = Duration::ZERO;
                accepted
            }
            Err(err) => {
                // EMFILE and friends: retrying at once would spin a core while the
                // condition lasts. One warning per 10 s says how many were skipped.
                unreported += 1;
                if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    warn!(listener = what, %err, errors = unreported, "cannot accept connections; backing off");
                    last_warning = Some(Instant::now());
                    unreported = 0;
                }
                counters.accept_errors.with_label_values(&[what]).inc();
                backoff = (backoff * 2).clamp(Duration::from_millis(5), MAX_ACCEPT_BACKOFF);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => continue,
                }
            }
        };
        let Ok(permit) = limits.slots.clone().try_acquire_owned() else {
            // Closed at once (dropped): a client told "no" retries elsewhere or later,
            // one left waiting in the backlog holds a file descriptor for nothing.
            refused.inc();
            if last_full_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                warn!(
                    listener = what,
                    max_connections = limits.limits.max_connections,
                    "connection limit reached: refusing new connections"
                );
                last_full_warning = Some(Instant::now());
            }
            continue;
        };
        open.inc();
        let slot = Slot { _permit: permit, open: open.clone() };
        // Small stream messages must not wait for more: latency over coalescing.
        if let Err(err) = tcp.set_nodelay(true) {
            debug!(%addr, %err, "cannot set TCP_NODELAY; dropping the connection");
            continue;
        }
        let idle = limits.limits.idle_timeout.map(idle_timer);
        let head = limits.limits.header_read_timeout.map(HeadDeadline::new);
        let Some((tls, protocols)) = &tls else {
            let peer = PeerInfo::new(addr, Arc::new([]));
            let conn = Conn { io: Io::Plain(tcp), peer, idle, head, _slot: slot };
            if tx.send(conn).await.is_err() {
                return;
            }
            continue;
        };
        let acceptor = tls.acceptor(*protocols);
        let tx = tx.clone();
        let failures = counters.handshake_failures.with_label_values(&[what]);
        let evicted = counters.handshakes_evicted.with_label_values(&[what]);
        let (handshakes, silent) = (handshakes.clone(), silent.clone());
        tokio::spawn(async move {
            // No handshake slot before the first byte: a silent socket waits in the
            // bounded pool, where a newer one can evict it.
            let (id, kicked) = silent.enter(addr.ip());
            let mut first = [0u8; 1];
            let spoke = tokio::select! {
                () = kicked.cancelled() => None,
                spoke = tokio::time::timeout(FIRST_BYTE_TIMEOUT, tcp.peek(&mut first)) => Some(spoke),
            };
            silent.leave(id, addr.ip());
            match spoke {
                Some(Ok(Ok(n))) if n > 0 => {}
                Some(Ok(_)) => return, // closed, or a read error: nothing to serve
                Some(Err(_)) | None => {
                    debug!(listener = what, %addr, "closed before its TLS handshake: silent too long, or evicted");
                    evicted.inc();
                    return;
                }
            }
            let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
            let handshake = async {
                let _permit = handshakes.acquire_owned().await.map_err(io::Error::other)?;
                acceptor.accept(tcp).await
            };
            let stream = match tokio::time::timeout_at(deadline, handshake).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    debug!(listener = what, %addr, %err, "TLS handshake failed");
                    failures.inc();
                    return;
                }
                Err(_) => {
                    debug!(listener = what, %addr, "TLS handshake timed out");
                    failures.inc();
                    return;
                }
            };
            let subjects = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(certificate_subjects)
                .unwrap_or_default();
            // The idle clock starts once the handshake is done.
            let peer = PeerInfo::new(addr, subjects.into());
            let _ = tx.send(Conn { io: Io::Tls(Box::new(stream)), peer, idle, head, _slot: slot }).await;
        });
    }
}

/// The sockets of one listener that have not sent a byte yet, oldest first, bounded
/// overall and per source address: a newcomer past a bound evicts the oldest (of all,
/// or of its source), which the attacker, not the fresh client, pays for.
#[derive(Debug, Default)]
struct Silent {
    inner: parking_lot::Mutex<SilentInner>,
}

#[derive(Debug, Default)]
struct SilentInner {
    next: u64,
    /// id → (source, what evicts it); ids grow, so the first is the oldest.
    all: std::collections::BTreeMap<u64, (std::net::IpAddr, CancellationToken)>,
    by_source: std::collections::HashMap<std::net::IpAddr, std::collections::BTreeSet<u64>>,
}

impl Silent {
    /// Adds a socket from `source`, evicting the oldest ones past the bounds; the token
    /// is cancelled if this one is evicted in turn.
    fn enter(&self, source: std::net::IpAddr) -> (u64, CancellationToken) {
        let mut s = self.inner.lock();
        let id = s.next;
        s.next += 1;
        let kicked = CancellationToken::new();
        s.all.insert(id, (source, kicked.clone()));
        let mine = s.by_source.entry(source).or_default();
        mine.insert(id);
        let oldest_of_source = (mine.len() > MAX_SILENT_PER_SOURCE).then(|| mine.first().copied()).flatten();
        if let Some(old) = oldest_of_source {
            s.evict(old);
        }
        if s.all.len() > MAX_SILENT
            && let Some(old) = s.all.first_key_value().map(|(id, _)| *id)
        {
            s.evict(old);
        }
        (id, kicked)
    }

    /// The socket `id` spoke, timed out or was evicted.
    fn leave(&self, id: u64, source: std::net::IpAddr) {
        let mut s = self.inner.lock();
        s.all.remove(&id);
        if let Some(mine) = s.by_source.get_mut(&source) {
            mine.remove(&id);
            if mine.is_empty() {
                s.by_source.remove(&source);
            }
        }
    }
}

impl SilentInner {
    fn evict(&mut self, id: u64) {
        if let Some((source, kicked)) = self.all.remove(&id) {
            kicked.cancel();
            if let Some(mine) = self.by_source.get_mut(&source) {
                mine.remove(&id);
                if mine.is_empty() {
                    self.by_source.remove(&source);
                }
            }
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl Conn {
    /// Who is at the other end.
    pub(crate) fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// Whether the idle timeout has expired: no request in progress for that long.
    /// Registers the reader's waker, for the timer and for the end of the last request.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(idle) = &mut self.idle else { return false };
        if idle.fired {
            return true;
        }
        let activity = &self.peer.activity;
        activity.reader.register(cx.waker());
        if activity.in_progress.load(Ordering::Acquire) > 0 {
            return false;
        }
        let deadline = *activity.idle_since.lock() + idle.timeout;
        if idle.sleep.deadline() != deadline {
            idle.sleep.as_mut().reset(deadline);
        }
        if idle.sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        debug!(peer = %self.peer.addr, "closing an idle connection");
        idle.fired = true;
        idle.closed.inc();
        true
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // End-of-file: the server closes the connection as if the client had.
        if this.idle_expired(cx) {
            return Poll::Ready(Ok(()));
        }
        if let Some(head) = &mut this.head {
            head.check(cx, &this.peer.activity)?;
        }
        let before = buf.filled().len();
        let read = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let (Some(head), Poll::Ready(Ok(()))) = (&mut this.head, &read)
            && head.received(cx, &buf.filled()[before..], &this.peer.activity) == Verdict::Done
        {
            this.head = None;
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Marks each request in progress on its connection ([`Activity`]) from its start to
/// the end of its response body (a gRPC stream: until it closes), so a connection with
/// an open stream is never idle. For tonic, which puts the [`PeerInfo`] in each
/// request's extensions.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TrackRequestsLayer;

impl<S> tower_layer::Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests(inner)
    }
}

/// See [`TrackRequestsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct TrackRequests<S>(S);

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for TrackRequests<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<Tracked<ResBody>>;
    type Error = S::Error;
    type Future = TrackedResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let guard = req.extensions().get::<PeerInfo>().map(|peer| peer.activity.begin());
        TrackedResponse { inner: Box::pin(self.0.call(req)), guard }
    }
}

/// The response of a tracked request, its body carrying the [`InProgress`] mark.
#[derive(Debug)]
pub(crate) struct TrackedResponse<F> {
    inner: Pin<Box<F>>,
    guard: Option<InProgress>,
}

impl<F, B, E> Future for TrackedResponse<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Tracked<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = futures::ready!(this.inner.as_mut().poll(cx));
        let guard = this.guard.take();
        Poll::Ready(response.map(|response| response.map(|body| Tracked::new(body, guard))))
    }
}

/// A response body that keeps its request marked in progress until it is done.
#[derive(Debug)]
pub(crate) struct Tracked<B> {
    inner: B,
    _guard: Option<InProgress>,
}

impl<B> Tracked<B> {
    pub(crate) fn new(inner: B, guard: Option<InProgress>) -> Self {
        Self { inner, _guard: guard }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
