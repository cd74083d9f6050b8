//! A private `redis-server` per test ([`RedisProc`]), a private Redis Cluster
//! ([`RedisCluster`]), and tools to fail a connection to one ([`RedisProxy`]).
//!
//! Without `redis-server` on the PATH the Redis tests pass with a loud notice, unless
//! `EVENTBUS_REQUIRE_REDIS=1` (set by `.ci/run`), which makes a missing binary a failure.

mod cluster;

pub use cluster::{Node, RedisCluster};

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};

use crate::{DEADLINE, eventually};

#[derive(Debug)]
pub struct RedisProc {
    pub port: u16,
    binary: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Extra arguments (TLS, ACL users).
    pub extra: Vec<String>,
    /// ACL user and password the helper's own connections log in with.
    pub credentials: Option<(String, String)>,
    /// Persist with an append-only file fsynced on every write (restart tests).
    pub persist: bool,
}

static SKIP_NOTICE: Once = Once::new();

impl RedisProc {
    /// Starts a private redis-server, or returns None (after a notice) when there is
    /// none to start and it is not required.
    pub async fn start() -> Option<Self> {
        Self::start_with(false, Vec::new(), None).await
    }

    /// [`RedisProc::start`] with one ACL user, `username` with `password` and every
    /// right; the `default` user is off, so nothing gets in without them.
    pub async fn start_acl(username: &str, password: &str) -> Option<Self> {
        let user = [username, "on", &format!(">{password}"), "~*", "&*", "+@all"];
        let extra = ["--user", "default", "off", "--user"].into_iter().chain(user).map(str::to_owned).collect();
        Self::start_with(false, extra, Some((username.to_owned(), password.to_owned()))).await
    }

    /// A replica of `master` (`--replicaof`), which it has caught up with on return.
    pub async fn start_replica_of(master: &RedisProc) -> Option<Self> {
        let extra = ["--replicaof", "127.0.0.1", &master.port.to_string()].map(str::to_owned).to_vec();
        let replica = Self::start_with(false, extra, None).await?;
        let conn = replica.conn().await;
        eventually("the replica to be in sync", || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap();
                info.contains("master_link_status:up")
            }
        })
        .await;
        Some(replica)
    }

    /// [`RedisProc::start`] with persistence (AOF, `appendfsync always`): a restart
    /// keeps everything it acknowledged.
    pub async fn start_persistent() -> Option<Self> {
        Self::start_with(true, Vec::new(), None).await
    }

    async fn start_with(persist: bool, extra: Vec<String>, credentials: Option<(String, String)>) -> Option<Self> {
        let Some(binary) = which_redis() else {
            assert!(
                std::env::var("EVENTBUS_REQUIRE_REDIS").as_deref() != Ok("1"),
                "EVENTBUS_REQUIRE_REDIS=1 but redis-server is not on the PATH"
            );
            SKIP_NOTICE.call_once(|| {
                eprintln!(
                    "\n*** NOTICE: redis-server not found: the Redis mode tests were SKIPPED. ***\n\
                     *** Install it (apt-get install redis-server) to run them, and set     ***\n\
                     *** EVENTBUS_REQUIRE_REDIS=1 to make a missing redis-server a failure.  ***\n"
                )
            });
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let mut redis = Self { port: 0, binary, dir, child: None, extra, credentials, persist };
        // A free port can be taken again before redis-server binds it (by another
        // test's redis-server, say): then ours exits and the PING is answered by the
        // other one. Check who answered and try another port.
        for _ in 0..5 {
            redis.port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            if redis.try_spawn().await {
                return Some(redis);
            }
            redis.kill();
        }
        panic!("could not start a redis-server of our own on a free port");
    }

    /// A port nobody listens on, for "Redis is down" at start-up.
    pub fn reserve() -> Option<Self> {
        let binary = which_redis()?;
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        Some(Self { port, binary, dir, child: None, extra: Vec::new(), credentials: None, persist: false })
    }

    /// Starts (or restarts) redis-server on `self.port`.
    pub async fn spawn(&mut self) {
        assert!(self.try_spawn().await, "port {} was taken by another redis-server", self.port);
    }

    /// Starts redis-server; false when the one answering on the port is not ours.
    async fn try_spawn(&mut self) -> bool {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(match self.persist {
                true => &["--appendonly", "yes", "--appendfsync", "always"][..],
                false => &["--appendonly", "no"][..],
            })
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id();
        self.child = Some(child);
        if self.port == 0 {
            return true; // TLS only: the test waits for the broker to connect instead of PINGing.
        }
        wait_for_ping(&self.url()).await;
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut self.conn().await).await.unwrap();
        info.lines().any(|l| l.trim() == format!("process_id:{pid}"))
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to redis-server: a stopped Redis keeps its
    /// sockets open but answers nothing, like a hung one.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pid} failed");
    }

    pub fn url(&self) -> String {
        match &self.credentials {
            Some((user, password)) => format!("redis://{user}:{password}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }

    /// Prefixed channels and pattern count this Redis has subscribers for.
    pub async fn pubsub(&self) -> (Vec<String>, i64) {
        let mut conn = self.conn().await;
        let mut channels: Vec<String> =
            redis::cmd("PUBSUB").arg("CHANNELS").arg("socle:eventbus:*").query_async(&mut conn).await.unwrap();
        channels.sort();
        let numpat: i64 = redis::cmd("PUBSUB").arg("NUMPAT").query_async(&mut conn).await.unwrap();
        (channels, numpat)
    }
}

/// Waits until the Redis at `url` answers PING.
pub async fn wait_for_ping(url: &str) {
    eventually(&format!("{url} to answer PING"), || async move {
        let Ok(client) = redis::Client::open(url) else { return false };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return false };
        redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
    })
    .await;
}

pub fn which_redis() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("redis-server")).find(|p| p.is_file())
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP proxy to a Redis that can silence one of its connections: nothing more is
/// forwarded either way, both sockets held open (a connection whose far end vanished
/// without a FIN: a host or a middlebox gone).
#[derive(Debug)]
pub struct RedisProxy {
    pub port: u16,
    /// What silences each connection, by the proxy's local port towards Redis (the
    /// `addr` Redis's `CLIENT LIST` shows).
    links: Links,
}

