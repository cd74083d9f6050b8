#!/usr/bin/env bash
# TypeScript client tests: `npm ci` (from package-lock.json), `npm run build` (which
# generates the code from proto/ with buf and ts-proto, then compiles ESM and CJS), then
# `npm test`: Node's test runner against real eventbusd processes.
# Needs the daemon and the test OTLP receiver built first:
#   cargo build -p eventbus-server -p eventbus-testkit --bin eventbusd --bin otlp-receiver
# (or EVENTBUS_BIN=/path/to/eventbusd, EVENTBUS_OTLP_RECEIVER=/path/to/otlp-receiver),
# Node.js 20 or newer with npm, and openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export EVENTBUS_BIN="${EVENTBUS_BIN:-$repo/target/debug/eventbusd}"

fail() { echo "run-tests.sh: $*" >&2; exit 1; }
command -v node >/dev/null 2>&1 || fail "node not found: install Node.js 20 or newer (with npm)"
command -v npm >/dev/null 2>&1 || fail "npm not found: install npm (Node.js 20 or newer)"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 20 ] || fail "Node.js $(node --version) is too old: 20 or newer is needed"
command -v openssl >/dev/null 2>&1 || fail "openssl not found (the TLS tests make their certificates with it)"
[ -x "$EVENTBUS_BIN" ] || fail "$EVENTBUS_BIN missing: cargo build -p eventbus-server --bin eventbusd"

cd "$here"
echo "== npm ci (node $(node --version), npm $(npm --version))"
npm ci --no-audit --no-fund
echo "== npm run build"
npm run build
echo "== npm test"
npm test
