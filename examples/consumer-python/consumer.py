#!/usr/bin/env python3
"""Reads hl7gw topics and prints one JSON line per record: the example of docs/consuming.md.

Every hl7gw topic (hl7.inbound, hl7.out.<destination>, hl7.dlq) carries an hl7gw.v1.Envelope (protobuf) as the
record value. This consumer decodes it with the code protoc generates from proto/ (scripts/python-env.sh does
that), reads with isolation.level=read_committed (the transformer writes in Kafka transactions), and commits a
record's offset only after it was handled (at-least-once).

    py=$(scripts/python-env.sh)
    "$py" examples/consumer-python/consumer.py --brokers 127.0.0.1:9092 --count 10 hl7.inbound hl7.out.json

Exit status: 0 when --count records were printed (or, with --count 0, when --timeout ran out); 1 when the
timeout ran out first; 2 on a usage, setup or fatal Kafka error.

The summary includes the patient id (PID-3) of JSON records to show a lookup in the flat view; a real consumer
must not log such values.
"""

import argparse
import hashlib
import json
import sys
import time
import uuid

try:
    from confluent_kafka import Consumer, KafkaError
except ImportError:
    sys.exit("confluent_kafka is missing: run this with the interpreter scripts/python-env.sh prints")
try:
    from google.protobuf.message import DecodeError
    from hl7gw.v1 import envelope_pb2
except ImportError:
    sys.exit("hl7gw.v1.envelope_pb2 is missing: run this with the interpreter scripts/python-env.sh prints")

# The `content-type` header of every hl7gw record.
ENVELOPE_CONTENT_TYPE = "application/x-protobuf; messageType=hl7gw.v1.Envelope"
HL7_V2 = "application/hl7-v2"
JSON = "application/json"
# The flat key of the first PID-3 value: PID-3, first repetition, component 1 (the id itself).
PID3_KEY = "PID(1)-3(1)-1-1"


def text(value):
    """Kafka keys and header values are bytes; hl7gw writes them as text (see docs/consuming.md)."""
    if value is None:
        return None
    return value.decode("utf-8", "replace")


