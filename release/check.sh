#!/usr/bin/env bash
# Installs and runs each artifact release/build.sh made, as a user would, away from the
# checkout: the checksums hold; the binaries from the tarball answer --version, and the
# daemon serves the CLI; the Python wheel (and a wheel built from the sdist) installs in a
# fresh virtualenv and runs the client README's publish example; the npm tarball installs
# in a fresh Node project and runs the same example as plain JavaScript (.mjs); each
# crate holds its manifest and the sources its build reads.
#
#   bash release/check.sh            # after bash release/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

DIST=$(cd "${DIST:-target/dist}" && pwd)
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
WORK=$(mktemp -d)
DAEMON=""
cleanup() {
  [ -z "$DAEMON" ] || kill "$DAEMON" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "release/check.sh: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The first fenced block of the given language in a Markdown file.
first_block() { awk -v lang="$2" '$0 == "```" lang { inside = 1; next } inside && /^```/ { exit } inside' "$1"; }
expect_published() {
  grep -Eq '^published [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' "$1" \
    || fail "$2 did not print 'published <event id>': $(cat "$1")"
}

echo "== checksums"
(cd "$DIST" && sha256sum --quiet -c SHA256SUMS)

echo "== binaries"
tar -C "$WORK" -xzf "$DIST/eventbus-$VERSION-x86_64-unknown-linux-gnu.tar.gz"
BIN="$WORK/eventbus-$VERSION-x86_64-unknown-linux-gnu"
for bin in eventbusd eventbus; do
  out=$("$BIN/$bin" --version)
  [ "$out" = "$bin $VERSION" ] || fail "$bin --version printed '$out', not '$bin $VERSION'"
  echo "$out"
done
GRPC=$(free_port)
HTTP=$(free_port)
mkdir -p "$WORK/run"
(cd "$WORK/run" && EVENTBUS__SERVER__GRPC_ADDR="127.0.0.1:$GRPC" EVENTBUS__SERVER__HTTP_ADDR="127.0.0.1:$HTTP" exec "$BIN/eventbusd" --config "$BIN/config.yaml" --data-dir "$WORK/run/data" \
  >"$WORK/eventbusd.log" 2>&1) &
DAEMON=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$HTTP/readyz" >/dev/null 2>&1 && break
  kill -0 "$DAEMON" 2>/dev/null || fail "eventbusd exited: $(cat "$WORK/eventbusd.log")"
  sleep 0.1
done
curl -fs "http://127.0.0.1:$HTTP/readyz" >/dev/null || fail "eventbusd not ready after 10 s: $(cat "$WORK/eventbusd.log")"
URL="http://127.0.0.1:$GRPC"
"$BIN/eventbus" --server "$URL" publish orders.created '{"id":1}' >"$WORK/cli.out"
grep -q . "$WORK/cli.out" || fail "eventbus publish printed nothing"
echo "eventbus publish: $(cat "$WORK/cli.out")"

echo "== Python: the wheel, and a wheel built from the sdist, in a fresh virtualenv"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet "$DIST/socle_eventbus-$VERSION-py3-none-any.whl"
first_block clients/python/README.md python >"$WORK/publish.py"
(cd "$WORK" && EVENTBUS_URL="$URL" venv/bin/python publish.py >"$WORK/py.out")
expect_published "$WORK/py.out" "the Python README example"
echo "python: $(cat "$WORK/py.out")"
"$WORK/venv/bin/pip" wheel --quiet --no-deps -w "$WORK/from-sdist" "$DIST/socle_eventbus-$VERSION.tar.gz"
ls "$WORK/from-sdist"/socle_eventbus-"$VERSION"-*.whl >/dev/null || fail "the sdist built no wheel"

echo "== TypeScript: the npm tarball in a fresh Node project, the example as plain JavaScript"
mkdir -p "$WORK/node"
(cd "$WORK/node" && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error "$DIST/socle-eventbus-$VERSION.tgz" >/dev/null)
first_block clients/typescript/README.md ts >"$WORK/node/publish.mjs"
(cd "$WORK/node" && EVENTBUS_URL="$URL" node publish.mjs >"$WORK/node.out")
expect_published "$WORK/node.out" "the TypeScript README example"
echo "node: $(cat "$WORK/node.out")"

echo "== Rust crates"
# Each crate holds its manifest and every file its sources name in include_str!/include_bytes!
# (resolved from the including file, as rustc does): a path out of the crate would not be.
python3 - "$DIST/crates" "$VERSION" <<'PY'
import os, pathlib, re, sys, tarfile
dist, version = pathlib.Path(sys.argv[1]), sys.argv[2]
include = re.compile(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)')
problems = []
for crate in sorted(dist.glob("*.crate")):
    root = crate.name[: -len(".crate")]
    names = set(tarfile.open(crate).getnames())
    if f"{root}/Cargo.toml" not in names:
        problems.append(f"{crate.name}: no Cargo.toml")
    source_dir = pathlib.Path("crates") / root[: -len(version) - 1]
    for source in source_dir.rglob("*.rs"):
        for rel in include.findall(source.read_text()):
            packaged = f"{root}/" + os.path.relpath(os.path.normpath(source.parent / rel), source_dir)
            if packaged not in names:
                problems.append(f"{crate.name}: lacks {packaged}, which {source} includes")
    print(f"{crate.name}: {len(names)} files")
if problems:
    sys.exit("release/check.sh: " + "; ".join(problems))
PY

echo "release artifacts install and run"
