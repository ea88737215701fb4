// hl7gw's ingress over the gRPC Ingest API (proto/hl7gw/v1/ingest.proto) with k6's built-in k6/net/grpc.
// Runs on any k6 v1.x; scripts/k6.sh's build has it too.
//
//   scripts/k6.sh run loadtest/k6/grpc.js -e GRPC_ADDR=127.0.0.1:50051 -e SCENARIO=sustained
//
// Each VU keeps one plaintext HTTP/2 connection and calls hl7gw.v1.Ingest/Send, one message in flight. The p99
// threshold is on k6's own grpc_req_duration. PROTO_DIR: the repository's proto/ (scripts/k6.sh passes it).
// Scenarios and thresholds: lib/hl7.js.
import grpc from 'k6/net/grpc';
import encoding from 'k6/encoding';
import { Counter, Rate } from 'k6/metrics';
import { adtA01, options as hl7Options } from './lib/hl7.js';

const addr = __ENV.GRPC_ADDR || '127.0.0.1:50051';
const accepted = new Rate('grpc_accepted'); // status OK, ackCode CA and controlId = the MSH-10 sent
const errors = new Counter('grpc_errors'); // calls that did not return OK (the VU reconnects)

const client = new grpc.Client();
client.load([__ENV.PROTO_DIR || '../../proto'], 'hl7gw/v1/ingest.proto');

export const options = hl7Options('grpc', 'grpc_req_duration');

let connected = false;

export default function () {
  const { controlId, message } = adtA01();
  try {
    if (!connected) {
      client.connect(addr, { plaintext: true, timeout: '10s' });
      connected = true;
    }
    const res = client.invoke('hl7gw.v1.Ingest/Send', { message: encoding.b64encode(message) }, { timeout: '10s' });
    if (res.status !== grpc.StatusOK) throw new Error(`status ${res.status}: ${JSON.stringify(res.error)}`);
    accepted.add(res.message.ackCode === 'CA' && res.message.controlId === controlId);
  } catch (e) {
    errors.add(1);
    accepted.add(false);
    if (connected) {
      client.close();
      connected = false;
    }
  }
}
