//! The harness's network: one namespace per host, each joined to a bridge in a hub
//! namespace by a veth pair, addresses only inside those namespaces; partitions are
//! iptables DROP rules in the namespaces of both ends.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::Command;

/// Prefix of every namespace and interface the harness creates (and removes).
const PREFIX: &str = "ebf-";
const HUB: &str = "ebf-hub";
const BRIDGE: &str = "br0";

/// Where the embedded store lives: a small filesystem the harness mounts, so that it
/// can fill it.
pub(crate) const DISK: &str = "/run/ebf-disk";
const DISK_SIZE: &str = "64m";

/// A host of the harness: its namespace and its one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Host {
    pub(crate) name: &'static str,
    pub(crate) ip: &'static str,
}

impl Host {
    pub(crate) fn namespace(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }
}

/// The clients, the checker and the nemesis run here.
pub(crate) const CLIENT: Host = Host { name: "c", ip: "10.77.0.2" };
/// eventbusd instances of the Redis fleets.
pub(crate) const INSTANCES: [Host; 3] = [
    Host { name: "i1", ip: "10.77.0.11" },
    Host { name: "i2", ip: "10.77.0.12" },
    Host { name: "i3", ip: "10.77.0.13" },
];
/// The Redis Cluster's six nodes (three masters, three replicas once created).
pub(crate) const CLUSTER: [Host; 6] = [
    Host { name: "r1", ip: "10.77.0.21" },
    Host { name: "r2", ip: "10.77.0.22" },
    Host { name: "r3", ip: "10.77.0.23" },
    Host { name: "r4", ip: "10.77.0.24" },
    Host { name: "r5", ip: "10.77.0.25" },
    Host { name: "r6", ip: "10.77.0.26" },
];
/// The single Redis.
pub(crate) const SINGLE: Host = Host { name: "s", ip: "10.77.0.30" };
/// The embedded-mode instance.
pub(crate) const EMBEDDED: Host = Host { name: "e", ip: "10.77.0.40" };

fn all_hosts() -> Vec<Host> {
    let mut hosts = vec![CLIENT, SINGLE, EMBEDDED];
    hosts.extend(INSTANCES);
    hosts.extend(CLUSTER);
    hosts
}

/// Runs a command to completion; an error names it and carries what it printed.
pub(crate) async fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        Command::new(program).args(args).stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .with_context(|| format!("`{program} {}` did not finish within 20 s", args.join(" ")))?
    .with_context(|| format!("cannot run `{program}`"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

async fn ip(args: &[&str]) -> Result<String> {
    run("ip", args).await
}

/// Creates the namespaces, the bridge, the links and the small filesystem (after
/// removing whatever an earlier run left).
pub(crate) async fn up() -> Result<()> {
    down().await;
    ip(&["netns", "add", HUB]).await?;
    ip(&["-n", HUB, "link", "set", "lo", "up"]).await?;
    ip(&["-n", HUB, "link", "add", BRIDGE, "type", "bridge"]).await?;
    ip(&["-n", HUB, "link", "set", BRIDGE, "up"]).await?;
    for host in all_hosts() {
        let ns = host.namespace();
        let outer = format!("{PREFIX}v{}", host.name);
        let address = format!("{}/24", host.ip);
        ip(&["netns", "add", &ns]).await?;
        ip(&["link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &ns]).await?;
        ip(&["link", "set", &outer, "netns", HUB]).await?;
        ip(&["-n", HUB, "link", "set", &outer, "master", BRIDGE, "up"]).await?;
        ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"]).await?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"]).await?;
        ip(&["-n", &ns, "link", "set", "lo", "up"]).await?;
    }
    std::fs::create_dir_all(DISK).with_context(|| format!("cannot create {DISK}"))?;
    run("mount", &["-t", "tmpfs", "-o", &format!("size={DISK_SIZE}"), "ebf-disk", DISK]).await?;
    Ok(())
}

/// Removes everything `up` creates, killing what still runs in the namespaces first.
/// Never fails: each step is attempted and what could not be removed is printed.
pub(crate) async fn down() {
    let mut namespaces: Vec<String> = all_hosts().iter().map(Host::namespace).collect();
    namespaces.push(HUB.to_owned());
    let existing = ip(&["netns", "list"]).await.unwrap_or_default();
    for ns in namespaces.iter().filter(|ns| existing.lines().any(|line| line.split_whitespace().next() == Some(ns))) {
        if let Ok(pids) = ip(&["netns", "pids", ns]).await {
            for pid in pids.split_whitespace() {
                let _ = run("kill", &["-CONT", pid]).await;
                let _ = run("kill", &["-KILL", pid]).await;
            }
        }
        if let Err(err) = ip(&["netns", "del", ns]).await {
            eprintln!("faults: {err:#}");
        }
    }
    // A link left in this namespace by an interrupted `up`.
    for host in all_hosts() {
        let outer = format!("{PREFIX}v{}", host.name);
        if ip(&["link", "show", &outer]).await.is_ok() {
            let _ = ip(&["link", "del", &outer]).await;
        }
    }
    if run("mountpoint", &["-q", DISK]).await.is_ok()
        && let Err(err) = run("umount", &["-l", DISK]).await
    {
        eprintln!("faults: {err:#}");
    }
}

/// Drops every packet between `a` and `b`, both ways, in both namespaces (the TCP
/// connections between them hang, as across a real partition).
pub(crate) async fn cut(a: Host, b: Host) -> Result<()> {
    for (here, there) in [(a, b), (b, a)] {
        let ns = here.namespace();
        run("ip", &["netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", there.ip, "-j", "DROP"]).await?;
        run("ip", &["netns", "exec", &ns, "iptables", "-A", "OUTPUT", "-d", there.ip, "-j", "DROP"]).await?;
    }
    Ok(())
}

/// Removes every rule `cut` added in `host`'s namespace.
pub(crate) async fn heal(host: Host) -> Result<()> {
    run("ip", &["netns", "exec", &host.namespace(), "iptables", "-F"]).await.map(drop)
}
