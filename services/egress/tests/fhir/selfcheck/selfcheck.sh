#!/usr/bin/env bash
# By hand, after `mvn package` (README.md): the validator on a valid and an invalid resource, then a server on a
# free port: a transaction Bundle (Patient with ifNoneExist + Encounter by conditional PUT, referencing the
# Patient by urn:uuid) delivered twice and once changed leaves 1 Patient and 1 Encounter; an invalid resource
# is refused with 422; injected 503s with Retry-After; a failing Bundle changes nothing. Then a second server
# with HTTPS, mutual TLS, a static bearer token and SMART Backend Services (certificates and keys made with
# openssl, assertions signed by jwt-assertion.sh). Prints the timings.
#   selfcheck.sh [--bench N]   also validates N ADT-like Bundles in one JVM and delivers each twice.
# FHIR_HARNESS: the build directory (default: the repository's target/tmp/fhir-harness).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../../.." && pwd)"
out="${FHIR_HARNESS:-$root/target/tmp/fhir-harness}"
jar="$out/fhir-harness-1.jar"
[ -f "$jar" ] || { echo "selfcheck: no $jar (mvn -f $here/../pom.xml package)" >&2; exit 2; }
java_opts=(${JAVA_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx1g})
bench=0
[ "${1:-}" = "--bench" ] && bench="${2:-100}"
tmp="$(mktemp -d)"
server_pid=
server2_pid=
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  [ -z "$server2_pid" ] || kill "$server2_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
passed=0 failed=0
check() { # check NAME EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1: expected $2, got $3"; fi
}
ms() { date +%s%3N; }
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
# start_server VAR NAME ARGS...: `serve --port 0 ARGS` in the background (its PID in VAR, its output in $tmp/NAME.out
# and .err), back once it prints its listening line; exits when it dies first.
start_server() {
  local var=$1 name=$2
  shift 2
  java "${java_opts[@]}" -jar "$jar" serve --port 0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  printf -v "$var" '%s' "$!"
  for _ in $(seq 240); do
    grep -q '^fhir-server listening port=' "$tmp/$name.out" && break
    kill -0 "${!var}" 2>/dev/null || { cat "$tmp/$name.err" >&2; exit 1; }
    sleep 0.5
  done
}

# 1. validate, one JVM for both files (offline: when `unshare` can make a network namespace, it runs in one
#    with no network at all, so a lookup would fail instead of being quietly made).
net=()
unshare -rn true 2>/dev/null && net=(unshare -rn)
t0=$(ms)
"${net[@]}" java "${java_opts[@]}" -jar "$jar" validate "$here/valid-patient.json" "$here/invalid-patient.json" \
  "$here/observation-loinc.json" >"$tmp/validate.out"
t1=$(ms)
check "validate: valid-patient.json has no error" 0 "$(sed -n 1p "$tmp/validate.out" | field 'd["errors"]')"
check "validate: invalid-patient.json has errors" True "$(sed -n 2p "$tmp/validate.out" | field 'd["errors"] > 0')"
check "validate: LOINC, SNOMED, a local code system: warnings, no error" 0 \
  "$(sed -n 3p "$tmp/validate.out" | field 'd["errors"]')"
echo "     validate: $((t1 - t0)) ms for the JVM and 3 files ${net[*]:+(no network)}"

# 2. the server
t0=$(ms)
start_server server_pid serve
port=$(sed -n 's/^fhir-server listening port=//p' "$tmp/serve.out")
t1=$(ms)
echo "     serve: listening on $port after $((t1 - t0)) ms; $(tail -1 "$tmp/serve.err")"
base="http://127.0.0.1:$port/fhir"
admin="http://127.0.0.1:$port/admin"
post() { curl -s -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/fhir+json' "$@"; }

check "transaction, first delivery" 200 "$(post --data @"$here/transaction.json" "$base")"
check "  Patient created" "201 Created" "$(field 'd["entry"][0]["response"]["status"]' <"$tmp/body")"
check "transaction, second delivery" 200 "$(post --data @"$here/transaction.json" "$base")"
check "  Patient matched by ifNoneExist" "200 OK" "$(field 'd["entry"][0]["response"]["status"]' <"$tmp/body")"
python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); b["entry"][1]["resource"]["status"]="finished"; print(json.dumps(b))' \
  "$here/transaction.json" >"$tmp/changed.json"
