//! The processes of a fleet: Redis nodes and eventbusd instances, each started in its
//! host's namespace, each with its log file, each one that can be paused, killed with
//! SIGKILL and started again as it was.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use crate::net::{self, Host};

/// Which fan-out core and store the instances run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// One instance, `in_memory` mode, its durable store on a small filesystem.
    Embedded,
    /// Two instances on one Redis (append-only file, fsync on every write).
    Single,
    /// Three instances on a Redis Cluster of three masters and three replicas.
    Cluster,
}

/// Settings of the durability knobs the promises depend on.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Durability {
    /// `eventbus.redis.min_replicas_acked` (cluster).
    pub(crate) min_replicas_acked: u32,
    /// Redis `appendfsync` (`always` or `everysec`).
    pub(crate) appendfsync: &'static str,
}

/// The ack deadline of the durable consumer: pauses last longer.
pub(crate) const ACK_DEADLINE_MS: u64 = 4000;
/// Redis Cluster's `cluster-node-timeout`: pauses last longer.
pub(crate) const NODE_TIMEOUT_MS: u64 = 2000;
/// Port of the push consumer's endpoint, on the client host.
pub(crate) const PUSH_PORT: u16 = 9090;
/// How long `/healthz` fails before the harness, as a supervisor, restarts the process.
const LIVENESS_GRACE: Duration = Duration::from_secs(3);

/// One process the harness owns.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) host: Host,
    program: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    fn new(name: &str, host: Host, program: &str, args: Vec<String>, dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        Self { name: name.to_owned(), host, program: program.to_owned(), args, log, child: None }
    }

    /// Starts it in its host's namespace, its output appended to its log file.
    pub(crate) fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.host.namespace(), &self.program])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Sends `signal` (`STOP`, `CONT`) to it.
    pub(crate) async fn signal(&self, signal: &str) -> Result<()> {
        let Some(pid) = self.pid() else { bail!("{} is not running", self.name) };
        net::run("kill", &[&format!("-{signal}"), &pid.to_string()]).await.map(drop)
    }

    /// SIGKILL, and waits for it to be gone.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Its resident memory in KiB, from /proc.
    pub(crate) fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether it exited by itself (a crash), with its status.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }
}

/// An eventbusd instance.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) proc: Proc,
    /// Since when `/healthz` has failed, as a supervisor watching liveness sees it.
    unhealthy_since: Option<Instant>,
}

impl Instance {
    pub(crate) fn grpc_url(&self) -> String {
        format!("http://{}:50051", self.proc.host.ip)
    }

    pub(crate) fn ready_url(&self) -> String {
        format!("http://{}:8080/readyz", self.proc.host.ip)
    }

    fn health_url(&self) -> String {
        format!("http://{}:8080/healthz", self.proc.host.ip)
    }
}

/// A fleet: its instances and its Redis nodes.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) kind: Kind,
    pub(crate) durability: Durability,
    pub(crate) instances: Vec<Instance>,
    pub(crate) redis: Vec<Proc>,
    /// Where its logs, configuration and data are.
    pub(crate) dir: PathBuf,
}

