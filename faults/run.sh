#!/usr/bin/env bash
# The fault harness (docs/guarantees.md). Needs root: it creates network namespaces,
# veth links, iptables rules and a small tmpfs, and removes them all when it ends,
# also after a failure.
#
#   bash faults/run.sh                         # the short schedule (CI): each fault once
#   bash faults/run.sh --seed 42               # the same schedule and targets as seed 42
#   bash faults/run.sh --long --minutes 20     # random faults and pairs, 20 min per fleet
#   bash faults/run.sh --fleets cluster --min-replicas-acked 0
#
# Writes target/faults/report.json and each process's log under target/faults/<fleet>/;
# prints a table per fleet. Exit status 1 when a promise was broken.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "faults/run.sh: run as root (network namespaces, iptables, a tmpfs mount)" >&2
  exit 2
fi
for tool in ip iptables redis-server redis-cli mountpoint; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "faults/run.sh: $tool is missing (Debian packages: iproute2, iptables, redis-server, util-linux)" >&2
    exit 2
  fi
done

profile="${PROFILE:-debug}"
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build --locked --quiet "${flag[@]}" -p eventbus-server -p eventbus-faults --bin eventbusd --bin eventbus-faults
bin="target/$profile"

trap '"$bin/eventbus-faults" net down' EXIT
"$bin/eventbus-faults" net up
ip netns exec ebf-c "$bin/eventbus-faults" run --eventbusd "$bin/eventbusd" "$@"
