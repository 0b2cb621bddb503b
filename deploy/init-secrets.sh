#!/usr/bin/env bash
# First-start secrets for the compose deployment, written to DIR once (a later
# run finds DIR/kilnd.textproto and changes nothing):
#
#   DIR/ca.pem, ca.key          a private CA (keep ca.key off the servers in production)
#   DIR/server.pem, server.key  kilnd's certificate: DNS kilnd, kilnd-1, kilnd-2, kiln-lb,
#                               localhost; IP 127.0.0.1 (plus $KILN_SERVER_SANS)
#   DIR/client.pem, client.key  a client certificate of tenant "ops" (mTLS)
#   DIR/api-key                 an API key of tenant "ops" (only its SHA-256 is in the config)
#   DIR/kilnd.textproto         BASE_CONFIG plus TLS, the client CA and tenant "ops"
#
#   deploy/init-secrets.sh DIR [BASE_CONFIG]     (default: container.textproto beside it)
#
# docker-compose.yml runs it in the kiln-init service; by hand it makes the same
# files for a kilnd outside a container. Replace them with your own PKI in production.
set -euo pipefail

if (($# < 1 || $# > 2)); then
  echo "usage: $0 DIR [BASE_CONFIG]" >&2
  exit 2
fi
dir=$1
base=${2:-$(dirname "$0")/container.textproto}
if [[ -f $dir/kilnd.textproto ]]; then
  echo "init-secrets: $dir/kilnd.textproto exists; nothing to do"
  exit 0
fi
mkdir -p "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

sans="DNS:kilnd,DNS:kilnd-1,DNS:kilnd-2,DNS:kiln-lb,DNS:localhost,IP:127.0.0.1"
if [[ -n ${KILN_SERVER_SANS:-} ]]; then sans="$sans,$KILN_SERVER_SANS"; fi

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/O=Kiln/CN=Kiln deployment CA" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
leaf() {  # name subject extensions
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.csr" 2>/dev/null
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 825 -extfile <(printf '%s\n' "$3") -out "$tmp/$1.pem" 2>/dev/null
  rm "$tmp/$1.csr"
}
leaf server "/O=Kiln/CN=kilnd" \
  "subjectAltName=$sans
extendedKeyUsage=serverAuth"
leaf client "/O=Kiln/CN=ops" \
  "subjectAltName=URI:spiffe://kiln/tenant/ops
extendedKeyUsage=clientAuth"
openssl rand -hex 24 | tr -d '\n' >"$tmp/api-key"
digest=$(sha256sum <"$tmp/api-key" | cut -d' ' -f1)

{
  cat "$base"
  cat <<CONF

# --- written by deploy/init-secrets.sh ---
tls {
  cert_file: "$dir/server.pem"
  key_file: "$dir/server.key"
  client_ca_file: "$dir/ca.pem"   # mTLS: client certificates of this CA map to tenants
}
tenants {
  name: "ops"
  api_key_sha256: "$digest"       # the key is in $dir/api-key
  client_cert_san: "spiffe://kiln/tenant/ops"
  admin: true
}
CONF
} >"$tmp/kilnd.textproto"

rm -f "$tmp/ca.srl"
chmod 0644 "$tmp"/*.pem "$tmp/kilnd.textproto"
chmod 0600 "$tmp"/*.key "$tmp/api-key"
# kilnd.textproto last: its presence means the directory is complete.
mv "$tmp"/ca.* "$tmp"/server.* "$tmp"/client.* "$tmp/api-key" "$dir/"
mv "$tmp/kilnd.textproto" "$dir/kilnd.textproto"
echo "init-secrets: wrote $dir (tenant ops: API key in $dir/api-key, client certificate $dir/client.pem)"
