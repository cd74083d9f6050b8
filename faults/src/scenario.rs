//! One fleet's run: start it, start the clients, apply the schedule, heal, wait for
//! convergence, check.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::check::{self, Window};
use crate::fleet::{self, Durability, Fleet, Kind};
use crate::nemesis::{self, Fault};
use crate::report::FleetReport;
use std::collections::HashSet;

use crate::workload::{self, Answer, TickItem, Workload, lock};
use crate::{CONVERGE_WITHIN, since};

/// One step: faults applied together, for this long.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) faults: Vec<Fault>,
    pub(crate) hold: Duration,
}

/// The short schedule applies each fault of the kind once (and, on a cluster, one
/// pair); the long one picks single faults and pairs at random for `minutes`.
pub(crate) fn schedule(kind: Kind, long: bool, minutes: u64, rng: &mut StdRng) -> Vec<Step> {
    let faults = Fault::for_kind(kind);
    if !long {
        let mut steps: Vec<Step> =
            faults.iter().map(|f| Step { faults: vec![*f], hold: nemesis::duration(rng, false) }).collect();
        if kind == Kind::Cluster {
            steps.push(Step {
                faults: vec![Fault::PartitionMasterReplica, Fault::KillInstance],
                hold: nemesis::duration(rng, false),
            });
        }
        return steps;
    }
    let budget = Duration::from_secs(minutes * 60);
    let mut total = Duration::ZERO;
    let mut steps = Vec::new();
    while total < budget {
        let first = *faults.choose(rng).unwrap_or(&Fault::KillInstance);
        let mut step = vec![first];
        if rng.gen_bool(0.3) {
            let partners: Vec<Fault> = faults.iter().copied().filter(|f| first.combines_with(*f)).collect();
            if let Some(second) = partners.choose(rng) {
                step.push(*second);
            }
        }
        let hold = nemesis::duration(rng, true);
        // The step's own time and the quiet time after it.
        total += hold + Duration::from_secs(8);
        steps.push(Step { faults: step, hold });
    }
    steps
}

/// Runs the fleet of `kind` through `steps`.
pub(crate) async fn run_fleet(
    kind: Kind,
    durability: Durability,
    steps: &[Step],
    eventbusd: &Path,
    dir: &Path,
    rng: &mut StdRng,
) -> Result<FleetReport> {
    let mut fleet = Fleet::start(kind, durability, eventbusd, dir).await?;
    let result = exercise(&mut fleet, steps, rng).await;
    fleet.stop().await;
    result
}

