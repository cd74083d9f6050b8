//! The shared client against a TLS server that requires client certificates (mTLS):
//! the handshake with `--tls-ca`, `--tls-cert`, `--tls-key`, and the bearer token
//! arriving as `authorization` metadata.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use eventbus_client::{Client, ClientOptions, Error};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// Answers every Admin call `UNIMPLEMENTED`, keeping the `authorization` it was sent.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl NamedService for Recorder {
    const NAME: &'static str = "eventbus.v1.Admin";
}

impl tower_service::Service<http::Request<Body>> for Recorder {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let auth = req.headers().get("authorization").map(|v| v.to_str().unwrap().to_owned());
        self.0.lock().unwrap().push(auth.unwrap_or_default());
        std::future::ready(Ok(tonic::Status::unimplemented("recorded").into_http()))
    }
}

/// A CA (`ca.crt`) and certificates it signed: `server.crt`/`.key` for localhost and
/// `client.crt`/`.key` for "billing".
fn issue_all(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "eventbus test CA");
    std::fs::write(dir.join("ca.crt"), ca.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    for (name, cn) in [("server", "localhost"), ("client", "billing")] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.distinguished_name.push(DnType::CommonName, cn);
        std::fs::write(dir.join(format!("{name}.crt")), params.signed_by(&key, &issuer).unwrap().pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

#[tokio::test]
async fn mtls_handshake_and_the_token_reach_the_server() {
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    issue_all(dir);
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();

    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("server.crt"), read("server.key")))
        .client_ca_root(Certificate::from_pem(read("ca.crt")));
    let recorder = Recorder::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_routes(Routes::new(recorder.clone()))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let server = tokio::spawn(server);

    let path = |f: &str| Some(dir.join(f));
    let mtls = ClientOptions {
        token: Some("ebt_s3cret".into()),
        tls_ca: path("ca.crt"),
        tls_cert: path("client.crt"),
        tls_key: path("client.key"),
        ..ClientOptions::new(format!("https://127.0.0.1:{}", addr.port()))
    };
    let call = |options: ClientOptions| async move { Client::connect(options).await?.stats().await };
    let err = call(mtls.clone()).await.unwrap_err();
    assert!(matches!(&err, Error::Other(s) if s.code() == tonic::Code::Unimplemented), "{err:?}");
    assert_eq!(*recorder.0.lock().unwrap(), ["Bearer ebt_s3cret"]);

    // Without the client certificate, or without trusting the CA: no call gets through.
    let no_cert = ClientOptions { tls_cert: None, tls_key: None, ..mtls.clone() };
    assert!(!matches!(call(no_cert).await, Err(Error::Other(ref s)) if s.code() == tonic::Code::Unimplemented));
    let system_roots = ClientOptions { tls_ca: None, ..mtls };
    assert!(call(system_roots).await.is_err_and(|e| e.to_string().contains("cannot connect")));
    assert_eq!(recorder.0.lock().unwrap().len(), 1);
    server.abort();
}
