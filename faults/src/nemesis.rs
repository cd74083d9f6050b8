//! Faults, applied to a running fleet and healed: each picks its targets with the
//! run's seeded generator at the moment it starts (the cluster's roles change as
//! failovers happen), and remembers exactly what to undo.

use std::time::Duration;

use anyhow::Result;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::fleet::{self, Fleet, Kind};
use crate::net::{self, Host};

/// The faults the harness knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Fault {
    /// One instance cannot reach one Redis master (or the single Redis).
    PartitionInstanceMaster,
    /// A master cannot reach its replica; both still reach everything else.
    PartitionMasterReplica,
    /// A master cannot reach any other Redis node, while instances still reach it: the
    /// others fail it over, and it accepts writes until it notices.
    IsolateMaster,
    /// One instance cannot reach any Redis node.
    IsolateInstance,
    /// SIGSTOP of one instance for longer than every timeout, then SIGCONT.
    PauseInstance,
    /// SIGSTOP of one Redis master (or the single Redis) for longer than every timeout.
    PauseRedis,
    /// SIGKILL of one instance, started again at the heal.
    KillInstance,
    /// SIGKILL of one Redis master (or the single Redis), started again at the heal.
    KillRedis,
    /// The embedded store's filesystem filled to the last byte.
    FullDisk,
}

impl Fault {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::PartitionInstanceMaster => "partition instance-master",
            Self::PartitionMasterReplica => "partition master-replica",
            Self::IsolateMaster => "isolate master",
            Self::IsolateInstance => "isolate instance",
            Self::PauseInstance => "pause instance",
            Self::PauseRedis => "pause redis",
            Self::KillInstance => "kill -9 instance",
            Self::KillRedis => "kill -9 redis",
            Self::FullDisk => "full disk",
        }
    }

    /// The faults that make sense on a fleet of this kind.
    pub(crate) fn for_kind(kind: Kind) -> &'static [Fault] {
        match kind {
            Kind::Embedded => &[Self::PauseInstance, Self::KillInstance, Self::FullDisk],
            Kind::Single => &[
                Self::PartitionInstanceMaster,
                Self::PauseInstance,
                Self::PauseRedis,
                Self::KillRedis,
                Self::KillInstance,
            ],
            Kind::Cluster => &[
                Self::PartitionInstanceMaster,
                Self::PartitionMasterReplica,
                Self::IsolateMaster,
                Self::IsolateInstance,
                Self::PauseInstance,
                Self::PauseRedis,
                Self::KillInstance,
                Self::KillRedis,
            ],
        }
    }

    /// Whether two faults may be applied together (not twice to one kind of target,
    /// and never two that both take the same process away).
    pub(crate) fn combines_with(self, other: Fault) -> bool {
        self != other
            && !(self.takes_instance() && other.takes_instance())
            && !(self.takes_redis() && other.takes_redis())
    }

    fn takes_instance(self) -> bool {
        matches!(self, Self::PauseInstance | Self::KillInstance | Self::FullDisk)
    }

    fn takes_redis(self) -> bool {
        matches!(self, Self::PauseRedis | Self::KillRedis | Self::IsolateMaster)
    }
}

/// What an applied fault must undo.
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) fault: Fault,
    /// Its targets, for the report (`i1`, `r3`, …).
    pub(crate) targets: Vec<&'static str>,
    undo: Undo,
}

#[derive(Debug)]
enum Undo {
    Flush(Vec<Host>),
    Continue { instance: Option<usize>, redis: Option<Host> },
    Restart { instance: Option<usize>, redis: Option<Host> },
    Remove(std::path::PathBuf),
}

/// A fault with nothing to apply it to at that moment (the topology changed under it:
/// a master without a replica after failovers): skipped. Any other error applying a
/// fault (a command that cannot run) fails the run: its schedule was not applied.
#[derive(Debug)]
pub(crate) struct NoTarget(String);

impl std::fmt::Display for NoTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoTarget {}

async fn pick_master(fleet: &Fleet, rng: &mut StdRng) -> Result<(Host, Vec<Host>)> {
    match fleet.kind {
        Kind::Cluster => {
            let masters = fleet::topology().await?;
            match masters.choose(rng) {
                Some(pair) => Ok(pair.clone()),
                None => Err(NoTarget("the cluster has no master".to_owned()).into()),
            }
        }
        _ => Ok((net::SINGLE, vec![])),
    }
}

