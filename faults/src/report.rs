//! The report: JSON for tools, a table for people (fault × promise, per fleet).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::CONVERGE_WITHIN;
use crate::check::{Checked, Counts, Window};
use crate::fleet::{Durability, Kind};

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) seed: u64,
    pub(crate) long: bool,
    pub(crate) fleets: Vec<FleetReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct FleetReport {
    pub(crate) kind: Kind,
    pub(crate) durability: Durability,
    pub(crate) windows: Vec<Window>,
    /// Faults with no target just then (e.g. a master without a replica): not applied.
    pub(crate) skipped: Vec<String>,
    /// Faults that could not be applied (a command failed): the run is not valid.
    pub(crate) unapplied: Vec<String>,
    /// Instances that exited without being killed.
    pub(crate) crashes: Vec<String>,
    /// Instances restarted because `/healthz` failed (what their supervisor would do).
    pub(crate) restarts: Vec<String>,
    /// Seconds from the last heal until ready, drained and live; `None`: not within 60 s.
    pub(crate) converge_secs: Option<f64>,
    pub(crate) rss_kib_before: Vec<Option<u64>>,
    pub(crate) rss_kib_after: Vec<Option<u64>>,
    pub(crate) publish_errors: BTreeMap<String, u64>,
    pub(crate) checked: Checked,
}

impl FleetReport {
    /// What breaks a promise: a checker's violation, a crash, or no convergence
    /// within the promised time.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let total = &self.checked.total;
        if total.violations() > 0 {
            problems.push(format!(
                "{} violations (lost {}, not captured {}, out of key order {}, not pushed {}, false no-gap {})",
                total.violations(),
                total.durable_lost,
                total.durable_not_captured,
                total.order_violations,
                total.push_lost,
                total.false_no_gap
            ));
        }
        problems.extend(self.crashes.iter().cloned());
        if let Some(first) = self.unapplied.first() {
            problems.push(format!("{} faults could not be applied, the first: {first}", self.unapplied.len()));
        }
        match self.converge_secs {
            Some(secs) if secs <= CONVERGE_WITHIN.as_secs_f64() => {}
            Some(secs) => problems.push(format!("converged in {secs:.1} s, more than {CONVERGE_WITHIN:?}")),
            None => problems.push("did not converge".to_owned()),
        }
        problems
    }
}

fn row(table: &mut String, name: &str, c: &Counts) {
    let _ = writeln!(
        table,
        "| {name} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} / {} |",
        c.durable_ok,
        c.durable_unknown,
        c.durable_lost,
        c.durable_not_captured,
        c.durable_duplicates,
        c.order_violations,
        c.push_lost,
        c.push_duplicates,
        c.false_no_gap,
        c.ticks_missed_untold,
        c.ticks_missed_told,
        c.ticks_missed_told + c.ticks_missed_untold,
        c.group_lost,
        c.group_duplicates
    );
}

impl Report {
    pub(crate) fn passed(&self) -> bool {
        self.fleets.iter().all(|f| f.problems().is_empty())
    }

    /// One table per fleet: a row per fault (what happened while it was on and until
    /// the next one), then the totals and the verdict.
    pub(crate) fn table(&self) -> String {
        let mut table = String::new();
        for fleet in &self.fleets {
            let d = fleet.durability;
            let config = match fleet.kind {
                Kind::Embedded => "fsync always".to_owned(),
                Kind::Single => format!("appendfsync {}", d.appendfsync),
                Kind::Cluster => format!("appendfsync {}, min_replicas_acked {}", d.appendfsync, d.min_replicas_acked),
            };
            let _ = writeln!(table, "\n{:?} fleet ({config}), seed {}", fleet.kind, self.seed);
            table.push_str(
                "| fault | durable OK | unknown | lost | not captured | dup | order | push lost / dup | \
                 false no-gap / untold | told / all missed | group lost / dup |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for (fault, counts) in &fleet.checked.by_fault {
                row(&mut table, fault, counts);
            }
            row(&mut table, "**total**", &fleet.checked.total);
            let converge = fleet.converge_secs.map_or("no".to_owned(), |s| format!("{s:.1} s"));
            let rss: Vec<String> = fleet
                .rss_kib_before
                .iter()
                .zip(&fleet.rss_kib_after)
                .map(|(b, a)| format!("{}→{} MiB", b.unwrap_or(0) / 1024, a.unwrap_or(0) / 1024))
                .collect();
            let _ = writeln!(table, "converged after the last heal: {converge}; memory: {}", rss.join(", "));
            let longest = fleet.checked.group_loss_spans.iter().map(|s| s.to - s.from).fold(0.0, f64::max);
            if !fleet.checked.group_loss_spans.is_empty() {
                let _ = writeln!(
                    table,
                    "group losses: {} spans, the longest {longest:.1} s",
                    fleet.checked.group_loss_spans.len()
                );
            }
            if !fleet.restarts.is_empty() {
                let _ = writeln!(table, "restarted on liveness: {}", fleet.restarts.join(", "));
            }
            if !fleet.skipped.is_empty() {
                let _ = writeln!(table, "skipped: {}", fleet.skipped.join("; "));
            }
            let problems = fleet.problems();
            let verdict = if problems.is_empty() { "every promise held".to_owned() } else { problems.join("; ") };
            let _ = writeln!(table, "verdict: {verdict}");
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(skipped: &[&str], unapplied: &[&str]) -> FleetReport {
        FleetReport {
            kind: Kind::Single,
            durability: Durability { min_replicas_acked: 1, appendfsync: "always" },
            windows: Vec::new(),
            skipped: skipped.iter().map(|s| (*s).to_owned()).collect(),
            unapplied: unapplied.iter().map(|s| (*s).to_owned()).collect(),
            crashes: Vec::new(),
            restarts: Vec::new(),
            converge_secs: Some(1.0),
            rss_kib_before: Vec::new(),
            rss_kib_after: Vec::new(),
            publish_errors: BTreeMap::new(),
            checked: Checked::default(),
        }
    }

    #[test]
    fn a_fault_that_could_not_be_applied_fails_the_run_and_one_without_a_target_does_not() {
        assert!(fleet(&["partition master-replica: master r1 has no replica now"], &[]).problems().is_empty());
        let failed = fleet(&[], &["partition instance-master: exec of \"iptables\" failed"]).problems();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].contains("could not be applied") && failed[0].contains("iptables"), "{failed:?}");
    }
}