check "transaction, third delivery, Encounter changed" 200 "$(post --data @"$tmp/changed.json" "$base")"
check "  Encounter updated in place (version 2)" 'W/"2"' "$(field 'd["entry"][1]["response"]["etag"]' <"$tmp/body")"
counts=$(curl -s "$admin/counts")
check "/admin/counts: 1 Patient" 1 "$(echo "$counts" | field 'd["Patient"]')"
check "/admin/counts: 1 Encounter" 1 "$(echo "$counts" | field 'd["Encounter"]')"
check "search by identifier finds the Patient" 1 "$(curl -s "$base/Patient?identifier=urn:oid:2.16.840.1.113883.19.5%7CMRN-SELF-1" | field 'd["total"]')"
check "the Encounter references it" "Patient/" "$(curl -s "$base/Encounter?identifier=urn:oid:2.16.840.1.113883.19.5.1%7CVISIT-SELF-1" | field 'd["entry"][0]["resource"]["subject"]["reference"][:8]')"
check "an invalid Patient is refused" 422 "$(post --data @"$here/invalid-patient.json" "$base/Patient")"
check "  with an OperationOutcome" OperationOutcome "$(field 'd["resourceType"]' <"$tmp/body")"
python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))
b["entry"].insert(0, {"request": {"method": "DELETE", "url": "Patient?identifier=urn:oid:2.16.840.1.113883.19.5|MRN-SELF-1"}})
b["entry"][2]["resource"]["subject"]["reference"] = "urn:uuid:00000000-0000-4000-8000-000000000000"
print(json.dumps(b))' "$here/transaction.json" >"$tmp/failing.json"
check "a Bundle with a failing entry is refused" 400 "$(post --data @"$tmp/failing.json" "$base")"
check "  and its delete is undone" 1 "$(curl -s "$admin/counts" | field 'd["Patient"]')"
curl -s -X POST "$admin/fail?status=503&count=2&retryAfter=1" >/dev/null
s1=$(curl -s -o /dev/null -w '%{http_code}/%header{retry-after}' "$base/Patient?_count=1")
s2=$(curl -s -o /dev/null -w '%{http_code}/%header{retry-after}' "$base/Patient?_count=1")
s3=$(curl -s -o /dev/null -w '%{http_code}' "$base/Patient?_count=1")
check "/admin/fail: 503 with Retry-After twice, then 200" "503/1 503/1 200" "$s1 $s2 $s3"
check "/admin/requests logs them" "503 503 200" "$(curl -s "$admin/requests" | field '" ".join(str(r["status"]) for r in d["requests"][-3:])')"

if [ "$bench" -gt 0 ]; then
  python3 "$here/adt-like-bundle.py" "$tmp/bench" "$bench"
  t0=$(ms)
  java "${java_opts[@]}" -jar "$jar" validate "$tmp/bench" >"$tmp/bench.out"
  t1=$(ms)
  check "bench: $bench ADT-like Bundles validate without error" 0 "$(python3 -c 'import json,sys; print(sum(json.loads(l)["errors"] for l in open(sys.argv[1])))' "$tmp/bench.out")"
  python3 -c 'import json,sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1])]
