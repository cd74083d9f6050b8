//! Push consumers (docs/push.md): the broker is the worker. For every consumer with a
//! `push` endpoint, each instance attaches to it like any client (so in redis mode the
//! engine shares its events among the instances) and POSTs what it is handed; the
//! answer acks, retries or dead-letters.
//!
//! - this file: [`Pusher`], which follows the consumer definitions and runs one worker
//!   per push consumer, and the HTTP client they share;
//! - `worker`: one consumer's attachment, its concurrency cap and its requests;
//! - `owner`: the owner's rights, checked at start and after each reload;
//! - `request`: what a request carries and what its answer means;
//! - `resolve`: the address rules (`push.deny_networks`, `push.allow_networks`, the
//!   broker's own listeners) applied to every resolved address.

mod owner;
mod request;
mod resolve;
mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use eventbus_core::durable::{DurableBackend, PushConfig};
use eventbus_core::{Supervisor, TaskHandle};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::access::Access;
use crate::config::PushSettings;
use crate::metrics::PushMetrics;
use crate::spans::Spans;
use resolve::{Reach, Resolver};
use worker::Worker;

/// Why push consumers cannot be served with these settings.
#[derive(Debug, thiserror::Error)]
pub enum PushSetupError {
    #[error("push.ca_file {path}: {problem}")]
    CaFile { path: String, problem: String },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot build the push HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// The HTTP client every push worker shares (one connection pool), and the address
/// rules.
#[derive(Debug, Clone)]
pub(crate) struct Endpoints {
    pub(crate) client: reqwest::Client,
    pub(crate) reach: Reach,
    /// `push.ca_file`'s certificates, for the clients built for one port.
    roots: Arc<[reqwest::Certificate]>,
}

impl Endpoints {
    /// The client of `settings`: rustls with the system's roots and `ca_file`'s, no
    /// redirects followed, no proxy, names resolved past the address rules; requests
    /// never reach `listeners` (the broker's own).
    pub(crate) fn new(settings: &PushSettings, listeners: Vec<SocketAddr>) -> Result<Self, PushSetupError> {
        let reach = Reach::new(settings.denied()?, settings.allowed()?, listeners);
        let mut roots = Vec::new();
        if !settings.ca_file.is_empty() {
            let ca_error = |problem: String| PushSetupError::CaFile { path: settings.ca_file.clone(), problem };
            let pem = std::fs::read(&settings.ca_file).map_err(|e| ca_error(e.to_string()))?;
            roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_error(e.to_string()))?;
            if roots.is_empty() {
                return Err(ca_error("holds no PEM certificate".to_owned()));
            }
        }
        let roots: Arc<[reqwest::Certificate]> = roots.into();
        let client = build_client(&reach, &roots, None)?;
        Ok(Self { client, reach, roots })
    }

    /// The client for requests to `url`: the shared one, or, when its port is one of
    /// the broker's listeners', one whose resolver refuses the broker's own addresses
    /// (a resolver is told names, not ports).
    pub(crate) fn client_for(&self, url: &reqwest::Url) -> Result<reqwest::Client, PushSetupError> {
        match url.port_or_known_default() {
            Some(port) if self.reach.is_listener_port(port) => build_client(&self.reach, &self.roots, Some(port)),
            _ => Ok(self.client.clone()),
        }
    }
}

fn build_client(
    reach: &Reach,
    roots: &[reqwest::Certificate],
    port: Option<u16>,
) -> Result<reqwest::Client, PushSetupError> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("eventbusd/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(60))
        .tls_built_in_native_certs(true)
        .dns_resolver(Arc::new(Resolver::new(reach.clone(), port)));
    for cert in roots {
        builder = builder.add_root_certificate(cert.clone());
    }
    builder.build().map_err(PushSetupError::Client)
}

/// Longest wait for a connection to an endpoint (the request's own timeout also bounds it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry delays of the definitions follower when the engine cannot list consumers.
const LIST_RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Runs one worker per push consumer, for as long as the consumer has a push endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Pusher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    durable: Arc<dyn DurableBackend>,
    endpoints: Endpoints,
    metrics: PushMetrics,
    /// Judges each consumer's owner.
    access: Access,
    spans: Spans,
    supervisor: Supervisor,
    /// Cancelled at shutdown: workers stop taking events and finish their requests.
    stop: CancellationToken,
    workers: Mutex<HashMap<String, Running>>,
    follower: Mutex<Option<TaskHandle>>,
}

/// What a push worker serves: the endpoint, and the owner whose rights it uses on
/// which channels.
#[derive(Debug, Clone, PartialEq)]
struct Definition {
    push: PushConfig,
    owner: String,
    channels: Vec<String>,
}

/// A worker and the definition it was started for.
#[derive(Debug)]
struct Running {
    definition: Definition,
    worker: Arc<Worker>,
    _task: TaskHandle,
}

