#!/usr/bin/env python3
"""Medians of bench/cluster.sh results as Markdown: throughput on one Redis and on a
Redis Cluster, and per event the CPU time of the daemon and of the Redis processes (the
cluster's per node, busiest first)."""
import json
import statistics
import sys
from collections import defaultdict

from summarize import events_of, key


def main(path):
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        runs[key(r)][r["side"]].append(r)
    print("| workload | metric | one Redis | cluster (3+3) | cluster/one |")
    print("|---|---|---:|---:|---:|")
    for workload, by_side in runs.items():
        rate = "delivered_per_sec" if workload.startswith("fanout") else "published_per_sec"
        med = {s: statistics.median(r[rate] for r in rs) for s, rs in by_side.items()}
        loss = {s: sum(r.get("loss", 0) for r in rs) for s, rs in by_side.items()}
        cells = [f"{med[s]:,.0f}" + (f" (loss {loss[s]})" if loss[s] else "") for s in ("single", "cluster")]
        print(f"| {workload} | {rate.replace('_per_sec', '/s')} | {cells[0]} | {cells[1]} "
              f"| {med['cluster'] / med['single']:.2f}× |")
        if workload.startswith("durable"):
            consumed = {s: statistics.median(r["consumed_per_sec"] for r in rs) for s, rs in by_side.items()}
            print(f"| {workload} | consumed+acked/s | {consumed['single']:,.0f} | {consumed['cluster']:,.0f} "
                  f"| {consumed['cluster'] / consumed['single']:.2f}× |")
    print("\nCPU per event, µs (median): the daemon, all Redis processes, and each cluster node")
    print("| workload | one Redis: daemon | one Redis: redis | cluster: daemon | cluster: redis total "
          "| cluster: per node, busiest first |")
    print("|---|---:|---:|---:|---:|---|")
    for workload, by_side in runs.items():
        def per_event(side, get):
            return statistics.median(get(r) / events_of(r) * 1e6 for r in by_side[side])
        nodes = len(by_side["cluster"][0]["redis_s"])
        per_node = sorted((statistics.median(r["redis_s"][i] / events_of(r) * 1e6 for r in by_side["cluster"])
                           for i in range(nodes)), reverse=True)
        print(f"| {workload} | {per_event('single', lambda r: r['daemon_s']):.2f} "
              f"| {per_event('single', lambda r: sum(r['redis_s'])):.2f} "
              f"| {per_event('cluster', lambda r: r['daemon_s']):.2f} "
              f"| {per_event('cluster', lambda r: sum(r['redis_s'])):.2f} "
              f"| {' / '.join(f'{n:.2f}' for n in per_node)} |")
    rounds = max(len(rs) for by in runs.values() for rs in by.values())
    print(f"\nMedians of {rounds} rounds per cell.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench/cluster.jsonl")
