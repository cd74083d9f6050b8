#!/usr/bin/env bash
# Builds what a user downloads, into target/dist (or $DIST):
#   eventbus-VERSION-x86_64-unknown-linux-gnu.tar.gz   eventbusd and eventbus, stripped release
#                                                      builds, with LICENSE, README.md and the
#                                                      default configuration
#   socle_eventbus-VERSION-py3-none-any.whl, socle_eventbus-VERSION.tar.gz   the Python client
#   socle-eventbus-VERSION.tgz                          the TypeScript client (npm pack)
#   crates/*.crate                                      the Rust crates (cargo package)
#   eventbus-image-VERSION.tar                          the container image (deploy/Dockerfile),
#                                                       only where a container engine answers
#   SHA256SUMS                                          over all of the above
# then lists them with their sizes. release/check.sh installs and runs each one.
#
#   bash release/build.sh
#   IMAGE=0 bash release/build.sh       # no container image even where an engine answers
#   VERIFY=1 bash release/build.sh      # cargo package also builds each packaged crate (slow)
set -euo pipefail
cd "$(dirname "$0")/.."

DIST=${DIST:-target/dist}
IMAGE=${IMAGE:-1}
VERIFY=${VERIFY:-0}
TRIPLE=x86_64-unknown-linux-gnu
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$VERSION" ] || { echo "release/build.sh: no [workspace.package] version in Cargo.toml" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "release/build.sh: builds $TRIPLE binaries on x86_64 only (this is $(uname -m))" >&2; exit 1; }

rm -rf "$DIST"
mkdir -p "$DIST/crates"
DIST=$(cd "$DIST" && pwd)

echo "== binaries: eventbusd and eventbus, release, stripped"
cargo build --release --locked -p eventbus-server --bin eventbusd -p eventbus-cli --bin eventbus --features eventbus-cli/jemalloc
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BUNDLE="eventbus-$VERSION-$TRIPLE"
STAGE="$DIST/$BUNDLE"
mkdir -p "$STAGE"
for bin in eventbusd eventbus; do
  strip -o "$STAGE/$bin" "$TARGET_DIR/release/$bin"
done
cp LICENSE README.md "$STAGE/"
cp config/default.yaml "$STAGE/config.yaml"
tar -C "$DIST" -czf "$DIST/$BUNDLE.tar.gz" "$BUNDLE"
rm -rf "$STAGE"

echo "== Python client: wheel and sdist"
VENV="$TARGET_DIR/release-venv"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip build
fi
"$VENV/bin/python" -m build --outdir "$DIST" clients/python >"$TARGET_DIR/release-python.log" 2>&1 \
  || { cat "$TARGET_DIR/release-python.log" >&2; exit 1; }

echo "== TypeScript client: npm pack"
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm pack --silent --pack-destination "$DIST" >/dev/null)

echo "== Rust crates: cargo package"
package_args=(--workspace --exclude peers --exclude eventbus-testkit --exclude eventbus-faults --locked)
[ "$VERIFY" = 1 ] || package_args+=(--no-verify)
cargo package "${package_args[@]}" --quiet
cp "$TARGET_DIR"/package/*.crate "$DIST/crates/"

echo "== container image (deploy/Dockerfile)"
engine=""
for candidate in docker podman; do
  if command -v "$candidate" >/dev/null 2>&1 && timeout 10 "$candidate" info >/dev/null 2>&1; then
    engine=$candidate
    break
  fi
done
if [ "$IMAGE" != 1 ]; then
  echo "skipped (IMAGE=$IMAGE)"
elif [ -z "$engine" ]; then
  echo "skipped: no container engine answers here (docker or podman); build it where one does:"
  echo "  docker build -f deploy/Dockerfile -t socle/eventbus:$VERSION ."
else
  "$engine" build --quiet -f deploy/Dockerfile -t "socle/eventbus:$VERSION" .
  "$engine" save -o "$DIST/eventbus-image-$VERSION.tar" "socle/eventbus:$VERSION"
fi

(cd "$DIST" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | xargs sha256sum > SHA256SUMS)

echo "== $DIST"
(cd "$DIST" && find . -type f | sed 's|^\./||' | sort | xargs ls -l | awk '{ printf "%10d  %s\n", $5, $9 }')
