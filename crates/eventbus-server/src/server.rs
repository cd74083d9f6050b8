//! Binding listeners, serving, and the shutdown drain (SPEC §4).

use std::net::SocketAddr;
use std::time::Duration;

use eventbus_core::Bus;
use eventbus_proto::pb;
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Settings;
use crate::grpc::{AdminService, EventBusService};

/// After the drain, how long open connections get to close before the server stops
/// regardless (a client holding a publish stream open must not block exit forever).
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Room above `max_payload_bytes` for the rest of a publish request (metadata is up
/// to 64 × 4 KiB), so an oversized payload gets our error naming the limit.
const REQUEST_OVERHEAD: usize = 1 << 20;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A broker with its listeners bound, ready to [`run`](Server::run).
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    bus: Bus,
    grpc: TcpListener,
    grpc_addr: SocketAddr,
}

impl Server {
    /// Builds the bus and binds the listeners named in `settings` (port 0 picks a free
    /// port; see [`Server::grpc_addr`]).
    pub async fn bind(settings: Settings) -> Result<Self, ServerError> {
        let addr = settings.server.grpc_addr;
        let grpc = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { what: "gRPC", addr, source })?;
        let grpc_addr = grpc.local_addr().map_err(|source| ServerError::Bind { what: "gRPC", addr, source })?;
        let bus = Bus::new(settings.bus_config());
        Ok(Self { settings, bus, grpc, grpc_addr })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bus this server serves.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Serves until `shutdown` is cancelled, then drains: new calls get UNAVAILABLE,
    /// subscribers receive what is queued for up to `shutdown_timeout_ms`, remaining
    /// streams end with UNAVAILABLE, and the listeners close.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let Self { settings, bus, grpc, grpc_addr } = self;
        let max_request = settings.eventbus.max_payload_bytes + REQUEST_OVERHEAD;
        let event_bus = pb::event_bus_server::EventBusServer::new(EventBusService::new(bus.clone()))
            .max_decoding_message_size(max_request);
        let admin = pb::admin_server::AdminServer::new(AdminService::new(bus.clone()));

        // Small stream messages must not wait for more: latency over coalescing.
        let incoming = TcpListenerStream::new(grpc).map(|conn| {
            let conn = conn?;
            conn.set_nodelay(true)?;
            Ok::<_, std::io::Error>(conn)
        });

        let stopped = CancellationToken::new();
        let drain = drain(bus.clone(), shutdown, settings.shutdown_timeout(), stopped.clone());
        let serve = tonic::transport::Server::builder()
            .add_service(event_bus)
            .add_service(admin)
            .serve_with_incoming_shutdown(incoming, drain);

        info!(%grpc_addr, mode = bus.mode(), instance_id = bus.instance_id(), "eventbusd started");
        tokio::select! {
            result = serve => result?,
            () = async { stopped.cancelled().await; tokio::time::sleep(CLOSE_GRACE).await } => {
                warn!(grace = ?CLOSE_GRACE, "connections still open after shutdown; closing them");
            }
        }
        info!("eventbusd stopped");
        Ok(())
    }
}

/// Resolves when the gRPC server should stop accepting: after the bus has drained or
/// the drain timed out and the remaining streams were ended.
async fn drain(bus: Bus, shutdown: CancellationToken, timeout: Duration, stopped: CancellationToken) {
    shutdown.cancelled().await;
    info!(pending_subscriptions = bus.stats().active_subscriptions, "shutting down: draining subscriptions");
    bus.begin_shutdown();
    if tokio::time::timeout(timeout, bus.drained()).await.is_err() {
        warn!(
            remaining = bus.stats().active_subscriptions,
            timeout_ms = timeout.as_millis() as u64,
            "shutdown timeout reached: ending remaining subscription streams"
        );
        bus.close_all();
    }
    stopped.cancel();
}
