#!/usr/bin/env python3
"""Runs the shell examples of the guide, page after page, as a reader would.

Every page of docs/ (in PAGES' order; those in UNCHECKED say why not) has each of its
```sh blocks run with bash (`set -euo pipefail`), and each must succeed, one after the
other, against one eventbusd. A page with a ```sh block that is in neither list fails
the check: a new page is checked from the start. A block that cannot run on a fresh
machine (it needs Docker, Kubernetes, Redis, grpcurl, an endpoint of the reader's, or
it runs until interrupted) carries a `skip` marker saying so.
The install block runs as written (`cargo install`), with `--debug --root <tmp>` added
so that it reuses the workspace's debug build and installs into a scratch directory; the
later blocks run the binaries it installed. A block preceded by a comment steers it:

    <!-- check: skip (why) -->     not run (why: what it needs). The first skipped
                                   block that starts eventbusd is where the check starts
                                   its own (on free ports, in a scratch directory)
    <!-- check: background -->     run in the background: it must end by itself,
                                   successfully, before the check does
    <!-- check: save NAME -->      the block (any language) is a file the reader saves:
                                   written as NAME in the service directory
    <!-- check: service HOST:PORT --> a server the reader leaves running: started in
                                   the background from the service directory, the
                                   check goes on once HOST:PORT accepts connections,
                                   and stops it at the end

Every relative link of README.md and docs/ is checked first: the file exists, and so
does the anchor.

The examples name the default addresses (`localhost:8080`, `127.0.0.1:50051`); they are
pointed at the check's daemon, and `EVENTBUS_SERVER` names its gRPC address.

    python3 .ci/check_docs.py
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "docs/getting-started.md",
    "docs/durable.md",
    "docs/push.md",
    "docs/security.md",
    "docs/cli.md",
    "docs/consumer-operations.md",
    "docs/operations.md",
    "docs/web.md",
    "docs/clients.md",
    "docs/deployment.md",
    "docs/redis.md",
    "docs/performance-summary.md",
]
# Pages with shell blocks that are not run, and why.
UNCHECKED = {
    "README.md": "the front page, whose blocks run in three terminals: docs/getting-started.md runs the same steps",
    "docs/PERFORMANCE.md": "the measurements' own commands: minutes each, some against NATS and Redis",
    "docs/guarantees.md": "the fault harness, as root, for minutes: CI runs its short schedule itself",
}
BLOCK_TIMEOUT = 300  # the install block may compile
DEADLINE = 30


def blocks(page):
    """(marker, argument, code, line) of each ```sh block of `page`, and of each block
    marked `save`."""
    lines = (ROOT / page).read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```") and len(fence) > 3:
            start = i
            marker, argument = "", ""
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j >= 0:
                m = re.match(r"<!-- check: (\w+)(?: (.*?))?\s*-->", lines[j].strip())
                if m:
                    marker, argument = m.group(1), m.group(2) or ""
            code = []
            i += 1
            while lines[i].strip() != "```":
                code.append(lines[i])
                i += 1
            if fence == "```sh" or marker == "save":
                out.append((marker, argument, "\n".join(code), start + 1))
        i += 1
    return out


def start_daemon(bin_dir, workdir):
    proc = subprocess.Popen(
        [str(bin_dir / "eventbusd"), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--log-format", "text"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As docs/push.md restarts it: its receiver listens on 127.0.0.1, which
        # push.deny_networks refuses by default.
        env=dict(os.environ, RUST_LOG="info", EVENTBUS__PUSH__ALLOW_NETWORKS="127.0.0.0/8,::1/128"))
    deadline = time.monotonic() + DEADLINE
    for line in proc.stdout:
        if "eventbusd started" in line:
            grpc = re.search(r"grpc_addr=(\S+)", line).group(1)
            http = re.search(r"http_addr=(\S+)", line).group(1)
            # Keep reading its log, so that a full pipe never stops it.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, grpc, http
        if time.monotonic() > deadline:
            break
    proc.kill()
    sys.exit("eventbusd did not start")


def slug(heading):
    """The anchor GitHub and mdBook give a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(path):
    text = path.read_text()
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    found = {slug(h) for h in re.findall(r"(?m)^#+ (.*)$", text)}
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def check_links():
    """Every relative link of README.md and docs/ names a file that exists, and an
    anchor that file has."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such anchor)")
    if broken:
        sys.exit("broken links:\n  " + "\n  ".join(broken))
    print("docs check: every link resolves")


