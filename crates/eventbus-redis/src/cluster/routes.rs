//! The publishing fast path: one multiplexed connection per master (reconnecting by
//! itself), each bucket's shard
//! channel mapped to the master that owns its slot, so an `SPUBLISH` goes straight to
//! its node, pipelined with the others. The cluster client routes everything else
//! (subscriptions, the health check) and is the fallback while the map is being made
//! or after a redirection says it is out of date.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, Value};
use tracing::warn;

use super::slots::key_slot;
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use crate::transport::RedisOptions;

/// How to reach a node the cluster names (`CLUSTER SLOTS` gives host and port).
#[derive(Debug, Clone)]
pub(crate) struct NodeAccess {
    tls: bool,
    username: Option<String>,
    password: Option<String>,
    ca_pem: Option<Vec<u8>>,
    response_timeout: Duration,
}

impl NodeAccess {
    pub(crate) fn new(settings: &RedisOptions, ca_pem: Option<Vec<u8>>) -> Self {
        Self {
            tls: settings.cluster_nodes.iter().any(|n| n.starts_with("rediss://")),
            username: settings.username.clone(),
            password: settings.password.clone(),
            ca_pem,
            response_timeout: settings.response_timeout(COMMAND_TIMEOUT),
        }
    }

    /// A client for the node at `host:port`, with the credentials and TLS of the seeds.
    pub(crate) fn client(&self, host: &str, port: u16) -> RedisResult<Client> {
        let addr = match self.tls {
            true => ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: false, tls_params: None },
            false => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let mut redis = redis::RedisConnectionInfo::default();
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        let info: ConnectionInfo = addr.into_connection_info()?.set_redis_settings(redis);
        match &self.ca_pem {
            Some(pem) => {
                Client::build_with_tls(info, redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) })
            }
            None => Client::open(info),
        }
    }

    async fn connect(&self, host: &str, port: u16) -> RedisResult<ConnectionManager> {
        let client = self.client(host, port)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1);
        client.get_connection_manager_with_config(config).await
    }
}

/// The master connection of each bucket; `None` where the map has no master for its
/// slot (the fallback then asks the cluster client).
#[derive(Default, Clone)]
pub(super) struct Routes {
    pub(super) by_bucket: Vec<Option<ConnectionManager>>,
    /// Connections by node address, reused by the next map.
    nodes: HashMap<(String, u16), ConnectionManager>,
}

impl Routes {
    /// The map for the topology `CLUSTER SLOTS` answered, reusing `previous`'s
    /// connections to nodes that are still masters.
    pub(super) async fn build(
        slots: Value,
        channels: &[String],
        access: &NodeAccess,
        previous: &Routes,
    ) -> Result<Self, String> {
        let ranges = parse_slots(slots)?;
        let mut nodes = HashMap::new();
        let mut unreachable = Vec::new();
        let mut by_bucket = Vec::with_capacity(channels.len());
        for channel in channels {
            let slot = key_slot(channel.as_bytes());
            let Some((_, _, host, port)) = ranges.iter().find(|(start, end, ..)| (*start..=*end).contains(&slot))
            else {
                by_bucket.push(None);
                continue;
            };
            let key = (host.clone(), *port);
            if !nodes.contains_key(&key) && !unreachable.contains(&key) {
                match previous.nodes.get(&key) {
                    Some(conn) => {
                        nodes.insert(key.clone(), conn.clone());
                    }
                    None => match access.connect(host, *port).await {
                        Ok(conn) => {
                            nodes.insert(key.clone(), conn);
                        }
                        Err(err) => {
                            // Its buckets go through the cluster client meanwhile.
                            warn!(node = %format!("{host}:{port}"), error = %err, "cannot connect to a master to publish to it");
                            unreachable.push(key.clone());
                        }
                    },
                }
            }
            by_bucket.push(nodes.get(&key).cloned());
        }
        Ok(Self { by_bucket, nodes })
    }
}

/// `CLUSTER SLOTS`: (first slot, last slot, master host, master port) per range.
fn parse_slots(value: Value) -> Result<Vec<(u16, u16, String, u16)>, String> {
    let Value::Array(ranges) = value else { return Err(format!("unexpected CLUSTER SLOTS reply: {value:?}")) };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return Err("a CLUSTER SLOTS range is not an array".to_owned()) };
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => u16::try_from(*n).ok(),
            _ => None,
        };
        let (Some(start), Some(end)) = (int(fields.first()), int(fields.get(1))) else {
            return Err("a CLUSTER SLOTS range has no slot bounds".to_owned());
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err("a CLUSTER SLOTS range has no master".to_owned());
        };
        let host = match master.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => return Err("a CLUSTER SLOTS master has no host".to_owned()),
        };
        let Some(port) = int(master.get(1)) else { return Err("a CLUSTER SLOTS master has no port".to_owned()) };
        out.push((start, end, host, port));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_replies_parse_into_master_ranges() {
        let node = |host: &str, port| Value::Array(vec![Value::BulkString(host.into()), Value::Int(port)]);
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("10.0.0.1", 7000), node("10.0.0.4", 7000)]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("10.0.0.2", 7001)]),
        ]);
        assert_eq!(
            parse_slots(reply).unwrap(),
            [(0, 5460, "10.0.0.1".to_owned(), 7000), (5461, 16383, "10.0.0.2".to_owned(), 7001)]
        );
        assert!(parse_slots(Value::Int(1)).is_err());
    }
}
