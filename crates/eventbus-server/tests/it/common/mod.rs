//! Shared harness: a real server on 127.0.0.1:0 and real tonic clients.
#![allow(dead_code, unreachable_pub)]

pub mod auth;
pub mod consume;
pub mod redis_cluster;
pub mod redis_server;
pub mod sse;
pub mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use eventbus_proto::pb::{self, admin_client::AdminClient, event_bus_client::EventBusClient, subscribe_response::Kind};
use eventbus_server::{Server, ServerError, Settings};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

pub use eventbus_testkit::{DEADLINE, copy_dir, eventually, within};

pub struct TestServer {
    pub addr: SocketAddr,
    pub http: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), ServerError>>,
    /// The server's background-task supervisor (a test can make a task stop).
    pub supervisor: eventbus_core::Supervisor,
    /// What SIGHUP does, for tests that reload without a signal.
    pub reloader: eventbus_server::Reloader,
}

pub fn test_settings() -> Settings {
    let mut settings = Settings::default();
    settings.server.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.server.http_addr = "127.0.0.1:0".parse().unwrap();
    settings.durable.data_dir = String::new(); // in memory
    settings
}

pub async fn start() -> TestServer {
    start_with(|_| {}).await
}

pub async fn start_with(tweak: impl FnOnce(&mut Settings)) -> TestServer {
    let mut settings = test_settings();
    tweak(&mut settings);
    let server = Server::bind(settings).await.expect("bind");
    let addr = server.grpc_addr();
    let http = server.http_addr();
    let supervisor = server.supervisor().clone();
    let reloader = server.reloader();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    TestServer { addr, http, shutdown, task, supervisor, reloader }
}

impl TestServer {
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.addr)).unwrap().connect_timeout(DEADLINE)
    }

    pub async fn channel(&self) -> Channel {
        self.endpoint().connect().await.expect("connect")
    }

    pub async fn client(&self) -> EventBusClient<Channel> {
        EventBusClient::new(self.channel().await)
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
    }

    /// Opens a subscription and waits for its `started` message.
    pub async fn subscribe(&self, req: pb::SubscribeRequest) -> Subscriber {
        subscribe_on(&mut self.client().await, req).await
    }

    /// A connection with the smallest HTTP/2 windows (64 KiB): a stream on it that is
    /// not read stops the server's writes after a few large events.
    pub async fn small_window_channel(&self) -> Channel {
        let endpoint = self.endpoint().initial_stream_window_size(65_535).initial_connection_window_size(65_535);
        endpoint.connect().await.expect("connect")
    }

    /// URL of an HTTP route.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(self.task).await.expect("join").expect("server result");
    }
}

pub struct Subscriber {
    pub id: String,
    pub stream: Streaming<pb::SubscribeResponse>,
}

pub async fn subscribe_on(client: &mut EventBusClient<Channel>, req: pb::SubscribeRequest) -> Subscriber {
    let mut stream = within(client.subscribe(req)).await.expect("subscribe").into_inner();
    let first = within(stream.message()).await.expect("first message").expect("stream open");
    match first.kind {
        Some(Kind::Started(s)) => Subscriber { id: s.subscription_id, stream },
        other => panic!("first message must be started, got {other:?}"),
    }
}

impl Subscriber {
    /// Reads exactly `n` events (across batches).
    pub async fn take(&mut self, n: usize) -> Vec<pb::Event> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match within(self.stream.message()).await {
                Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) })) => {
                    assert!(!batch.events.is_empty(), "batches are never empty");
                    out.extend(batch.events);
                }
                other => panic!("expected events after {} of {n}, got {other:?}", out.len()),
            }
        }
        assert_eq!(out.len(), n, "more events than expected arrived in the last batch");
        out
    }

    /// Reads until the stream ends, which must be the broker's "interrupted" (redis
    /// mode: its connection to Redis was lost or restored); returns the events before.
    pub async fn until_interrupted(&mut self) -> Vec<pb::Event> {
        match self.until_end().await {
            (events, Some(status)) if is_interrupted(&status) => events,
            (_, end) => panic!("expected the stream to end interrupted, it ended with {end:?}"),
        }
    }

    /// Reads until the stream ends; returns the events and the final status (None = OK).
    pub async fn until_end(&mut self) -> (Vec<pb::Event>, Option<tonic::Status>) {
        let mut out = Vec::new();
        loop {
            match within(self.stream.message()).await {
                Ok(Some(pb::SubscribeResponse { kind: Some(Kind::Events(batch)) })) => out.extend(batch.events),
                Ok(Some(other)) => panic!("unexpected message {other:?}"),
                Ok(None) => return (out, None),
                Err(status) => return (out, Some(status)),
            }
        }
    }
}

/// Whether a stream ended because the instance's connection to Redis changed (the
/// client is to subscribe again and recover).
pub fn is_interrupted(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.message().starts_with("interrupted")
}

/// The events' payloads as text, in order.
pub fn payloads(events: &[pb::Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(&e.payload).into_owned()).collect()
}

pub fn sub(channels: &[&str]) -> pb::SubscribeRequest {
    pb::SubscribeRequest { channels: channels.iter().map(|c| c.to_string()).collect(), ..Default::default() }
}

pub fn event(channel: &str, payload: impl Into<bytes::Bytes>) -> pb::PublishRequest {
    pb::PublishRequest { channel: channel.into(), payload: payload.into(), ..Default::default() }
}

pub async fn subscription_ids(admin: &mut AdminClient<Channel>) -> Vec<String> {
    let list = admin.list_subscriptions(pb::ListSubscriptionsRequest {}).await.unwrap().into_inner();
    list.subscriptions.into_iter().map(|s| s.id).collect()
}

/// A subscriber that does not read: its connection has the smallest HTTP/2 windows
/// (64 KiB), so once a few large events are in flight, the server cannot write more
/// and the subscription's own queue fills up.
pub async fn slow_subscriber(
    server: &TestServer,
    pattern: &str,
    overflow: pb::OverflowPolicy,
    capacity: u32,
) -> Subscriber {
    let channel = server.small_window_channel().await;
    let req = pb::SubscribeRequest { queue_capacity: capacity, overflow: overflow as i32, ..sub(&[pattern]) };
    subscribe_on(&mut EventBusClient::new(channel), req).await
}
