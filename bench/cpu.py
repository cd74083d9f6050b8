#!/usr/bin/env python3
"""Runs one load generator and adds the CPU time it and the servers spent to its JSON.

    python3 bench/cpu.py --server PID [--server PID ...] -- COMMAND...

COMMAND prints one JSON report on stdout (`eventbus bench --json`, `peers --json`);
this prints it again with `cpu: {"client_s": ..., "server_s": ...}`: the generator's
user + system time (from its rusage) and the servers' (from /proc/PID/stat, before
and after), in seconds. bench/summarize.py turns them into CPU per event.
"""
import json
import os
import resource
import subprocess
import sys

TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may hold spaces: the fields after it start after ")".
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def main(argv):
    pids, i = [], 0
    while argv[i] != "--":
        if argv[i] != "--server":
            sys.exit(f"unexpected argument {argv[i]!r}; usage: cpu.py --server PID ... -- COMMAND...")
        pids.append(int(argv[i + 1]))
        i += 2
    command = argv[i + 1:]
    before_server = server_cpu(pids)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, stdout=subprocess.PIPE, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(done.stdout)
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report["cpu"] = {"client_s": round(client, 3), "server_s": round(server_cpu(pids) - before_server, 3)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
