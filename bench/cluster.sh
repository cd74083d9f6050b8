#!/usr/bin/env bash
# Core pub/sub and durable publishing on one Redis against a Redis Cluster of 3
# masters + 3 replicas, on this machine, same run (no persistence on either side): one eventbusd in redis mode on each, the same `eventbus bench`
# workloads interleaved (single, cluster, single, cluster, ...) ROUNDS times. Prints the
# median throughput of each side and, per event, the CPU time of the daemon and of each
# Redis process (bench/cluster_summary.py).
#
# On one machine the cluster cannot be faster (its six processes share the same cores);
# what this measures is the CPU the cluster adds per event and how evenly the masters
# share it, from which what N machines would carry follows.
#
#   bash bench/cluster.sh                 # results in target/bench/cluster.jsonl
#   ROUNDS=5 bash bench/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

ROUNDS=${ROUNDS:-3}
OUT=$PWD/target/bench/cluster
rm -rf "$OUT"; mkdir -p "$OUT"
RESULTS=$OUT/../cluster.jsonl
: > "$RESULTS"
cargo build --release --quiet -p eventbus-server -p eventbus-cli --features eventbus-cli/jemalloc
T=${T:-target/release}  # another build's binaries: T=/path/to/bin bash bench/cluster.sh

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Both sides as compare.sh runs core pub/sub: no persistence.
SINGLE=$(free_port)
redis-server --bind 127.0.0.1 --port "$SINGLE" --save '' --appendonly no >"$OUT/single.log" 2>&1 & PIDS+=($!)
SINGLE_PID=$!
NODES=(); NODE_PIDS=()
for i in 1 2 3 4 5 6; do
  port=$(free_port); bus=$(free_port); mkdir -p "$OUT/node-$port"
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --cluster-enabled yes --cluster-port "$bus" \
    --cluster-config-file nodes.conf --dir "$OUT/node-$port" >"$OUT/node-$port.log" 2>&1 & PIDS+=($!)
  NODES+=("127.0.0.1:$port"); NODE_PIDS+=($!)
done
wait_port "$SINGLE"
for node in "${NODES[@]}"; do wait_port "${node#*:}"; done
create_cluster "$OUT/create.log" "${NODES[@]}"

start_daemon() { # side env...
  local side=$1 grpc; shift
  grpc=$(free_port)
  env "$@" "$T/eventbusd" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$(free_port)" --mode redis \
    --log-level warn >"$OUT/eventbusd-$side.log" 2>&1 & PIDS+=($!)
  wait_port "$grpc"
  echo "$grpc $!"
}
read -r SINGLE_GRPC SINGLE_DAEMON < <(start_daemon single EVENTBUS__EVENTBUS__REDIS__HOST=127.0.0.1 \
  EVENTBUS__EVENTBUS__REDIS__PORT="$SINGLE" EVENTBUS__DURABLE__DATA_DIR="")
read -r CLUSTER_GRPC CLUSTER_DAEMON < <(start_daemon cluster REDIS_CLUSTER_NODES="$(IFS=,; echo "${NODES[*]}")")
PIDS+=("$SINGLE_DAEMON" "$CLUSTER_DAEMON")

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
WORKLOADS=(
  "fanout --publishers 1 --subscribers 16 --payload 128 --count 200000 --mode stream"
  "fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream"
  "pubonly --publishers 4 --payload 128 --count 300000 --mode stream"
  "durable --publishers 16 --count 20000 --payload 128 --mode unary"
  "durable --publishers 16 --count 60000 --payload 128 --mode stream"
)
for round in $(seq "$ROUNDS"); do
  for workload in "${WORKLOADS[@]}"; do
    for side in single cluster; do
      echo "round $round/$ROUNDS: $side $workload" >&2
      if [ "$side" = single ]; then grpc=$SINGLE_GRPC daemon=$SINGLE_DAEMON redis=("$SINGLE_PID")
      else grpc=$CLUSTER_GRPC daemon=$CLUSTER_DAEMON redis=("${NODE_PIDS[@]}"); fi
      before=(); for pid in "$daemon" "${redis[@]}"; do before+=("$(ticks "$pid")"); done
      # shellcheck disable=SC2086
      "$T/eventbus" --server "http://127.0.0.1:$grpc" --json bench $workload >"$OUT/one.json"
      after=(); for pid in "$daemon" "${redis[@]}"; do after+=("$(ticks "$pid")"); done
      python3 - "$OUT/one.json" "$side" "$round" "$(getconf CLK_TCK)" "${before[*]}" "${after[*]}" >>"$RESULTS" <<'PY'
import json, sys
path, side, rnd, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
before, after = sys.argv[5].split(), sys.argv[6].split()
r = json.load(open(path))
cpu = [(int(a) - int(b)) / tck for a, b in zip(after, before)]
r.update(side=side, round=rnd, daemon_s=cpu[0], redis_s=cpu[1:])
print(json.dumps(r))
PY
    done
  done
done
python3 bench/cluster_summary.py "$RESULTS"
