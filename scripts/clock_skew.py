#!/usr/bin/env python3
"""Measure how early or late absolute-eta tasks and schedule ticks are with one clock off.

    python scripts/clock_skew.py [--skews 30,-8,-60] [--tasks 30] [--ticks 8] [--eta 3]

(``--skews 0,...``: a run with every clock right first, for the same box's baseline.)

For each skew: three nodes on 127.0.0.1 (the shared harness: free ports, a temp dir, the
server's default timings), one of them under libfaketime at that skew. It gets the lowest
cluster address, so the bootstrap's first turn is its and it often leads first (the
line says whether it did, and handed over). Then ``--tasks`` tasks with an absolute eta
``--eta`` s ahead are enqueued on the skewed node (and as many on the others), and a
schedule ticking every second is posted; each first delivery at a local sink is timed
against its due time by the real clock. Prints one JSON line per skew: the earliest and
latest delivery against the due time (negative: early), in seconds. Every wait has a
deadline; every node it started is stopped on exit. Needs the Debian package faketime.

2026-12-02, the 2-core box at load 3.5-5.5, 30 tasks and 9 ticks a skew (seconds against
the due time; the skewed node led first at every skew and handed over):
    skew   eta taken by the skewed node   by the others    ticks
      0            +0.012 .. +0.801       +0.001 .. +0.365  +0.048 .. +0.227
    +30            +0.002 .. +0.386       +0.002 .. +0.240  +0.110 .. +0.318
     -8            +0.002 .. +0.276       +0.001 .. +0.272  +0.023 .. +0.576
    -60            +0.001 .. +0.008       +0.001 .. +0.019  +0.012 .. +0.253
Before (main at fb3e57a, the same script): +30 s: -2.998 .. -2.892 and ticks -29.98 ..
-29.42; -8 s: +8.003 .. +8.672 and ticks +8.05 .. +8.71. At load 12-13 nothing was early
either, and the latest were 2.2 s (etas) and 2.9 s (ticks), as late as with no skew.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (HarnessError, NodeProcess, Sink, cluster_view, plan_cluster,  # noqa: E402
                     stop_all, wait_converged, wait_until)

FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                            + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)
TIMEOUT = 60.0


def spread(late: list[float]) -> dict[str, Any]:
    late = sorted(late)
    return {"n": len(late), "earliest": round(late[0], 3) if late else None,
            "latest": round(late[-1], 3) if late else None}


def start(workdir: str, skew: float) -> tuple[list[NodeProcess], NodeProcess]:
    nodes = plan_cluster(workdir, ["a", "b", "c"], own_session=True,
                         extra_args=["--log-level", "warning"])
    off = min(nodes, key=lambda n: n.cluster_addr)
    off.raw_env.update({"LD_PRELOAD": str(FAKETIME), "FAKETIME": f"{skew:+g}s",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    for n in nodes:
        n.start()
    for n in nodes:
        n.wait_ready(TIMEOUT)
    wait_converged(nodes, TIMEOUT)
    if abs(skew) > 1.0:  # beyond the default max_clock_skew (0: a baseline run)
        wait_until(lambda: cluster_view(off).get("clock", {}).get("skewed")
                   and all(cluster_view(n)["leader"] not in (None, off.node_id)
                           for n in nodes),
                   TIMEOUT, what="the skewed node placed, and a leader whose clock is right")
    return nodes, off


def etas(sink: Sink, nodes: list[NodeProcess], off: NodeProcess, count: int,
         ahead: float) -> dict[str, Any]:
    due: dict[str, tuple[float, bool]] = {}
    for i in range(2 * count):
        n = off if i % 2 == 0 else [p for p in nodes if p is not off][i // 2 % 2]
        eta = time.time() + ahead
        due[n.enqueue(url=sink.url_for("/eta"), eta=eta)["id"]] = (eta, n is off)
    reqs = sink.wait_for(lambda rs: {r.task_id for r in rs} >= set(due), path="/eta",
                         timeout=TIMEOUT + ahead)
    first: dict[str, float] = {}
    for r in reqs:
        first.setdefault(r.task_id, r.time)
    return {"eta_taken_by_skewed": spread([t - due[i][0] for i, t in first.items()
                                           if i in due and due[i][1]]),
            "eta_taken_by_others": spread([t - due[i][0] for i, t in first.items()
                                           if i in due and not due[i][1]])}


def ticks(sink: Sink, nodes: list[NodeProcess], count: int) -> dict[str, Any]:
    posted = time.time()
    beat = {"name": "beat", "every": 1, "task": {"url": sink.url_for("/beat")}}
    wait_until(lambda: nodes[0].post("/schedules", json=beat, timeout=15).status_code == 200,
               TIMEOUT, what="the leader to take the schedule")
    sink.wait_for(count=count + 2, path="/beat", timeout=TIMEOUT + count)
    first: dict[int, float] = {}
    for r in sink.requests("/beat"):
        first.setdefault(int(r.headers["X-Task-Name"].rsplit(":", 1)[1]), r.time)
    # the tick of the second the schedule was made in fires at once: not a timed one
    return {"ticks": spread([t - tick for tick, t in first.items() if tick >= posted])}


def one(skew: float, args: argparse.Namespace) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="miyamoto-skew-")
    nodes: list[NodeProcess] = []
    out: dict[str, Any] = {"skew": skew}
    try:
        with Sink() as sink:
            nodes, off = start(workdir, skew)
            log = off.log_text()
            out["skewed_led_first"] = "our clock is off the cluster" in log
            out.update(etas(sink, nodes, off, args.tasks, args.eta))
            out.update(ticks(sink, nodes, args.ticks))
            out["load"] = [round(x, 1) for x in os.getloadavg()]
    except HarnessError as e:
        out.update(error=str(e).splitlines()[0], logs=workdir)
        return out
    finally:
        stop_all(nodes, 5.0)
    shutil.rmtree(workdir, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skews", default="30,-8,-60")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--ticks", type=int, default=8)
    parser.add_argument("--eta", type=float, default=3.0)
    args = parser.parse_args()
    if FAKETIME is None:
        print(json.dumps({"error": "needs libfaketime (Debian package faketime)"}))
        return 2
    failed = False
    for skew in (float(s) for s in args.skews.split(",")):
        result = one(skew, args)
        failed |= "error" in result
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
