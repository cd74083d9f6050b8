#!/usr/bin/env python3
"""Turns a fault run's report (target/faults/report.json) into the tables of
docs/guarantees.md: a row per fault, pairs of faults merged into one row, and a line
per fleet with its steps, time under faults, convergence, memory and group losses.

    python3 faults/summarize.py [target/faults/report.json]
"""
import json
import sys

COLUMNS = "| fault | durable OK | lost | order | not pushed | false no-gap | dup (worker / push) | group lost / dup |"
ADDED = ["durable_ok", "durable_lost", "order_violations", "push_lost", "false_no_gap",
         "durable_duplicates", "push_duplicates", "group_lost", "group_duplicates"]
CONFIG = {
    "embedded": lambda d: "`fsync: always`",
    "single": lambda d: f"`appendfsync {d['appendfsync']}`",
    "cluster": lambda d: f"`appendfsync {d['appendfsync']}`, `min_replicas_acked: {d['min_replicas_acked']}`",
}


def n(value):
    return f"{value:,}"


def row(name, c):
    return (f"| {name} | {n(c['durable_ok'])} | {n(c['durable_lost'])} | {n(c['order_violations'])} | {n(c['push_lost'])} "
            f"| {n(c['false_no_gap'])} | {n(c['durable_duplicates'])} / {n(c['push_duplicates'])} "
            f"| {n(c['group_lost'])} / {n(c['group_duplicates'])} |")


def fleet_table(fleet):
    rows = {}
    for fault, counts in fleet["checked"]["by_fault"].items():
        name = "two faults at once" if " + " in fault else fault
        merged = rows.setdefault(name, dict.fromkeys(ADDED, 0))
        for key in ADDED:
            merged[key] += counts[key]
    before = rows.pop("none", None)
    lines = [f"**{fleet['kind'].lower()}** ({CONFIG[fleet['kind'].lower()](fleet['durability'])}):", "", COLUMNS,
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    order = sorted(name for name in rows if name != "two faults at once")
    order += [name for name in ["two faults at once"] if name in rows]
    lines += [row(name, rows[name]) for name in order]
    if before is not None:
        lines.append(row("before the first fault", before))
    lines.append(row("**total**", fleet["checked"]["total"]))

    windows = fleet["windows"]
    fault_on = sum(w["healed"] - w["start"] for w in windows) / 60
    converge = fleet["converge_secs"]
    mib = lambda kib: "?" if kib is None else kib // 1024  # noqa: E731
    memory = ", ".join(f"{mib(b)}→{mib(a)} MiB"
                       for b, a in zip(fleet["rss_kib_before"], fleet["rss_kib_after"]))
    facts = [f"{len(windows)} steps, {fault_on:.1f} min with a fault on",
             f"converged {converge:.1f} s after the last heal" if converge is not None else "did not converge",
             f"memory {memory}"]
    spans = fleet["checked"]["group_loss_spans"]
    if spans:
        longest = max(s["to"] - s["from"] for s in spans)
        facts.append(f"group losses in {len(spans)} spans, the longest {longest:.1f} s")
    if fleet["restarts"]:
        facts.append(f"{len(fleet['restarts'])} restarts on liveness")
    if fleet["skipped"]:
        facts.append(f"{len(fleet['skipped'])} faults skipped without a target")
    lines += ["", "; ".join(facts)]
    return lines, len(windows), fault_on, sum(" + " in w["faults"] for w in windows)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "target/faults/report.json"
    with open(path) as f:
        report = json.load(f)
    steps = fault_on = pairs = 0
    out = []
    for fleet in report["fleets"]:
        lines, s, on, p = fleet_table(fleet)
        steps, fault_on, pairs = steps + s, fault_on + on, pairs + p
        out += [""] + lines
    print(f"seed {report['seed']}: {len(report['fleets'])} fleets, {steps} steps, "
          f"{fault_on:.1f} minutes with a fault on, {pairs} of the steps two faults at once")
    print("\n".join(out))


if __name__ == "__main__":
    main()
