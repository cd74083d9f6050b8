//! Where the engine's commands go: one Redis (a connection manager that reconnects by
//! itself) or a Redis Cluster (redis-rs' cluster connection, which discovers the
//! topology from the seed nodes, follows MOVED and ASK, and refreshes its slot map on
//! failover and resharding). Scripts and commands are the same on both; on a cluster
//! each one names a key first, in the slot of the keys it touches (see `keys`).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection, PubSub};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};

/// How long a blocked read waits before it asks again: its connection has a response
/// timeout just past it, so that a connection that died silently (no FIN: a host or a
/// middlebox gone) is found, not waited on for ever.
pub(crate) const READ_BLOCK: Duration = Duration::from_secs(10);

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
    /// other command; each blocks for at most [`READ_BLOCK`].
    pub(crate) async fn reader(&self) -> RedisResult<Conn> {
        match self {
            Self::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(READ_BLOCK + COMMAND_TIMEOUT));
                client.get_multiplexed_async_connection_with_config(&config).await.map(Conn::Multiplexed)
            }
            Self::Cluster { client, .. } => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(READ_BLOCK + COMMAND_TIMEOUT);
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
            Self::Cluster(c) => match pipeline.is_transaction() {
                true => Box::pin(transaction(c, pipeline, offset, count)),
                false => c.req_packed_commands(pipeline, offset, count),
            },
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

/// Times a transaction is sent again after a node redirected it.
const TRANSACTION_REDIRECTS: u32 = 3;

/// A transaction (MULTI/EXEC) on a cluster. The cluster client follows MOVED and ASK
/// for single commands and plain pipelines, but a transaction the node refused for a
/// redirection comes back as an error (EXECABORT): a slot that moved (a failover) is
/// learnt by one single-key read in that slot, which the client redirects and refreshes
/// its slot map on, and the transaction is sent again, a bounded number of times.
async fn transaction(
    conn: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let mut redirects = 0;
    loop {
        let (slot, ask) = match conn.req_packed_commands(pipeline, offset, count).await {
            Err(err) if redirects < TRANSACTION_REDIRECTS => match redirection(&err) {
                Some(redirected) => redirected,
                None => return Err(err),
            },
            answer => return answer,
        };
        redirects += 1;
        if let Some(key) = key_in(pipeline, slot) {
            // Only for the client to follow the redirection: its answer does not matter.
            let _ = redis::cmd("EXISTS").arg(key).query_async::<Value>(conn).await;
        }
        if ask {
            // The slot is migrating: its keys move over shortly.
            tokio::time::sleep(Duration::from_millis(20) * redirects).await;
        }
    }
}

/// The slot a refused transaction was redirected for, and whether by ASK (a migration)
/// rather than MOVED.
fn redirection(err: &redis::RedisError) -> Option<(u16, bool)> {
    use redis::ErrorKind::Server;
    if !matches!(err.kind(), Server(ServerErrorKind::ExecAbort | ServerErrorKind::Moved | ServerErrorKind::Ask)) {
        return None;
    }
    let errors = err.clone().into_server_errors()?;
    errors.iter().find_map(|(_, e)| {
        let ask = match e.kind()? {
            ServerErrorKind::Moved => false,
            ServerErrorKind::Ask => true,
            _ => return None,
        };
        // "<slot> <host>:<port>"
        let slot = e.details()?.split_whitespace().next()?.parse().ok()?;
        Some((slot, ask))
    })
}

/// An argument of `pipeline` that hashes to `slot`: a key the transaction touches there.
fn key_in(pipeline: &Pipeline, slot: u16) -> Option<Vec<u8>> {
    pipeline.cmd_iter().find_map(|cmd| {
        cmd.args_iter().skip(1).find_map(|arg| match arg {
            redis::Arg::Simple(bytes) if crate::cluster::key_slot(bytes) == slot => Some(bytes.to_vec()),
            _ => None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> redis::RedisError {
        redis::parse_redis_value(reply).unwrap().extract_error().unwrap_err()
    }

    #[test]
    fn a_redirection_names_its_slot_and_the_transactions_key_there() {
        assert_eq!(redirection(&server_error(b"-MOVED 1389 127.0.0.1:7000\r\n")), Some((1389, false)));
        assert_eq!(redirection(&server_error(b"-ASK 12182 127.0.0.1:7001\r\n")), Some((12182, true)));
        assert_eq!(redirection(&server_error(b"-ERR wrong\r\n")), None);
        let mut pipe = redis::pipe();
        pipe.atomic().get("socle:eventbus:{durable}:version").hgetall("foo");
        assert_eq!(crate::cluster::key_slot(b"{durable}"), 1389);
        assert_eq!(key_in(&pipe, 1389).as_deref(), Some(&b"socle:eventbus:{durable}:version"[..]));
        assert_eq!(key_in(&pipe, 12182).as_deref(), Some(&b"foo"[..]));
        assert_eq!(key_in(&pipe, 0), None);
    }
}