def check_pages_listed():
    """Every page with a ```sh block is run (PAGES) or says why not (UNCHECKED)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    unlisted = [str(p.relative_to(ROOT)) for p in pages
                if re.search(r"(?m)^```sh$", p.read_text())
                and str(p.relative_to(ROOT)) not in PAGES + list(UNCHECKED)]
    if unlisted:
        sys.exit("pages with shell blocks the check neither runs nor excludes (PAGES, UNCHECKED in "
                 ".ci/check_docs.py): " + ", ".join(unlisted))


def main():
    check_links()
    check_pages_listed()
    scratch = Path(tempfile.mkdtemp(prefix="eventbus-docs-"))
    install_root = scratch / "install"
    bin_dir = install_root / "bin"
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["CARGO_TARGET_DIR"] = str(ROOT / "target")
    services_dir = scratch / "services"
    services_dir.mkdir()
    daemon, grpc, http = None, None, None
    background, services = [], []
    try:
        for page in PAGES:
            for marker, argument, code, line in blocks(page):
                where = f"{page}:{line}"
                if marker == "save":
                    (services_dir / argument).write_text(code + "\n")
                    print(f"-- {where}: saved as {argument}")
                    continue
                if marker == "service":
                    print(f"-- {where} (service on {argument})\n{code}", flush=True)
                    proc = subprocess.Popen(["bash", "-c", f"set -euo pipefail\n{code}\n"], cwd=services_dir,
                                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            start_new_session=True)
                    services.append((where, proc))
                    wait_for_port(argument, proc, where)
                    continue
                if marker == "skip":
                    print(f"-- {where}: skipped {argument}")
                    if daemon is None and "eventbusd" in code:
                        daemon, grpc, http = start_daemon(bin_dir, scratch)
                        env["EVENTBUS_SERVER"] = f"http://{grpc}"
                        print(f"   the check's daemon instead: gRPC {grpc}, HTTP {http}")
                    continue
                code = code.replace("cargo install ", f"cargo install --debug --root {install_root} ")
                if http:
                    code = code.replace("localhost:8080", http).replace("127.0.0.1:8080", http)
                    code = code.replace("localhost:50051", grpc).replace("127.0.0.1:50051", grpc)
                print(f"-- {where}{' (background)' if marker == 'background' else ''}\n{code}", flush=True)
                script = f"set -euo pipefail\n{code}\n"
                if marker == "background":
                    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    background.append((where, proc))
                    wait_for_subscription(env)
                    continue
                done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
                print(done.stdout, end="")
                if done.returncode != 0:
                    sys.exit(f"FAILED: the block at {where} exited with {done.returncode}")
        for where, proc in background:
            out, _ = proc.communicate(timeout=DEADLINE)
            print(f"-- {where} (background) printed:\n{out}", end="")
            if proc.returncode != 0:
                sys.exit(f"FAILED: the background block at {where} exited with {proc.returncode}")
        print("docs check: every example ran")
    finally:
        for _, proc in background:
            if proc.poll() is None:
                proc.kill()
        for where, proc in services:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
            out, _ = proc.communicate(timeout=DEADLINE)
            print(f"-- {where} (service) printed:\n{out}", end="")
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=DEADLINE)


def wait_for_port(address, proc, where):
    """A service is up once `address` (HOST:PORT) accepts a connection."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"FAILED: the service at {where} exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"FAILED: the service at {where} never listened on {address}")


def wait_for_subscription(env):
    """A background subscriber is live once the broker lists a subscription."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        listed = subprocess.run(["eventbus", "subscriptions", "--json"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if listed.returncode == 0 and listed.stdout.strip() not in ("", "[]"):
            return
        time.sleep(0.05)
    sys.exit("the background subscriber never showed up in `eventbus subscriptions`")


if __name__ == "__main__":
    main()
