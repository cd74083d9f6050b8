"""The README's examples, run as written against a daemon of their own."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path
from typing import List

from conftest import Daemon

README = Path(__file__).resolve().parents[1] / "README.md"
TOP_README = Path(__file__).resolve().parents[3] / "docs" / "clients.md"


def blocks(lang: str = "python") -> List[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


async def run(code: str, daemon: Daemon) -> asyncio.subprocess.Process:
    env = dict(os.environ, EVENTBUS_URL=daemon.url)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def output(proc: asyncio.subprocess.Process) -> str:
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def test_readme_examples_run_as_written(own_daemon: Daemon) -> None:
    publish, subscribe, _, worker = blocks()  # the Recovery example: below

    assert re.match(r"published [0-9a-f-]{36}\n", await output(await run(publish, own_daemon)))
    assert await output(await run(subscribe, own_daemon)) == "received orders.shipped parcel 7\n"

    proc = await run(worker, own_daemon)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.decode() == "billing order 42 attempt 1\n"
    proc.send_signal(signal.SIGTERM)
    rest = await output(proc)
    assert rest.startswith("stopped: WorkerStats(processed=1, failed=0"), rest


def test_the_top_readme_shows_only_examples_run_here() -> None:
    """Each Python example of the guide's clients page is one the tests run, but for one
    marked `<!-- check: skip (why) -->` (the guide's marker for an example that needs what
    a test machine lacks, e.g. an OTLP collector), which must say why."""
    shown = re.findall(r"(<!-- check: skip (\([^\n]*\)) -->\n)?```python\n(.*?)```", TOP_README.read_text(), re.S)
    run_here = [block for marker, _, block in shown if not marker]
    assert run_here, "the guide's clients page shows a Python example"
    for block in run_here:
        assert block in blocks(), "a Python example of the guide is not one of the tested ones"
    for marker, why, _ in shown:
        assert not marker or why.strip("() "), "a skipped example says why"


async def test_readme_recovery_example_runs_as_written(tmp_path: Path) -> None:
    """The Recovery example, against a daemon configured with the README's history rule."""
    (config,) = blocks("yaml")
    (tmp_path / "history.yaml").write_text(config)
    daemon = Daemon(tmp_path, env={"EVENTBUS_CONFIG": str(tmp_path / "history.yaml")})
    daemon.start()
    try:
        recovery = blocks()[2]
        assert await output(await run(recovery, daemon)) == "received 1.08\nrecovered 1.09 at offset 2 complete: True\n"
    finally:
        daemon.stop()
