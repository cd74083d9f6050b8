#!/usr/bin/env python3
"""Medians of bench/compare.sh results, with eventbus / peer ratios, as Markdown."""
import json
import statistics
import sys
from collections import defaultdict


def key(r):
    p = r["params"]
    if r["workload"] == "durable":
        return f"durable {p['publishers']} pub, {p['payload']} B, {p.get('mode', 'unary')}"
    if r["workload"] == "latency":
        return f"latency {p['rate']}/s, {p['subscribers']} sub, {p['payload']} B" + (f", ack {p['ack']}" if "ack" in p else "")
    mode = f"{p['mode']} {p['batch']}" if "batch" in p else p["mode"]
    if "ack" in p:
        mode += f", ack {p['ack']}"  # eventbus's choice; the peers answer no publish
    if r["workload"] == "fanout":
        return f"fanout {p['publishers']}→{p['subscribers']}, {p['payload']} B, {mode}"
    return f"pubonly {p['publishers']} pub, {p['payload']} B, {mode}"


def durable(runs):
    """eventbus in_memory (embedded store), redis mode (Redis Streams) on one Redis and on
    a Redis Cluster, next to JetStream."""
    systems = ["eventbus", "eventbus-redis", "eventbus-cluster", "nats"]
    metrics = [("published/s", lambda r: r["published_per_sec"]),
               ("publish p50 µs", lambda r: r["publish_latency_us"]["p50"]),
               ("publish p99 µs", lambda r: r["publish_latency_us"]["p99"]),
               ("consumed+acked/s", lambda r: r["consumed_per_sec"])]
    for workload, by_system in runs.items():
        if not workload.startswith("durable"):
            continue
        print("\n| workload | metric | eventbus in_memory | eventbus redis mode | eventbus on a cluster | JetStream "
              "| in_memory/JetStream | redis mode/JetStream | cluster/redis mode |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, get in metrics:
            med = {s: statistics.median(get(r) for r in by_system[s]) for s in systems if by_system.get(s)}
            cells = [f"{med[s]:,.0f}" if s in med else "-" for s in systems]
            ratio = lambda s, to="nats": f"{med[s] / med[to]:.2f}×" if s in med and med.get(to) else "-"
            print(f"| {workload} | {name} | {' | '.join(cells)} | {ratio('eventbus')} | {ratio('eventbus-redis')} "
                  f"| {ratio('eventbus-cluster', 'eventbus-redis')} |")


def events_of(r):
    """What the CPU is divided by: deliveries in fan-out runs, else publishes (a durable
    run's CPU covers publishing and consuming each event)."""
    if r["workload"] == "fanout":
        return r["received"]
    if r["workload"] == "durable":
        return r["params"]["count"]
    return r["published"]


def cpu(runs):
    """CPU per event on each side (bench/cpu.py): the servers and the load generator."""
    systems = [s for s in ["eventbus", "eventbus-redis", "eventbus-cluster", "nats", "redis"]
               if any(s in by and all("cpu" in r for r in by[s]) for by in runs.values())]
    if not systems:
        return
    print("\nCPU per event, µs (user + system; server = the daemon, and its Redis in redis mode; "
          "client = the load generator; per delivery in fan-out, per publish otherwise):\n")
    head = " | ".join(f"{s} server | {s} client" for s in systems)
    print(f"| workload | {head} |")
    print("|---|" + "---:|" * (2 * len(systems)))
    for workload, by_system in runs.items():
        cells = []
        for s in systems:
            rs = [r for r in by_system.get(s, []) if "cpu" in r and events_of(r)]
            for side in ("server_s", "client_s"):
                cells.append(f"{statistics.median(r['cpu'][side] / events_of(r) * 1e6 for r in rs):.2f}" if rs else "-")
        print(f"| {workload} | {' | '.join(cells)} |")


def main(path):
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        system = "nats" if r["system"] == "jetstream" else r["system"]
        runs[key(r)][system].append(r)
    systems = ["eventbus", "nats", "redis", "eventbus-cluster"]
    print("| workload | metric | eventbus | nats | redis | eventbus on a Redis Cluster | eventbus/nats | eventbus/redis |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for workload, by_system in runs.items():
        if workload.startswith("durable"):
            continue
        if workload.startswith("latency"):
            metrics = [("p50 µs", lambda r: r["latency_us"]["p50"]), ("p99 µs", lambda r: r["latency_us"]["p99"]),
                       ("p99.9 µs", lambda r: r["latency_us"]["p99_9"])]
        elif workload.startswith("pubonly"):
            metrics = [("published/s", lambda r: r["published_per_sec"])]
        else:
            metrics = [("delivered/s", lambda r: r["delivered_per_sec"]), ("published/s", lambda r: r["published_per_sec"])]
        for name, get in metrics:
            med = {s: statistics.median(get(r) for r in by_system[s]) for s in systems if by_system.get(s)}
            loss = {s: sum(r.get("loss", 0) for r in by_system[s]) for s in systems if by_system.get(s)}
            cells = [f"{med[s]:,.0f}" + (f" (loss {loss[s]})" if loss[s] else "") if s in med else "-" for s in systems]
            ratio = lambda peer: f"{med['eventbus'] / med[peer]:.2f}×" if peer in med and med.get(peer) else "-"
            print(f"| {workload} | {name} | {' | '.join(cells)} | {ratio('nats')} | {ratio('redis')} |")
    durable(runs)
    cpu(runs)
    rounds = max(len(v) for by in runs.values() for v in by.values())
    print(f"\nMedians of {rounds} rounds per cell; latency ratios above 1 mean eventbus is slower.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench/results.jsonl")
