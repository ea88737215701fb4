// What both scripts share: the message, the scenarios and the thresholds, chosen with -e SCENARIO=...
//
//   smoke      2 VUs for SECONDS (3)                     (scripts/k6.sh smoke, in `make test`)
//   vus1       1 VU  x ITERATIONS (5000) messages
//   vus4       4 VUs x ITERATIONS messages each
//   vus8       8 VUs x ITERATIONS messages each
//   sustained  8 VUs for SECONDS (30)
//
// Thresholds: every answer is CA (`<proto>_accepted` rate == 1), no transport error, and the round trip's p99
// under P99_MS (default 100 ms; 1000 ms for smoke, which may run against a debug build on a busy machine).

// One id per process: with the VU number and the iteration it makes MSH-10 unique across runs, so the
// ingress's duplicate window (same MSH-3, MSH-4, MSH-10) never answers a k6 message with an earlier ACK.
const run = __ENV.RUN_ID || Date.now().toString(36);

// ADT^A01 in the shape of hl7gw-load's fixture (MSH, PID, PV1; ~300 bytes). MSH-15 AL and MSH-16 NE make it
// enhanced mode: the ingress answers CA once Kafka holds the message (durable mode). 20 patients per VU, so one
// VU's messages spread over partitions (the key is MSH-4 + PID-3.1) as hl7gw-load's do.
export function adtA01() {
  const id = `${run}-${__VU}-${__ITER}`;
  const pid = `K6${__VU}-${__ITER % 20}`;
  return {
    controlId: id,
    message:
      `MSH|^~\\&|K6LOAD|K6FAC|HL7GW|HL7GW|20260101120000||ADT^A01^ADT_A01|${id}|P|2.5|||AL|NE\r` +
      `PID|1||${pid}^^^K6FAC^MR||ZZTEST^FAKE^LOAD||19700101|U|||1 FAKE ST^^NOWHERE^ZZ^00000^ZZZ||^PRN^PH^^1^555^5550100\r` +
      `PV1|1|I|ZZW^101^A^K6FAC||||0000001^ZZDOC^FAKE^X^MD^^MD|||||||||VIP|||||||||||||||||||||||||20260101115500\r`,
  };
}

// The k6 options for SCENARIO; `latency` is the Trend the p99 threshold applies to.
export function options(proto, latency) {
  const scenario = __ENV.SCENARIO || 'smoke';
  const iterations = parseInt(__ENV.ITERATIONS || '5000', 10);
  const duration = `${parseInt(__ENV.SECONDS || (scenario === 'smoke' ? '3' : '30'), 10)}s`;
  const p99 = parseFloat(__ENV.P99_MS || (scenario === 'smoke' ? '1000' : '100'));
  const each = (vus) => ({ executor: 'per-vu-iterations', vus, iterations, maxDuration: '10m' });
  const scenarios = {
    smoke: { executor: 'constant-vus', vus: 2, duration },
    vus1: each(1),
    vus4: each(4),
    vus8: each(8),
    sustained: { executor: 'constant-vus', vus: 8, duration },
  };
  if (!scenarios[scenario]) throw new Error(`unknown SCENARIO ${scenario}: ${Object.keys(scenarios).join(', ')}`);
  return {
    scenarios: { [scenario]: scenarios[scenario] },
    thresholds: {
      [`${proto}_accepted`]: ['rate==1'],
      [`${proto}_errors`]: ['count==0'],
      [latency]: [`p(99)<${p99}`],
    },
    summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
  };
}
