#!/usr/bin/env python3
"""Hostile clients for `make bench-hostile`: N connections that cost their owner almost nothing and try to hold
the gateway's slots, bytes and time. Each is re-made as soon as the gateway closes it, for SECONDS, then all stop.
Only for addresses on this machine (the bench passes 127.0.0.1).

  hostile.py MODE HOST:PORT N SECONDS [FROM]

FROM: the local address the connections come from (default 127.0.0.2, so a normal sender on 127.0.0.1 is
another client as the gateway's per-address bounds see it).

MODE:
  slow      open an MLLP frame (start block) and send one more byte every 20 s, never ending it (slowloris)
  idle      connect and send nothing
  noread    send ADT messages as fast as the socket takes them and never read an ACK
  grpc-idle connect to the gRPC port and send nothing (not even the HTTP/2 preface)
  grpc-watch connect to the gRPC port and hold an open grpc.health.v1.Health/Watch stream (answering the
            server's PINGs, so the connection is alive and busy as far as the server can tell)

Prints one JSON line at the end: connections made, closed by the gateway, and bytes sent.
"""
import asyncio
import json
import sys
import time

SB, EB, CR = b"\x0b", b"\x1c", b"\x0d"


def adt(i):
    return (f"MSH|^~\\&|HOSTILE|HOSTILE|GW|GW|20261127000000||ADT^A01|H{i}|P|2.5\r"
            f"PID|1||H{i}^^^HOSTILE^MR\r").encode()


class Stats:
    def __init__(self):
        self.connections = 0
        self.closed_by_gateway = 0
        self.bytes_sent = 0


async def closed(reader, timeout):
    """True when the gateway closed the connection within `timeout` (EOF or reset)."""
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout)
        return data == b""
    except asyncio.TimeoutError:
        return False
    except OSError:
        return True


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def hpack_literal(name, value):
    """A header field as a literal without indexing, no Huffman (RFC 7541 6.2.2)."""
    def s(x):
        assert len(x) < 127
        return bytes([len(x)]) + x
    return b"\x00" + s(name) + s(value)


def watch_request(host, port):
    """The HTTP/2 preface, SETTINGS, and a Health/Watch call (HEADERS, then an empty request message)."""
    headers = b"".join(hpack_literal(k, v) for k, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/grpc.health.v1.Health/Watch"),
        (b":authority", f"{host}:{port}".encode()), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0)
            + h2_frame(1, 0x4, 1, headers) + h2_frame(0, 0, 1, b"\x00\x00\x00\x00\x00"))


async def hold_watch(reader, writer, end):
    """Reads frames until the server goes or `end`: ACKs its SETTINGS, answers its PINGs. True: it closed."""
    while time.monotonic() < end:
        try:
            head = await asyncio.wait_for(reader.readexactly(9), max(end - time.monotonic(), 0.01))
            payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
        except asyncio.TimeoutError:
            return False
        except (asyncio.IncompleteReadError, OSError):
            return True
        kind, flags = head[3], head[4]
        if kind == 4 and not flags & 1:
            writer.write(h2_frame(4, 1, 0))
        elif kind == 6 and not flags & 1:
            writer.write(h2_frame(6, 1, 0, payload))
        elif kind == 7:  # GOAWAY
            return True
        await writer.drain()
    return False


async def one(mode, host, port, end, stats, n, source):
    while time.monotonic() < end:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError:
            await asyncio.sleep(0.2)
            continue
        stats.connections += 1
        gone = False
        try:
            if mode == "slow":
                writer.write(SB + b"M")
                stats.bytes_sent += 2
                while not gone and time.monotonic() < end:
                    gone = await closed(reader, min(20.0, max(end - time.monotonic(), 0.01)))
                    if not gone:
                        writer.write(b"X")
                        stats.bytes_sent += 1
                        await writer.drain()
            elif mode in ("idle", "grpc-idle"):
                while not gone and time.monotonic() < end:
                    gone = await closed(reader, max(end - time.monotonic(), 0.01))
            elif mode == "grpc-watch":
                writer.write(watch_request(host, port))
                await writer.drain()
                gone = await hold_watch(reader, writer, end)
            elif mode == "noread":
                i = 0
                while time.monotonic() < end:
                    frame = SB + adt(f"{n}-{i}") + EB + CR
                    writer.write(frame)
                    i += 1
                    # Waits only while the socket's send buffer is full: nothing is ever read.
                    await asyncio.wait_for(writer.drain(), max(end - time.monotonic(), 0.01))
                    stats.bytes_sent += len(frame)
            else:
                sys.exit(f"hostile.py: unknown mode {mode}")
        except (OSError, asyncio.TimeoutError):
            gone = time.monotonic() < end
        if gone:
            stats.closed_by_gateway += 1
        writer.close()


async def main():
    mode, target, n, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    source = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.2"
    host, port = target.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost") or not source.startswith("127."):
        sys.exit("hostile.py: only addresses on this machine")
    stats = Stats()
    end = time.monotonic() + seconds
    await asyncio.gather(*(one(mode, host, int(port), end, stats, i, source) for i in range(n)))
    print(json.dumps({"mode": mode, "clients": n, "connections": stats.connections,
                      "closed_by_gateway": stats.closed_by_gateway, "bytes_sent": stats.bytes_sent}))


if __name__ == "__main__":
    asyncio.run(main())