def schema_validator(path):
    """A validator of the canonical JSON form's JSON Schema (proto/hl7gw/v1/canonical.schema.json)."""
    import jsonschema

    with open(path, encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def summarise(msg, validator=None):
    """One record as a small JSON-ready dict; with `validator`, canonical JSON records are checked against it."""
    headers = {}
    for name, value in msg.headers() or []:
        headers[name] = text(value)
    out = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "key": text(msg.key()),
        "type": headers.get("hl7.type"),
        "control_id": headers.get("hl7.control_id"),
        "traceparent": headers.get("traceparent"),
    }
    if "hl7gw.destination" in headers:
        out["destination_header"] = headers["hl7gw.destination"]
    if headers.get("content-type") != ENVELOPE_CONTENT_TYPE:
        out["error"] = "not an hl7gw Envelope (content-type %r)" % headers.get("content-type")
        return out
    env = envelope_pb2.Envelope()
    try:
        env.ParseFromString(msg.value() or b"")
    except DecodeError as e:
        out["error"] = "Envelope does not decode: %s" % e
        return out
    h = env.header
    content_type = env.content_type or HL7_V2
    out.update(
        {
            "envelope_id": env.id,
            "received_at": env.received_at.ToJsonString() if env.HasField("received_at") else None,
            "message_type": h.message_type + ("^" + h.trigger_event if h.trigger_event else ""),
            "envelope_control_id": h.control_id,
            "sending_facility": h.sending_facility,
            "sequence": env.sequence,
            "attempts": env.attempts,
            "stages": [s.name for s in env.stages],
            "charset": env.charset,
            "content_type": content_type,
            "destination": env.destination,
            "route": env.route,
            "envelope_key": env.key,
            "raw_bytes": len(env.raw),
            "raw_sha256": hashlib.sha256(env.raw).hexdigest(),
        }
    )
    if env.HasField("rejection"):
        r = env.rejection
        out["rejection"] = {
            "stage": r.stage,
            "reason": r.reason,
            "hl7_error_code": r.hl7_error_code,
            "detail": r.detail,
            "ack_bytes": len(r.ack),
        }
    if content_type == JSON:
        # The canonical JSON form is UTF-8 whatever the message's own charset was.
        try:
            doc = json.loads(env.raw.decode("utf-8"))
        except ValueError as e:
            out["error"] = "raw is not JSON: %s" % e
            return out
        flat = doc.get("flat", {})
        out["json"] = {
            "format": doc.get("format"),
            "messageType": doc.get("messageType"),
            "triggerEvent": doc.get("triggerEvent"),
            "controlId": doc.get("controlId"),
            "segments": doc.get("segments"),
            "pid3": flat.get(PID3_KEY),
        }
        if validator is not None:
            out["json"]["schema_errors"] = [
                "%s: %s" % ("/".join(map(str, e.absolute_path)), e.message) for e in validator.iter_errors(doc)
            ]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("topics", nargs="+", help="topics to read, e.g. hl7.inbound hl7.out.json")
    p.add_argument("--brokers", default="127.0.0.1:9092", help="bootstrap servers (default %(default)s)")
    p.add_argument(
        "--group",
        default=None,
        help="consumer group (default: a new one per run, which reads from the start; use a fixed one to resume)",
    )
    p.add_argument("--count", type=int, default=0, help="stop after this many records (0: until --timeout)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait in all (default %(default)s)")
    p.add_argument(
        "--offset-reset",
        choices=["earliest", "latest"],
        default="earliest",
        help="where a group without committed offsets starts (default %(default)s)",
    )
    # The same settings as the services' kafka.security (README, Security), with the same file-based secrets.
    sec = p.add_argument_group("security (as the services' kafka.security)")
    sec.add_argument(
        "--security-protocol",
        default="PLAINTEXT",
        choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
        help="security.protocol (default %(default)s)",
    )
    sec.add_argument("--ca-file", help="PEM CA bundle of the brokers' certificates (ssl.ca.location)")
    sec.add_argument("--cert-file", help="client certificate for mutual TLS (ssl.certificate.location)")
    sec.add_argument("--key-file", help="client key for mutual TLS (ssl.key.location)")
    sec.add_argument(
        "--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], help="sasl.mechanism"
    )
    sec.add_argument("--username", help="sasl.username")
    sec.add_argument("--password-file", help="file holding sasl.password (a mounted Secret)")
    p.add_argument(
        "--schema",
        metavar="FILE",
        help="check canonical JSON records against this JSON Schema (proto/hl7gw/v1/canonical.schema.json); "
        "the summary lists what does not conform under json.schema_errors",
    )
    p.add_argument(
        "-X",
        dest="props",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka property (security.protocol, sasl.*, ssl.*), repeatable",
    )
    args = p.parse_args(argv)

    conf = {
        "bootstrap.servers": args.brokers,
        "group.id": args.group or "hl7gw-example-%s" % uuid.uuid4().hex,
        "client.id": "hl7gw-example-consumer-python",
        "auto.offset.reset": args.offset_reset,
        # Never see records of aborted or still-open transformer transactions.
        "isolation.level": "read_committed",
        # At-least-once: an offset is stored after its record was handled, and committed in the background and
        # on close. A crash before the commit means the record is read again.
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
    }
    conf["security.protocol"] = args.security_protocol
    for flag, key in [
        ("ca_file", "ssl.ca.location"),
        ("cert_file", "ssl.certificate.location"),
        ("key_file", "ssl.key.location"),
        ("sasl_mechanism", "sasl.mechanism"),
        ("username", "sasl.username"),
    ]:
        if getattr(args, flag):
            conf[key] = getattr(args, flag)
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            conf["sasl.password"] = f.read().rstrip("\r\n")
    for prop in args.props:
        key, sep, value = prop.partition("=")
        if not sep:
            p.error("-X wants KEY=VALUE, got %r" % prop)
        conf[key] = value

    validator = schema_validator(args.schema) if args.schema else None
    consumer = Consumer(conf)
    consumer.subscribe(args.topics)
    deadline = time.monotonic() + args.timeout
    seen = 0
    status = 0
    try:
        while args.count == 0 or seen < args.count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            msg = consumer.poll(min(1.0, left))
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.fatal():
                    print("consumer: fatal: %s" % err, file=sys.stderr)
                    status = 2
                    break
                # Transient (broker restart, topic not created yet): librdkafka retries by itself.
                if err.code() != KafkaError._PARTITION_EOF:
                    print("consumer: %s" % err, file=sys.stderr)
                continue
            print(json.dumps(summarise(msg, validator), ensure_ascii=False), flush=True)
            consumer.store_offsets(message=msg)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()  # commits the stored offsets and leaves the group
    if status:
        return status
    if args.count and seen < args.count:
        print("consumer: %d of %d records within %gs" % (seen, args.count, args.timeout), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
