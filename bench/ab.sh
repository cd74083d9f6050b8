#!/usr/bin/env bash
# Same-session A/B of two eventbusd variants (two builds, or one build with two
# configurations), interleaved A B A B ... ROUNDS times, with the same `eventbus bench`
# client; prints medians and B/A ratios. Used for "does this change cost anything".
#
#   A_BIN=/tmp/before/eventbusd bash bench/ab.sh                  # an older build (A) vs this one (B)
#   B_ENV="EVENTBUS__AUTH__ENABLED=true EVENTBUS__AUTH__PRINCIPALS_FILE=p.yaml" B_TOKEN=ebt_… bash bench/ab.sh
#   ROUNDS=5 WORKLOADS="fanout1x16 pubonly" bash bench/ab.sh
#
# A_BIN/B_BIN: the daemons (default target/release/eventbusd); A_ENV/B_ENV: extra
# environment for each; A_TOKEN/B_TOKEN: the client's --token for each.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
A_BIN=${A_BIN:-target/release/eventbusd}
B_BIN=${B_BIN:-target/release/eventbusd}
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/ab.jsonl"
: > "$RESULTS"

declare -A WORKLOAD=(
  [fanout1x16]="fanout --publishers 1 --subscribers 16 --payload 128 --count 200000 --mode stream"
  [fanout1x1]="fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream"
  [pubonly]="pubonly --publishers 1 --payload 128 --count 300000 --mode stream"
  [unary]="pubonly --publishers 16 --payload 128 --count 100000 --mode unary"
  [durable_stream]="durable --publishers 16 --count 60000 --payload 128 --mode stream"
  [durable_unary]="durable --publishers 16 --count 20000 --payload 128 --mode unary"
)
WORKLOADS=${WORKLOADS:-"fanout1x16 fanout1x1 pubonly unary durable_stream durable_unary"}

cargo build --release --quiet -p eventbus-server -p eventbus-cli --features eventbus-cli/jemalloc

# shellcheck source=bench/lib.sh
source bench/lib.sh

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

declare -A PORT
for side in A B; do
  bin_var=${side}_BIN; env_var=${side}_ENV
  PORT[$side]=$(free_port)
  # Each daemon runs in an empty directory: no ./config/default.yaml of this checkout
  # (an older build would refuse keys it does not know).
  dir="$PWD/$OUT/ab-$side"
  rm -rf "$dir"; mkdir -p "$dir"
  bin=$(realpath "${!bin_var}")
  # shellcheck disable=SC2086
  (cd "$dir" && exec env EVENTBUS__DURABLE__DATA_DIR="$dir/data" ${!env_var:-} "$bin" \
    --grpc-addr "127.0.0.1:${PORT[$side]}" --http-addr "127.0.0.1:$(free_port)" --log-level warn \
    >"$dir.log" 2>&1) & PIDS+=($!)
done
wait_port "${PORT[A]}"; wait_port "${PORT[B]}"

for round in $(seq "$ROUNDS"); do
  for name in $WORKLOADS; do
    for side in A B; do
      token_var=${side}_TOKEN
      token=()
      [ -n "${!token_var:-}" ] && token=(--token "${!token_var}")
      echo "round $round/$ROUNDS: $side $name" >&2
      # shellcheck disable=SC2086
      target/release/eventbus --server "http://127.0.0.1:${PORT[$side]}" "${token[@]}" --json bench ${WORKLOAD[$name]} \
        | python3 -c "import json,sys; r=json.load(sys.stdin); r['side']='$side'; r['name']='$name'; print(json.dumps(r))" \
        >>"$RESULTS"
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(list))
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["name"] not in order:
        order.append(r["name"])
    runs[r["name"]][r["side"]].append(r)
print("| workload | metric | A | B | B/A |")
print("|---|---|---:|---:|---:|")
for name in order:
    sample = runs[name]["A"][0]
    metrics = [m for m in ("delivered_per_sec", "published_per_sec", "consumed_per_sec") if m in sample]
    for m in metrics:
        if not any(r[m] for r in runs[name]["A"]):
            continue  # not measured by this workload (a publish-only run delivers nothing)
        a = statistics.median(r[m] for r in runs[name]["A"])
        b = statistics.median(r[m] for r in runs[name]["B"])
        print(f"| {name} | {m} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× |")
EOF