/// Applies `fault` to `fleet`.
pub(crate) async fn apply(fault: Fault, fleet: &mut Fleet, rng: &mut StdRng) -> Result<Applied> {
    let instance = rng.gen_range(0..fleet.instances.len());
    let instance_host = fleet.instances[instance].proc.host;
    let (targets, undo) = match fault {
        Fault::PartitionInstanceMaster => {
            let (master, _) = pick_master(fleet, rng).await?;
            net::cut(instance_host, master).await?;
            (vec![instance_host.name, master.name], Undo::Flush(vec![instance_host, master]))
        }
        Fault::PartitionMasterReplica => {
            let (master, replicas) = pick_master(fleet, rng).await?;
            let Some(&replica) = replicas.first() else {
                return Err(NoTarget(format!("master {} has no replica now", master.name)).into());
            };
            net::cut(master, replica).await?;
            (vec![master.name, replica.name], Undo::Flush(vec![master, replica]))
        }
        Fault::IsolateMaster => {
            let (master, _) = pick_master(fleet, rng).await?;
            let others: Vec<Host> = net::CLUSTER.iter().copied().filter(|h| *h != master).collect();
            for other in &others {
                net::cut(master, *other).await?;
            }
            let mut touched = others;
            touched.push(master);
            (vec![master.name], Undo::Flush(touched))
        }
        Fault::IsolateInstance => {
            let redis: Vec<Host> = fleet.redis.iter().map(|p| p.host).collect();
            for node in &redis {
                net::cut(instance_host, *node).await?;
            }
            let mut touched = redis;
            touched.push(instance_host);
            (vec![instance_host.name], Undo::Flush(touched))
        }
        Fault::PauseInstance => {
            fleet.instances[instance].proc.signal("STOP").await?;
            (vec![instance_host.name], Undo::Continue { instance: Some(instance), redis: None })
        }
        Fault::PauseRedis => {
            let (master, _) = pick_master(fleet, rng).await?;
            match fleet.redis_on(master) {
                Some(proc) => proc.signal("STOP").await?,
                None => return Err(NoTarget(format!("no Redis process on {}", master.name)).into()),
            }
            (vec![master.name], Undo::Continue { instance: None, redis: Some(master) })
        }
        Fault::KillInstance => {
            fleet.instances[instance].proc.kill().await;
            (vec![instance_host.name], Undo::Restart { instance: Some(instance), redis: None })
        }
        Fault::KillRedis => {
            let (master, _) = pick_master(fleet, rng).await?;
            match fleet.redis_on(master) {
                Some(proc) => proc.kill().await,
                None => return Err(NoTarget(format!("no Redis process on {}", master.name)).into()),
            }
            (vec![master.name], Undo::Restart { instance: None, redis: Some(master) })
        }
        Fault::FullDisk => (vec![instance_host.name], Undo::Remove(fill_disk()?)),
    };
    Ok(Applied { fault, targets, undo })
}

/// Undoes what `apply` did.
pub(crate) async fn heal(applied: Applied, fleet: &mut Fleet) -> Result<()> {
    match applied.undo {
        Undo::Flush(hosts) => {
            for host in hosts {
                net::heal(host).await?;
            }
        }
        Undo::Continue { instance, redis } => {
            if let Some(i) = instance {
                fleet.instances[i].proc.signal("CONT").await?;
            }
            if let Some(host) = redis
                && let Some(proc) = fleet.redis_on(host)
            {
                proc.signal("CONT").await?;
            }
        }
        Undo::Restart { instance, redis } => {
            if let Some(i) = instance {
                fleet.instances[i].proc.start()?;
            }
            if let Some(host) = redis
                && let Some(proc) = fleet.redis_on(host)
            {
                proc.start()?;
            }
        }
        Undo::Remove(path) => {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Writes a file until the embedded store's filesystem has no byte left.
fn fill_disk() -> Result<std::path::PathBuf> {
    use std::io::Write;
    let path = std::path::Path::new(net::DISK).join("fill");
    let mut file = std::fs::File::create(&path)?;
    let block = vec![0u8; 1 << 20];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::StorageFull => break,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(path)
}

/// How long a fault lasts: longer than every timeout it is meant to outlast (ack
/// deadline, group membership, cluster node timeout).
pub(crate) fn duration(rng: &mut StdRng, long: bool) -> Duration {
    let floor = fleet::ACK_DEADLINE_MS.max(5000) + 2000;
    if long { Duration::from_millis(rng.gen_range(floor..floor + 20_000)) } else { Duration::from_millis(floor) }
}
