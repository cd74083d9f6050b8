//! Shared harness: a real eventbusd in-process on 127.0.0.1, and the client under test.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use eventbus_client::{Backoff, Client, ClientOptions, pb};
use eventbus_server::{Server, ServerError, Settings};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bound on every wait: generous for a loaded 2-core machine, reached only when
/// something is broken.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Quick reconnection for tests (a restarted broker is found within ~200 ms).
pub const FAST: Backoff =
    Backoff { initial: Duration::from_millis(20), multiplier: 2.0, max: Duration::from_millis(200) };

pub struct Broker {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
    /// Stops the broker when the test ends, however it ends.
    _guard: tokio_util::sync::DropGuard,
}

pub fn settings() -> Settings {
    for_tests(Settings::default())
}

/// [`settings`] over a configuration file holding `yaml`, read as eventbusd reads its
/// `--config`.
pub fn settings_from_file(yaml: &str) -> Settings {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eventbusd.yaml");
    std::fs::write(&path, yaml).unwrap();
    let overrides = eventbus_server::config::Overrides { config_file: Some(path), ..Default::default() };
    for_tests(Settings::load(&overrides, &Default::default()).unwrap())
}

/// Local addresses picked by the system, a quick shutdown, durable state in memory.
fn for_tests(mut settings: Settings) -> Settings {
    settings.server.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.http_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.shutdown_timeout_ms = 500;
    settings.durable.data_dir = String::new(); // in memory
    settings
}

impl Broker {
    pub async fn start() -> Self {
        Self::start_with(settings()).await
    }

    pub async fn start_with(settings: Settings) -> Self {
        let server = Server::bind(settings).await.expect("bind");
        let addr = server.grpc_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(shutdown.clone()));
        Self { addr, shutdown: shutdown.clone(), task, _guard: shutdown.drop_guard() }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> Client {
        Client::connect(ClientOptions::new(self.url())).await.unwrap()
    }

    /// Starts a broker again on `addr` with `settings` and the store the stopped one
    /// left in `data`. (A copy: in-process, the stopped server's connection tasks may
    /// keep its store open until the clients close them; a real process exits and
    /// frees it.) Keep the returned directory as long as the broker runs.
    pub async fn restart(
        addr: SocketAddr,
        mut settings: Settings,
        data: &std::path::Path,
    ) -> (Self, tempfile::TempDir) {
        let restarted = tempfile::tempdir().unwrap();
        copy_dir(data, restarted.path());
        settings.server.grpc_addr = addr;
        settings.durable.data_dir = restarted.path().to_string_lossy().into_owned();
        (Self::start_with(settings).await, restarted)
    }

    /// Stops the broker and waits for it to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(self.task).await.expect("join").expect("server result");
    }
}

/// A consumer on `channel` (and its sub-channels) with quick retries.
pub fn consumer(name: &str, channel: &str) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        name: name.into(),
        channels: vec![channel.into()],
        backoff: Some(pb::Backoff { initial_ms: 20, multiplier: 2.0, max_ms: 200, ..Default::default() }),
        ..Default::default()
    }
}

pub fn event(channel: &str, payload: impl Into<bytes::Bytes>) -> pb::PublishRequest {
    pb::PublishRequest { channel: channel.into(), payload: payload.into(), ..Default::default() }
}

/// Publishes `n` events (payloads "0".."n-1"); returns their ids.
pub async fn publish_n(client: &Client, channel: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(client.publish_request(event(channel, i.to_string())).await.unwrap().event_id);
    }
    ids
}

/// Awaits `fut`, failing the test past [`DEADLINE`].
pub async fn within<F: Future>(fut: F) -> F::Output {
    eventbus_testkit::within_deadline(DEADLINE, fut).await
}

/// Polls `check` until it returns true, failing the test past [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventbus_testkit::eventually_within(DEADLINE, what, check).await
}

/// The consumer's state, once nothing is left pending or in flight.
pub async fn settled(client: &Client, name: &str) -> pb::ConsumerInfo {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let info = client.consumer(name).await.unwrap();
        if info.pending == 0 && info.in_flight == 0 {
            return info;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {name} to settle: {info:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub use eventbus_testkit::copy_dir;
