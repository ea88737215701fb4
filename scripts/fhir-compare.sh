#!/usr/bin/env bash
# toFhir beside another converter (issue 28): LinuxForHealth's HL7 v2 -> FHIR R4 converter
# (io.github.linuxforhealth:hl7v2-fhir-converter 1.0.19, Java, from Maven Central), one thread, on the messages of
# our own bench (services/fhir/benches/convert.rs) and a few corpus messages. Not part of `make test`.
#
#   scripts/fhir-compare.sh [FILE...]      # FILEs replace the default corpus messages
#
# Messages: services/fhir/tests/data/adt_a01.hl7; the bench's 1-order, 20-OBX ORU_R01 (built in code there, written
# here byte for byte by oru_20_obx below, 2,129 bytes); and FHIR_COMPARE_CORPUS (names in TESTDATA_HL7, default
# ../shared/testdata/hl7; read from there, never copied into the repo).
# Settings: FHIR_COMPARE_BUNDLE (transaction), FHIR_COMPARE_WARMUP_SECONDS (10) and FHIR_COMPARE_WARMUP_MIN (2000)
# over all messages in turn, FHIR_COMPARE_ROUNDS (5) rounds of FHIR_COMPARE_ROUND_MS (1000) per message,
# FHIR_COMPARE_JAVA_OPTS (-Xms1g -Xmx1g). Output: one line per message (wall µs per conversion: mean, median and
# best round; the JVM's CPU µs per conversion, all threads; bytes in and out; resources by type) and each
# message's Bundle in target/fhir-compare/NAME.json.
set -euo pipefail
cd "$(dirname "$0")/.."
testdata=${TESTDATA_HL7:-../shared/testdata/hl7}
corpus=(${FHIR_COMPARE_CORPUS:-oie__TestADT__m02.hl7 rth__adt-a01-full.hl7 lfh__ORU-multiline-short.hl7
  msfc__LRI_2.0-NG_CBC_Typ_Message.hl7 msfc__VXU.hl7})
out=target/fhir-compare
mkdir -p "$out/in"

# The bench's oru_20_obx(): MSH, PID, PV1, ORC, OBR and OBX 1..20, each segment ended by CR.
oru_20_obx() {
  printf '%s\r' \
    'MSH|^~\&|LAB|HOSP|EHR|HOSP|20240102030405+0100||ORU^R01^ORU_R01|C20|P|2.5.1' \
    'PID|1||12345^^^HOSP^MR||DOE^JANE||19800214|F' \
    'PV1|1|O|LAB^^^HOSP||||1234^SMITH^ANNA' \
    'ORC|RE|P1^EHR|F1^LAB' \
    'OBR|1|P1^EHR|F1^LAB|24323-8^Comprehensive metabolic panel^LN|||20240102020000+0100|||||||||1234^SMITH^ANNA||||||20240102030000+0100|||F'
  for i in $(seq 1 20); do
    printf 'OBX|%d|NM|%d-%d^Analyte %d^LN||%d.%d|mmol/L^mmol/L^UCUM|3.5-5.0|N|||F|||20240102020000+0100\r' \
      "$i" $((2000 + i)) $((i % 10)) "$i" "$i" $((i % 7))
  done
}
oru_20_obx >"$out/in/oru_r01_20obx.hl7"
size=$(wc -c <"$out/in/oru_r01_20obx.hl7")
if [[ $size -ne 2129 ]]; then
  echo "fhir-compare: the 20-OBX ORU_R01 is $size bytes, the bench's is 2129: convert.rs changed?" >&2
  exit 1
fi

files=(services/fhir/tests/data/adt_a01.hl7 "$out/in/oru_r01_20obx.hl7")
if [[ $# -gt 0 ]]; then
  files+=("$@")
else
  for name in "${corpus[@]}"; do
    if [[ -f $testdata/$name ]]; then files+=("$testdata/$name"); else echo "fhir-compare: no $testdata/$name" >&2; fi
  done
fi

(cd loadtest/fhir-compare && mvn -q -B --no-transfer-progress package) >&2
# shellcheck disable=SC2086 # FHIR_COMPARE_JAVA_OPTS is a list of flags
java ${FHIR_COMPARE_JAVA_OPTS:--Xms1g -Xmx1g} -cp 'loadtest/fhir-compare/target/classes:loadtest/fhir-compare/target/libs/*' \
  hl7gw.fhircompare.Main \
  --bundle "${FHIR_COMPARE_BUNDLE:-transaction}" \
  --warmup-seconds "${FHIR_COMPARE_WARMUP_SECONDS:-10}" --warmup-min "${FHIR_COMPARE_WARMUP_MIN:-2000}" \
  --rounds "${FHIR_COMPARE_ROUNDS:-5}" --round-ms "${FHIR_COMPARE_ROUND_MS:-1000}" \
  "$out" "${files[@]}"
