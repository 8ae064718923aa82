#!/usr/bin/env python3
"""Measure the time from a leader's kill -9 to the next leader.

    python scripts/failover.py [--rounds 3] [--nodes 3] [--node-env KEY=VALUE ...]

Starts a cluster on 127.0.0.1 the way scripts/bench.py does (its node machinery: free
ports, temp data dirs, default timings unless --node-env overrides them), then, each
round: kills the leader with SIGKILL, polls the survivors' GET /cluster until all of them
name one new leader with a higher term, and restarts the killed node seeded with the
survivors. Prints one JSON line with the seconds per round. Every wait has a deadline;
every node it started is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (scripts/ is not a package)

ROUND_TIMEOUT = 60.0


def wait_new_leader(survivors: list[bench.Node], old: str, term: int) -> float:
    """Seconds until every survivor names one new leader in a higher term."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < ROUND_TIMEOUT:
        views = [bench.cluster_view(n) for n in survivors]
        if all(v and v.get("leader") not in (None, old) and v.get("term", 0) > term
               for v in views) and len({v["leader"] for v in views if v}) == 1:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise bench.BenchError(f"no new leader within {ROUND_TIMEOUT:g} s after killing {old}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    mine = parser.parse_args()
    args = bench.parse_args(["--nodes", str(mine.nodes)]
                            + [f"--node-env={kv}" for kv in mine.node_env])
    workdir = tempfile.mkdtemp(prefix="miyamoto-failover-")
    nodes = bench.plan_nodes(args, workdir)
    results: list[float] = []
    try:
        bench.start_nodes(args, nodes)
        for _ in range(mine.rounds):
            view = bench.wait_formed(nodes, time.monotonic() + ROUND_TIMEOUT)
            old = next(n for n in nodes if n.id == view["leader"])
            survivors = [n for n in nodes if n is not old]
            assert old.proc is not None
            old.proc.send_signal(signal.SIGKILL)
            old.proc.wait(timeout=10)
            results.append(round(wait_new_leader(survivors, old.id, view["term"]), 3))
            bench.spawn_node(args, old, [n.cluster for n in survivors])
    except bench.BenchError as e:
        print(json.dumps({"error": str(e), "kill9_to_new_leader_s": results, "logs": workdir}))
        bench.stop_nodes(nodes, args.stop_timeout)
        return 1
    bench.stop_nodes(nodes, args.stop_timeout)
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"nodes": mine.nodes, "kill9_to_new_leader_s": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
