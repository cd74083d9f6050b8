//! README "Security", TLS: both listeners over TLS, mTLS, and a certificate reload that
//! keeps open streams. Certificates are made here, for each test.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use eventbus_proto::pb::event_bus_client::EventBusClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A certificate authority that signs server and client certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A leaf certificate and its key, in PEM.
    fn leaf(&self, common_name: &str, dns: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The server's files in a temporary directory.
struct ServerFiles {
    dir: tempfile::TempDir,
}

impl ServerFiles {
    fn new(ca: &Ca) -> Self {
        let files = Self { dir: tempfile::tempdir().unwrap() };
        files.install(ca);
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A fresh server certificate signed by `ca`.
    fn install(&self, ca: &Ca) {
        let (cert, key) = ca.leaf("eventbusd", &["localhost"]);
        write_atomically(&self.path("server.pem"), &cert);
        write_atomically(&self.path("server.key"), &key);
    }

    fn settings(&self, client_ca: Option<&Path>) -> impl FnOnce(&mut eventbus_server::Settings) + use<> {
        let cert = self.path("server.pem").to_string_lossy().into_owned();
        let key = self.path("server.key").to_string_lossy().into_owned();
        let client_ca = client_ca.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        move |s| {
            s.server.tls.cert_file = cert;
            s.server.tls.key_file = key;
            s.server.tls.client_ca_file = client_ca;
        }
    }
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn tls_endpoint(server: &TestServer, ca: &Ca, identity: Option<(String, String)>) -> Endpoint {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem)).domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .connect_timeout(DEADLINE)
        .tls_config(tls)
        .unwrap()
}

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
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_certs(&ca.pem) {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = within(connector.connect(name, tcp)).await.unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    within(tls.read_to_string(&mut answer)).await.ok();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let plain = reqwest::get(server.url("/healthz")).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success(), "plain HTTP is refused");
    server.stop().await;
}

fn rustls_pki_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).map(Result::unwrap).collect()
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
