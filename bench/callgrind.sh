#!/usr/bin/env bash
# Instructions per event in eventbusd, counted by callgrind: repeatable on a busy
# machine, where wall-clock benchmarks are noise. Runs the daemon under
# `valgrind --tool=callgrind`, warms it up with a small run of the workload, zeroes the
# counters, runs the workload once more with COUNT events, dumps, and prints the
# daemon's instructions per event (Ir / COUNT) and the top functions (inclusive).
#
#   bash bench/callgrind.sh pubonly                 # one workload
#   BIN=/tmp/old/eventbusd COUNT=20000 bash bench/callgrind.sh fanout1x1 latency
#
# Workloads: pubonly pubonly_none pubonly_cumulative pubonly_batch fanout1x1 fanout1x1_none fanout1x16 latency unary durable_unary durable_stream.
# BIN: the daemon (default target/release/eventbusd); CLI: the load generator
# (default: next to BIN, else target/release/eventbus); OUT: where callgrind files go.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release/eventbusd}
CLI=${CLI:-$(dirname "$BIN")/eventbus}
[ -x "$CLI" ] || CLI=target/release/eventbus
COUNT=${COUNT:-20000}
OUT=${OUT:-target/callgrind}
TAG=${TAG:-$(basename "$(dirname "$(realpath "$BIN")")")}
mkdir -p "$OUT"; OUT=$(realpath "$OUT")

# shellcheck source=bench/lib.sh
source bench/lib.sh

# The latency workload paces COUNT events at RATE/s; pubonly_batch sends BATCH events
# per PublishBatch call (default 256).
RATE=${RATE:-1000}
declare -A WORKLOAD=(
  [pubonly]="pubonly --publishers 1 --payload 128 --count COUNT --mode stream"
  [pubonly_none]="pubonly --publishers 1 --payload 128 --count COUNT --mode stream --ack none"
  [pubonly_cumulative]="pubonly --publishers 1 --payload 128 --count COUNT --mode stream --ack cumulative"
  [fanout1x1_none]="fanout --publishers 1 --subscribers 1 --payload 128 --count COUNT --mode stream --ack none"
  [pubonly_batch]="pubonly --publishers 1 --payload 128 --count COUNT --mode batch --batch ${BATCH:-256}"
  [fanout1x1]="fanout --publishers 1 --subscribers 1 --payload 128 --count COUNT --mode stream"
  [fanout1x16]="fanout --publishers 1 --subscribers 16 --payload 128 --count COUNT --mode stream"
  [latency]="latency --rate $RATE --duration DURATION --subscribers 1 --payload 128"
  [unary]="pubonly --publishers 16 --payload 128 --count COUNT --mode unary"
  [durable_unary]="durable --publishers 16 --count COUNT --payload 128 --mode unary"
  [durable_stream]="durable --publishers 16 --count COUNT --payload 128 --mode stream"
)

args_for() { # workload count
  local a=${WORKLOAD[$1]}
  a=${a//COUNT/$2}
  a=${a//DURATION/$(python3 -c "print($2 / $RATE)")}
  echo "$a"
}

for name in "$@"; do
  port=$(free_port)
  dir="$OUT/run-$TAG-$name"
  rm -rf "$dir"; mkdir -p "$dir"
  file="$OUT/$TAG-$name.out"
  rm -f "$file"*
  bin=$(realpath "$BIN")
  (cd "$dir" && exec env EVENTBUS__DURABLE__DATA_DIR="$dir/data" valgrind --tool=callgrind \
    --callgrind-out-file="$file" "$bin" --grpc-addr "127.0.0.1:$port" \
    --http-addr "127.0.0.1:$(free_port)" --log-level warn >"$dir.log" 2>&1) &
  vpid=$!
  for _ in $(seq 600); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
    sleep 0.2
  done
  # The subshell execs env, which execs valgrind: $vpid is the daemon under valgrind.
  pid=$vpid
  # shellcheck disable=SC2046
  "$CLI" --server "http://127.0.0.1:$port" --json bench $(args_for "$name" $((COUNT / 10))) >/dev/null
  callgrind_control -z "$pid" >/dev/null
  # shellcheck disable=SC2046
  "$CLI" --server "http://127.0.0.1:$port" --json bench $(args_for "$name" "$COUNT") >"$dir.json"
  callgrind_control -d "$pid" >/dev/null
  kill -INT "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
  dump=$(ls -t "$file".* 2>/dev/null | grep -v '\.1$' | head -1 || true)
  dump=$(ls "$file".1 2>/dev/null || echo "$dump")
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
  echo "$TAG $name: $total Ir over $COUNT events = $((total / COUNT)) Ir/event ($dump)"
done
