#!/usr/bin/env bash
# Durable publishing as a Python or Node service does it, against JetStream driven the
# same way from the same language, same run: 16 concurrent tasks share one client, each
# awaiting its publish() of one durable 128-byte event before the next. Starts nats-server
# with JetStream and one eventbusd on the embedded store (each on its own directory), runs
# bench/clients/publish.py and bench/clients/publish.mjs in three modes, interleaved ROUNDS
# times, and prints medians with the ratio to JetStream of the same language:
#   shared     the clients' default: concurrent publish() calls share one PublishStream
#   unary      Client.connect(url, unary_publish=True) / connect(url, { unaryPublish: true })
#   jetstream  nats-py / nats.js, js.publish() on one connection, a file-storage stream
# and the CPU each side spent per event (the server process from /proc/PID/stat, the load
# generator from its own rusage / process.cpuUsage()), over the timed events only.
#
#   bash bench/clients.sh
#   ROUNDS=5 FSYNC=batch bash bench/clients.sh
#   EVENTBUS_BIN=/path/to/eventbusd COUNT=10000 bash bench/clients.sh
#
# FSYNC: the daemon's durable.fsync, always (default) or batch. COUNT timed events per run
# (20,000), WARMUP untimed ones before (2,000), CONCURRENCY (16), PAYLOAD bytes (128).
# EVENTBUS_BIN: the daemon to run; unset, this checkout's is built (cargo build --release).
# Needs python3 (venv), node >= 20 with npm, and nats-server; the first run makes a
# virtualenv (the Python client from clients/python, nats-py) and a node project (the
# TypeScript client packed from clients/typescript, nats) under target/bench, and makes
# them again when the clients' sources change.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
FSYNC=${FSYNC:-always}
COUNT=${COUNT:-20000}
WARMUP=${WARMUP:-2000}
CONCURRENCY=${CONCURRENCY:-16}
PAYLOAD=${PAYLOAD:-128}
case "$FSYNC" in always|batch) ;; *) echo "FSYNC must be always or batch, not $FSYNC" >&2; exit 1 ;; esac
OUT=target/bench
VENV="$PWD/$OUT/clients-venv"
NODE_DIR="$PWD/$OUT/clients-node"
RESULTS="$OUT/clients-$FSYNC.jsonl"
mkdir -p "$OUT"
: > "$RESULTS"

for tool in nats-server node npm python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
if [ -z "${EVENTBUS_BIN:-}" ]; then
  cargo build --release --quiet -p eventbus-server
  EVENTBUS_BIN="${CARGO_TARGET_DIR:-target}/release/eventbusd"
fi
EVENTBUS_BIN=$(realpath "$EVENTBUS_BIN")

# shellcheck source=bench/lib.sh
source bench/lib.sh

# A digest of the files under the given paths (what an install was made from).
digest() { find "$@" -type f \( -name '*.py' -o -name '*.ts' -o -name '*.mjs' -o -name '*.json' -o -name '*.toml' -o -name '*.proto' \) \
  -not -path '*/node_modules/*' -not -path '*/dist/*' -not -path '*/gen/*' -not -path '*/__pycache__/*' -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16; }

# The virtualenv: socle_eventbus from clients/python (its build compiles proto/), nats-py.
stamp=$(digest clients/python/src clients/python/setup.py clients/python/pyproject.toml proto)
if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$stamp" ]; then
  echo "installing the Python clients into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check ./clients/python nats-py
  echo "$stamp" > "$VENV/.installed"
fi

# The node project: @socle/eventbus packed from clients/typescript (npm pack builds it), nats.
stamp=$(digest clients/typescript/src clients/typescript/scripts clients/typescript/package.json \
  clients/typescript/package-lock.json proto)
if [ "$(cat "$NODE_DIR/.installed" 2>/dev/null)" != "$stamp" ]; then
  echo "installing the Node clients into $NODE_DIR" >&2
  rm -rf "$NODE_DIR"; mkdir -p "$NODE_DIR"
  (cd clients/typescript && npm ci --silent --no-audit --no-fund \
    && npm pack --silent --pack-destination "$NODE_DIR" >/dev/null)
  tarball=$(find "$NODE_DIR" -maxdepth 1 -name 'socle-eventbus-*.tgz' | head -n 1)
  [ -n "$tarball" ] || { echo "npm pack made no socle-eventbus tarball in $NODE_DIR" >&2; exit 1; }
  echo '{"name": "eventbus-client-bench", "private": true, "type": "module"}' > "$NODE_DIR/package.json"
  (cd "$NODE_DIR" && npm install --silent --no-audit --no-fund "./$(basename "$tarball")" 'nats@^2')
  echo "$stamp" > "$NODE_DIR/.installed"
fi
# Imports resolve from the script's own folder: run it from inside the project.
cp bench/clients/publish.mjs "$NODE_DIR/publish.mjs"

trap stop_started EXIT
start_jetstream clients
EB_PORT=$(free_port)
# An empty directory for the daemon: no ./config/default.yaml of this checkout.
dir="$PWD/$OUT/clients-eventbus"
rm -rf "$dir"; mkdir -p "$dir"
(cd "$dir" && exec env EVENTBUS__DURABLE__DATA_DIR="$dir/data" EVENTBUS__DURABLE__FSYNC="$FSYNC" "$EVENTBUS_BIN" \
  --grpc-addr "127.0.0.1:$EB_PORT" --http-addr "127.0.0.1:$(free_port)" --log-level warn \
  >"$dir.log" 2>&1) & PIDS+=($!)
# The subshell execs the daemon: $! is its pid.
EB_PID=$!
wait_port "$NATS_PORT"
wait_port "$EB_PORT"

MODES=(shared unary jetstream)
for round in $(seq "$ROUNDS"); do
  for lang in python node; do
    # Each round starts with the next mode, so none always runs first.
    for i in 0 1 2; do
      mode=${MODES[$(( (i + round - 1) % 3 ))]}
      if [ "$mode" = jetstream ]; then target="nats://127.0.0.1:$NATS_PORT"; pid=$NATS_PID
      else target="http://127.0.0.1:$EB_PORT"; pid=$EB_PID; fi
      echo "round $round/$ROUNDS: $lang $mode (fsync $FSYNC)" >&2
      args=("$target" "$mode" "$COUNT" "$CONCURRENCY" "$PAYLOAD" --server-pid "$pid" --warmup "$WARMUP")
      if [ "$lang" = python ]; then
        "$VENV/bin/python" bench/clients/publish.py "${args[@]}"
      else
        node "$NODE_DIR/publish.mjs" "${args[@]}"
      fi | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['fsync']='$FSYNC'; print(json.dumps(r))" >>"$RESULTS"
    done
  done
done

echo "eventbusd $EVENTBUS_BIN, durable.fsync $FSYNC; nats-server $(nats-server --version | awk '{print $2}') (JetStream, file storage)"
python3 bench/clients_summary.py "$RESULTS"
