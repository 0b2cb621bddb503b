#!/bin/sh
# A throwaway PKI for trying TLS and mTLS (docs/server.md, "TLS and mTLS"):
#   DIR/ca.pem, ca.key          a CA ("Kiln Dev CA")
#   DIR/kilnd.pem, kilnd.key    kilnd's certificate, SAN localhost and 127.0.0.1
#   DIR/carol.pem, carol.key    a client certificate, SAN carol.clients.kiln,
#                               subject CN=carol,O=Kiln (tenant carol in
#                               configs/multi-tenant.textproto)
#   DIR/crl/                    an empty CRL of the CA, hashed (`openssl rehash`)
# Never use these keys for anything real.
#
#   scripts/make-dev-certs.sh certs
set -eu
dir=${1:?usage: make-dev-certs.sh DIR}
mkdir -p "$dir/crl"
cd "$dir"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.pem -days 365 -subj "/O=Kiln Dev/CN=Kiln Dev CA" 2>/dev/null
sign() {  # name subject extensions
  printf '%b\n' "$3" > "$1.ext"
  openssl req -new $ec -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 -sha256 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign kilnd "/O=Kiln/CN=kilnd" "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth"
sign carol "/O=Kiln/CN=carol" "subjectAltName=DNS:carol.clients.kiln\nextendedKeyUsage=clientAuth"
printf '[ca]\ndefault_ca = dev\n[dev]\ndatabase = ca.index\ncrlnumber = ca.crlnumber\ncertificate = ca.pem\nprivate_key = ca.key\ndefault_md = sha256\ndefault_crl_days = 365\n' > ca.cnf
: > ca.index
echo 1000 > ca.crlnumber
openssl ca -config ca.cnf -gencrl -out crl/ca.crl 2>/dev/null
openssl rehash crl
chmod 600 ./*.key
echo "made $(pwd): ca.pem kilnd.pem/.key carol.pem/.key crl/"