async fn exercise(fleet: &mut Fleet, steps: &[Step], rng: &mut StdRng) -> Result<FleetReport> {
    let start = Instant::now();
    let urls: Vec<String> = fleet.instances.iter().map(fleet::Instance::grpc_url).collect();
    let workload = Workload::start(&urls, start).await?;
    let records = workload.records.clone();
    fleet::wait_for("clients under way", Duration::from_secs(30), || {
        let records = records.clone();
        async move {
            lock(&records.delivered).len() > 20 && records.tick_items.iter().all(|items| lock(items).len() > 20)
        }
    })
    .await?;
    let rss_before: Vec<Option<u64>> = fleet.instances.iter().map(|i| i.proc.rss_kib()).collect();

    let mut windows = Vec::new();
    let mut skipped = Vec::new();
    let mut unapplied = Vec::new();
    let mut crashes = Vec::new();
    let mut restarts = Vec::new();
    for step in steps {
        let at = since(start);
        let mut applied = Vec::new();
        for fault in &step.faults {
            match nemesis::apply(*fault, fleet, rng).await {
                Ok(done) => applied.push(done),
                Err(err) if err.downcast_ref::<nemesis::NoTarget>().is_some() => {
                    skipped.push(format!("{}: {err:#}", fault.name()));
                }
                Err(err) => {
                    println!("faults: {:>7.1} s  cannot apply {}: {err:#}", at, fault.name());
                    unapplied.push(format!("{}: {err:#}", fault.name()));
                }
            }
        }
        if applied.is_empty() {
            continue;
        }
        let names: Vec<&str> = applied.iter().map(|a| a.fault.name()).collect();
        let targets: Vec<&'static str> = applied.iter().flat_map(|a| a.targets.iter().copied()).collect();
        println!("faults: {:>7.1} s  {} on {}", at, names.join(" + "), targets.join(", "));
        tokio::time::sleep(step.hold).await;
        for done in applied {
            nemesis::heal(done, fleet).await?;
        }
        let healed = since(start);
        let last = std::ptr::eq(step, steps.last().unwrap_or(step));
        // The last heal is measured by `converge`; after the others, the fleet gets
        // ready again (bounded) and quiet before the next step.
        let mut ready_after = None;
        if !last {
            let deadline = Instant::now() + CONVERGE_WITHIN;
            loop {
                if fleet.wait_ready(Duration::ZERO).await.is_ok() {
                    ready_after = Some(since(start) - healed);
                    break;
                }
                if Instant::now() > deadline {
                    break;
                }
                restarts.extend(fleet.supervise().await);
                crashes.extend(restart_crashed(fleet));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            crashes.extend(restart_crashed(fleet));
        }
        windows.push(Window { faults: names.join(" + "), targets, start: at, healed, ready_after });
        if !last {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }

    // After the last heal: how long until the fleet is ready, every durable publisher
    // has been answered OK again, both subscribers receive live events, and (the
    // publishers stopped) every event answered OK has been delivered.
    let healed = Instant::now();
    let converged = converge(fleet, &workload, since(start), &mut restarts).await;
    let converge_secs = converged.then(|| healed.elapsed().as_secs_f64());
    crashes.extend(restart_crashed(fleet));
    let rss_after: Vec<Option<u64>> = fleet.instances.iter().map(|i| i.proc.rss_kib()).collect();
    let records = workload.stop().await;
    let checked = check::check(&records, &windows);
    let dump = fleet.dir.join("records.json");
    if let Err(err) = std::fs::write(&dump, records.dump().to_string()) {
        eprintln!("faults: cannot write {}: {err}", dump.display());
    }
    let errors = lock(&records.errors).clone();
    Ok(FleetReport {
        kind: fleet.kind,
        durability: fleet.durability,
        windows,
        skipped,
        unapplied,
        crashes,
        restarts,
        converge_secs,
        rss_kib_before: rss_before,
        rss_kib_after: rss_after,
        publish_errors: errors,
        checked,
    })
}

/// Waits up to twice the promised time for convergence; true if it came.
async fn converge(fleet: &mut Fleet, workload: &Workload, healed_at: f64, restarts: &mut Vec<String>) -> bool {
    let records = &workload.records;
    let deadline = Instant::now() + CONVERGE_WITHIN * 2;
    let last_tick = lock(&records.ticks_ok).last().map_or(0, |(seq, _)| *seq);
    let mut publishing = true;
    loop {
        restarts.extend(fleet.supervise().await);
        let ready = fleet.wait_ready(Duration::ZERO).await.is_ok();
        let live = records.tick_items.iter().all(|items| {
            lock(items).iter().any(|item| matches!(item, TickItem::Event { seq, .. } if *seq > last_tick))
        });
        let answered = {
            let published = lock(&records.published);
            let fresh: HashSet<u32> = published
                .iter()
                .filter(|p| p.at >= healed_at && matches!(p.answer, Answer::Ok { .. }))
                .map(|p| p.key)
                .collect();
            fresh.len() == workload::PUBLISHERS as usize
        };
        if publishing && ready && live && answered {
            workload.stop_publishing();
            publishing = false;
        }
        let delivered = !publishing && {
            let acked = |list: &std::sync::Mutex<Vec<workload::Delivered>>| -> HashSet<(u32, u64)> {
                lock(list).iter().filter(|d| d.acked).map(|d| (d.key, d.seq)).collect()
            };
            let (worked, pushed) = (acked(&records.delivered), acked(&records.pushed));
            lock(&records.published)
                .iter()
                .filter(|p| matches!(p.answer, Answer::Ok { .. }))
                .all(|p| worked.contains(&(p.key, p.seq)) && pushed.contains(&(p.key, p.seq)))
        };
        // Everything delivered, or (an event lost, which the checker counts) nothing
        // left to deliver.
        if delivered || (!publishing && workload.drained().await) {
            return true;
        }
        if Instant::now() > deadline {
            println!(
                "faults: not converged: ready {ready}, publishes answered again {answered}, subscribers live {live}, \
                 everything delivered {delivered}"
            );
            workload.stop_publishing();
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Instances that exited by themselves: each is recorded and started again.
fn restart_crashed(fleet: &mut Fleet) -> Vec<String> {
    let mut crashes = Vec::new();
    for instance in &mut fleet.instances {
        if let Some(status) = instance.proc.exited() {
            crashes.push(format!("{} exited by itself ({status})", instance.proc.name));
            if let Err(err) = instance.proc.start() {
                crashes.push(format!("{} could not be started again: {err:#}", instance.proc.name));
            }
        }
    }
    crashes
}
