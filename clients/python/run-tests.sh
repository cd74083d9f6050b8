#!/usr/bin/env bash
# Python client tests: a fresh virtualenv, `pip install ./clients/python[test]` (which
# generates the stubs from proto/), then pytest against a real eventbusd.
# Needs the daemon and the test OTLP receiver built first:
#   cargo build -p eventbus-server -p eventbus-testkit --bin eventbusd --bin otlp-receiver
# (or EVENTBUS_BIN=/path/to/eventbusd, EVENTBUS_OTLP_RECEIVER=/path/to/otlp-receiver).
# Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${EVENTBUS_PY_VENV:-$repo/target/py-venv}"
export EVENTBUS_BIN="${EVENTBUS_BIN:-$repo/target/debug/eventbusd}"

if [ ! -x "$EVENTBUS_BIN" ]; then
  echo "run-tests.sh: $EVENTBUS_BIN missing: cargo build -p eventbus-server --bin eventbusd" >&2
  exit 1
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi

rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# From the repository root so the relative path in setup.py (../../proto) resolves in-tree.
(cd "$repo" && "$venv/bin/python" -m pip install -q "./clients/python[test]")
# Run from the tests directory against the installed package (not src/, which has no stubs).
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" tests
