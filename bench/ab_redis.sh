#!/usr/bin/env bash
# Same-session A/B of two eventbusd builds in redis mode on the durable stream workload
# (publish, then consume + ack), each daemon on its own redis-server (AOF everysec, as
# bench/compare.sh), with JetStream (N) interleaved: A B N A B N ... ROUNDS times.
# Prints medians, and per event the CPU time of each side's redis-server and daemon
# (publish + consume); INFO commandstats of every run are kept in $OUT/cs-{side}-{round}.txt.
#
#   A_BIN=/tmp/before/eventbusd B_BIN=target/release/eventbusd ROUNDS=5 bash bench/ab_redis.sh
#   SIDES="A B" COUNT=100000 ...    # without JetStream; another event count
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
ROUNDS=${ROUNDS:-3}
T=${T:-target/release}
A_BIN=$(realpath "${A_BIN:-$T/eventbusd}"); B_BIN=$(realpath "${B_BIN:-$T/eventbusd}")
OUT=$PWD/target/bench/ab-redis; rm -rf "$OUT"; mkdir -p "$OUT"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
NATS_PORT=$(free_port)
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$OUT/jetstream" >"$OUT/nats.log" 2>&1 & PIDS+=($!)
declare -A RPORT GPORT RPID DPID
for side in A B; do
  bin_var=${side}_BIN
  RPORT[$side]=$(free_port); GPORT[$side]=$(free_port)
  mkdir -p $OUT/aof-$side $OUT/d-$side
  redis-server --bind 127.0.0.1 --port "${RPORT[$side]}" --save '' --appendonly yes --appendfsync everysec \
    --dir "$OUT/aof-$side" >"$OUT/redis-$side.log" 2>&1 & PIDS+=($!); RPID[$side]=$!
  wait_port "${RPORT[$side]}"
  (cd $OUT/d-$side && exec env EVENTBUS__EVENTBUS__MODE=redis EVENTBUS__EVENTBUS__REDIS__HOST=127.0.0.1 EVENTBUS__EVENTBUS__REDIS__PORT="${RPORT[$side]}" \
    "${!bin_var}" --grpc-addr "127.0.0.1:${GPORT[$side]}" --http-addr "127.0.0.1:$(free_port)" --log-level warn \
    >"$OUT/eventbusd-$side.log" 2>&1) & PIDS+=($!)
done
wait_port "$NATS_PORT"; wait_port "${GPORT[A]}"; wait_port "${GPORT[B]}"
W="durable --publishers 16 --count ${COUNT:-60000} --payload 128 --mode stream"
cpu() { awk '{printf "%.2f", ($14+$15)/100}' /proc/$1/stat; }  # seconds
daemon_pid() { pgrep -f -- "--grpc-addr 127.0.0.1:$1" | head -1; }
for round in $(seq "$ROUNDS"); do
  for side in ${SIDES:-A B N}; do
    if [ "$side" = N ]; then
      $T/peers --system nats --url "nats://127.0.0.1:$NATS_PORT" --json $W 2>>$OUT/err.log \
        | python3 -c "import json,sys; r=json.load(sys.stdin); r['side']='N'; r['round']=$round; print(json.dumps(r))" >>$OUT/res.jsonl
      continue
    fi
    redis-cli -p "${RPORT[$side]}" CONFIG RESETSTAT >/dev/null
    dp=$(daemon_pid "${GPORT[$side]}")
    r0=$(cpu "${RPID[$side]}"); d0=$(cpu "$dp")
    "$T/eventbus" --server "http://127.0.0.1:${GPORT[$side]}" --json bench $W 2>>$OUT/err.log >$OUT/one.json
    r1=$(cpu "${RPID[$side]}"); d1=$(cpu "$dp")
    redis-cli -p "${RPORT[$side]}" INFO commandstats >$OUT/cs-$side-$round.txt
    python3 -c "import json,sys; r=json.load(open('$OUT/one.json')); r['side']='$side'; r['round']=$round; r['redis_cpu_s']=$r1-$r0; r['daemon_cpu_s']=$d1-$d0; print(json.dumps(r))" >>$OUT/res.jsonl
  done
done
uptime
python3 - $OUT/res.jsonl <<'PY'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for l in open(sys.argv[1]):
    r = json.loads(l); runs[r['side']].append(r)
for side, rs in sorted(runs.items()):
    pub = statistics.median(r['published_per_sec'] for r in rs)
    con = statistics.median(r['consumed_per_sec'] for r in rs)
    extra = ''
    if 'redis_cpu_s' in rs[0]:
        rc = statistics.median(r['redis_cpu_s'] for r in rs); dc = statistics.median(r['daemon_cpu_s'] for r in rs)
        extra = f" redis_cpu/ev(pub+cons) {rc/rs[0]['params']['count']*1e6:.1f}us daemon_cpu/ev {dc/rs[0]['params']['count']*1e6:.1f}us"
    print(f"{side}: published/s {pub:,.0f} consumed/s {con:,.0f} all_consumed={[r['consumed_per_sec'] for r in rs]} all_pub={[r['published_per_sec'] for r in rs]}{extra}")
PY
