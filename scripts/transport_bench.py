#!/usr/bin/env python
"""CPU per cluster message through miyamoto.wire.transport alone: two Transports in one process.

Why: the end-to-end bench (bench.py) mixes the transport's cost with HTTP, the journal and
the replica protocol, and on a shared box its CPU figures vary by ±10 % from run to run.
This isolates the ZeroMQ path, so two versions of transport.py can be compared directly:

  PYTHONPATH=/path/to/tree python scripts/transport_bench.py [--messages N]

Modes (both bounded in count and time, 127.0.0.1 only):
  flood     A sends N STOREs to B as fast as the HWM allows: the batched (drain) path
  pingpong  A and B bounce one message N times: every message wakes its receiver
Prints one JSON line: process CPU microseconds per message for each mode (the CPU of the
libzmq I/O threads included) and the wall time.
"""

from __future__ import annotations

if __name__ == "__main__":
    from gevent import monkey

    monkey.patch_all()

import argparse
import time

import gevent
import ujson
from gevent.event import Event

from miyamoto.wire.verbs import Verb
from miyamoto.wire.transport import Transport

PAYLOAD = {"id": "0123456789abcdef", "url": "http://127.0.0.1:1/x", "params": {"a": "b"},
           "due": 1.5}
LOOPBACK = "tcp://127.0.0.1:0"


def _connected(a: Transport, b: Transport, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (a.send("b", b.address, Verb.HEARTBEAT, {}) and
               b.send("a", a.address, Verb.HEARTBEAT, {})):
        if time.monotonic() > deadline:
            raise SystemExit("transports did not connect")
        gevent.sleep(0.01)
    gevent.sleep(0.2)  # let the heartbeats land before counting


def flood(n: int, timeout: float) -> dict:
    got = [0]
    done = Event()

    def on_b(sender, verb, payload, key):
        got[0] += 1
        if got[0] >= n:
            done.set()

    a, b = Transport("a", LOOPBACK, lambda *m: None), Transport("b", LOOPBACK, on_b)
    a.start(), b.start()
    try:
        _connected(a, b)
        got[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        deadline = time.monotonic() + timeout
        for i in range(n):
            while not a.send("b", b.address, Verb.STORE, PAYLOAD):  # at the HWM
                if time.monotonic() > deadline:
                    raise SystemExit("flood timed out")
                gevent.sleep(0.001)
            if i % 500 == 0:
                gevent.sleep(0)
        done.wait(max(0.0, deadline - time.monotonic()))
        return _result(got[0], n, cpu, wall)
    finally:
        a.stop(), b.stop()


def pingpong(n: int, timeout: float) -> dict:
    count = [0]
    done = Event()

    def on_a(sender, verb, payload, key):
        count[0] += 1
        if count[0] >= n:
            done.set()
        else:
            a.send("b", b.address, Verb.STORE, PAYLOAD)

    def on_b(sender, verb, payload, key):
        b.send("a", a.address, Verb.STORED, payload)

    a, b = Transport("a", LOOPBACK, on_a), Transport("b", LOOPBACK, on_b)
    a.start(), b.start()
    try:
        _connected(a, b)
        count[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        a.send("b", b.address, Verb.STORE, PAYLOAD)
        done.wait(timeout)
        return _result(2 * count[0], 2 * n, cpu, wall)
    finally:
        a.stop(), b.stop()


def _result(got: int, wanted: int, cpu: float, wall: float) -> dict:
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"messages": got, "complete": got >= wanted,
            "cpu_us_per_message": round(1e6 * cpu / max(got, 1), 1), "wall_s": round(wall, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--timeout", type=float, default=60.0, help="per mode, seconds")
    args = p.parse_args()
    print(ujson.dumps({"flood": flood(args.messages, args.timeout),
                       "pingpong": pingpong(args.messages // 2, args.timeout)}))


if __name__ == "__main__":
    main()
