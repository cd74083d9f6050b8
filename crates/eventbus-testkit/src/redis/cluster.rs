//! A private Redis Cluster per test: 3 masters and 3 replicas on free loopback ports,
//! made with `redis-server --cluster-enabled yes` and `redis-cli --cluster create`.
//! Skipped (with the notice of [`RedisProc::start`](super::RedisProc::start)) when
//! redis-server is missing and not required.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use super::{wait_for_ping, which_redis};
use crate::eventually;

#[derive(Debug)]
pub struct Node {
    pub port: u16,
    child: Option<Child>,
}

#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts 6 nodes and joins them into a cluster with one replica per master.
    pub async fn start() -> Option<Self> {
        let binary = which_redis()?;
        let cli = binary.with_file_name("redis-cli");
        assert!(cli.is_file(), "redis-cli is not beside {}", binary.display());
        let dir = tempfile::tempdir().unwrap();
        // Free ports, held until every one is chosen so no two are the same: one for
        // each node's clients and one for its cluster bus (by default the client port
        // + 10,000, which may be taken or past 65,535).
        let listeners: Vec<TcpListener> = (0..12).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
        drop(listeners);
        let mut nodes = Vec::new();
        for (port, bus) in ports[..6].iter().copied().zip(ports[6..].iter().copied()) {
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir(&node_dir).unwrap();
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
                .args(["--cluster-port", &bus.to_string()])
                // Quick failover for the tests; other shards keep serving while one has no master.
                .args(["--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"])
                .args(["--cluster-allow-pubsubshard-when-down", "yes"])
                // A replica just created may promote however recent its last sync.
                .args(["--cluster-replica-validity-factor", "0"])
                // A replica syncs at once (not after waiting 5 s for others to join).
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            nodes.push(Node { port, child: Some(child) });
        }
        let cluster = Self { nodes, _dir: dir };
        for node in &cluster.nodes {
            wait_for_ping(&node.url()).await;
        }
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let created = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(created.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&created.stderr));
        cluster.wait_ok().await;
        Some(cluster)
    }

    /// Waits until every live node says every slot is served, and every replica has
    /// its master's data.
    pub async fn wait_ok(&self) {
        self.wait_slots_served().await;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let url = node.url();
            eventually("every replica to be in sync with its master", || {
                let url = url.clone();
                async move {
                    let Ok(client) = redis::Client::open(url) else { return false };
                    let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return false };
                    let info: String =
                        redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap_or_default();
                    info.contains("role:master") || info.contains("master_link_status:up")
                }
            })
            .await;
        }
    }

    async fn wait_slots_served(&self) {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let url = node.url();
            eventually("the cluster to serve every slot", || {
                let url = url.clone();
                async move {
                    cluster_info(&url).await.is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
                }
            })
            .await;
        }
    }

    /// kill -9 of the master at `port`; returns once one of its replicas took over
    /// and every slot is served again.
    pub async fn kill_master(&mut self, port: u16) {
        let replicas = self.kill_master_now(port).await;
        self.wait_promoted(replicas).await;
    }

    /// kill -9 of the master at `port`; returns its replicas' URLs, for
    /// [`RedisCluster::wait_promoted`].
    pub async fn kill_master_now(&mut self, port: u16) -> Vec<String> {
        let replicas = self.replicas_of(port).await;
        self.nodes.iter_mut().find(|n| n.port == port).unwrap().kill();
        replicas
    }

    /// Moves `slot` and its keys to the master at `to` (`SETSLOT … MIGRATING` /
    /// `IMPORTING`, `MIGRATE`, `SETSLOT … NODE`); returns once every node says so. The
    /// old owner stays up and answers MOVED for the slot.
    pub async fn move_slot(&self, slot: u16, to: u16) {
        let from = self.owner_of(slot).await;
        let node = |port: u16| self.nodes.iter().find(|n| n.port == port).unwrap();
        let id = |port: u16| async move {
            redis::cmd("CLUSTER").arg("MYID").query_async::<String>(&mut node(port).conn().await).await.unwrap()
        };
        let (from_id, to_id) = (id(from).await, id(to).await);
        let (mut source, mut target) = (node(from).conn().await, node(to).conn().await);
        let setslot = |state: &str, id: &str| redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(state).arg(id).clone();
        let _: () = setslot("IMPORTING", &from_id).query_async(&mut target).await.unwrap();
        let _: () = setslot("MIGRATING", &to_id).query_async(&mut source).await.unwrap();
        loop {
            let keys: Vec<String> =
                redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100).query_async(&mut source).await.unwrap();
            if keys.is_empty() {
                break;
            }
            let _: () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query_async(&mut source)
                .await
                .unwrap();
        }
        for port in [to, from] {
            let _: () = setslot("NODE", &to_id).query_async(&mut node(port).conn().await).await.unwrap();
        }
        for master in self.masters().await {
            let _: () = setslot("NODE", &to_id).query_async(&mut master.conn().await).await.unwrap();
        }
        eventually("every node to see the slot's new owner", || async move {
            for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                let Some(owner) = slot_owner(&mut node.conn().await, slot).await else { return false };
                if owner != to {
                    return false;
                }
            }
            true
        })
        .await;
        self.wait_ok().await;
    }

    /// The URLs of the replicas of the master at `port`.
    async fn replicas_of(&self, port: u16) -> Vec<String> {
        let mut replicas = Vec::new();
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut node.conn().await).await.unwrap();
            if matches!(role.get(2), Some(redis::Value::Int(p)) if *p == i64::from(port)) {
                replicas.push(node.url());
            }
        }
        assert!(!replicas.is_empty(), "the master at {port} has a replica");
        replicas
    }

    /// Returns once one of `replicas` took over and every slot is served again.
    pub async fn wait_promoted(&self, replicas: Vec<String>) {
        eventually("a replica of the killed master to be promoted", || {
            let replicas = replicas.clone();
            async move {
                for url in replicas {
                    let Ok(client) = redis::Client::open(url) else { continue };
                    let Ok(mut conn) = client.get_multiplexed_async_connection().await else { continue };
                    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap_or_default();
                    if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
                        return true;
                    }
                }
                false
            }
        })
        .await;
        self.wait_ok().await;
    }

    /// The port of the master serving `slot` now.
    pub async fn owner_of(&self, slot: u16) -> u16 {
        let node = self.nodes.iter().find(|n| n.child.is_some()).unwrap();
        slot_owner(&mut node.conn().await, slot).await.expect("a master serves the slot")
    }

    /// The slot of `key`.
    pub async fn slot_of(&self, key: &str) -> u16 {
        let node = self.nodes.iter().find(|n| n.child.is_some()).unwrap();
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut node.conn().await).await.unwrap()
    }

    /// `host:port` of every node, for `eventbus.redis.cluster_nodes`.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    /// The live masters.
    pub async fn masters(&self) -> Vec<&Node> {
        let mut masters = Vec::new();
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let mut conn = node.conn().await;
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
            if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
                masters.push(node);
            }
        }
        masters
    }
}

/// The port of the master serving `slot`, as the node behind `conn` sees it.
async fn slot_owner(conn: &mut redis::aio::MultiplexedConnection, slot: u16) -> Option<u16> {
    let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await.unwrap();
    let port = slots.iter().find_map(|range| match (&range[0], &range[1], &range[2]) {
        (redis::Value::Int(start), redis::Value::Int(end), redis::Value::Array(master))
            if (*start..=*end).contains(&i64::from(slot)) =>
        {
            match &master[1] {
                redis::Value::Int(port) => Some(*port),
                _ => None,
            }
        }
        _ => None,
    });
    port.and_then(|p| u16::try_from(p).ok())
}

async fn cluster_info(url: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("CLUSTER").arg("INFO").query_async::<String>(&mut conn).await.ok()
}

impl Node {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Calls of `command` this node has served (`INFO commandstats`).
    pub async fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut self.conn().await).await.unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}
