#!/usr/bin/env python
"""Follow one task through the code of a real cluster: which files it passes, in order.

Starts three nodes of a checkout (``--root``, default this one) at replication 2 with a
profiler preloaded in each (a ``sitecustomize`` on their PYTHONPATH), enqueues one task on
the first node, waits until the sink has it and its sibling copy has ended, and stops
the nodes. Each node recorded every call into the package whose arguments name the task
(its id, or an object whose ``id`` or ``tasks`` hold it). Printed, per node and in all:
the files entered (a move is a call from one file into another), the calls that go back
up (into a file of a higher level than the caller's, by ``scripts/imports.py``'s levels:
a callback, a hook), and the returns to a file already left (a call back into a file the
task had passed through and left). Compare two checkouts in one run:

    .venv/bin/python scripts/trace_task.py --root OLD_CHECKOUT
    .venv/bin/python scripts/trace_task.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CLUSTER_KEYS, Sink, plan_cluster, stop_all, wait_until  # noqa: E402
import imports  # noqa: E402

# loaded by each node before anything else: appends (caller file, callee file) for each
# call whose arguments name a task id, to $TRACE_TASKS_OUT, one JSON line per call
_SITECUSTOMIZE = textwrap.dedent('''
    import json, os, re, sys, threading
    _OUT = open(os.environ["TRACE_TASKS_OUT"], "a", buffering=1)
    _ROOT = os.environ["TRACE_TASKS_ROOT"] + "/miyamoto/"
    _UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

    def _ids(v, depth=0):
        if isinstance(v, str):
            return [v] if len(v) == 36 and _UUID.match(v) else []
        out = []
        for name in ("id", "tasks", "msg"):
            try:
                inner = getattr(v, name, None)
            except Exception:
                inner = None
            if inner is not None and inner is not v and depth < 3:
                out += _ids(inner, depth + 1)
        if isinstance(v, (list, tuple)) and depth < 3:
            for x in v[:8]:
                out += _ids(x, depth + 1)
        return out

    def _profile(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(_ROOT):
            return
        ids = set()
        for v in list(frame.f_locals.values())[:frame.f_code.co_argcount + 2]:
            ids.update(_ids(v))
        if ids:
            back = frame.f_back
            caller = back.f_code.co_filename if back is not None else ""
            _OUT.write(json.dumps({"t": __import__("time").monotonic(), "ids": sorted(ids),
                                   "file": f[len(_ROOT) - 9:], "func": frame.f_code.co_name,
                                   "caller": caller[len(_ROOT) - 9:]
                                   if caller.startswith(_ROOT) else ""}) + "\\n")

    sys.setprofile(_profile)
    threading.setprofile(_profile)
''')


def run(root: Path, work: Path) -> dict[str, list[dict]]:
    """Trace one task through a 3-node cluster of ``root``; the calls, per node."""
    (work / "trace").mkdir()
    (work / "trace" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {"replication": 2, "replica_offset": 1.0, "heartbeat_interval": 0.1,
           "failure_timeout": 1.0, "election_timeout_min": 0.3, "election_timeout_max": 0.6,
           "curve_public": CLUSTER_KEYS[0], "curve_secret": CLUSTER_KEYS[1]}
    nodes = plan_cluster(work, ["a", "b", "c"], env=env)
    for n in nodes:
        n.raw_env = {"PYTHONPATH": f"{work / 'trace'}{os.pathsep}{root}",
                     "TRACE_TASKS_OUT": str(work / f"calls-{n.node_id}.jsonl"),
                     "TRACE_TASKS_ROOT": str(root)}
    with Sink() as sink:
        try:
            for n in nodes:
                n.start()
            for n in nodes:
                n.wait_ready(timeout=60)
            r = requests.post(nodes[0].url + "/queue", timeout=10,
                              data={"task.url": sink.url_for("/work"), "x": "1"})
            r.raise_for_status()
            task_id = r.json()["id"]
            wait_until(lambda: any(q.task_id == task_id for q in sink.requests()), timeout=30)
            # the DONE reaches the sibling, whose engine ends its copy (apply_remote)
            wait_until(lambda: _sibling_ended(work, task_id), timeout=30)
        finally:
            stop_all(nodes)
    calls = {}
    for n in nodes:
        path = work / f"calls-{n.node_id}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        calls[n.node_id] = [c for c in map(json.loads, lines) if task_id in c["ids"]]
    return calls


def _sibling_ended(work: Path, task_id: str) -> bool:
    """Some node applied a sibling's news of the task to its own copy."""
    for path in work.glob("calls-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"apply_remote"' in line and task_id in line:
                return True
    return False


def summary(calls: list[dict], levels: dict[str, int]) -> dict:
    """Files entered, moves between files, calls back up, returns to a file left."""
    path: list[str] = []
    up = 0
    for c in calls:
        caller, callee = c["caller"], c["file"]
        if caller and caller != callee and levels.get(callee, 0) > levels.get(caller, 0):
            up += 1
        if not path or path[-1] != callee:
            path.append(callee)
    returns = sum(1 for i, f in enumerate(path) if f in path[:i])
    return {"files": len(set(path)), "moves": max(0, len(path) - 1), "calls_up": up,
            "returns": returns, "path": path}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    p.add_argument("--paths", action="store_true", help="print each node's path of files")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    levels = imports.measure(root)["file_levels"]
    with tempfile.TemporaryDirectory(prefix="trace-task-") as tmp:
        per_node = run(root, Path(tmp))
    out = {node: summary(calls, levels) for node, calls in per_node.items()}
    total = {k: sum(v[k] for v in out.values()) for k in ("moves", "calls_up", "returns")}
    total["files"] = len({f for v in out.values() for f in v["path"]})
    if not args.paths:
        for v in out.values():
            v.pop("path")
    print(json.dumps({"root": str(root), "nodes": out, "total": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