impl Fleet {
    /// Starts Redis (creating the cluster), then the instances, and waits until every
    /// instance is ready.
    pub(crate) async fn start(kind: Kind, durability: Durability, eventbusd: &Path, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let redis_hosts: Vec<Host> = match kind {
            Kind::Embedded => vec![],
            Kind::Single => vec![net::SINGLE],
            Kind::Cluster => net::CLUSTER.to_vec(),
        };
        let mut redis = Vec::new();
        for host in &redis_hosts {
            let data = dir.join(format!("redis-{}", host.name));
            std::fs::create_dir_all(&data)?;
            let mut args: Vec<String> = [
                "--bind",
                host.ip,
                "--port",
                "6379",
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                durability.appendfsync,
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            args.extend(["--dir".to_owned(), data.display().to_string()]);
            if kind == Kind::Cluster {
                args.extend(
                    ["--cluster-enabled", "yes", "--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()]
                        .map(str::to_owned),
                );
            }
            let mut proc = Proc::new(&format!("redis-{}", host.name), *host, "redis-server", args, dir);
            proc.start()?;
            redis.push(proc);
        }
        for host in &redis_hosts {
            wait_for(&format!("redis on {}", host.ip), Duration::from_secs(20), || async move {
                redis_cli(*host, &["PING"]).await.is_ok_and(|out| out.trim() == "PONG")
            })
            .await?;
        }
        if kind == Kind::Cluster {
            create_cluster(&redis_hosts).await?;
        }

        let hosts: Vec<Host> = match kind {
            Kind::Embedded => vec![net::EMBEDDED],
            Kind::Single => net::INSTANCES[..2].to_vec(),
            Kind::Cluster => net::INSTANCES.to_vec(),
        };
        let mut instances = Vec::new();
        for host in hosts {
            let config = dir.join(format!("eventbusd-{}.yaml", host.name));
            std::fs::write(&config, instance_config(kind, durability, host))
                .with_context(|| format!("cannot write {}", config.display()))?;
            let args = vec!["--config".to_owned(), config.display().to_string()];
            let mut proc =
                Proc::new(&format!("eventbusd-{}", host.name), host, &eventbusd.display().to_string(), args, dir);
            proc.start()?;
            instances.push(Instance { proc, unhealthy_since: None });
        }
        let fleet = Self { kind, durability, instances, redis, dir: dir.to_owned() };
        fleet.wait_ready(Duration::from_secs(60)).await?;
        Ok(fleet)
    }

    /// Waits until every instance answers `/readyz` with 200.
    pub(crate) async fn wait_ready(&self, within: Duration) -> Result<()> {
        for instance in &self.instances {
            let url = instance.ready_url();
            wait_for(&format!("{} ready", instance.proc.name), within, || ready(url.clone())).await?;
        }
        Ok(())
    }

    /// What a supervisor does with a liveness probe (a Kubernetes `livenessProbe` on
    /// `/healthz`, a systemd watchdog): an instance whose `/healthz` has failed for
    /// [`LIVENESS_GRACE`] is restarted. Returns what it restarted. (An instance that
    /// does not answer at all is left alone: it may be paused or cut off.)
    pub(crate) async fn supervise(&mut self) -> Vec<String> {
        let mut restarted = Vec::new();
        for instance in &mut self.instances {
            if instance.proc.pid().is_none() {
                continue;
            }
            let failing = reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .ok()
                .map(|client| client.get(instance.health_url()).send());
            let failing = match failing {
                Some(request) => request.await.is_ok_and(|r| r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE),
                None => false,
            };
            match (failing, instance.unhealthy_since) {
                (false, _) => instance.unhealthy_since = None,
                (true, None) => instance.unhealthy_since = Some(Instant::now()),
                (true, Some(since)) if since.elapsed() >= LIVENESS_GRACE => {
                    instance.proc.kill().await;
                    instance.unhealthy_since = None;
                    match instance.proc.start() {
                        Ok(()) => restarted.push(format!("{} (liveness off)", instance.proc.name)),
                        Err(err) => restarted.push(format!("{} could not be restarted: {err:#}", instance.proc.name)),
                    }
                }
                (true, Some(_)) => {}
            }
        }
        restarted
    }

    /// The Redis node on `host`.
    pub(crate) fn redis_on(&mut self, host: Host) -> Option<&mut Proc> {
        self.redis.iter_mut().find(|proc| proc.host == host)
    }

    /// Stops every process.
    pub(crate) async fn stop(&mut self) {
        for proc in self.instances.iter_mut().map(|i| &mut i.proc).chain(self.redis.iter_mut()) {
            let _ = proc.signal("CONT").await;
            proc.kill().await;
        }
    }
}

/// Whether `url` answers 200.
pub(crate) async fn ready(url: String) -> bool {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(1)).build();
    match client {
        Ok(client) => client.get(url).send().await.is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

/// Polls `condition` until it holds, or fails naming `what` after `within`.
pub(crate) async fn wait_for<F, Fut>(what: &str, within: Duration, mut condition: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if condition().await {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `redis-cli` against the node on `host`, bounded in time.
pub(crate) async fn redis_cli(host: Host, args: &[&str]) -> Result<String> {
    let mut full = vec!["-h", host.ip, "-p", "6379"];
    full.extend_from_slice(args);
    tokio::time::timeout(Duration::from_secs(3), net::run("redis-cli", &full))
        .await
        .with_context(|| format!("redis-cli {}: no answer within 3 s", host.ip))?
}

async fn create_cluster(hosts: &[Host]) -> Result<()> {
    let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
    args.extend(hosts.iter().map(|h| format!("{}:6379", h.ip)));
    args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    net::run("redis-cli", &args).await?;
    for host in hosts {
        wait_for(&format!("cluster state ok on {}", host.ip), Duration::from_secs(30), || async move {
            redis_cli(*host, &["CLUSTER", "INFO"]).await.is_ok_and(|out| out.contains("cluster_state:ok"))
        })
        .await?;
    }
    Ok(())
}

/// The cluster's current masters, each with its replicas, as `CLUSTER NODES` on the
/// first node that answers sees it (nodes marked failed left out).
pub(crate) async fn topology() -> Result<Vec<(Host, Vec<Host>)>> {
    for host in net::CLUSTER {
        let Ok(out) = redis_cli(host, &["CLUSTER", "NODES"]).await else { continue };
        let mut ids = Vec::new();
        let mut replicas = Vec::new();
        for line in out.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || fields[2].contains("fail") {
                continue;
            }
            let ip = fields[1].split(':').next().unwrap_or_default();
            let Some(node) = net::CLUSTER.iter().find(|h| h.ip == ip) else { continue };
            if fields[2].contains("master") {
                ids.push((fields[0].to_owned(), *node));
            } else {
                replicas.push((fields[3].to_owned(), *node));
            }
        }
        let masters = ids
            .iter()
            .map(|(id, master)| (*master, replicas.iter().filter(|(of, _)| of == id).map(|(_, r)| *r).collect()))
            .collect::<Vec<_>>();
        if !masters.is_empty() {
            return Ok(masters);
        }
    }
    bail!("no cluster node answers CLUSTER NODES")
}

/// The durable consumer, the channel with a history, and the fan-out core.
fn instance_config(kind: Kind, durability: Durability, host: Host) -> String {
    let ip = host.ip;
    let mut yaml = format!(
        "server:\n  grpc_addr: \"{ip}:50051\"\n  http_addr: \"{ip}:8080\"\n  shutdown_timeout_ms: 2000\n  close_grace_ms: 500\n\
         log:\n  level: info\n\
         eventbus:\n  history:\n    - channels: \"faults.ticks\"\n      size: 100000\n"
    );
    match kind {
        Kind::Embedded => yaml.push_str("  mode: in_memory\n"),
        Kind::Single => {
            let _ = write!(yaml, "  mode: redis\n  redis:\n    url: \"redis://{}:6379\"\n", net::SINGLE.ip);
        }
        Kind::Cluster => {
            let nodes: Vec<String> = net::CLUSTER.iter().map(|h| format!("\"{}:6379\"", h.ip)).collect();
            let _ = write!(
                yaml,
                "  mode: redis\n  redis:\n    cluster_nodes: [{}]\n    min_replicas_acked: {}\n",
                nodes.join(", "),
                durability.min_replicas_acked
            );
        }
    }
    let data_dir = match kind {
        Kind::Embedded => format!("{}/data", net::DISK),
        _ => String::new(),
    };
    let _ = write!(
        yaml,
        "durable:\n  data_dir: \"{data_dir}\"\n  min_free_disk_bytes: 8388608\n  consumers:\n    - name: faults-work\n      \
         channels: [\"faults.orders.>\"]\n      ack_deadline_ms: {ACK_DEADLINE_MS}\n      max_attempts: 1000\n      \
         backoff: {{initial_ms: 100, max_ms: 1000}}\n    - name: faults-push\n      \
         channels: [\"faults.orders.>\"]\n      ack_deadline_ms: {ACK_DEADLINE_MS}\n      max_attempts: 1000\n      \
         backoff: {{initial_ms: 100, max_ms: 1000}}\n      push: {{url: \"http://{}:{PUSH_PORT}/push\", timeout_ms: 2000}}\n\
         push:\n  allow_networks: [\"{}/32\"]\n",
        net::CLIENT.ip,
        net::CLIENT.ip,
    );
    yaml
}
