#!/usr/bin/env python3
"""Everyday publishing from a Python service: CONCURRENCY asyncio tasks share one client,
each awaiting its publish() of one durable event before the next.

    python publish.py TARGET MODE COUNT CONCURRENCY PAYLOAD [--server-pid PID] [--warmup N]

TARGET: the daemon's gRPC URL (http://127.0.0.1:PORT) for the eventbus modes, a NATS URL
(nats://127.0.0.1:PORT) for jetstream. MODE: shared (socle_eventbus's default: concurrent
publish() calls share one PublishStream), unary (Client.connect(unary_publish=True): one
Publish call each) or jetstream (nats-py, js.publish() on one connection). The events are
durable: a durable consumer (eventbus) or a file-storage stream (JetStream) takes them,
created before and deleted after the run. WARMUP events are published first, untimed.

Prints one JSON line: lang, mode, count, published_per_s, p50_us, p99_us, and the CPU per
event (µs, user + system) of this process (getrusage) and of the server process
--server-pid (/proc/PID/stat), both over the timed events only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
import uuid
from typing import Awaitable, Callable, List, Optional

TICK = os.sysconf("SC_CLK_TCK")

Publish = Callable[[], Awaitable[object]]


def server_cpu(pid: Optional[int]) -> float:
    """The server process's user + system time, seconds (0 without a pid)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: the fields after it start after ")".
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(publish: Publish, count: int, concurrency: int) -> List[int]:
    """Publishes `count` events from `concurrency` tasks, each awaiting one publish before
    the next; returns every publish's latency in nanoseconds."""
    latencies: List[int] = []
    left = count

    async def task() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter_ns()
            await publish()
            latencies.append(time.perf_counter_ns() - start)

    await asyncio.gather(*(task() for _ in range(concurrency)))
    return latencies


def percentile(sorted_ns: List[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


async def measure(publish: Publish, args: argparse.Namespace) -> dict:
    await drive(publish, args.warmup, args.concurrency)
    server_before, own_before = server_cpu(args.server_pid), own_cpu()
    start = time.perf_counter()
    latencies = await drive(publish, args.count, args.concurrency)
    elapsed = time.perf_counter() - start
    server_s, own_s = server_cpu(args.server_pid) - server_before, own_cpu() - own_before
    latencies.sort()
    return {
        "lang": "python",
        "mode": args.mode,
        "count": args.count,
        "concurrency": args.concurrency,
        "payload": args.payload,
        "published_per_s": round(args.count / elapsed, 1),
        "p50_us": round(percentile(latencies, 0.50), 1),
        "p99_us": round(percentile(latencies, 0.99), 1),
        "mean_us": round(statistics.fmean(latencies) / 1000, 1),
        "server_cpu_us_per_event": round(server_s / args.count * 1e6, 2),
        "client_cpu_us_per_event": round(own_s / args.count * 1e6, 2),
    }


async def run_eventbus(args: argparse.Namespace) -> dict:
    from socle_eventbus import Client

    name = "bench-" + uuid.uuid4().hex[:8]
    channel, body = f"{name}.e", b"x" * args.payload
    async with await Client.connect(args.target, unary_publish=args.mode == "unary") as client:
        await client.create_consumer(name, [f"{name}.>"])
        try:
            return await measure(lambda: client.publish(channel, body), args)
        finally:
            await client.delete_consumer(name)


async def run_jetstream(args: argparse.Namespace) -> dict:
    import nats
    from nats.js.api import StorageType

    name = "bench-" + uuid.uuid4().hex[:8]
    subject, body = f"{name}.e", b"x" * args.payload
    nc = await nats.connect(args.target)
    try:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name}.>"], storage=StorageType.FILE)
        try:
            return await measure(lambda: js.publish(subject, body), args)
        finally:
            await js.delete_stream(name)
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("mode", choices=["shared", "unary", "jetstream"])
    parser.add_argument("count", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("payload", type=int)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--warmup", type=int, default=2000)
    args = parser.parse_args()
    if args.count < 1 or args.concurrency < 1 or args.payload < 0 or args.warmup < 0:
        parser.error("count and concurrency must be positive, payload and warmup not negative")
    run = run_jetstream if args.mode == "jetstream" else run_eventbus
    print(json.dumps(asyncio.run(run(args))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
