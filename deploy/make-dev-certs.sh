#!/usr/bin/env bash
# FOR DEVELOPMENT ONLY. Makes throwaway TLS and auth material for docker-compose.yml and
# a test cluster: a private CA, a server certificate, a client certificate (mTLS) and a
# principals file with one admin token. Never use these in production: the CA key sits
# beside the certificates, the server key is world-readable (so that the container's
# unprivileged user can read the bind mount), and nothing here rotates.
#
#   deploy/make-dev-certs.sh [OUT_DIR]        (default: deploy/dev-secrets, gitignored)
#
# Environment:
#   NAMESPACE=default   Kubernetes namespace in the server certificate's service names
#   DAYS=365            validity of the certificates
#   FORCE=1             overwrite an existing OUT_DIR
#
# Writes:
#   ca.crt ca.key               the dev CA (trust ca.crt in clients: eventbus --tls-ca)
#   server.crt server.key       eventbusd's certificate (server.tls.cert_file, key_file)
#   client.crt client.key       a client certificate, CN=admin (eventbus --tls-cert/--tls-key)
#   principals.yaml             auth.principals_file: principal "admin", every right, by
#                               token or by the client certificate
#   admin.token                 the admin token in plain text (eventbus --token)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/dev-secrets}"
namespace="${NAMESPACE:-default}"
days="${DAYS:-365}"

command -v openssl >/dev/null || { echo "make-dev-certs: openssl is required" >&2; exit 1; }
if [[ -e "$out/principals.yaml" && "${FORCE:-}" != 1 ]]; then
  echo "make-dev-certs: $out already holds secrets; FORCE=1 to replace them" >&2
  exit 1
fi
mkdir -p "$out"
# The containers run as uid 10001: the directory must be traversable by it.
chmod 755 "$out"
umask 077
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Server names: loopback, the Compose services, and the Kubernetes Service
# (deploy/k8s/service.yaml, "eventbusd") in every form a pod may dial.
sans="DNS:localhost,IP:127.0.0.1,IP:::1,DNS:eventbus,DNS:eventbusd,DNS:eventbusd-1,DNS:eventbusd-2"
sans+=",DNS:eventbusd.$namespace,DNS:eventbusd.$namespace.svc,DNS:eventbusd.$namespace.svc.cluster.local"

echo "== dev CA"
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -days "$days" \
  -subj "/O=Socle EventBus dev/CN=Socle EventBus dev CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null

# leaf NAME CN EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
leaf() {
  local name="$1" cn="$2" eku="$3" san="${4:-}"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$eku"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$work/$name.ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/O=Socle EventBus dev/CN=$cn" \
    -keyout "$work/$name.key" -out "$work/$name.csr" 2>/dev/null
  # PKCS#8 PEM: what eventbusd and the CLI read.
  openssl pkcs8 -topk8 -nocrypt -in "$work/$name.key" -out "$out/$name.key"
  openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$work/$name.ext" -out "$out/$name.crt" 2>/dev/null
}

echo "== server certificate ($sans)"
leaf server eventbusd serverAuth "$sans"
echo "== client certificate (CN=admin)"
leaf client admin clientAuth "DNS:admin"
rm -f "$out/ca.srl"

echo "== admin token"
# `eventbus auth new-token` when the CLI is built or installed; openssl otherwise (the
# same shape: ebt_ and 256 random bits in hex; the file keeps only the SHA-256).
cli=""
for candidate in "$here/../target/release/eventbus" "$here/../target/debug/eventbus" "$(command -v eventbus || true)"; do
  if [[ -n "$candidate" && -x "$candidate" ]]; then cli="$candidate"; break; fi
done
if [[ -n "$cli" ]]; then
  token="$("$cli" auth new-token admin | sed -n 1p)"
else
  token="ebt_$(openssl rand -hex 32)"
fi
sha256="$(printf %s "$token" | openssl dgst -sha256 -r | cut -d' ' -f1)"
printf '%s\n' "$token" >"$out/admin.token"

cat >"$out/principals.yaml" <<EOF
# auth.principals_file, made by deploy/make-dev-certs.sh FOR DEVELOPMENT ONLY.
# "admin" gets in with the token in admin.token or with client.crt (mTLS).
# Add principals with \`eventbus auth new-token NAME\`; eventbusd re-reads this on SIGHUP.
principals:
  - name: admin
    token_sha256: $sha256
    cert_subject: admin
    permissions:
      publish:   { allow: [">"], deny: [] }
      subscribe: { allow: [">"], deny: [] }
      consumers: { allow: ["*"] }
      manage_consumers: ["*"]
      admin: true
EOF

# eventbusd (uid 10001 in the image) reads these through a bind mount: dev only.
chmod 644 "$out/ca.crt" "$out/server.crt" "$out/server.key" "$out/client.crt" "$out/principals.yaml"
# Never needed by the server: the CA key, the client key and the plain token stay private.
chmod 600 "$out/ca.key" "$out/client.key" "$out/admin.token"

echo
echo "Wrote $out (development only; never commit it). Next:"
echo "  docker compose up --build"
echo "  eventbus --server https://localhost:50051 --tls-ca $out/ca.crt --token \"\$(cat $out/admin.token)\" stats"
