#!/usr/bin/env bash
# Durable publishing on the embedded store against JetStream (file storage), same run:
# starts nats-server with JetStream and one eventbusd per variant, each on its own data
# directory, then runs the durable workloads (16 unary publishers; 16 tasks sharing one
# client, each awaiting its publish(); 16 stream publishers) against every side
# interleaved ROUNDS times, and prints medians with the
# ratio to JetStream, and the CPU each side spent per event (bench/cpu.py: the server
# process, and the load generator), publishing and consuming included.
#
#   bash bench/durable.sh
#   ROUNDS=5 bash bench/durable.sh
#   VARIANTS="before=/tmp/old/eventbusd: after=target/release/eventbusd:" bash bench/durable.sh
#
# VARIANTS: space-separated NAME=BIN:FSYNC (FSYNC: always or batch; empty = always).
# Default: this build with fsync always, and with fsync batch (JetStream's own default
# does not fsync each message either).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-"always=target/release/eventbusd:always batch=target/release/eventbusd:batch"}
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/durable.jsonl"
: > "$RESULTS"

command -v nats-server >/dev/null || { echo "missing nats-server (apt-get install nats-server)" >&2; exit 1; }
cargo build --release --quiet -p eventbus-server -p eventbus-cli -p peers --features eventbus-cli/jemalloc

# shellcheck source=bench/lib.sh
source bench/lib.sh

trap stop_started EXIT
start_jetstream durable
declare -A PORT SERVER
SERVER[jetstream]=$NATS_PID
SIDES=()
for variant in $VARIANTS; do
  name=${variant%%=*}; rest=${variant#*=}; bin=$(realpath "${rest%%:*}"); fsync=${rest#*:}
  PORT[$name]=$(free_port); SIDES+=("$name")
  # An empty directory per daemon: no ./config/default.yaml of this checkout.
  dir="$PWD/$OUT/durable-$name"
  rm -rf "$dir"; mkdir -p "$dir"
  (cd "$dir" && exec env EVENTBUS__DURABLE__DATA_DIR="$dir/data" EVENTBUS__DURABLE__FSYNC="${fsync:-always}" "$bin" \
    --grpc-addr "127.0.0.1:${PORT[$name]}" --http-addr "127.0.0.1:$(free_port)" --log-level warn \
    >"$dir.log" 2>&1) & PIDS+=($!)
  # The subshell execs the daemon: $! is its pid.
  SERVER[$name]=$!
done
wait_port "$NATS_PORT"
for name in "${SIDES[@]}"; do wait_port "${PORT[$name]}"; done

WORKLOADS=("durable --publishers 16 --count 20000 --payload 128 --mode unary"
           "durable --publishers 16 --count 20000 --payload 128 --mode client"
           "durable --publishers 16 --count 60000 --payload 128 --mode stream")
for round in $(seq "$ROUNDS"); do
  for workload in "${WORKLOADS[@]}"; do
    for side in "${SIDES[@]}" jetstream; do
      echo "round $round/$ROUNDS: $side $workload" >&2
      if [ "$side" = jetstream ]; then
        # shellcheck disable=SC2086
        python3 bench/cpu.py --server "${SERVER[$side]}" -- \
          target/release/peers --system nats --url "nats://127.0.0.1:$NATS_PORT" --json $workload
      else
        # shellcheck disable=SC2086
        python3 bench/cpu.py --server "${SERVER[$side]}" -- \
          target/release/eventbus --server "http://127.0.0.1:${PORT[$side]}" --json bench $workload
      fi | python3 -c "import json,sys; r=json.load(sys.stdin); r['side']='$side'; print(json.dumps(r))" >>"$RESULTS"
    done
  done
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
sides = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[r["params"]["mode"]][r["side"]].append(r)
    if r["side"] not in sides:
        sides.append(r["side"])
metrics = [("published/s", lambda r: r["published_per_sec"]),
           ("publish p50 µs", lambda r: r["publish_latency_us"]["p50"]),
           ("publish p99 µs", lambda r: r["publish_latency_us"]["p99"]),
           ("consumed+acked/s", lambda r: r["consumed_per_sec"])]
print("| mode | metric | " + " | ".join(sides) + " | " + " | ".join(f"{s}/JetStream" for s in sides if s != "jetstream") + " |")
print("|---|---|" + "---:|" * (2 * len(sides) - 1))
for mode, by_side in runs.items():
    for label, get in metrics:
        med = {s: statistics.median(get(r) for r in by_side[s]) for s in sides}
        ratios = [f"{med[s] / med['jetstream']:.2f}×" if med["jetstream"] else "" for s in sides if s != "jetstream"]
        print(f"| {mode} | {label} | " + " | ".join(f"{med[s]:,.0f}" for s in sides) + " | " + " | ".join(ratios) + " |")
print("\nCPU per event, µs (server process / load generator; publishing and consuming):\n")
print("| mode | " + " | ".join(sides) + " |")
print("|---|" + "---:|" * len(sides))
for mode, by_side in runs.items():
    cells = []
    for s in sides:
        per = lambda side: statistics.median(r["cpu"][side] / r["params"]["count"] * 1e6 for r in by_side[s])
        cells.append(f"{per('server_s'):.1f} / {per('client_s'):.1f}")
    print(f"| {mode} | " + " | ".join(cells) + " |")
PY
