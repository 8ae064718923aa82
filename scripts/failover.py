#!/usr/bin/env python3
"""Measure the time from a leader's kill -9 to the next leader.

    python scripts/failover.py [--rounds 3] [--nodes 3] [--node-env KEY=VALUE ...]

Starts a cluster on 127.0.0.1 with the shared harness (scripts/harness: free ports, a
temp dir for data and logs, the server's default timings unless --node-env overrides
them), then, each round: kills the leader with SIGKILL, polls the survivors' GET
/cluster until all of them name one new leader with a higher term, and restarts the
killed node seeded with the survivors. Prints one JSON line with the seconds per round.
Every wait has a deadline; every node it started is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (HarnessError, NodeProcess, plan_cluster, probe_view,  # noqa: E402
                     stop_all, wait_converged, wait_until)

ROUND_TIMEOUT = 60.0


def wait_new_leader(survivors: list[NodeProcess], old: str, term: int) -> float:
    """Seconds until every survivor names one new leader in a higher term."""
    t0 = time.monotonic()

    def elected() -> bool:
        views = [probe_view(n) for n in survivors]
        return (all(v and v.get("leader") not in (None, old) and v.get("term", 0) > term
                    for v in views) and len({v["leader"] for v in views if v}) == 1)

    wait_until(elected, ROUND_TIMEOUT, what=f"a new leader after killing {old}")
    return time.monotonic() - t0


def rounds(nodes: list[NodeProcess], count: int, results: list[float]) -> None:
    for _ in range(count):
        view = wait_converged(nodes, ROUND_TIMEOUT)
        old = next(n for n in nodes if n.node_id == view["leader"])
        survivors = [n for n in nodes if n is not old]
        old.kill()
        results.append(round(wait_new_leader(survivors, old.node_id, view["term"]), 3))
        old.seeds = [n.cluster_addr for n in survivors]
        old.start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if any("=" not in kv for kv in args.node_env):
        parser.error("--node-env wants KEY=VALUE")
    workdir = tempfile.mkdtemp(prefix="miyamoto-failover-")
    nodes = plan_cluster(workdir, [f"n{i + 1}" for i in range(args.nodes)], seed_all=False,
                         extra_args=["--log-level", "warning"], own_session=True,
                         raw_env=dict(kv.split("=", 1) for kv in args.node_env))
    results: list[float] = []
    try:
        nodes[0].start().wait_ready(ROUND_TIMEOUT, ready=False)
        for n in nodes[1:]:
            n.start()
        rounds(nodes, args.rounds, results)
    except HarnessError as e:
        print(json.dumps({"error": str(e).splitlines()[0], "kill9_to_new_leader_s": results,
                          "logs": workdir}))
        return 1
    finally:
        stop_all(nodes, 5.0)
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"nodes": args.nodes, "kill9_to_new_leader_s": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
