# Shared by the bench scripts (sourced from the repository root).

# A free loopback TCP port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits (10 s at most) until something listens on loopback port $1.
wait_port() {
  for _ in $(seq 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2; exit 1
}

# Joins the redis-server nodes $2... into a cluster with one replica per master (the
# redis-cli output to file $1), and waits (10 s at most) until every slot is served.
create_cluster() {
  local log=$1; shift
  redis-cli --cluster create "$@" --cluster-replicas 1 --cluster-yes >"$log"
  for _ in $(seq 100); do
    redis-cli -p "${1#*:}" cluster info | grep -q 'cluster_slots_ok:16384' && return 0
    sleep 0.1
  done
  echo "the cluster of $* does not serve every slot" >&2; exit 1
}

# Processes a script started (`cmd & PIDS+=($!)`), stopped on exit with
# `trap stop_started EXIT`.
PIDS=()
stop_started() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }

# Starts nats-server with JetStream on a fresh store, $OUT/$1-jetstream (log
# $OUT/$1-nats.log); sets NATS_PORT and NATS_PID.
start_jetstream() {
  NATS_PORT=$(free_port)
  rm -rf "$OUT/$1-jetstream"
  nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$OUT/$1-jetstream" >"$OUT/$1-nats.log" 2>&1 &
  NATS_PID=$!
  PIDS+=("$NATS_PID")
}
