#!/usr/bin/env python3
"""Hostile clients for `make bench-hostile`: N connections that cost their owner almost nothing and try to hold
the gateway's slots, bytes and time. Each is re-made as soon as the gateway closes it, for SECONDS, then all stop.
Only for addresses on this machine (the bench passes 127.0.0.1).

  hostile.py MODE HOST:PORT N SECONDS

MODE:
  slow      open an MLLP frame (start block) and send one more byte every 20 s, never ending it (slowloris)
  idle      connect and send nothing
  noread    send ADT messages as fast as the socket takes them and never read an ACK
  grpc-idle connect to the gRPC port and send nothing (not even the HTTP/2 preface)

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


async def one(mode, host, port, end, stats, n):
    while time.monotonic() < end:
        try:
            reader, writer = await asyncio.open_connection(host, port)
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
    host, port = target.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("hostile.py: only addresses on this machine")
    stats = Stats()
    end = time.monotonic() + seconds
    await asyncio.gather(*(one(mode, host, int(port), end, stats, i) for i in range(n)))
    print(json.dumps({"mode": mode, "clients": n, "connections": stats.connections,
                      "closed_by_gateway": stats.closed_by_gateway, "bytes_sent": stats.bytes_sent}))


if __name__ == "__main__":
    asyncio.run(main())
