#!/usr/bin/env python3
"""Run every node of a cluster config on this machine, until Ctrl-C.

    python scripts/cluster.py [cluster.example.ini] [--nodes a,b]

Each [node:ID] section becomes one `miyamoto serve --config FILE --node ID` process;
their output is prefixed with the node id. Ctrl-C (or SIGTERM) stops them all
gracefully, then kills any that has not exited within the shutdown timeout.
"""

from __future__ import annotations

import argparse
import configparser
import os
import signal
import subprocess
import sys
import threading
import time


def node_ids(path: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    with open(path, encoding="utf-8") as f:
        parser.read_file(f)
    return [s[len("node:"):] for s in parser.sections() if s.startswith("node:")]


def _pump(node: str, stream) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{node}] {line.decode('utf-8', 'replace')}")
        sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="cluster.example.ini")
    parser.add_argument("--nodes", help="comma-separated subset of node ids")
    parser.add_argument("--stop-timeout", type=float, default=15.0)
    args = parser.parse_args()
    ids = node_ids(args.config)
    if args.nodes:
        wanted = args.nodes.split(",")
        unknown = set(wanted) - set(ids)
        if unknown:
            print(f"no [node:X] section for {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        ids = wanted
    if not ids:
        print(f"{args.config} has no [node:ID] sections", file=sys.stderr)
        return 2
    procs: dict[str, subprocess.Popen] = {}
    for node in ids:
        procs[node] = subprocess.Popen(
            [sys.executable, "-m", "miyamoto", "serve", "--config", args.config, "--node", node],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        threading.Thread(target=_pump, args=(node, procs[node].stdout), daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and all(p.poll() is None for p in procs.values()):
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + args.stop_timeout
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    return max((p.returncode or 0) for p in procs.values())


if __name__ == "__main__":
    raise SystemExit(main())
