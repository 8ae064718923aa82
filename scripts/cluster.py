#!/usr/bin/env python3
"""Run every node of a cluster config on this machine, until Ctrl-C.

    python scripts/cluster.py [cluster.example.ini] [--nodes a,b]

Each [node:ID] section becomes one `miyamoto serve --config FILE --node ID` process;
their output is prefixed with the node id. Ctrl-C (or SIGTERM) stops them all
gracefully, then kills any that has not exited within the shutdown timeout. The
processes are the shared harness's NodeProcess (scripts/harness), run with the
config's own addresses instead of free ports.
"""

from __future__ import annotations

import argparse
import configparser
import os
import signal
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import NodeProcess, stop_all  # noqa: E402  (scripts/ is not a package)


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
    config = os.path.abspath(args.config)
    nodes = [NodeProcess(tempfile.gettempdir(), node, config=config, address_flags=False,
                         output="pipe", inherit_miyamoto_env=True, cwd=os.getcwd())
             for node in ids]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for n in nodes:
            n.start()
            threading.Thread(target=_pump, args=(n.node_id, n.proc.stdout), daemon=True).start()
        while not stop.is_set() and all(n.running for n in nodes):
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        codes = stop_all(nodes, args.stop_timeout)
    return max((c or 0) for c in codes.values())


if __name__ == "__main__":
    raise SystemExit(main())
