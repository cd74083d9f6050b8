#!/usr/bin/env bash
# The web console's browser tests: pytest + Selenium driving Debian's headless chromium
# (packages chromium and chromium-driver, which this does not install) against the
# eventbusd and eventbus just built (cargo build; or EVENTBUS_BIN / EVENTBUS_CLI).
# The virtualenv is target/ui-tests-venv (rebuilt when requirements.txt changes);
# screenshots go to target/ui-screenshots/<page>.png. Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${EVENTBUS_UI_VENV:-$repo/target/ui-tests-venv}"
export EVENTBUS_BIN="${EVENTBUS_BIN:-$repo/target/debug/eventbusd}"
export EVENTBUS_CLI="${EVENTBUS_CLI:-$repo/target/debug/eventbus}"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
export UI_SCREENSHOTS="${UI_SCREENSHOTS:-$repo/target/ui-screenshots}"
# Both paths are given: Selenium Manager must not look for (or download) anything.
export SE_OFFLINE=true
# Nothing written next to the tests.
export PYTHONDONTWRITEBYTECODE=1

missing=0
for bin in "$EVENTBUS_BIN" "$EVENTBUS_CLI"; do
  if [ ! -x "$bin" ]; then
    echo "ui-tests/run.sh: $bin missing: cargo build -p eventbus-server --bin eventbusd -p eventbus-cli --bin eventbus" >&2
    missing=1
  fi
done
for bin in "$CHROMIUM" "$CHROMEDRIVER"; do
  if [ ! -x "$bin" ]; then
    echo "ui-tests/run.sh: $bin missing: apt-get install -y chromium chromium-driver" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
echo "ui-tests: $("$CHROMIUM" --version 2>/dev/null | head -1), $("$CHROMEDRIVER" --version | head -1)"

if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
stamp="$venv/.requirements"
if ! cmp -s "$here/requirements.txt" "$stamp"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$stamp"
fi

rm -rf "$UI_SCREENSHOTS"
mkdir -p "$UI_SCREENSHOTS"
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test_console.py
