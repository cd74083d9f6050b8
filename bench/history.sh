#!/usr/bin/env bash
# What channel history costs publishers and subscribers: the same workloads as
# bench/compare.sh (the `eventbus bench` load generator), against eventbusd with
# history off and with a history rule on every channel (`>`, 10,000 events each), in
# in_memory mode and in redis mode (one redis-server, no persistence: the cost measured
# is the history's, not the disk's). Runs interleaved (off, on, off, on ...) ROUNDS
# times and prints the medians and the on/off ratios.
#
#   bash bench/history.sh              # results in target/bench/history.jsonl
#   ROUNDS=5 bash bench/history.sh
#   BASELINE=/path/to/old/bin bash bench/history.sh   # also an older eventbusd's redis
#                                      # pair, interleaved (before/after, same run)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/history.jsonl"
: > "$RESULTS"

for tool in redis-server python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install redis-server python3)" >&2; exit 1; }
done
cargo build --release --quiet -p eventbus-server -p eventbus-cli --features eventbus-cli/jemalloc

# shellcheck source=bench/lib.sh
source bench/lib.sh

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cat >"$OUT/history.yaml" <<'EOF'
eventbus:
  history:
    - channels: ">"
      size: 10000
EOF

REDIS_PORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no >"$OUT/history-redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT"

declare -A PORT
start() { # name mode config-or-empty [eventbusd]
  local name=$1 mode=$2 config=$3 daemon=${4:-target/release/eventbusd} port http
  port=$(free_port); http=$(free_port)
  local args=(--grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$http" --log-level warn --mode "$mode")
  [ -n "$config" ] && args+=(--config "$config")
  # Each instance has its own data directory, and each redis-mode one its own prefix:
  # the two never see each other's events.
  rm -rf "$OUT/history-data-$name"
  EVENTBUS__DURABLE__DATA_DIR="$OUT/history-data-$name" \
  EVENTBUS__EVENTBUS__REDIS__PORT="$REDIS_PORT" EVENTBUS__EVENTBUS__REDIS__PREFIX="bench-$name" \
    "$daemon" "${args[@]}" >"$OUT/eventbusd-$name.log" 2>&1 &
  PIDS+=($!)
  PORT[$name]=$port
  wait_port "$port"
}
start memory in_memory ""
start memory-history in_memory "$OUT/history.yaml"
start redis redis ""
start redis-history redis "$OUT/history.yaml"
SYSTEMS=(memory memory-history redis redis-history)
if [ -n "${BASELINE:-}" ]; then
  start redis-base redis "" "$BASELINE/eventbusd"
  start redis-history-base redis "$OUT/history.yaml" "$BASELINE/eventbusd"
  SYSTEMS+=(redis-base redis-history-base)
fi

WORKLOADS=(
  "pubonly --publishers 1 --payload 128 --count 300000 --mode stream"
  "fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream"
  "fanout --publishers 1 --subscribers 16 --payload 128 --count 200000 --mode stream"
)

for round in $(seq "$ROUNDS"); do
  for workload in "${WORKLOADS[@]}"; do
    for system in "${SYSTEMS[@]}"; do
      echo "round $round/$ROUNDS: $system $workload" >&2
      # shellcheck disable=SC2086
      target/release/eventbus --server "http://127.0.0.1:${PORT[$system]}" --json bench $workload \
        | python3 -c "import json,sys; r=json.load(sys.stdin); r['system']='$system'; print(json.dumps(r))" >>"$RESULTS"
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    r = json.loads(line)
    p = r["params"]
    name = f"{r['workload']} {p['publishers']} pub" + (f" → {p['subscribers']} sub" if r["workload"] == "fanout" else "")
    rate = r["delivered_per_sec"] if r["workload"] == "fanout" else r["published_per_sec"]
    runs[name][r["system"]].append(rate)
print("| workload | mode | history off (events/s) | history on | on/off |")
print("|---|---|---:|---:|---:|")
for name, by in runs.items():
    for mode, off, on in [("in_memory", "memory", "memory-history"), ("redis", "redis", "redis-history"),
                          ("redis (baseline)", "redis-base", "redis-history-base")]:
        if not by[off]:
            continue
        a, b = statistics.median(by[off]), statistics.median(by[on])
        print(f"| {name} | {mode} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× |")
EOF
