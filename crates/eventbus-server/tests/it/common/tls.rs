//! TLS harness: a certificate authority made for each test, server files, clients.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::*;

/// A certificate authority that signs server and client certificates.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A leaf certificate and its key, in PEM.
    pub fn leaf(&self, common_name: &str, dns: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The server's files in a temporary directory.
pub struct ServerFiles {
    pub dir: tempfile::TempDir,
}

impl ServerFiles {
    pub fn new(ca: &Ca) -> Self {
        let files = Self { dir: tempfile::tempdir().unwrap() };
        files.install(ca);
        files
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A fresh server certificate signed by `ca`.
    pub fn install(&self, ca: &Ca) {
        let (cert, key) = ca.leaf("eventbusd", &["localhost"]);
        write_atomically(&self.path("server.pem"), &cert);
        write_atomically(&self.path("server.key"), &key);
    }

    pub fn settings(&self, client_ca: Option<&Path>) -> impl FnOnce(&mut eventbus_server::Settings) + use<> {
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

pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

pub fn tls_endpoint(server: &TestServer, ca: &Ca, identity: Option<(String, String)>) -> Endpoint {
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

pub fn rustls_pki_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).map(Result::unwrap).collect()
}

/// A rustls client trusting `ca` (for raw HTTPS to the HTTP listener).
pub fn https_connector(ca: &Ca) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_certs(&ca.pem) {
        roots.add(cert).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// `GET /healthz` over HTTPS (HTTP/1.1) with a client trusting `ca`: the raw answer.
pub async fn https_healthz(server: &TestServer, ca: &Ca) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = https_connector(ca);
    let tcp = within(tokio::net::TcpStream::connect(server.http)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = within(connector.connect(name, tcp)).await.unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    within(tls.read_to_string(&mut answer)).await.ok();
    answer
}
