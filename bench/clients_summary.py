#!/usr/bin/env python3
"""Medians of bench/clients.sh results per (client, mode), with ratios to JetStream driven
from the same language, as Markdown.

    python3 bench/clients_summary.py target/bench/clients-always.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict

MODES = ["shared", "unary", "jetstream"]
LANGS = {"python": "Python (socle_eventbus / nats-py)", "node": "Node (@socle/eventbus / nats.js)"}
METRICS = [("published/s", "published_per_s", "{:,.0f}"), ("p50 µs", "p50_us", "{:,.0f}"),
           ("p99 µs", "p99_us", "{:,.0f}"), ("server CPU µs/event", "server_cpu_us_per_event", "{:.1f}"),
           ("client CPU µs/event", "client_cpu_us_per_event", "{:.1f}")]


def main(path):
    runs = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        runs[(r["lang"], r["mode"])].append(r)
    if not runs:
        sys.exit(f"no results in {path}")
    med = {k: {field: statistics.median(r[field] for r in rs) for _, field, _ in METRICS} for k, rs in runs.items()}
    print("| client | mode | " + " | ".join(label for label, _, _ in METRICS) + " | published/s ÷ JetStream | p50 ÷ JetStream |")
    print("|---|---|" + "---:|" * (len(METRICS) + 2))
    for lang, title in LANGS.items():
        js = med.get((lang, "jetstream"))
        for mode in MODES:
            m = med.get((lang, mode))
            if m is None:
                continue
            cells = [fmt.format(m[field]) for _, field, fmt in METRICS]
            ratio = lambda field: f"{m[field] / js[field]:.2f}×" if js and js[field] else "-"
            print(f"| {title} | {mode} | " + " | ".join(cells) + f" | {ratio('published_per_s')} | {ratio('p50_us')} |")
    print()
    for lang, title in LANGS.items():
        shared, unary = med.get((lang, "shared")), med.get((lang, "unary"))
        if shared and unary:
            ratio = lambda field: f"{shared[field] / unary[field]:.2f}×" if unary[field] else "-"
            print(f"- {title}: shared ÷ unary: published/s {ratio('published_per_s')}, p50 {ratio('p50_us')}, "
                  f"server CPU per event {ratio('server_cpu_us_per_event')}, "
                  f"client CPU per event {ratio('client_cpu_us_per_event')}")
    rounds = max(len(rs) for rs in runs.values())
    params = next(iter(runs.values()))[0]
    print(f"\nMedians of {rounds} rounds per cell; {params['count']:,} timed events per run, "
          f"{params['concurrency']} concurrent publishers, {params['payload']} B payloads.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/bench/clients-always.jsonl")
