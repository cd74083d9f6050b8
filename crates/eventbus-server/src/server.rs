//! Binding listeners, serving, and the shutdown drain (docs/concepts.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use eventbus_auth::{AuthError, Authenticator};
use eventbus_core::durable::{AckObserver, DurableBackend, DurableOptions};
use eventbus_core::{Bus, Supervisor, Transport, TransportStatus};
use eventbus_durable::{Durable, Fsync};
use eventbus_proto::pb::{self, admin_server::AdminServer, event_bus_server::EventBusServer};
use eventbus_redis::{ClusterTransport, RedisDurable, RedisDurableSettings, RedisTransport};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::access::{Access, ConsumerLimits};
use crate::config::{FsyncSetting, Mode, Settings};
use crate::convert;
use crate::gate::{AllowedHosts, BrowserCorsLayer, GrpcGateLayer};
use crate::grpc::{AdminService, Authenticate, EncodedStreams, EventBusService};
use crate::http::{self, HttpState, Readiness};
use crate::listener::{ConnectionLimits, Incoming, TrackRequestsLayer};
use crate::metrics::{EdgeCounters, LabelLimits, Metrics, PushMetrics};
use crate::ops::Ops;
use crate::push::{Endpoints, PushSetupError, Pusher};
use crate::request_limit::{PayloadLimit, RequestErrors};
use crate::spans::{Spans, SpansError};
use crate::tls::{Protocols, Tls, TlsError};

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The message carries the OS error and, when the address is taken, the setting
    /// that chooses another.
    #[error("cannot listen on {addr} ({what}): {error}{}", bind_hint(what, error))]
    Bind { what: &'static str, addr: SocketAddr, error: std::io::Error },
    /// Another process holds the embedded store's directory (`durable.data_dir`).
    #[error(
        "another eventbusd holds the data directory {dir} (durable.data_dir): stop it, or give this one \
         its own with --data-dir DIR (or EVENTBUS__DURABLE__DATA_DIR)"
    )]
    DataDirLocked { dir: String },
    #[error("cannot set up metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot set up gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("cannot open the durable store")]
    Store(#[from] eventbus_durable::StoreError),
    #[error("cannot start durable consumers")]
    Durable(#[from] eventbus_core::durable::DurableError),
    #[error(transparent)]
    Spans(#[from] SpansError),
    #[error("invalid Redis settings")]
    Redis(#[source] eventbus_redis::RedisError),
    /// Redis may be down at start-up (the transport connects when it comes up), but
    /// credentials it refuses will not get better by retrying.
    #[error("Redis at {target} refused the credentials (eventbus.redis.username, eventbus.redis.password)")]
    RedisCredentials {
        target: String,
        #[source]
        source: redis::RedisError,
    },
    /// The cluster's nodes answer but refuse: wrong credentials, or not a cluster.
    #[error(
        "the Redis Cluster at {nodes} refused eventbusd (eventbus.redis.cluster_nodes, eventbus.redis.username, \
         eventbus.redis.password)"
    )]
    RedisCluster {
        nodes: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
    /// Its message names the setting and the file.
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Push(#[from] PushSetupError),
}

/// A broker with its listeners bound, ready to [`run`](Server::run).
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    bus: Bus,
    metrics: Option<Arc<Metrics>>,
    /// Stops the transport's background task (redis mode) once the server has stopped.
    transport_stop: CancellationToken,
    /// Every background task; one that stops turns readiness and health off.
    supervisor: Supervisor,
    tls: Option<Arc<Tls>>,
    access: Access,
    counters: EdgeCounters,
    grpc: TcpListener,
    grpc_addr: SocketAddr,
    http: TcpListener,
    http_addr: SocketAddr,
    /// Serves the push consumers.
    pusher: Option<Pusher>,
    spans: Spans,
}

async fn listen(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |error| ServerError::Bind { what, addr, error };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// For a listener address that is taken: which flag and setting choose another.
fn bind_hint(what: &str, error: &std::io::Error) -> String {
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return String::new();
    }
    let (flag, key, variable) = match what {
        "gRPC" => ("--grpc-addr", "server.grpc_addr", "EVENTBUS__SERVER__GRPC_ADDR"),
        _ => ("--http-addr", "server.http_addr", "EVENTBUS__SERVER__HTTP_ADDR"),
    };
    format!(
        "; another eventbusd (or another program) holds the port: stop it, or choose another address with \
         {flag} ADDR ({key}, {variable})"
    )
}

impl Server {
    /// What `eventbusd --check-config` checks beyond the settings themselves: the TLS
    /// files, the principals file and the JWT keys load as they would at start.
    pub fn check_files(settings: &Settings) -> Result<(), ServerError> {
        Tls::load(&settings.server.tls)?;
        if settings.auth.enabled {
            Authenticator::load(&settings.auth)?;
        }
        Endpoints::new(&settings.push, Vec::new())?;
        Ok(())
    }

    /// Builds the bus and binds the listeners named in `settings` (port 0 picks a free
    /// port; see [`Server::grpc_addr`] and [`Server::http_addr`]).
    pub async fn bind(settings: Settings) -> Result<Self, ServerError> {
        let cluster = settings.eventbus.mode == Mode::Redis && !settings.eventbus.redis.cluster_nodes.is_empty();
        if settings.eventbus.mode == Mode::Redis && !cluster {
            let redis = settings.redis_settings();
            if let Err(source) = redis.check_credentials().await {
                return Err(ServerError::RedisCredentials { target: redis.display_target(), source });
            }
        }
        if cluster {
            let redis = settings.redis_settings();
            if let Err(source) = ClusterTransport::check_access(&redis).await {
                return Err(ServerError::RedisCluster { nodes: redis.cluster_nodes.join(","), source });
            }
        }
        let (grpc, grpc_addr) = listen("gRPC", settings.server.grpc_addr).await?;
        let (http, http_addr) = listen("HTTP", settings.server.http_addr).await?;
        let tls = Tls::load(&settings.server.tls)?;
        let auth = match settings.auth.enabled {
            true => Authenticator::load(&settings.auth)?,
            false => Authenticator::disabled(),
        };
        let counters = EdgeCounters::new(&settings.eventbus.metrics.prefix)?;
        let limits = ConsumerLimits {
            per_principal: settings.auth.default_max_consumers,
            broker: settings.durable.max_consumers,
            queued_bytes: settings.auth.default_max_queued_bytes,
            subscriptions: settings.auth.default_max_subscriptions,
        };
        let access = Access::new(auth, counters.clone(), limits);
        let reachable = reachable_from_other_hosts(&[grpc_addr, http_addr]);
        if !settings.auth.enabled && !reachable.is_empty() {
            warn!(
                listeners = %reachable.join(", "),
                "authentication is off (auth.enabled: false) on listeners other hosts can reach: anyone who \
                 reaches them can publish, subscribe and administer (docs/security.md)"
            );
        }
        let transport_stop = CancellationToken::new();
        let supervisor = Supervisor::new();
        // The durable engine sends what it captures on a cluster through it.
        let mut cluster_transport = None;
        let bus = match settings.eventbus.mode {
            Mode::InMemory => Bus::new(settings.bus_config()),
            Mode::Redis if cluster => {
                let redis = settings.redis_settings();
                info!(
                    nodes = %redis.cluster_nodes.join(","),
                    prefix = %redis.prefix,
                    shard_tokens = redis.shard_tokens,
                    "redis cluster mode: connecting in the background"
                );
                let setup = ClusterTransport::client(&redis).map_err(ServerError::Redis)?;
                let stop = transport_stop.clone();
                Bus::with_transport(settings.bus_config(), |local| {
                    let transport: Arc<dyn Transport> =
                        ClusterTransport::start(setup, &redis, local, stop, &supervisor);
                    cluster_transport = Some(Arc::clone(&transport));
                    transport
                })
            }
            Mode::Redis => {
                let redis = settings.redis_settings();
                let client = redis.client().map_err(ServerError::Redis)?;
                info!(target = %redis.display_target(), prefix = %redis.prefix, "redis mode: connecting in the background");
                let stop = transport_stop.clone();
                Bus::with_transport(settings.bus_config(), |local| {
                    RedisTransport::start(client, &redis, local, stop, &supervisor)
                })
            }
        };
        let m = &settings.eventbus.metrics;
        let push_metrics = PushMetrics::new(&m.prefix, m.max_consumer_labels)?;
        let metrics = match m.enabled {
            true => {
                let limits = LabelLimits { subscriptions: m.max_subscription_labels, consumers: m.max_consumer_labels };
                let metrics = Metrics::new(&m.prefix, limits, bus.clone())?;
                metrics.register_edge(&counters)?;
                metrics.register_push(&push_metrics)?;
                Some(Arc::new(metrics))
            }
            false => None,
        };
        let endpoints = Endpoints::new(&settings.push, vec![grpc_addr, http_addr])?;
        match settings.eventbus.mode {
            Mode::InMemory => start_durable(&settings, &bus, metrics.clone(), &supervisor).await?,
            Mode::Redis => start_redis_durable(
                &settings,
                &bus,
                cluster_transport,
                metrics.clone(),
                transport_stop.clone(),
                &supervisor,
            )?,
        }
        let spans = Spans::start(&settings.telemetry)?;
        let pusher = bus.durable().map(|durable| {
            Pusher::start(Arc::clone(durable), endpoints, push_metrics, access.clone(), spans.clone(), &supervisor)
        });
        Ok(Self {
            settings,
            bus,
            metrics,
            transport_stop,
            supervisor,
            tls,
            access,
            counters,
            grpc,
            grpc_addr,
            http,
            http_addr,
            pusher,
            spans,
        })
    }

    /// What SIGHUP does: re-read the TLS files, the principals file and the JWT keys.
    pub fn reloader(&self) -> Reloader {
        Reloader { tls: self.tls.clone(), access: self.access.clone() }
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bus this server serves.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The supervisor of the server's background tasks.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Serves until `shutdown` is cancelled, then drains: readiness and gRPC health go
    /// false, new calls get UNAVAILABLE, subscribers receive what is queued for up to
    /// `shutdown_timeout_ms`, remaining streams end with UNAVAILABLE, and the
    /// listeners close.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let Self {
            settings,
            bus,
            metrics,
            transport_stop,
            supervisor,
            tls,
            access,
            counters,
            grpc,
            grpc_addr,
            http,
            http_addr,
            pusher,
            spans,
        } = self;
        // Stops the transport whichever way this function returns.
        let _transport_guard = transport_stop.drop_guard();
        let readiness = Readiness::new(bus.transport_status(), &supervisor).with_durable(bus.durable().cloned());
        let (health, health_service) = tonic_health::server::health_reporter();
        set_health(&health, health_status(readiness.get())).await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        // grpcurl before 1.9 and many tools still speak only v1alpha.
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        // A decode limit bounds what one message can make us buffer; a publish over it
        // is answered like any oversized payload (request_limit).
        let limit = PayloadLimit::new(settings.eventbus.max_payload_bytes);
        // Every service but health (probes carry no credentials) authenticates each call.
        let authenticate = Authenticate(access.clone());
        // Every protocol calls the same operations.
        let ops = Ops::new(bus.clone(), access.clone(), metrics, spans.clone(), settings.eventbus.max_publish_batch);
        let event_bus_service = EventBusService::new(ops.clone(), limit);
        let event_bus =
            EventBusServer::new(event_bus_service.clone()).max_decoding_message_size(limit.grpc_message_limit());
        // Subscribe streams are encoded by `grpc::encoded`, the other methods by the generated
        // server; tonic's own refusals of any of them get our statuses.
        let event_bus = EncodedStreams::new(event_bus, event_bus_service, limit);
        let event_bus = InterceptedService::new(RequestErrors::new(event_bus, Some(limit)), authenticate.clone());
        let admin = InterceptedService::new(
            RequestErrors::new(AdminServer::new(AdminService::new(ops.clone())), None),
            authenticate.clone(),
        );
        let reflection = settings.server.reflection;
        let reflection_v1 = reflection.then(|| InterceptedService::new(reflection_v1, authenticate.clone()));
        let reflection_v1alpha = reflection.then(|| InterceptedService::new(reflection_v1alpha, authenticate));

        let stopped = CancellationToken::new();
        let grpc_tls = tls.clone().map(|tls| (tls, Protocols::Grpc));
        let header_read_timeout = Duration::from_millis(settings.server.http.header_read_timeout_ms);
        let http_limits = ConnectionLimits {
            max_connections: settings.server.max_connections,
            idle_timeout: (settings.server.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(settings.server.idle_timeout_ms)),
            // hyper enforces it on the HTTP listener (`http::serve`).
            header_read_timeout: None,
        };
        // tonic does not let its hyper take the limit: the connections keep it.
        let grpc_limits = ConnectionLimits { header_read_timeout: Some(header_read_timeout), ..http_limits };
        let incoming = Incoming::start("grpc", grpc, grpc_tls, grpc_limits, counters.clone(), stopped.clone())
            .map_err(ServerError::Http)?
            .into_stream();
        let http_tls = tls.map(|tls| (tls, Protocols::Http));
        let http = Incoming::start("http", http, http_tls, http_limits, counters, stopped.clone())
            .map_err(ServerError::Http)?;
        // gRPC health follows readiness (a stopped background task, a Redis outage,
        // then shutdown).
        // The disk watermark and a store refusing writes after a failed one have no
        // event to wait on: with an on-disk store, readiness is read again once a
        // second (the engine reads free space at most that often anyway).
        let disk_watch = (settings.eventbus.mode == Mode::InMemory && !settings.durable.data_dir.is_empty())
            .then_some(DISK_CHECK_EVERY);
        tokio::spawn(follow_readiness(
            bus.transport_status(),
            supervisor.failures(),
            readiness.clone(),
            health.clone(),
            disk_watch,
            stopped.clone(),
        ));
        let on_stop = Stopping { readiness: readiness.clone(), health, supervisor, pusher };
        let drain = drain(bus.clone(), shutdown, settings.shutdown_timeout(), on_stop, stopped.clone());
        // Pings find connections whose peer vanished without a FIN (a crashed host, a
        // dropped NAT entry) and close them.
        let keepalive = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        // The windows bound what a client can send unread; half the connection window is
        // also h2's budget for unread small DATA frames (docs/limits.md).
        let allowed_hosts = AllowedHosts::new(&settings.server.http.allowed_hosts);
        let grpc_server = tonic::transport::Server::builder()
            // gRPC-Web (browsers) over HTTP/1.1 as well as HTTP/2, its CORS from
            // server.http.allowed_origins.
            .accept_http1(true)
            .http2_keepalive_interval(keepalive(settings.server.keepalive_interval_ms))
            .http2_keepalive_timeout(keepalive(settings.server.keepalive_timeout_ms))
            .initial_stream_window_size(settings.server.grpc_stream_window_bytes)
            .initial_connection_window_size(settings.server.grpc_connection_window_bytes)
            .layer(TrackRequestsLayer)
            .layer(GrpcGateLayer { hosts: allowed_hosts.clone() })
            .layer(BrowserCorsLayer(grpc_web_cors(&settings.server.http.allowed_origins)))
            .layer(tonic_web::GrpcWebLayer::new())
            .add_service(health_service)
            .add_optional_service(reflection_v1)
            .add_optional_service(reflection_v1alpha)
            .add_service(event_bus)
            .add_service(admin)
            .serve_with_incoming_shutdown(incoming, drain);

        let allowed_origins = settings.server.http.allowed_origins.clone().into();
        let sse_heartbeat = Duration::from_millis(settings.server.http.sse_heartbeat_ms);
        let app = http::router(HttpState { ops, readiness, limit, allowed_origins, allowed_hosts, sse_heartbeat });
        let http_server = http::serve(http, app, header_read_timeout, stopped.clone());

        info!(%grpc_addr, %http_addr, mode = bus.mode(), instance_id = bus.instance_id(), "eventbusd started");
        // After the drain, how long open connections get to close before the server
        // stops regardless (a client holding a publish stream open must not block exit).
        let close_grace = Duration::from_millis(settings.server.close_grace_ms);
        let grace = async {
            stopped.cancelled().await;
            tokio::time::sleep(close_grace).await;
        };
        let serve_both = async {
            let (grpc_result, ()) = tokio::join!(grpc_server, http_server);
            grpc_result.map_err(ServerError::from)
        };
        tokio::select! {
            result = serve_both => result?,
            () = grace => warn!(grace = ?close_grace, "connections still open after shutdown; closing them"),
        }
        if let Some(durable) = bus.durable()
            && let Err(err) = durable.flush().await
        {
            warn!(%err, "could not flush the durable store");
        }
        spans.flush().await;
        info!("eventbusd stopped");
        Ok(())
    }
}

/// The listeners, among `addrs`, that another host can reach: what an open broker
/// should warn about.
fn reachable_from_other_hosts(addrs: &[SocketAddr]) -> Vec<String> {
    addrs.iter().filter(|addr| !addr.ip().is_loopback()).map(ToString::to_string).collect()
}

/// Re-reads the TLS files, the principals file and the JWT keys (SIGHUP). A part that
/// fails keeps its previous configuration and logs one line; open streams whose
/// principal lost the right they use are ended with `PERMISSION_DENIED`.
#[derive(Debug, Clone)]
pub struct Reloader {
    tls: Option<Arc<Tls>>,
    access: Access,
}

impl Reloader {
    /// Returns whether every part reloaded.
    pub fn reload(&self) -> bool {
        let mut ok = true;
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(()) => info!("TLS certificate reloaded"),
                Err(err) => {
                    ok = false;
                    warn!(error = %eventbus_core::error_chain(&err), "TLS reload failed; keeping the previous certificate");
                }
            }
        }
        if self.access.enabled() {
            match self.access.reload() {
                Ok(ended) => info!(streams_ended = ended, "principals and JWT keys reloaded"),
                Err(err) => {
                    ok = false;
                    warn!(error = %eventbus_core::error_chain(&err), "auth reload failed; keeping the previous principals and keys");
                }
            }
        }
        ok
    }
}

