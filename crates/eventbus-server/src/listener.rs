//! Accepting connections for both listeners: TCP accept, `TCP_NODELAY`, the TLS
//! handshake (when on) in its own task under a deadline, then the connection is handed
//! to the gRPC or HTTP server with what is known of its peer ([`PeerInfo`]).
//!
//! Handshakes run beside the accept loop, so a client that opens a socket and says
//! nothing holds one handshake slot until its deadline, never the listener. Accept
//! errors (out of file descriptors, say) are logged, counted and backed off instead of
//! retried at once. Each listener serves at most `server.max_connections` connections:
//! past it, a new one is closed at once and counted (README "Operations").

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::EdgeCounters;
use crate::tls::{Protocols, Tls, certificate_subjects};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; past it, accepting waits.
const MAX_HANDSHAKES: usize = 256;
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
}

/// An accepted connection, plain or TLS. Its place under the listener's connection
/// limit is given back when it is dropped (the connection closed).
#[derive(Debug)]
pub(crate) struct Conn {
    io: Io,
    peer: PeerInfo,
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
    local: SocketAddr,
}

impl Incoming {
    /// Starts accepting on `listener` until `stop` is cancelled (or the server drops
    /// this).
    pub(crate) fn start(
        what: &'static str,
        listener: TcpListener,
        tls: Option<(Arc<Tls>, Protocols)>,
        max_connections: usize,
        counters: EdgeCounters,
        stop: CancellationToken,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let limits = Limits { slots: Arc::new(Semaphore::new(max_connections)), max_connections };
        tokio::spawn(accept_loop(what, listener, tls, limits, counters, tx, stop));
        Ok(Self { rx, local })
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

/// The connection limit of one listener.
struct Limits {
    slots: Arc<Semaphore>,
    max_connections: usize,
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
    let mut backoff = Duration::ZERO;
    let mut last_warning: Option<Instant> = None;
    let mut unreported = 0u64;
    let mut last_full_warning: Option<Instant> = None;
    let open = counters.connections_open.with_label_values(&[what]);
    let refused = counters.connections_refused.with_label_values(&[what]);
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
                    max_connections = limits.max_connections,
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
        let Some((tls, protocols)) = &tls else {
            let conn = Conn { io: Io::Plain(tcp), peer: PeerInfo { addr, cert_subjects: Arc::new([]) }, _slot: slot };
            if tx.send(conn).await.is_err() {
                return;
            }
            continue;
        };
        let permit = tokio::select! {
            () = stop.cancelled() => return,
            permit = handshakes.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let acceptor = tls.acceptor(*protocols);
        let tx = tx.clone();
        let failures = counters.handshake_failures.with_label_values(&[what]);
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
            let peer = PeerInfo { addr, cert_subjects: subjects.into() };
            let _ = tx.send(Conn { io: Io::Tls(Box::new(stream)), peer, _slot: slot }).await;
        });
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

/// The HTTP listener, for `axum::serve`.
#[derive(Debug)]
pub(crate) struct HttpIncoming(pub(crate) Incoming);

impl axum::serve::Listener for HttpIncoming {
    type Io = Conn;
    type Addr = PeerInfo;

    async fn accept(&mut self) -> (Conn, PeerInfo) {
        match self.0.next().await {
            Some(conn) => {
                let peer = conn.peer.clone();
                (conn, peer)
            }
            // The accept loop stopped: shutdown, when axum is about to stop calling.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<PeerInfo> {
        Ok(PeerInfo { addr: self.0.local, cert_subjects: Arc::new([]) })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, HttpIncoming>> for PeerInfo {
    fn connect_info(stream: axum::serve::IncomingStream<'_, HttpIncoming>) -> Self {
        stream.remote_addr().clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
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
