//! Durable consumer helpers: Consume streams over real gRPC, and the real binary.

use std::process::Stdio;

use eventbus_proto::pb::{self, consume_request, consume_response};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::*;

pub fn consumer(name: &str, channels: &[&str]) -> pb::ConsumerConfig {
    pb::ConsumerConfig {
        name: name.into(),
        channels: channels.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    }
}

/// A Consume stream: requests in, responses out.
pub struct Consumer {
    pub requests: mpsc::Sender<pb::ConsumeRequest>,
    pub responses: Streaming<pb::ConsumeResponse>,
    pub info: pb::ConsumerInfo,
}

pub fn req(kind: consume_request::Kind) -> pb::ConsumeRequest {
    pb::ConsumeRequest { kind: Some(kind) }
}

pub async fn attach(
    endpoint: tonic::transport::Endpoint,
    name: &str,
    max_in_flight: u32,
) -> Result<Consumer, tonic::Status> {
    let attach = pb::Attach { consumer: name.into(), max_in_flight, ..Default::default() };
    attach_as(endpoint, attach, None).await
}

/// Opens a Consume stream with `attach` as its first request, sending `token` as the
/// bearer credential when given.
pub async fn attach_as(
    endpoint: tonic::transport::Endpoint,
    attach: pb::Attach,
    token: Option<&str>,
) -> Result<Consumer, tonic::Status> {
    let mut client = pb::event_bus_client::EventBusClient::new(endpoint.connect().await.unwrap());
    let (tx, rx) = mpsc::channel(64);
    tx.send(req(consume_request::Kind::Attach(attach))).await.unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut responses = client.consume(request).await?.into_inner();
    match within(responses.message()).await? {
        Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Attached(a)) }) => {
            Ok(Consumer { requests: tx, responses, info: a.consumer.unwrap() })
        }
        other => panic!("expected attached, got {other:?}"),
    }
}

impl Consumer {
    pub async fn deliveries(&mut self, n: usize) -> Vec<pb::Delivery> {
        let mut out = Vec::new();
        while out.len() < n {
            match within(self.responses.message()).await.unwrap() {
                Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(d)) }) => {
                    out.extend(d.deliveries)
                }
                other => panic!("expected deliveries, got {other:?}"),
            }
        }
        out
    }

    pub async fn send(&self, kind: consume_request::Kind) {
        self.requests.send(req(kind)).await.unwrap();
    }
}

pub fn ids(d: &[pb::Delivery]) -> Vec<String> {
    d.iter().map(|d| d.event.as_ref().unwrap().id.clone()).collect()
}

/// Spawns eventbusd on `data_dir`; returns the child and its gRPC address.
pub async fn daemon(data_dir: &std::path::Path) -> (tokio::process::Child, String) {
    daemon_with(data_dir, &[]).await
}

/// Kills `child` with SIGKILL (no chance to flush or clean up) and waits for it.
pub async fn kill_9(child: &mut tokio::process::Child) {
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    within(child.wait()).await.unwrap();
}

/// [`daemon`] with extra environment variables.
pub async fn daemon_with(data_dir: &std::path::Path, env: &[(&str, String)]) -> (tokio::process::Child, String) {
    let (child, grpc, _) = daemon_addrs(data_dir, env).await;
    (child, grpc)
}

/// [`daemon_with`], returning the HTTP address too.
pub async fn daemon_addrs(
    data_dir: &std::path::Path,
    env: &[(&str, String)],
) -> (tokio::process::Child, String, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_eventbusd"))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("EVENTBUS__DURABLE__DATA_DIR", data_dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("RUST_LOG")
        .current_dir(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let field = |line: &str, key: &str| {
        line.split(&format!("{key}="))
            .nth(1)
            .map(|rest| rest.split_whitespace().next().unwrap().trim_matches('"').to_owned())
    };
    let (grpc, http) = within(async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let (Some(grpc), Some(http)) = (field(&line, "grpc_addr"), field(&line, "http_addr")) {
                return (grpc, http);
            }
        }
        panic!("eventbusd exited before starting");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, grpc, http)
}