/// Opens the durable store, starts the engine on the bus and declares the configured
/// consumers. A store that cannot be opened stops start-up: never a silent empty store.
async fn start_durable(
    settings: &Settings,
    bus: &Bus,
    metrics: Option<Arc<Metrics>>,
    supervisor: &Supervisor,
) -> Result<(), ServerError> {
    let d = &settings.durable;
    let fsync = match d.fsync {
        FsyncSetting::Always => Fsync::Always,
        FsyncSetting::Batch => Fsync::Batch,
    };
    let store = eventbus_durable::open_store(std::path::Path::new(&d.data_dir), fsync, settings.retention()).map_err(
        |err| match err {
            eventbus_durable::StoreError::Locked { .. } => ServerError::DataDirLocked { dir: d.data_dir.clone() },
            err => ServerError::Store(err),
        },
    )?;
    let options = durable_options(settings, metrics, supervisor);
    let durable = Durable::start(store, options)?;
    bus.enable_durable(durable.clone());
    for consumer in &d.consumers {
        durable.declare_consumer(consumer.to_config()).await?;
    }
    let where_ = if d.data_dir.is_empty() { "memory" } else { d.data_dir.as_str() };
    info!(store = where_, consumers = durable.list_consumers().len(), "durable consumers ready");
    Ok(())
}

