//! docs/security.md, TLS: both listeners over TLS, mTLS, and a certificate reload that
//! keeps open streams. Certificates are made here, for each test.

use crate::common;

use common::tls::*;
use common::*;
use eventbus_proto::pb::event_bus_client::EventBusClient;
use tonic::transport::{Channel, Endpoint};

async fn connect(endpoint: Endpoint) -> Result<EventBusClient<Channel>, String> {
    let channel = within(endpoint.connect()).await.map_err(|e| format!("{e:?}"))?;
    Ok(EventBusClient::new(channel))
}

/// Whether a publish goes through this endpoint (connection and call).
async fn publishes(endpoint: Endpoint) -> bool {
    match connect(endpoint).await {
        Ok(mut client) => within(client.publish(event("tls.probe", &b"x"[..]))).await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_http_speak_tls_and_refuse_plaintext_and_strangers() {
    let ca = Ca::new("test ca");
    let files = ServerFiles::new(&ca);
    let server = start_with(files.settings(None)).await;

    assert!(publishes(tls_endpoint(&server, &ca, None)).await, "a client trusting the CA publishes");
    assert!(!publishes(server.endpoint()).await, "a plaintext client is refused");
    let stranger = Ca::new("another ca");
    assert!(!publishes(tls_endpoint(&server, &stranger, None)).await, "a client trusting another CA refuses");

    // The HTTP listener: a raw TLS client asking for /healthz over HTTP/1.1.
    let answer = https_healthz(&server, &ca).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let plain = reqwest::get(server.url("/healthz")).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success(), "plain HTTP is refused");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_and_names_the_principal() {
    let ca = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let files = ServerFiles::new(&ca);
    write_atomically(&files.path("clients.pem"), &clients.pem);
    let principals = files.path("principals.yaml");
    write_atomically(
        &principals,
        "principals:\n  - name: worker\n    cert_subject: worker.internal\n    permissions: { publish: { allow: ['tls.>'] } }\n",
    );
    let tls = files.settings(Some(&files.path("clients.pem")));
    let principals = principals.to_string_lossy().into_owned();
    let server = start_with(move |s| {
        tls(s);
        s.auth.enabled = true;
        s.auth.principals_file = principals;
    })
    .await;

    assert!(!publishes(tls_endpoint(&server, &ca, None)).await, "no client certificate: refused");
    let other = Ca::new("rogue ca").leaf("worker.internal", &["worker.internal"]);
    assert!(!publishes(tls_endpoint(&server, &ca, Some(other))).await, "a certificate of another CA: refused");
    let known = clients.leaf("worker.internal", &["worker.internal"]);
    assert!(publishes(tls_endpoint(&server, &ca, Some(known))).await, "the certificate is the credential");
    let unknown = clients.leaf("intruder", &["intruder.internal"]);
    let mut client = connect(tls_endpoint(&server, &ca, Some(unknown))).await.unwrap();
    let refused = client.publish(event("tls.probe", &b"x"[..])).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "a valid certificate of no principal");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_reload_keeps_open_streams_and_serves_new_connections_with_the_new_one() {
    let old_ca = Ca::new("old ca");
    let files = ServerFiles::new(&old_ca);
    let server = start_with(files.settings(None)).await;
    let mut old_client = connect(tls_endpoint(&server, &old_ca, None)).await.unwrap();
    let mut stream = subscribe_on(&mut old_client, sub(&["tls.>"])).await;

    // A broken file is refused and the old certificate stays.
    write_atomically(&files.path("server.pem"), "not a certificate");
    assert!(!server.reloader.reload());
    assert!(publishes(tls_endpoint(&server, &old_ca, None)).await);

    let new_ca = Ca::new("new ca");
    files.install(&new_ca);
    assert!(server.reloader.reload());
    assert!(publishes(tls_endpoint(&server, &new_ca, None)).await, "new connections get the new certificate");
    assert!(!publishes(tls_endpoint(&server, &old_ca, None)).await, "the old certificate is gone");

    // The stream opened before the reload still receives.
    old_client.publish(event("tls.after", &b"1"[..])).await.unwrap();
    let got = stream.take(3).await;
    assert!(got.iter().any(|e| e.channel == "tls.after"), "{got:?}");
    server.stop().await;
}
