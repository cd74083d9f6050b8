//! Reaching eventbusd: the address, TLS and the bearer token, in one place for every
//! client the `eventbus` CLI and its bench build.
//!
//! [`ConnectArgs`] are the command-line options; [`Connector::new`] checks them and
//! reads the certificate files once; each [`Connector::channel`] is a new connection
//! whose every call carries `authorization: Bearer <token>` when a token was given.
//! The token never appears in `Debug` output or in an error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use eventbus_proto::pb::{admin_client::AdminClient, event_bus_client::EventBusClient};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Batches can carry large payloads; accept far more than gRPC's default 4 MiB.
const MAX_MESSAGE: usize = 256 << 20;

/// How to reach the broker (global options of `eventbus`).
#[derive(Clone, Default, clap::Args)]
pub struct ConnectArgs {
    /// Broker gRPC address; `https://` turns TLS on.
    #[arg(long, global = true, env = "EVENTBUS_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// Bearer token sent with every call.
    #[arg(long, global = true, env = "EVENTBUS_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// PEM file of the CA that signed the broker's certificate (instead of the system's roots).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a broker that requires one (mTLS); needs --tls-key.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

/// Everything but the token.
impl std::fmt::Debug for ConnectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectArgs")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

impl ConnectArgs {
    /// Plain `http://` at `server`, no token: for tests and the bench's own defaults.
    pub fn plain(server: impl Into<String>) -> Self {
        Self { server: server.into(), ..Self::default() }
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
    pub fn new(token: Option<&str>) -> anyhow::Result<Self> {
        let Some(token) = token else { return Ok(Self(None)) };
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            bail!("invalid --token (EVENTBUS_TOKEN): a token is printable ASCII without spaces");
        }
        let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("invalid --token (EVENTBUS_TOKEN): not a valid header value"))?;
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
}

impl Connector {
    /// Checks the options and reads the TLS files (each error names its option or file).
    pub fn new(args: &ConnectArgs) -> anyhow::Result<Self> {
        let server = args.server.clone();
        let bearer = Bearer::new(args.token.as_deref())?;
        let endpoint = Endpoint::from_shared(server.clone())
            .with_context(|| format!("invalid server address {server:?} (expected e.g. http://127.0.0.1:50051)"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20);
        let endpoint = match tls_config(args)? {
            Some(tls) => endpoint.tls_config(tls).context("cannot use these TLS settings")?,
            None => endpoint,
        };
        Ok(Self { server, endpoint, bearer })
    }

    /// The server address, as given.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// A new connection.
    pub async fn channel(&self) -> anyhow::Result<AuthChannel> {
        let channel = self
            .endpoint
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {}: {}", self.server, root_cause(&e)))?;
        Ok(InterceptedService::new(channel, self.bearer.clone()))
    }

    /// An `EventBus` client on a new connection.
    pub async fn event_bus(&self) -> anyhow::Result<EventBusClient<AuthChannel>> {
        Ok(EventBusClient::new(self.channel().await?).max_decoding_message_size(MAX_MESSAGE))
    }

    /// An `Admin` client on a new connection.
    pub async fn admin(&self) -> anyhow::Result<AdminClient<AuthChannel>> {
        Ok(AdminClient::new(self.channel().await?).max_decoding_message_size(MAX_MESSAGE))
    }
}

/// `None` for `http://`; for `https://`, the CA given or the system's roots, and the
/// client certificate if any.
fn tls_config(args: &ConnectArgs) -> anyhow::Result<Option<ClientTlsConfig>> {
    let identity = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?)),
        (Some(_), None) => bail!("--tls-cert needs --tls-key (the client certificate's private key)"),
        (None, Some(_)) => bail!("--tls-key needs --tls-cert (the client certificate)"),
        (None, None) => None,
    };
    let https = args.server.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    if !https {
        if args.tls_ca.is_some() || identity.is_some() {
            bail!("--tls-ca, --tls-cert and --tls-key need a TLS server address: use https:// (got {})", args.server);
        }
        return Ok(None);
    }
    let tls = match &args.tls_ca {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?)),
        None => ClientTlsConfig::new().with_enabled_roots(),
    };
    Ok(Some(match identity {
        Some(identity) => tls.identity(identity),
        None => tls,
    }))
}

fn read(path: &Path, option: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {option} file {}", path.display()))
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

    fn args(server: &str) -> ConnectArgs {
        ConnectArgs::plain(server)
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
        let a = ConnectArgs { token: Some("ebt_s3cret".into()), ..args("http://127.0.0.1:1") };
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
        let cert_only = ConnectArgs { tls_cert: Some("c.pem".into()), ..args("https://broker:50051") };
        let err = Connector::new(&cert_only).unwrap_err().to_string();
        assert!(err.contains("--tls-cert needs --tls-key"), "{err}");
        let key_only = ConnectArgs { tls_key: Some("k.pem".into()), ..args("https://broker:50051") };
        assert!(Connector::new(&key_only).unwrap_err().to_string().contains("--tls-key needs --tls-cert"));

        let plain = ConnectArgs { tls_ca: Some("ca.pem".into()), ..args("http://broker:50051") };
        let err = Connector::new(&plain).unwrap_err().to_string();
        assert!(err.contains("use https://"), "{err}");

        let missing = ConnectArgs { tls_ca: Some("/no/such/ca.pem".into()), ..args("https://broker:50051") };
        let err = format!("{:#}", Connector::new(&missing).unwrap_err());
        assert!(err.contains("--tls-ca file /no/such/ca.pem"), "{err}");

        assert!(Connector::new(&args("https://broker:50051")).is_ok(), "system roots by default");
        assert!(Connector::new(&args("HTTPS://broker:50051")).is_ok());
    }
}
