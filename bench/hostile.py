#!/usr/bin/env python3
"""Short hostile-client soak for eventbusd: idle connections and file-descriptor
exhaustion. Starts the daemon (127.0.0.1, port 0), runs each scenario, and prints the
process's RSS, open file descriptors, CPU use and /healthz latency before, during and
after. Standard library only.

    cargo build --release -p eventbus-server --bin eventbusd
    python3 bench/hostile.py [--bin target/release/eventbusd]

Scenarios:
  idle   1,000 idle TCP connections on the gRPC port (server.idle_timeout_ms = 3 s):
         held, then closed by the daemon; FDs come back.
  fdmax  under `prlimit --nofile=256`, 400 idle connections: the daemon runs out of
         descriptors, backs off instead of spinning, keeps answering /healthz on an
         open connection, counts _accept_errors_total, and accepts again once the
         idle timeout has freed descriptors.
  stalled  a `>` subscriber that never reads (an `eventbus subscribe` whose output
         nobody reads) while 600 MiB of 512 KiB events are published over REST: the
         queue stops at its byte bound (eventbus.default_queue_bytes, 64 MiB), RSS stays
         bounded, the drops are counted.
  bigkeys  publishes with 100 KiB idempotency and ordering keys (the CLI, so real gRPC
         requests): each refused with INVALID_ARGUMENT, nothing kept, RSS flat.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")


class Daemon:
    def __init__(self, binary: str, nofile: int | None, env: dict[str, str]) -> None:
        cmd = [binary, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
        if nofile:
            cmd = ["prlimit", f"--nofile={nofile}", "--", *cmd]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS__") and k != "RUST_LOG"}
        full_env.update({"EVENTBUS__DURABLE__DATA_DIR": "", "NO_COLOR": "1", **env})
        self.dir = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(cmd, cwd=self.dir.name, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        started = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if "eventbusd started" in line:
                    started.set()

        threading.Thread(target=pump, daemon=True).start()
        if not started.wait(30):
            raise SystemExit("eventbusd did not start:\n" + "".join(self.lines))
        line = next(l for l in self.lines if "eventbusd started" in l)
        self.grpc = re.search(r"grpc_addr=(\S+)", line).group(1)
        self.http = re.search(r"http_addr=(\S+)", line).group(1)
        self.probe = http.client.HTTPConnection(*self.http.rsplit(":", 1), timeout=10)

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def get(self, path: str) -> tuple[int, bytes, float]:
        """On the probe's kept-alive connection (reopened if the daemon closed it)."""
        start = time.monotonic()
        for attempt in range(2):
            try:
                self.probe.request("GET", path)
                resp = self.probe.getresponse()
                return resp.status, resp.read(), time.monotonic() - start
            except (OSError, http.client.HTTPException):
                self.probe.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def report(self, label: str, window: float = 2.0) -> None:
        cpu0, t0 = self.cpu(), time.monotonic()
        time.sleep(window)
        cpu = (self.cpu() - cpu0) / (time.monotonic() - t0) * 100
        status, _, latency = self.get("/healthz")
        _, metrics, _ = self.get("/metrics")
        counters = {name: sum(float(v) for v in re.findall(rf"^socle_eventbus_{name}\S* (\S+)$", metrics.decode(), re.M))
                    for name in ("accept_errors_total", "connections_idle_closed_total")}
        print(f"  {label:<28} RSS {self.rss_mib():7.1f} MiB  FDs {self.fds():5}  CPU {cpu:5.1f}%  "
              f"/healthz {status} in {latency * 1000:6.1f} ms  accept_errors {counters['accept_errors_total']:.0f}  "
              f"idle_closed {counters['connections_idle_closed_total']:.0f}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def connect_many(addr: str, n: int) -> list[socket.socket]:
    host, port = addr.rsplit(":", 1)
    socks = []
    failures = 0
    for _ in range(n):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect((host, int(port)))
        except OSError:  # past the daemon's descriptors and its backlog
            s.close()
            failures += 1
            if failures == 3:
                break
            continue
        socks.append(s)
    return socks


def wait_closed(socks: list[socket.socket], timeout: float) -> int:
    """How many of `socks` the daemon closed within `timeout`."""
    deadline = time.monotonic() + timeout
    closed = 0
    for s in socks:
        try:
            while True:  # an HTTP/2 server speaks first (SETTINGS): read to the end
                s.settimeout(max(0.01, deadline - time.monotonic()))
                if s.recv(4096) == b"":
                    closed += 1
                    break
        except TimeoutError:
            pass
        except OSError:  # reset: closed too
            closed += 1
    return closed


def idle(binary: str) -> None:
    print("idle: 1,000 idle connections, server.idle_timeout_ms = 3000")
    d = Daemon(binary, None, {"EVENTBUS__SERVER__IDLE_TIMEOUT_MS": "3000"})
    try:
        d.report("before")
        socks = connect_many(d.grpc, 1000)
        d.report(f"holding {len(socks)}", window=1.0)
        closed = wait_closed(socks, 10)
        print(f"  the daemon closed {closed} of {len(socks)}")
        for s in socks:
            s.close()
        d.report("after")
    finally:
        d.stop()


def fdmax(binary: str) -> None:
    print("fdmax: prlimit --nofile=256, 400 idle connections, server.idle_timeout_ms = 3000")
    d = Daemon(binary, 256, {"EVENTBUS__SERVER__IDLE_TIMEOUT_MS": "3000"})
    try:
        d.report("before")
        d.get("/healthz")  # the probe's connection is open before the flood
        socks = connect_many(d.grpc, 400)
        d.report(f"{len(socks)} connected, out of FDs")
        closed = wait_closed(socks, 15)
        print(f"  the daemon closed {closed} of {len(socks)} (idle timeout; the backlog's accepted later)")
        for s in socks:
            s.close()
        d.report("after")
        warnings = [l.strip() for l in d.lines if "cannot accept" in l]
        print(f"  accept warnings logged: {len(warnings)}")
    finally:
        d.stop()


def cli_of(binary: str) -> str:
    """The `eventbus` CLI built beside `binary`."""
    cli = Path(binary).with_name("eventbus")
    if not cli.exists():
        raise SystemExit(f"{cli} not found: cargo build -p eventbus-cli (same profile as --bin)")
    return str(cli)


def rest_publish(d: Daemon, channel: str, payload: str) -> int:
    conn = http.client.HTTPConnection(*d.http.rsplit(":", 1), timeout=30)
    body = '{"channel":"%s","payload":"%s"}' % (channel, payload)
    conn.request("POST", "/admin/eventbus/publish", body=body, headers={"content-type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def stalled(binary: str) -> None:
    print("stalled: a `>` subscriber that never reads; 1,200 events of 512 KiB published")
    d = Daemon(binary, None, {})
    try:
        d.report("before")
        # Its output goes to a pipe nobody reads: once the pipe is full the CLI stops
        # reading its stream, and the broker's queue for it fills.
        sub = subprocess.Popen([cli_of(binary), "subscribe", ">", "--server", f"http://{d.grpc}"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        payload = "x" * (512 * 1024)
        statuses: dict[int, int] = {}
        for _ in range(1200):
            status = rest_publish(d, "soak.big", payload)
            statuses[status] = statuses.get(status, 0) + 1
        print(f"  publish answers: {statuses}")
        d.report("subscriber stalled")
        _, metrics, _ = d.get("/metrics")
        text = metrics.decode()
        for name in ("queued_bytes", "max_queued_bytes", "dropped_by_reason_total"):
            for line in re.findall(rf"^socle_eventbus_{name}\b.*$", text, re.M):
                print(f"  {line}")
        sub.kill()
        sub.wait()
        d.report("after")
    finally:
        d.stop()


def bigkeys(binary: str) -> None:
    print("bigkeys: 20 publishes each with 100 KiB idempotency and ordering keys")
    d = Daemon(binary, None, {})
    try:
        d.report("before")
        codes: dict[str, int] = {}
        key = "k" * (100 * 1024)
        for i in range(20):
            for flag in ("--idempotency-key", "--ordering-key"):
                run = subprocess.run([cli_of(binary), "publish", "soak.keys", f"{i}", flag, key,
                                      "--server", f"http://{d.grpc}"], capture_output=True, text=True)
                word = "refused: " + (re.search(r"(InvalidArgument|invalid \w+)", run.stderr) or [run.stderr[:40]])[0] \
                    if run.returncode else "accepted"
                codes[word] = codes.get(word, 0) + 1
        print(f"  answers: {codes}")
        d.report("after")
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(REPO / "target" / "release" / "eventbusd"))
    parser.add_argument("scenarios", nargs="*", default=["idle", "fdmax", "stalled", "bigkeys"])
    args = parser.parse_args()
    for name in args.scenarios:
        {"idle": idle, "fdmax": fdmax, "stalled": stalled, "bigkeys": bigkeys}[name](args.bin)


if __name__ == "__main__":
    main()
