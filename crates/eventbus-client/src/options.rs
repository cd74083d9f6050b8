//! Reaching eventbusd: the address, TLS and the bearer token, in one place for every
//! client in the repository (the library, the `eventbus` CLI and its bench).
//!
//! [`ClientOptions`] say where and how; [`Connector::new`] checks them and reads the
//! certificate files once; each [`Connector::channel`] is a new connection whose every
//! call carries `authorization: Bearer <token>` when a token was given. The token never
//! appears in `Debug` output or in an error.
//!
//! Error messages name the options as the `eventbus` command line spells them
//! (`--tls-cert`, `--token`), the one place where people type them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::Error;
use crate::publisher::Tuning;

/// Default broker address: a local eventbusd on its default gRPC port.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Batches can carry large payloads; accept far more than gRPC's default 4 MiB.
pub(crate) const MAX_MESSAGE: usize = 256 << 20;

/// How to reach the broker: address, bearer token and TLS files.
///
/// ```
/// use eventbus_client::ClientOptions;
///
/// let options = ClientOptions::new("https://broker:50051")
///     .token("ebt_0123")
///     .tls_ca("/etc/eventbus/ca.crt");
/// assert!(!format!("{options:?}").contains("ebt_0123"), "the token is never shown");
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    /// Broker gRPC address; `https://` turns TLS on.
    pub server: String,
    /// Bearer token sent with every call (`authorization: Bearer <token>`).
    pub token: Option<String>,
    /// PEM file of the CA that signed the broker's certificate (instead of the system's roots).
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a broker that requires one (mTLS); needs `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Bound on establishing a connection; also how long publishes wait for the broker
    /// to come back when their stream cannot be opened again.
    pub connect_timeout: Duration,
    /// [`Client::publish`](crate::Client::publish) makes one unary `Publish` call per
    /// event instead of sharing the client's `PublishStream` (the default, `false`).
    pub unary_publish: bool,
    /// How long the shared stream waits for more calls to send together while earlier
    /// ones are unanswered. Zero (the default) sends each call as soon as it can.
    pub publish_linger: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self::new(DEFAULT_SERVER)
    }
}

/// Everything but the token.
impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("connect_timeout", &self.connect_timeout)
            .field("unary_publish", &self.unary_publish)
            .field("publish_linger", &self.publish_linger)
            .finish()
    }
}

impl ClientOptions {
    /// Options for `server` (e.g. `http://127.0.0.1:50051`), no token, no TLS files.
    pub fn new(server: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            token: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            connect_timeout: CONNECT_TIMEOUT,
            unary_publish: false,
            publish_linger: Duration::ZERO,
        }
    }

    /// Sends `token` as `authorization: Bearer <token>` with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trusts the CA in this PEM file (instead of the system's roots); needs `https://`.
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }

    /// Presents this client certificate and key (PEM) to a broker that requires one (mTLS).
    pub fn tls_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert = Some(cert.into());
        self.tls_key = Some(key.into());
        self
    }

    /// Bounds establishing a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// `true`: [`Client::publish`](crate::Client::publish) makes one unary `Publish`
    /// call per event rather than sharing the client's `PublishStream`.
    pub fn unary_publish(mut self, unary: bool) -> Self {
        self.unary_publish = unary;
        self
    }

    /// Lets the shared publish stream wait up to `linger` for more calls to send
    /// together while earlier ones are unanswered (default zero: no wait).
    pub fn publish_linger(mut self, linger: Duration) -> Self {
        self.publish_linger = linger;
        self
    }
}

/// A connection as the broker's clients use it: every call passes through [`Bearer`].
pub type AuthChannel = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every call (nothing without a token).
#[derive(Clone, Default)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Bearer(<redacted>)" } else { "Bearer(none)" })
    }
}

impl Bearer {
    /// The header value for `token`; refused (without repeating it) when it cannot be one.
    pub fn new(token: Option<&str>) -> Result<Self, Error> {
        let Some(token) = token else { return Ok(Self(None)) };
        let invalid = |why: &str| Error::Options(format!("invalid --token (EVENTBUS_TOKEN): {why}"));
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("a token is printable ASCII without spaces"));
        }
        let mut value: AsciiMetadataValue =
            MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| invalid("not a valid header value"))?;
        // Kept out of tonic's and hyper's debug output.
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Checked options, ready to open connections. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Connector {
    server: String,
    endpoint: Endpoint,
    bearer: Bearer,
    /// How `publish` reaches the broker: `None` for unary calls.
    publishing: Option<Tuning>,
}

