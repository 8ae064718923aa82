#!/usr/bin/env python3
"""Run every node of a cluster config on this machine, until Ctrl-C.

    python scripts/cluster.py [cluster.example.ini] [--nodes a,b]

Each [node:ID] section becomes one `miyamoto serve --config FILE --node ID` process;
their output is prefixed with the node id. A node that dies is reported and the others
keep running; type `kill ID` (kill -9, to try the failover), `stop ID`, `restart ID` or
`status` on stdin. Ctrl-C (or SIGTERM) stops them all gracefully, then kills any that
has not exited within the shutdown timeout. The
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
    by_id = {n.node_id: n for n in nodes}
    reported: set[str] = set()
    try:
        for n in nodes:
            start(n)
        print(f"[cluster] {len(nodes)} nodes up. Type 'kill ID' (kill -9), 'stop ID', "
              f"'restart ID' or 'status'; Ctrl-C stops them all.", flush=True)
        threading.Thread(target=_commands, args=(by_id, reported), daemon=True).start()
        while not stop.is_set():
            for n in nodes:
                if not n.running and n.node_id not in reported:
                    reported.add(n.node_id)
                    print(f"[cluster] node {n.node_id} exited with code {n.returncode}; the "
                          f"others keep running ('restart {n.node_id}' starts it again)",
                          flush=True)
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        codes = stop_all(nodes, args.stop_timeout)
    return max([c for c in codes.values() if c and c > 0], default=0)  # a kill -9 is no error


def start(n: NodeProcess) -> None:
    n.start()
    threading.Thread(target=_pump, args=(n.node_id, n.proc.stdout), daemon=True).start()


def _commands(by_id: dict[str, NodeProcess], reported: set[str]) -> None:
    """Lines on stdin: kill / stop / restart a node, or show which are running."""
    for line in sys.stdin:
        verb, _, node_id = line.strip().partition(" ")
        n = by_id.get(node_id.strip())
        if verb == "status":
            print("[cluster] " + ", ".join(f"{i}: {'running' if m.running else 'down'}"
                                            for i, m in by_id.items()), flush=True)
        elif n is None or verb not in ("kill", "stop", "restart"):
            print("[cluster] commands: kill ID, stop ID, restart ID, status; ids: "
                  + ", ".join(by_id), flush=True)
        elif verb == "kill":
            n.kill()
        elif verb == "stop":
            n.stop()
        elif n.running:
            print(f"[cluster] node {node_id} is running", flush=True)
        else:
            reported.discard(n.node_id)
            start(n)
            print(f"[cluster] node {node_id} started again", flush=True)

if __name__ == "__main__":
    raise SystemExit(main())
