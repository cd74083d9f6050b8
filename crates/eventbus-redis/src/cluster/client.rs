//! Reaching a cluster: the cluster client for the seed nodes (credentials, TLS,
//! timeouts and retries), and the first connection made with it.

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, ProtocolVersion, PushInfo};
use tokio::sync::mpsc;

use super::routes::NodeAccess;
use super::slots::node_url;
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use crate::transport::{RedisOptions, read_tls_ca};

/// The client for a cluster's seed nodes, with the credentials and TLS of
/// `eventbus.redis`; pushes (subscribed messages) go to `pushes`, if any.
pub(super) fn client(
    settings: &RedisOptions,
    pushes: Option<mpsc::UnboundedSender<PushInfo>>,
) -> Result<(ClusterClient, NodeAccess), redis::RedisError> {
    let nodes: Vec<String> = settings
        .cluster_nodes
        .iter()
        .map(|n| {
            node_url(n).map_err(|problem| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "bad cluster node",
                    format!("{n}: {problem}"),
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(settings.response_timeout(COMMAND_TIMEOUT))
        // Bounded (a slot without a master fails its commands within about a second),
        // with room for a failover's stale route, MOVED and slot refresh.
        .retries(6)
        .min_retry_wait(20)
        .max_retry_wait(200);
    if let Some(pushes) = pushes {
        builder = builder.use_protocol(ProtocolVersion::RESP3).push_sender(pushes);
    }
    if let Some(username) = &settings.username {
        builder = builder.username(username);
    }
    if let Some(password) = &settings.password {
        builder = builder.password(password);
    }
    let mut ca_pem = None;
    if let Some(path) = &settings.tls_ca_file {
        let pem = read_tls_ca(path)?;
        builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) });
        ca_pem = Some(pem);
    }
    Ok((builder.build()?, NodeAccess::new(settings, ca_pem)))
}

/// What the durable engine reaches a cluster through: a cluster client (no pushes),
/// and a client for each seed node, with the same credentials and TLS.
pub(crate) fn durable_clients(settings: &RedisOptions) -> Result<(ClusterClient, Vec<Client>), redis::RedisError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (cluster, access) = client(settings, None)?;
    let mut seeds = Vec::with_capacity(settings.cluster_nodes.len());
    for node in &settings.cluster_nodes {
        let url = node_url(node).map_err(|problem| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "bad cluster node",
                format!("{node}: {problem}"),
            ))
        })?;
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?;
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => (host, *port),
            _ => continue,
        };
        seeds.push(access.client(host, port)?);
    }
    Ok((cluster, seeds))
}

/// A cluster client and the channel its pushes (subscribed messages) arrive on.
pub struct ClusterSetup {
    pub(super) client: ClusterClient,
    pub(super) access: NodeAccess,
    pub(super) pushes: mpsc::UnboundedReceiver<PushInfo>,
}

impl std::fmt::Debug for ClusterSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSetup").finish_non_exhaustive()
    }
}

/// One connection to the cluster, its topology discovered from the seed nodes.
pub(super) async fn connect(client: &ClusterClient) -> Result<ClusterConnection, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}