w = sum(json.loads(l)["warnings"] for l in open(sys.argv[1]))
print("     validate: %d Bundles in %d ms: first %.0f ms (loading the definitions), then %.0f ms per Bundle (last 10: %.0f), %d warnings"
      % (len(ms), int(sys.argv[2]), ms[0], sum(ms[1:]) / max(1, len(ms) - 1), sum(ms[-10:]) / min(10, len(ms)), w))' "$tmp/bench.out" "$((t1 - t0))"
  curl -s -X POST "$admin/reset" >/dev/null
  for round in 1 2; do
    t0=$(ms)
    bad=0
    for f in "$tmp"/bench/*.json; do
      [ "$(post --data @"$f" "$base")" = 200 ] || { bad=$((bad + 1)); cat "$tmp/body" >&2; }
    done
    t1=$(ms)
    check "bench: delivery $round of $bench Bundles, all 200" 0 "$bad"
    echo "     delivery $round: $(( (t1 - t0) / bench )) ms per Bundle (curl, one connection each, validation included)"
  done
  counts=$(curl -s "$admin/counts")
  check "bench: $bench Patients, $bench Encounters, $((5 * bench)) Observations, $bench Provenances after 2 deliveries" \
    "$bench $bench $((5 * bench)) $bench" \
    "$(echo "$counts" | field '"%d %d %d %d" % (d["Patient"], d["Encounter"], d["Observation"], d["Provenance"])')"
fi

# 3. HTTPS, mutual TLS, bearer tokens: a second server (one type, to start faster).
kill "$server_pid" 2>/dev/null || true
server_pid=
k="$tmp/keys"
mkdir -p "$k"
(
  cd "$k"
  ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2"; }
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 1 \
    -subj /CN=selfcheck-ca
  ec server localhost
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 1 \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost')
  ec client selfcheck-client
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 1 \
    -extfile <(printf 'extendedKeyUsage=clientAuth')
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.key
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out ec.key
  openssl pkey -in rsa.key -pubout -out rsa.pub
  openssl pkey -in ec.key -pubout -out ec.pub
  echo ' static-selfcheck-token ' >token.txt
) 2>/dev/null
t0=$(ms)
start_server server2_pid serve2 --types Patient --tls-cert "$k/server.pem" --tls-key "$k/server.key" \
  --client-ca "$k/ca.pem" --bearer-token-file "$k/token.txt" --smart-client "selfcheck=$k/rsa.pub" \
  --smart-client "selfcheck=$k/ec.pub" --token-ttl-seconds 3
t1=$(ms)
check "TLS: the listening line ends with scheme=https" https "$(sed -n 's/^fhir-server listening port=[0-9]* scheme=//p' "$tmp/serve2.out")"
port=$(sed -n 's/^fhir-server listening port=\([0-9]*\).*/\1/p' "$tmp/serve2.out")
echo "     serve (TLS, auth): listening on $port after $((t1 - t0)) ms"
origin="https://127.0.0.1:$port"
tls=(--cacert "$k/ca.pem" --cert "$k/client.pem" --key "$k/client.key")
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
check "mTLS: no client certificate, no exchange" 000 "$(code --cacert "$k/ca.pem" "$origin/fhir/metadata")"
check "mTLS: the failed handshake is counted" 1 "$(curl -s "${tls[@]}" "$origin/admin/auth" | field 'd["tlsHandshakeFailures"]')"
check "no token: 401 WWW-Authenticate Bearer, OperationOutcome login" "401 Bearer login" \
  "$(curl -s "${tls[@]}" -o "$tmp/body" -w '%{http_code} %header{www-authenticate}' "$origin/fhir/metadata" | cut -d' ' -f1,2) $(field 'd["issue"][0]["code"]' <"$tmp/body")"
check "static token (file trimmed), HTTP/2 by ALPN" "200 2" \
  "$(curl -s "${tls[@]}" -o /dev/null -w '%{http_code} %{http_version}' -H 'Authorization: Bearer static-selfcheck-token' "$origin/fhir/metadata")"
check "static token, HTTP/1.1" "200 1.1" \
  "$(curl -s --http1.1 "${tls[@]}" -o /dev/null -w '%{http_code} %{http_version}' -H 'Authorization: Bearer static-selfcheck-token' "$origin/fhir/metadata")"
