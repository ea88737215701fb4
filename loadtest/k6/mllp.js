// hl7gw's ingress over MLLP with the k6/x/mllp extension (a k6 built by scripts/k6.sh build).
//
//   scripts/k6.sh run loadtest/k6/mllp.js -e MLLP_ADDR=127.0.0.1:2575 -e SCENARIO=sustained
//
// Each VU keeps one persistent connection and has one message in flight: it sends, then waits for that ACK.
// Scenarios and thresholds: lib/hl7.js.
import mllp from 'k6/x/mllp';
import { Counter, Rate, Trend } from 'k6/metrics';
import { adtA01, options as hl7Options } from './lib/hl7.js';

const addr = __ENV.MLLP_ADDR || '127.0.0.1:2575';
const accepted = new Rate('mllp_accepted'); // MSA-1 CA and MSA-2 = the MSH-10 sent
const ackDuration = new Trend('mllp_ack_duration', true); // write to ACK read, in ms
const errors = new Counter('mllp_errors'); // connection errors and timeouts (the VU reconnects)

export const options = hl7Options('mllp', 'mllp_ack_duration');

let client = null;

export default function () {
  const { controlId, message } = adtA01();
  try {
    if (client === null) client = mllp.connect(addr, parseInt(__ENV.TIMEOUT_MS || '10000', 10));
    const r = client.send(message);
    ackDuration.add(r.ms);
    accepted.add(r.code === 'CA' && r.controlId === controlId);
  } catch (e) {
    errors.add(1);
    accepted.add(false);
    if (client !== null) {
      try { client.close(); } catch (_) { /* already closed */ }
      client = null;
    }
  }
}
