//! TLS for both listeners (docs/security.md): the certificate, its key and the client CA
//! read from PEM files, re-read on SIGHUP. A reload that fails keeps the previous
//! configuration; connections already open keep the one they were made with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;

/// The `server.tls` section: TLS is on when `cert_file` is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// PEM CA certificates; when set, every client must present a certificate they
    /// signed (mTLS).
    pub client_ca_file: String,
}

impl TlsSettings {
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    pub fn mutual(&self) -> bool {
        !self.client_ca_file.is_empty()
    }
}

/// Why TLS files could not be used. The messages name the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}", path.display())]
    Read {
        /// The setting that names the file.
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what} {} holds no PEM certificate", path.display())]
    /// `what`: the setting that names the file.
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("cannot use the client CA file {}", path.display())]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    #[error("the client CA file {} holds a certificate that cannot be a trust anchor", path.display())]
    BadCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot use the certificate {} with the key {}", cert.display(), key.display())]
    Config {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// Which listener a TLS configuration is for: they differ only in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocols {
    /// gRPC: HTTP/2 only.
    Grpc,
    /// The HTTP listener: HTTP/2 or HTTP/1.1.
    Http,
}

/// The live TLS configuration of both listeners, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Tls {
    settings: TlsSettings,
    grpc: ArcSwap<rustls::ServerConfig>,
    http: ArcSwap<rustls::ServerConfig>,
}

impl Tls {
    /// Reads the files; `None` when TLS is off.
    pub(crate) fn load(settings: &TlsSettings) -> Result<Option<Arc<Self>>, TlsError> {
        if !settings.enabled() {
            return Ok(None);
        }
        let (grpc, http) = build(settings)?;
        Ok(Some(Arc::new(Self {
            settings: settings.clone(),
            grpc: ArcSwap::from_pointee(grpc),
            http: ArcSwap::from_pointee(http),
        })))
    }

    /// Re-reads the files; on error the previous configuration stays in use.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let (grpc, http) = build(&self.settings)?;
        self.grpc.store(Arc::new(grpc));
        self.http.store(Arc::new(http));
        Ok(())
    }

    /// An acceptor with the current configuration, for one handshake.
    pub(crate) fn acceptor(&self, protocols: Protocols) -> TlsAcceptor {
        let config = match protocols {
            Protocols::Grpc => self.grpc.load_full(),
            Protocols::Http => self.http.load_full(),
        };
        TlsAcceptor::from(config)
    }
}

fn build(settings: &TlsSettings) -> Result<(rustls::ServerConfig, rustls::ServerConfig), TlsError> {
    let cert_path = Path::new(&settings.cert_file);
    let key_path = Path::new(&settings.key_file);
    let chain = read_certificates("server.tls.cert_file", cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|source| TlsError::Read {
        what: "server.tls.key_file",
        path: key_path.to_owned(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_error = |source| TlsError::Config { cert: cert_path.to_owned(), key: key_path.to_owned(), source };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?;
    let builder = if settings.mutual() {
        let ca_path = Path::new(&settings.client_ca_file);
        let mut roots = RootCertStore::empty();
        for ca in read_certificates("server.tls.client_ca_file", ca_path)? {
            roots.add(ca).map_err(|source| TlsError::BadCa { path: ca_path.to_owned(), source })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|source| TlsError::ClientCa { path: ca_path.to_owned(), source })?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut grpc = builder.with_single_cert(chain, key).map_err(config_error)?;
    let mut http = grpc.clone();
    // HTTP/1.1 on the gRPC port too: gRPC-Web clients may speak it.
    grpc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((grpc, http))
}

fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_error = |source| TlsError::Read { what, path: path.to_owned(), source };
    let certificates =
        CertificateDer::pem_file_iter(path).map_err(read_error)?.collect::<Result<Vec<_>, _>>().map_err(read_error)?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_owned() });
    }
    Ok(certificates)
}

/// The names a verified client certificate vouches for: its subject's common names
/// and its DNS subject alternative names (docs/security.md, `cert_subject`).
pub(crate) fn certificate_subjects(der: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned).collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push((*dns).to_owned());
            }
        }
    }
    names
}
