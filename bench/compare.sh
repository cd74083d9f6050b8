#!/usr/bin/env bash
# Measures eventbus, NATS core and Redis Pub/Sub with the same workloads, in one run on
# this machine: starts nats-server, redis-server and eventbusd on free loopback ports,
# runs every workload against the three systems interleaved (A B C A B C ...) ROUNDS
# times, stops them, and prints medians and ratios (bench/summarize.py).
#
# Each run also records the CPU time the load generator and the servers spent
# (bench/cpu.py); summarize.py prints it per event, for each side.
#
# The durable workloads (unary and stream publishers) also run against a second
# eventbusd in redis mode, backed by its own redis-server with AOF (appendfsync
# everysec, the recommended setting). Every workload also runs against a third one on
# a Redis Cluster of 3 masters + 3 replicas, AOF as above (column "eventbus-cluster";
# its server CPU counts the daemon and all six nodes; bench/cluster.sh compares it
# with one Redis per node).
#
#   bash bench/compare.sh            # results in target/bench/results.jsonl
#   ROUNDS=5 bash bench/compare.sh
#   REDIS_FSYNC=always bash bench/compare.sh   # the redis-mode durable run with appendfsync always
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

for tool in nats-server redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install nats-server redis-server python3)" >&2; exit 1; }
done

cargo build --release --quiet -p eventbus-server -p eventbus-cli -p peers --features eventbus-cli/jemalloc

# shellcheck source=bench/lib.sh
source bench/lib.sh

NATS_PORT=$(free_port); REDIS_PORT=$(free_port); GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
AOF_PORT=$(free_port); RGRPC_PORT=$(free_port); RHTTP_PORT=$(free_port)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

rm -rf "$OUT/jetstream" "$OUT/eventbus-data" "$OUT/redis-aof" "$OUT/cluster"
mkdir -p "$OUT/redis-aof"
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$OUT/jetstream" >"$OUT/nats.log" 2>&1 & NATS_PID=$!
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no >"$OUT/redis.log" 2>&1 & REDIS_PID=$!
EVENTBUS__DURABLE__DATA_DIR="$OUT/eventbus-data" target/release/eventbusd --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" --log-level warn \
  >"$OUT/eventbusd.log" 2>&1 & EVENTBUSD_PID=$!
# eventbus in redis mode (durable consumers on Redis Streams), on a persistent Redis.
redis-server --bind 127.0.0.1 --port "$AOF_PORT" --save '' --appendonly yes --appendfsync "${REDIS_FSYNC:-everysec}" \
  --dir "$OUT/redis-aof" >"$OUT/redis-aof.log" 2>&1 & AOF_PID=$!
EVENTBUS__EVENTBUS__MODE=redis EVENTBUS__EVENTBUS__REDIS__HOST=127.0.0.1 EVENTBUS__EVENTBUS__REDIS__PORT="$AOF_PORT" \
  target/release/eventbusd --grpc-addr "127.0.0.1:$RGRPC_PORT" --http-addr "127.0.0.1:$RHTTP_PORT" --log-level warn \
  >"$OUT/eventbusd-redis.log" 2>&1 & REDIS_EVENTBUSD_PID=$!
PIDS+=("$NATS_PID" "$REDIS_PID" "$EVENTBUSD_PID" "$AOF_PID" "$REDIS_EVENTBUSD_PID")
# eventbus on a Redis Cluster: 6 nodes, each with its own bus port.
CLUSTER_NODES=(); CLUSTER_PIDS=()
for _ in 1 2 3 4 5 6; do
  port=$(free_port); bus=$(free_port); mkdir -p "$OUT/cluster/$port"
  redis-server --bind 127.0.0.1 --port "$port" --cluster-port "$bus" --cluster-enabled yes --cluster-config-file nodes.conf \
    --save '' --appendonly yes --appendfsync "${REDIS_FSYNC:-everysec}" --dir "$OUT/cluster/$port" \
    >"$OUT/cluster/$port.log" 2>&1 & CLUSTER_PIDS+=($!)
  CLUSTER_NODES+=("127.0.0.1:$port")
done
PIDS+=("${CLUSTER_PIDS[@]}")
for node in "${CLUSTER_NODES[@]}"; do wait_port "${node#*:}"; done
create_cluster "$OUT/cluster/create.log" "${CLUSTER_NODES[@]}"
CGRPC_PORT=$(free_port)
REDIS_CLUSTER_NODES=$(IFS=,; echo "${CLUSTER_NODES[*]}") target/release/eventbusd --mode redis \
  --grpc-addr "127.0.0.1:$CGRPC_PORT" --http-addr "127.0.0.1:$(free_port)" --log-level warn \
  >"$OUT/eventbusd-cluster.log" 2>&1 & CLUSTER_EVENTBUSD_PID=$!