fn durable_options(settings: &Settings, metrics: Option<Arc<Metrics>>, supervisor: &Supervisor) -> DurableOptions {
    DurableOptions {
        supervisor: supervisor.clone(),
        dedup_window: Duration::from_millis(settings.durable.dedup_window_ms),
        dead_letter_encoder: Arc::new(convert::encode_dead_letter),
        on_ack: metrics.map(|m| -> AckObserver { Arc::new(move |consumer, latency| m.observe_ack(consumer, latency)) }),
        min_free_disk_bytes: settings.durable.min_free_disk_bytes,
        max_captures_per_publish: settings.durable.max_captures_per_publish,
    }
}

/// Redis mode: durable consumers live in Redis Streams, shared by every instance.
/// Redis may be down at start-up: consumers declared in the configuration are written
/// once it is reachable (retried in the background), never silently skipped.
fn start_redis_durable(
    settings: &Settings,
    bus: &Bus,
    cluster_transport: Option<Arc<dyn Transport>>,
    metrics: Option<Arc<Metrics>>,
    stop: CancellationToken,
    supervisor: &Supervisor,
) -> Result<(), ServerError> {
    let redis = settings.redis_settings();
    let durable_settings = RedisDurableSettings {
        prefix: redis.prefix.clone(),
        instance_id: bus.instance_id().to_owned(),
        retention: settings.retention(),
        envelope: redis.envelope,
        min_replicas_acked: redis.min_replicas_acked,
        replica_ack_timeout: redis.replica_ack_timeout,
        history: redis.history.clone(),
    };
    let options = durable_options(settings, metrics, supervisor);
    let durable = match redis.cluster_nodes.is_empty() {
        true => {
            let client = redis.client().map_err(ServerError::Redis)?;
            RedisDurable::start(client, durable_settings, options, stop.clone())?
        }
        false => RedisDurable::start_cluster(&redis, durable_settings, options, stop.clone())?,
    };
    if let Some(transport) = cluster_transport {
        durable.publish_through(transport);
    }
    bus.enable_durable(durable.clone());
    let declared: Vec<_> = settings.durable.consumers.iter().map(|c| c.to_config()).collect();
    if declared.is_empty() {
        return Ok(());
    }
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        for config in declared {
            loop {
                match durable.declare_consumer(config.clone()).await {
                    Ok(()) => {
                        info!(consumer = %config.name, "durable consumer declared in Redis");
                        break;
                    }
                    Err(err) => {
                        warn!(consumer = %config.name, %err, retry_in = ?backoff, "cannot declare a durable consumer yet");
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    });
    Ok(())
}

/// What flips when shutdown begins.
struct Stopping {
    readiness: Readiness,
    health: HealthReporter,
    supervisor: Supervisor,
    pusher: Option<Pusher>,
}

/// CORS for gRPC-Web calls from the pages of `origins` (`server.http.allowed_origins`):
/// preflights answered, the gRPC status headers exposed. Other origins get no CORS
/// headers, so a browser refuses them the answer.
fn grpc_web_cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins = origins.iter().filter_map(|o| HeaderValue::from_str(o).ok());
    let header = HeaderName::from_static;
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::POST])
        .allow_headers([
            header("authorization"),
            header("content-type"),
            header("x-grpc-web"),
            header("x-user-agent"),
            header("grpc-timeout"),
        ])
        .expose_headers([header("grpc-status"), header("grpc-message"), header("grpc-status-details-bin")])
        .max_age(Duration::from_secs(600))
}

