//! Where the engine's commands go: one Redis (a connection manager that reconnects by
//! itself) or a Redis Cluster (redis-rs' cluster connection, which discovers the
//! topology from the seed nodes, follows MOVED and ASK, and refreshes its slot map on
//! failover and resharding). Scripts and commands are the same on both; on a cluster
//! each one names a key first, in the slot of the keys it touches (see `keys`).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection, PubSub};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};

/// How long a blocked read on a cluster waits before it asks again: a cluster
/// connection always has a response timeout, so the read cannot block for ever.
pub(crate) const CLUSTER_READ_BLOCK: Duration = Duration::from_secs(10);

/// Where Redis is.
#[derive(Clone)]
pub(crate) enum Backend {
    Single(Box<Client>),
    Cluster {
        client: Box<ClusterClient>,
        /// One client per seed node, for the change notices: a cluster delivers a
        /// PUBLISH to the subscribers of every node, so any node that answers will do.
        seeds: Vec<Client>,
    },
}

impl Backend {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// A shared connection, connecting in the background (calls answer an error until
    /// Redis is there).
    pub(crate) fn shared_conn(&self) -> RedisResult<Conn> {
        match self {
            Self::Single(client) => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(COMMAND_TIMEOUT))
                    .set_number_of_retries(1)
                    .set_max_delay(super::MAX_BACKOFF);
                client.get_connection_manager_lazy(config).map(Conn::Manager)
            }
            Self::Cluster { client, .. } => {
                let config =
                    ClusterConfig::new().set_connection_timeout(CONNECT_TIMEOUT).set_response_timeout(COMMAND_TIMEOUT);
                Ok(Conn::Cluster(client.get_pending_async_connection_with_config(config)))
            }
        }
    }

    /// A connection of its own for blocking reads, so that a blocked read holds up no
    /// other command. On one Redis it may block for ever; on a cluster for at most
    /// [`CLUSTER_READ_BLOCK`].
    pub(crate) async fn reader(&self) -> RedisResult<Conn> {
        match self {
            Self::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(None);
                client.get_multiplexed_async_connection_with_config(&config).await.map(Conn::Multiplexed)
            }
            Self::Cluster { client, .. } => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(CLUSTER_READ_BLOCK + COMMAND_TIMEOUT);
                client.get_async_connection_with_config(config).await.map(Conn::Cluster)
            }
        }
    }

    /// A Pub/Sub connection for the change notices; `attempt` picks the seed node on a
    /// cluster (the next one after a failure).
    pub(crate) async fn pubsub(&self, attempt: usize) -> RedisResult<PubSub> {
        match self {
            Self::Single(client) => client.get_async_pubsub().await,
            Self::Cluster { seeds, .. } => match seeds.get(attempt % seeds.len().max(1)) {
                Some(client) => client.get_async_pubsub().await,
                None => Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no cluster seed node"))),
            },
        }
    }
}

/// A connection of any [`Backend`].
#[derive(Clone)]
pub(crate) enum Conn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Manager(c) => c.req_packed_command(cmd),
            Self::Multiplexed(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Multiplexed(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Manager(c) => c.get_db(),
            Self::Multiplexed(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