PIDS+=("$CLUSTER_EVENTBUSD_PID")
wait_port "$CGRPC_PORT"
wait_port "$NATS_PORT"; wait_port "$REDIS_PORT"; wait_port "$GRPC_PORT"; wait_port "$AOF_PORT"; wait_port "$RGRPC_PORT"

# `--ack` is what an eventbus stream publisher waits for (each answer, running totals,
# nothing but refusals); NATS and Redis answer no publish and run these rows as always,
# so each mode has its own same-round peer figures.
WORKLOADS=(
  "fanout --publishers 1 --subscribers 16 --payload 128 --count 200000 --mode stream"
  "fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream"
  "fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream --ack cumulative"
  "fanout --publishers 1 --subscribers 1 --payload 128 --count 300000 --mode stream --ack none"
  "latency --rate 10000 --duration 5 --subscribers 1 --payload 128"
  "pubonly --publishers 1 --payload 128 --count 300000 --mode stream"
  "pubonly --publishers 1 --payload 128 --count 300000 --mode stream --ack cumulative"
  "pubonly --publishers 1 --payload 128 --count 300000 --mode stream --ack none"
  "pubonly --publishers 1 --payload 128 --count 300000 --mode batch --batch 256"
)
DURABLES=("durable --publishers 16 --count 20000 --payload 128 --mode unary"
          "durable --publishers 16 --count 20000 --payload 128 --mode client"
          "durable --publishers 16 --count 60000 --payload 128 --mode stream")
# SYSTEMS="eventbus nats" and DURABLE=0 narrow a run to what is being looked at.
read -r -a SYSTEMS <<<"${SYSTEMS:-eventbus nats redis eventbus-cluster}"
if [ "${DURABLE:-1}" = 0 ]; then DURABLES=(); fi

# The CPU time each side spends (bench/cpu.py): the load generator, and the servers
# that carry the run (the daemon, plus its Redis in redis mode).
cpu() { python3 bench/cpu.py "$@"; }

run() { # system workload...
  local system=$1; shift
  case $system in
    eventbus) cpu --server "$EVENTBUSD_PID" -- target/release/eventbus --server "http://127.0.0.1:$GRPC_PORT" --json bench "$@" ;;
    eventbus-redis) cpu --server "$REDIS_EVENTBUSD_PID" --server "$AOF_PID" -- \
      target/release/eventbus --server "http://127.0.0.1:$RGRPC_PORT" --json bench "$@" ;;
    eventbus-cluster) cluster_servers=(); for pid in "$CLUSTER_EVENTBUSD_PID" "${CLUSTER_PIDS[@]}"; do cluster_servers+=(--server "$pid"); done
      cpu "${cluster_servers[@]}" -- target/release/eventbus --server "http://127.0.0.1:$CGRPC_PORT" --json bench "$@" ;;
    nats) cpu --server "$NATS_PID" -- target/release/peers --system nats --url "nats://127.0.0.1:$NATS_PORT" --json "$@" ;;
    redis) cpu --server "$REDIS_PID" -- target/release/peers --system redis --url "redis://127.0.0.1:$REDIS_PORT" --json "$@" ;;
  esac
}

tag() { # round [system]
  python3 -c "import json,sys; r=json.load(sys.stdin); r['round']=$1; r['system']='${2:-}' or r['system']; print(json.dumps(r))"
}

for round in $(seq "$ROUNDS"); do
  for workload in "${WORKLOADS[@]}"; do
    for system in "${SYSTEMS[@]}"; do
      echo "round $round/$ROUNDS: $system $workload" >&2
      # shellcheck disable=SC2086
      run "$system" $workload | tag "$round" "$system" >>"$RESULTS"
    done
  done
  # Durable: eventbus (embedded store, fsync always), eventbus in redis mode (Redis
  # Streams, AOF) and JetStream (file storage).
  for durable in "${DURABLES[@]+"${DURABLES[@]}"}"; do
    echo "round $round/$ROUNDS: $durable" >&2
    # shellcheck disable=SC2086
    run eventbus $durable | tag "$round" >>"$RESULTS"
    # shellcheck disable=SC2086
    run eventbus-redis $durable | tag "$round" eventbus-redis >>"$RESULTS"
    # shellcheck disable=SC2086
    # shellcheck disable=SC2086
    run eventbus-cluster $durable | tag "$round" eventbus-cluster >>"$RESULTS"
    # shellcheck disable=SC2086
    run nats $durable | tag "$round" >>"$RESULTS"
  done
done

python3 bench/summarize.py "$RESULTS"
