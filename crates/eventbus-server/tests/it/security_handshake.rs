//! Handshake slots cannot be exhausted without credentials: an attacker holding
//! hundreds of TCP connections that never send a byte, on both TLS listeners, keeps no
//! real client from connecting and being served at once.

use crate::common;

use std::time::{Duration, Instant};

use common::tls::*;
use common::*;
use eventbus_proto::pb::event_bus_client::EventBusClient;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const SILENT: usize = 600;
/// What a real client may take to connect and be served while the attack goes on.
const PROMPT: Duration = Duration::from_secs(1);

async fn silent_sockets(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(within(TcpStream::connect(addr)).await.unwrap());
    }
    held
}

/// gRPC over TLS: connect, handshake and one publish, timed.
async fn grpc_call(server: &TestServer, ca: &Ca) -> Duration {
    let started = Instant::now();
    let channel = within(tls_endpoint(server, ca, None).connect()).await.unwrap();
    within(EventBusClient::new(channel).publish(event("probe", &b"x"[..]))).await.unwrap();
    started.elapsed()
}

/// HTTPS: connect, handshake and `GET /healthz`, timed.
async fn https_call(server: &TestServer, ca: &Ca) -> Duration {
    let started = Instant::now();
    let answer = https_healthz(server, ca).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_silent_sockets_do_not_keep_a_real_client_waiting() {
    let ca = Ca::new("test ca");
    let files = ServerFiles::new(&ca);
    let server = start_with(files.settings(None)).await;
    let quiet = grpc_call(&server, &ca).await;

    let mut grpc_attack = silent_sockets(server.addr, SILENT).await;
    let _http_attack = silent_sockets(server.http, SILENT).await;
    let grpc = grpc_call(&server, &ca).await;
    let https = https_call(&server, &ca).await;
    println!(
        "real client, connect + call: {quiet:?} alone, gRPC {grpc:?} and HTTPS {https:?} with {SILENT} silent sockets on each port"
    );
    assert!(grpc < PROMPT, "gRPC client took {grpc:?} behind {SILENT} silent sockets");
    assert!(https < PROMPT, "HTTPS client took {https:?} behind {SILENT} silent sockets");

    // The attacker pays: its oldest silent sockets were closed to make room.
    let mut byte = [0u8; 1];
    assert_eq!(within(grpc_attack[0].read(&mut byte)).await.unwrap(), 0, "the oldest silent socket is closed");
    server.stop().await;
}
