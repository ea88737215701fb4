#!/usr/bin/env bash
# A SMART Backend Services client assertion (RFC 7523 JWT), signed with openssl alone; prints it on stdout.
#   jwt-assertion.sh RS384|ES384 PRIVATE-KEY.pem CLIENT_ID AUD [EXP_SECONDS_AHEAD (240)] [JTI (random)]
# AUD is the token endpoint as the client calls it, e.g. https://127.0.0.1:PORT/auth/token. Keys:
#   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.key            (RS384)
#   openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out ec.key           (ES384)
#   openssl pkey -in KEY -pubout -out KEY.pub        (the PUBLIC KEY PEM for serve --smart-client ID=KEY.pub)
set -euo pipefail
alg=$1 key=$2 client=$3 aud=$4 ahead=${5:-240} jti=${6:-$(openssl rand -hex 16)}
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
header=$(printf '{"alg":"%s","typ":"JWT","kid":"test-key-1"}' "$alg" | b64url)
claims=$(printf '{"iss":"%s","sub":"%s","aud":"%s","exp":%d,"jti":"%s"}' \
  "$client" "$client" "$aud" $(( $(date +%s) + ahead )) "$jti" | b64url)
case "$alg" in
  RS384) sig=$(printf '%s.%s' "$header" "$claims" | openssl dgst -sha384 -sign "$key" -binary | b64url) ;;
  # openssl's ECDSA signature is DER (a SEQUENCE of r and s); JWS wants r||s, each left-padded to 48 bytes.
  ES384) sig=$(printf '%s.%s' "$header" "$claims" | openssl dgst -sha384 -sign "$key" -binary \
           | openssl asn1parse -inform DER | sed -n 's/.*INTEGER *://p' \
           | while read -r n; do printf '%096s' "$n" | tr ' ' 0; done | xxd -r -p | b64url) ;;
  *) echo "jwt-assertion.sh: alg RS384 or ES384" >&2; exit 2 ;;
esac
printf '%s.%s.%s\n' "$header" "$claims" "$sig"
