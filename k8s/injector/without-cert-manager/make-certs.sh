#!/usr/bin/env bash
# Makes the injector's TLS material without cert-manager, with openssl: a CA
# (ca.crt, ca.key; kept when OUTDIR already has them, so a renewal needs no change to
# the webhook's caBundle) and a serving certificate for the Service's DNS names signed
# by it (tls.crt, tls.key), valid for DAYS (default 365). Renew before it expires:
# run it again on the same OUTDIR and replace the Secret's data; the injector reloads
# the mounted files by itself.
#   usage: make-certs.sh OUTDIR [NAMESPACE] [DAYS]
set -euo pipefail
out=${1:?usage: make-certs.sh OUTDIR [NAMESPACE] [DAYS]}
ns=${2:-idemgate-system}
days=${3:-365}
svc="idemgate-injector.$ns.svc"
mkdir -p "$out"
cd "$out"
if [ ! -s ca.key ] || [ ! -s ca.crt ]; then
  # The CA lives ten years: it is what the webhook's caBundle trusts.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=idemgate-injector CA" -keyout ca.key -out ca.crt 2>/dev/null
fi
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=$svc" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' "$svc" "$svc" >tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
  -sha256 -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext ca.srl
echo "wrote $out/ca.crt, $out/tls.crt, $out/tls.key for $svc (valid $days days)"