check "smart-configuration names the token endpoint" "$origin/auth/token" \
  "$(curl -s "${tls[@]}" "$origin/fhir/.well-known/smart-configuration" | field 'd["token_endpoint"]')"
token() { # token ASSERTION -> status; body in $tmp/body
  code "${tls[@]}" "$origin/auth/token" -d grant_type=client_credentials -d scope=system/Patient.write \
    --data-urlencode client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer \
    --data-urlencode "client_assertion=$1"
}
jwt="$here/jwt-assertion.sh"
check "SMART: an RS384 assertion gets a token" 200 "$(token "$("$jwt" RS384 "$k/rsa.key" selfcheck "$origin/auth/token")")"
check "  expires_in from --token-ttl-seconds, scope echoed" "3 system/Patient.write" "$(field '"%d %s" % (d["expires_in"], d["scope"])' <"$tmp/body")"
a=$("$jwt" ES384 "$k/ec.key" selfcheck "$origin/auth/token")
check "SMART: an ES384 assertion gets a token" 200 "$(token "$a")"
t=$(field 'd["access_token"]' <"$tmp/body")
check "  which /fhir accepts" 200 "$(code "${tls[@]}" -H "Authorization: Bearer $t" "$origin/fhir/Patient")"
check "the same assertion again: 400 invalid_grant (replay)" "400 invalid_grant" "$(token "$a") $(field 'd["error"]' <"$tmp/body")"
check "aud not the endpoint: 400 invalid_grant" "400 invalid_grant" "$(token "$("$jwt" RS384 "$k/rsa.key" selfcheck "https://localhost:$port/auth/token")") $(field 'd["error"]' <"$tmp/body")"
check "exp 400 s ahead: 400 invalid_grant" "400 invalid_grant" "$(token "$("$jwt" RS384 "$k/rsa.key" selfcheck "$origin/auth/token" 400)") $(field 'd["error"]' <"$tmp/body")"
check "signed by another key: 401 invalid_client" "401 invalid_client" "$(token "$("$jwt" ES384 "$k/server.key" selfcheck "$origin/auth/token")") $(field 'd["error"]' <"$tmp/body")"
check "unknown client: 401 invalid_client" "401 invalid_client" "$(token "$("$jwt" RS384 "$k/rsa.key" someone "$origin/auth/token")") $(field 'd["error"]' <"$tmp/body")"
curl -s -X POST "${tls[@]}" "$origin/admin/revoke" >/dev/null
check "after POST /admin/revoke the token is refused" 401 "$(code "${tls[@]}" -H "Authorization: Bearer $t" "$origin/fhir/Patient")"
token "$("$jwt" RS384 "$k/rsa.key" selfcheck "$origin/auth/token")" >/dev/null
t=$(field 'd["access_token"]' <"$tmp/body")
sleep 3.2
check "a token past expires_in is refused" 401 "$(code "${tls[@]}" -H "Authorization: Bearer $t" "$origin/fhir/Patient")"
r='d["tokenRequestsRefusedBy"]'; u='d["fhirUnauthorizedBy"]'
check "/admin/auth: issued; refused client/grant/request/grant_type; 401 expired/revoked/missing/unknown; 200s; CN" \
  "3; 2 3 0 0; 1 1 1 0; 3; selfcheck-client" \
  "$(curl -s "${tls[@]}" "$origin/admin/auth" | field "'%d; %d %d %d %d; %d %d %d %d; %d; %s' % (d['tokensIssued'],
    $r['invalid_client'], $r['invalid_grant'], $r['invalid_request'], $r['unsupported_grant_type'],
    $u['expired'], $u['revoked'], $u['missing'], $u['unknown'], d['fhirAuthorized'], d['lastClientCertificateCn'])")"
echo "selfcheck: $passed passed, $failed failed"
[ "$failed" = 0 ]