impl Pusher {
    /// Starts following `durable`'s consumers.
    pub(crate) fn start(
        durable: Arc<dyn DurableBackend>,
        endpoints: Endpoints,
        metrics: PushMetrics,
        access: Access,
        spans: Spans,
        supervisor: &Supervisor,
    ) -> Self {
        let inner = Arc::new(Inner {
            durable,
            endpoints,
            metrics,
            access,
            spans,
            supervisor: supervisor.clone(),
            stop: CancellationToken::new(),
            workers: Mutex::default(),
            follower: Mutex::default(),
        });
        let follower = supervisor.spawn("push consumer follower", follow(Arc::downgrade(&inner)));
        *inner.follower.lock() = Some(follower);
        Self { inner }
    }

    /// Shutdown: every worker stops taking events; resolves once their requests have
    /// been answered (each is bounded by its timeout).
    pub(crate) async fn stop(&self) {
        self.inner.stop.cancel();
        self.inner.follower.lock().take();
        let workers: Vec<Arc<Worker>> = self.inner.workers.lock().values().map(|r| Arc::clone(&r.worker)).collect();
        for worker in workers {
            worker.idle().await;
        }
    }
}

/// Follows the definitions: lists the consumers on every change and brings the
/// workers in line.
async fn follow(inner: std::sync::Weak<Inner>) {
    let Some(mut changes) = inner.upgrade().map(|i| i.durable.definitions()) else { return };
    let mut retry = LIST_RETRY.0;
    loop {
        let Some(this) = inner.upgrade() else { return };
        let stop = this.stop.clone();
        let listed = this.durable.list_consumers().await;
        let wait = match listed {
            Ok(consumers) => {
                retry = LIST_RETRY.0;
                this.reconcile(consumers.into_iter().filter_map(|c| {
                    let definition =
                        Definition { push: c.config.push?, owner: c.config.owner, channels: c.config.channels };
                    Some((c.config.name, definition))
                }));
                None
            }
            Err(err) => {
                warn!(%err, retry_in = ?retry, "cannot list durable consumers to find the push consumers");
                let wait = retry;
                retry = (retry * 2).min(LIST_RETRY.1);
                Some(wait)
            }
        };
        drop(this);
        let retried = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = retried => {}
            changed = changes.changed() => if changed.is_err() {
                // The engine is gone: only at shutdown.
                return stop.cancelled().await;
            },
        }
    }
}

impl Inner {
    /// Starts a worker for each push consumer without one (or whose definition
    /// changed), and retires the workers of consumers gone or no longer pushed.
    fn reconcile(self: &Arc<Self>, push_consumers: impl Iterator<Item = (String, Definition)>) {
        if self.stop.is_cancelled() {
            return;
        }
        let wanted: HashMap<String, Definition> = push_consumers.collect();
        let mut workers = self.workers.lock();
        workers.retain(|name, running| {
            let keep = wanted.get(name) == Some(&running.definition);
            if !keep {
                info!(consumer = %name, "push consumer retired (deleted, or redefined)");
            }
            if !wanted.contains_key(name) {
                self.metrics.forget(name);
            }
            keep
        });
        for (name, definition) in wanted {
            if workers.contains_key(&name) {
                continue;
            }
            let push = definition.push.clone();
            info!(consumer = %name, url = %redacted_url(&push.url), max_concurrency = push.max_concurrency, "pushing a durable consumer's events");
            let label = self.metrics.label(&name);
            let revoked = self.metrics.owner_revoked.with_label_values(&[&label]);
            let worker = Arc::new(Worker::new(
                name.clone(),
                push.clone(),
                self.endpoints.clone(),
                self.metrics.clone(),
                label,
                self.spans.clone(),
                self.stop.child_token(),
            ));
            let Definition { owner, channels, .. } = definition.clone();
            let owner = owner::Owner::new(name.clone(), owner, channels, self.access.clone(), revoked);
            let task =
                self.supervisor.spawn("push consumer", Arc::clone(&worker).run(Arc::clone(&self.durable), owner));
            workers.insert(name, Running { definition, worker, _task: task });
        }
    }
}

/// `url` as logs show it: without its query (which may carry a credential, like the
/// configured headers) nor a password.
pub(crate) fn redacted_url(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        // Not a URL: shown up to its query.
        return url.split(['?', '#']).next().unwrap_or_default().to_owned();
    };
    if parsed.query().is_some() {
        parsed.set_query(Some("redacted"));
    }
    parsed.set_fragment(None);
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("redacted"));
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_urls_lose_their_query_and_password() {
        assert_eq!(redacted_url("https://h.example/hook?key=s3cret#x"), "https://h.example/hook?redacted");
        assert_eq!(redacted_url("https://u:pw@h.example/"), "https://u:redacted@h.example/");
        assert_eq!(redacted_url("https://h.example/hook"), "https://h.example/hook");
        assert_eq!(redacted_url("not a url?key=s3cret"), "not a url");
    }
}
