#!/usr/bin/env python3
"""Throughput of the Python Worker with a no-op handler.

Creates a durable consumer, publishes N events into it (publish_stream, pipelined), then
starts a Worker and times until all N are handled and acked. Reports events/s over the
consume phase and the Python process's CPU time per event (the client's own cost,
independent of how fast the daemon is).

    python bench_worker.py --url http://127.0.0.1:50051 -n 100000
    python bench_worker.py -n 50000      # starts $EVENTBUS_BIN (default target/release,
                                         # else target/debug eventbusd) on 127.0.0.1:0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from socle_eventbus import Client, Delivery, Worker, publish_request

REPO = Path(__file__).resolve().parents[2]


def start_daemon() -> tuple[subprocess.Popen, str]:
    bin_ = os.environ.get("EVENTBUS_BIN")
    if not bin_:
        release, debug = REPO / "target/release/eventbusd", REPO / "target/debug/eventbusd"
        bin_ = str(release if release.exists() else debug)
    data = tempfile.mkdtemp(prefix="bench-worker-")
    env = dict(os.environ, EVENTBUS__DURABLE__DATA_DIR=data, NO_COLOR="1")
    proc = subprocess.Popen([bin_, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"], cwd=data, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "eventbusd started" in line:
            addr = re.search(r'grpc_addr="?([^\s"]+)', re.sub(r"\x1b\[[0-9;]*m", "", line))
            assert addr
            print(f"daemon: {bin_} on {addr.group(1)}", file=sys.stderr)
            # Keep draining its output so it never blocks on a full pipe.
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, f"http://{addr.group(1)}"
    raise SystemExit("eventbusd exited before starting")


async def bench(url: str, n: int, concurrency: int, payload: int) -> None:
    async with await Client.connect(url) as client:
        name = "bench-" + uuid.uuid4().hex[:8]
        await client.create_consumer(name, [f"{name}.>"], max_in_flight=10_000)
        body = b"x" * payload

        async def reqs():
            for _ in range(n):
                yield publish_request(f"{name}.e", body)

        t0 = time.perf_counter()
        published = 0
        async for _ in client.publish_stream(reqs()):
            published += 1
        t_pub = time.perf_counter() - t0
        print(f"published {published} in {t_pub:.2f}s ({published / t_pub:,.0f}/s)")

        done = asyncio.Event()
        handled = 0

        async def noop(d: Delivery) -> None:
            nonlocal handled
            handled += 1
            if handled == n:
                done.set()

        worker = Worker(client, name, noop, concurrency=concurrency, queue_capacity=4096)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await worker.start()
        await done.wait()
        while (info := await client.get_consumer(name)).pending or info.in_flight:
            await asyncio.sleep(0.005)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await worker.stop()
        info = await client.get_consumer(name)
        print(f"consumed {handled} (acked {info.acked}) in {elapsed:.2f}s: {handled / elapsed:,.0f} events/s; "
              f"python CPU {cpu:.2f}s = {cpu / handled * 1e6:.1f} us/event "
              f"(ceiling {handled / cpu:,.0f}/s on one core)")
        try:
            await client.delete_consumer(name)
        except Exception as e:  # a slow (debug) daemon may take long to drop many events
            print(f"(delete_consumer {name}: {e})", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="daemon to use (default: start one)")
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--payload", type=int, default=100, help="payload bytes")
    args = ap.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_daemon()
    try:
        asyncio.run(bench(url, args.n, args.concurrency, args.payload))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