type Links = std::sync::Arc<Mutex<std::collections::HashMap<u16, tokio_util::sync::CancellationToken>>>;

impl RedisProxy {
    pub async fn start(redis: &RedisProc) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let links = Links::default();
        let (registry, to) = (std::sync::Arc::clone(&links), redis.port);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { continue };
                let silence = tokio_util::sync::CancellationToken::new();
                registry.lock().unwrap().insert(outbound.local_addr().unwrap().port(), silence.clone());
                tokio::spawn(async move {
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    tokio::select! {
                        _ = silence.cancelled() => {}
                        _ = async { tokio::join!(tokio::io::copy(&mut ri, &mut wo), tokio::io::copy(&mut ro, &mut wi)) } => return,
                    }
                    // Silent, the sockets held open until the test's runtime ends.
                    std::future::pending::<()>().await;
                    drop((ri, wi, ro, wo));
                });
            }
        });
        Self { port, links }
    }

    /// Silences the connection whose end towards Redis is at local `port`.
    pub fn silence(&self, port: u16) {
        self.links.lock().unwrap().get(&port).expect("a connection through the proxy").cancel();
    }
}

/// The local port of a client of `redis` blocked in `command` now (`CLIENT LIST`), once
/// there is one.
pub async fn blocked_client(redis: &RedisProc, command: &str) -> u16 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut redis.conn().await).await.unwrap();
        let blocked = list.lines().find(|l| {
            l.split(' ').any(|f| f == format!("cmd={command}"))
                && l.split(' ').any(|f| f.starts_with("flags=") && f.contains('b'))
        });
        if let Some(line) = blocked {
            let addr = line.split(' ').find_map(|f| f.strip_prefix("addr=")).unwrap();
            return addr.rsplit_once(':').unwrap().1.parse().unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "no client blocked in {command}: {list}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