fn health_status(ready: bool) -> ServingStatus {
    if ready { ServingStatus::Serving } else { ServingStatus::NotServing }
}

/// How often readiness is read again with an on-disk store (its free-disk watermark,
/// a failed write).
const DISK_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Keeps gRPC health in step with readiness (the transport's connection, the background
/// tasks and, every `disk_watch`, the store's free-disk watermark and health) until the server stops, so
/// `grpc.health.v1` and `/readyz` always agree.
async fn follow_readiness(
    transport: Option<tokio::sync::watch::Receiver<TransportStatus>>,
    mut tasks: tokio::sync::watch::Receiver<Option<eventbus_core::TaskFailure>>,
    readiness: Readiness,
    health: HealthReporter,
    disk_watch: Option<Duration>,
    stopped: CancellationToken,
) {
    let mut transport = transport;
    let mut last = readiness.get();
    let mut disk = disk_watch.map(|every| {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    loop {
        let transport_changed = async {
            match transport.as_mut() {
                Some(status) => status.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let disk_tick = async {
            match disk.as_mut() {
                Some(tick) => tick.tick().await,
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            () = stopped.cancelled() => return,
            alive = transport_changed => { if !alive { transport = None }; true }
            changed = tasks.changed() => { if changed.is_err() { return }; true }
            _ = disk_tick => false,
        };
        if readiness.is_shutting_down() {
            continue;
        }
        let ready = readiness.get();
        if forced || ready != last {
            if ready != last {
                info!(ready, reason = readiness.reason().unwrap_or_default(), "readiness changed");
            }
            set_health(&health, health_status(ready)).await;
            last = ready;
        }
    }
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(<EventBusServer<EventBusService> as NamedService>::NAME, status).await;
    health.set_service_status(<AdminServer<AdminService> as NamedService>::NAME, status).await;
}

/// Resolves when the gRPC server should stop accepting: after the bus has drained or
/// the drain timed out and the remaining streams were ended.
async fn drain(
    bus: Bus,
    shutdown: CancellationToken,
    timeout: Duration,
    on_stop: Stopping,
    stopped: CancellationToken,
) {
    shutdown.cancelled().await;
    info!(subscriptions = bus.stats().active_subscriptions, "shutting down: draining subscriptions");
    on_stop.supervisor.stop();
    on_stop.readiness.shutting_down();
    set_health(&on_stop.health, ServingStatus::NotServing).await;
    bus.begin_shutdown();
    let deadline = tokio::time::Instant::now() + timeout;
    // Push requests in flight get their answers (each within its push.timeout_ms)
    // before the consumers' clients are detached.
    if let Some(pusher) = &on_stop.pusher
        && tokio::time::timeout_at(deadline, pusher.stop()).await.is_err()
    {
        warn!(timeout_ms = timeout.as_millis() as u64, "shutdown timeout reached with push requests in flight");
    }
    if let Some(durable) = bus.durable() {
        durable.detach_all();
    }
    if tokio::time::timeout_at(deadline, bus.drained()).await.is_err() {
        warn!(
            remaining = bus.stats().active_subscriptions,
            timeout_ms = timeout.as_millis() as u64,
            "shutdown timeout reached: ending remaining subscription streams"
        );
        bus.close_all();
    }
    stopped.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listeners_off_loopback_are_reachable() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
        let loopback = [addr("127.0.0.1:50051"), addr("[::1]:8080")];
        assert!(reachable_from_other_hosts(&loopback).is_empty());
        let open = [addr("0.0.0.0:50051"), addr("127.0.0.1:8080"), addr("[::]:8081")];
        assert_eq!(reachable_from_other_hosts(&open), ["0.0.0.0:50051", "[::]:8081"]);
    }
}
