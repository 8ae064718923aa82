#!/usr/bin/env python3
"""Measure the time from a leader's kill -9 to the next leader.

    python scripts/failover.py [--nodes 3] [--rounds 3] [--node-env KEY=VALUE ...]

Starts N nodes on 127.0.0.1 (free ports, temporary data dirs, default timings unless
--node-env overrides them), then, each round: kills the leader with SIGKILL, polls the
survivors' GET /cluster until all of them name one new leader with a higher term, and
restarts the killed node. Prints one JSON line with the seconds per round. Every wait has
a deadline; every process it started is killed on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def view(http: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/cluster", timeout=0.5) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def wait(fn, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.node_env))
    tmp = tempfile.mkdtemp(prefix="miyamoto-failover-")
    ids = [f"n{i + 1}" for i in range(args.nodes)]
    http = {n: free_port() for n in ids}
    cluster = {n: free_port() for n in ids}
    seeds = ",".join(f"tcp://127.0.0.1:{cluster[n]}" for n in ids)
    procs: dict[str, subprocess.Popen] = {}

    def start(n: str) -> None:
        procs[n] = subprocess.Popen(
            [sys.executable, "-m", "miyamoto", "serve", "--node", n,
             "--http", f"127.0.0.1:{http[n]}", "--cluster", f"tcp://127.0.0.1:{cluster[n]}",
             "--seeds", seeds, "--data-dir", os.path.join(tmp, n), "--log-level", "info"],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(tmp, f"{n}.log"), "ab"))

    def converged() -> dict | None:
        views = [view(http[n]) for n in ids]
        if all(v and v["leader"] and len(v["members"]) == len(ids) for v in views) and \
                len({(v["leader"], v["term"]) for v in views}) == 1:
            return views[0]
        return None

    results = []
    try:
        for n in ids:
            start(n)
        for _ in range(args.rounds):
            before = wait(converged, 60, "the cluster to converge")
            leader, term = before["leader"], before["term"]
            survivors = [n for n in ids if n != leader]
            t0 = time.monotonic()
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(timeout=10)

            def new_leader() -> bool:
                vs = [view(http[n]) for n in survivors]
                return all(v and v["leader"] not in (None, leader) and v["term"] > term
                           for v in vs) and len({v["leader"] for v in vs}) == 1

            wait(new_leader, 60, f"a new leader after killing {leader} (term {term})")
            results.append(round(time.monotonic() - t0, 3))
            start(leader)
    except TimeoutError as e:
        print(json.dumps({"error": str(e), "kill9_to_new_leader_s": results, "logs": tmp}))
        return 1
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    print(json.dumps({"nodes": args.nodes, "kill9_to_new_leader_s": results, "logs": tmp}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