impl Connector {
    /// Checks the options and reads the TLS files (each error names its option or file).
    pub fn new(options: &ClientOptions) -> Result<Self, Error> {
        let server = options.server.clone();
        let bearer = Bearer::new(options.token.as_deref())?;
        let endpoint = Endpoint::from_shared(server.clone())
            .map_err(|_| {
                Error::Options(format!("invalid server address {server:?} (expected e.g. http://127.0.0.1:50051)"))
            })?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20);
        let endpoint = match tls_config(options)? {
            Some(tls) => endpoint
                .tls_config(tls)
                .map_err(|e| Error::Options(format!("cannot use these TLS settings: {}", root_cause(&e))))?,
            None => endpoint,
        };
        let publishing = (!options.unary_publish)
            .then_some(Tuning { linger: options.publish_linger, reopen_for: options.connect_timeout });
        Ok(Self { server, endpoint, bearer, publishing })
    }

    /// The server address, as given.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// How `publish` shares a stream; `None` when it makes unary calls.
    pub(crate) fn publishing(&self) -> Option<Tuning> {
        self.publishing
    }

    /// A new connection.
    pub async fn channel(&self) -> Result<AuthChannel, Error> {
        let channel = self
            .endpoint
            .connect()
            .await
            .map_err(|e| Error::Connect { server: self.server.clone(), reason: root_cause(&e) })?;
        Ok(InterceptedService::new(channel, self.bearer.clone()))
    }
}

/// `None` for `http://`; for `https://`, the CA given or the system's roots, and the
/// client certificate if any.
fn tls_config(options: &ClientOptions) -> Result<Option<ClientTlsConfig>, Error> {
    let identity = match (&options.tls_cert, &options.tls_key) {
        (Some(cert), Some(key)) => Some(Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?)),
        (Some(_), None) => {
            return Err(Error::Options("--tls-cert needs --tls-key (the client certificate's private key)".into()));
        }
        (None, Some(_)) => return Err(Error::Options("--tls-key needs --tls-cert (the client certificate)".into())),
        (None, None) => None,
    };
    let https = options.server.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    if !https {
        if options.tls_ca.is_some() || identity.is_some() {
            return Err(Error::Options(format!(
                "--tls-ca, --tls-cert and --tls-key need a TLS server address: use https:// (got {})",
                options.server
            )));
        }
        return Ok(None);
    }
    let tls = match &options.tls_ca {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?)),
        None => ClientTlsConfig::new().with_enabled_roots(),
    };
    Ok(Some(match identity {
        Some(identity) => tls.identity(identity),
        None => tls,
    }))
}

fn read(path: &Path, option: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Options(format!("cannot read {option} file {}: {e}", path.display())))
}

/// The innermost error: "Connection refused (os error 111)" rather than "transport error".
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

    use super::*;

    fn args(server: &str) -> ClientOptions {
        ClientOptions::new(server)
    }

    #[test]
    fn the_token_goes_in_the_authorization_metadata_of_every_call() {
        let mut bearer = Bearer::new(Some("ebt_s3cret")).unwrap();
        for _ in 0..2 {
            let request = bearer.call(tonic::Request::new(())).unwrap();
            assert_eq!(request.metadata().get("authorization").unwrap(), "Bearer ebt_s3cret");
        }
        let request = Bearer::new(None).unwrap().call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get("authorization").is_none(), "no token, no header");
    }

    #[test]
    fn the_token_is_never_shown() {
        let a = args("http://127.0.0.1:1").token("ebt_s3cret");
        let connector = Connector::new(&a).unwrap();
        for shown in [format!("{a:?}"), format!("{connector:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        for bad in ["has space", "", "tab\there", "é"] {
            let err = Bearer::new(Some(bad)).unwrap_err().to_string();
            assert!(err.contains("--token") && (bad.is_empty() || !err.contains(bad)), "{err}");
        }
    }

    #[test]
    fn tls_options_are_checked() {
        let cert_only = ClientOptions { tls_cert: Some("c.pem".into()), ..args("https://broker:50051") };
        let err = Connector::new(&cert_only).unwrap_err().to_string();
        assert!(err.contains("--tls-cert needs --tls-key"), "{err}");
        let key_only = ClientOptions { tls_key: Some("k.pem".into()), ..args("https://broker:50051") };
        assert!(Connector::new(&key_only).unwrap_err().to_string().contains("--tls-key needs --tls-cert"));

        let plain = args("http://broker:50051").tls_ca("ca.pem");
        let err = Connector::new(&plain).unwrap_err().to_string();
        assert!(err.contains("use https://"), "{err}");

        let missing = args("https://broker:50051").tls_ca("/no/such/ca.pem");
        let err = Connector::new(&missing).unwrap_err().to_string();
        assert!(err.contains("--tls-ca file /no/such/ca.pem"), "{err}");

        assert!(Connector::new(&args("https://broker:50051")).is_ok(), "system roots by default");
        assert!(Connector::new(&args("HTTPS://broker:50051")).is_ok());
    }
}
