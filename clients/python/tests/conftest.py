"""Runs a real eventbusd for the tests.

The binary: `$EVENTBUS_BIN`, else `<repo>/target/debug/eventbusd` (build it first:
`cargo build -p eventbus-server --bin eventbusd`). Each daemon listens on 127.0.0.1:0 and
keeps its durable store in its own temporary directory; its address is read from the
`eventbusd started` line (no sleeps).
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Awaitable, Callable, Dict, Iterator, Optional

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("EVENTBUS_BIN", REPO / "target" / "debug" / "eventbusd"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
START_TIMEOUT = 30.0


class Daemon:
    """One eventbusd process; `restart()` keeps its gRPC port and data directory."""

    def __init__(self, workdir: Path, env: Optional[Dict[str, str]] = None) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.extra_env = dict(env or {})
        self.grpc_addr = "127.0.0.1:0"
        self.proc: Optional[subprocess.Popen[str]] = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.grpc_addr}"

    def start(self) -> None:
        if not BIN.exists():
            pytest.fail(f"{BIN} not found: run `cargo build -p eventbus-server --bin eventbusd` or set EVENTBUS_BIN")
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS__") and k != "RUST_LOG"}
        env.update({"EVENTBUS__DURABLE__DATA_DIR": str(self.data_dir), "NO_COLOR": "1"})
        env.update(self.extra_env)
        self.starts += 1
        log = open(self.workdir / f"eventbusd-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [str(BIN), "--grpc-addr", self.grpc_addr, "--http-addr", "127.0.0.1:0"],
            cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump() -> None:  # keeps the pipe drained for the daemon's whole life
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                lines.put(line)
            lines.put(None)
            log.close()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                pytest.fail(f"eventbusd did not start within {START_TIMEOUT}s")
            if line is None:
                pytest.fail(f"eventbusd exited before starting: {(self.workdir / f'eventbusd-{self.starts}.log').read_text()}")
            line = ANSI.sub("", line)
            if "eventbusd started" in line:
                m = re.search(r'grpc_addr="?([^\s"]+)', line)
                assert m, line
                self.grpc_addr = m.group(1)
                return

    def kill(self) -> None:
        """kill -9: no graceful anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        # The port was ours a moment ago; binding it again may race a lingering socket.
        deadline = time.monotonic() + 10
        while True:
            try:
                self.start()
                return
            except BaseException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon shared by the tests that do not restart it (names are unique per test)."""
    d = Daemon(tmp_path_factory.mktemp("eventbusd"))
    d.start()
    yield d
    d.stop()


@pytest.fixture
def own_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon for one test (which may kill and restart it)."""
    d = Daemon(tmp_path)
    d.start()
    yield d
    d.stop()


@pytest.fixture
def name() -> str:
    """A fresh name for this test's channels and consumers."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def span_exporter() -> InMemorySpanExporter:
    """The OpenTelemetry SDK, installed as an application would, keeping finished spans in
    memory. Installed once for the session (the global tracer provider can be set only
    once); from then on every test runs with it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
def spans(span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The session's span exporter, emptied for this test."""
    span_exporter.clear()
    yield span_exporter
    span_exporter.clear()


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "condition") -> None:
    """Polls `check` until true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
