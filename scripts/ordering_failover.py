#!/usr/bin/env python3
"""Ordering keys under kill -9: how long a key stalls when its owner dies, and whether
any key's tasks overlapped, ran out of order or were lost.

    python scripts/ordering_failover.py [--keys 3] [--per-key 30] [--delay 0.1]
                                        [--node-env KEY=VALUE ...]

Starts 3 nodes with replication 2 on 127.0.0.1 (the shared harness: free ports, a temp
dir; the server's default timings unless --node-env overrides them) and a real worker
sink that records when each delivery started and ended (it answers after ``--delay``).
Enqueues a stream of ordered tasks of a few keys, round robin over the keys and the
nodes; once a third of the first key's tasks are in, kills that key's owner (the node
that holds copy 0) with SIGKILL and goes on enqueuing on the survivors (an enqueue the
cluster refuses, 503 while the owner is not yet dropped, is sent again). Then waits for
every accepted task and prints one JSON line: the stall (seconds from the kill to the
next delivery start of the key), overlaps, order faults and lost tasks (all expected 0).
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
from typing import Any, Callable

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (HarnessError, NodeProcess, plan_cluster, stop_all,  # noqa: E402
                     wait_converged, wait_until)
from harness.sink import Reply, Request, Sink  # noqa: E402

DEADLINE = 180.0  # s: the whole stream delivered, at the latest
ENQUEUE_TRIES = 60  # a refused enqueue is sent again this many times (0.25 s apart)


class Stream:
    """Ordered tasks of ``keys`` (``per_key`` each) to ``sink``, enqueued over ``nodes``;
    the delivery record per key, checked."""

    def __init__(self, nodes: list[NodeProcess], sink: Sink, keys: int, per_key: int,
                 delay: float):
        self.nodes = list(nodes)
        self.sink = sink
        self.keys = [f"key{i}" for i in range(keys)]
        self.per_key = per_key
        self.accepted: dict[str, tuple[str, int]] = {}  # task id -> (key, index)
        self.killed_at: float | None = None
        self.victim: NodeProcess | None = None
        for key in self.keys:
            sink.reply(f"/o/{key}", Reply(200, delay=delay))

    def run(self, kill: Callable[[NodeProcess], None] | None = None) -> None:
        """Enqueue everything, killing the first key's owner a third of the way in."""
        n = 0
        for i in range(self.per_key):
            for key in self.keys:
                if kill is not None and self.victim is None and key == self.keys[0] \
                        and i == self.per_key // 3:
                    self._kill_owner(kill)
                self._enqueue(key, i, n)
                n += 1

    def _enqueue(self, key: str, i: int, n: int) -> None:
        for attempt in range(ENQUEUE_TRIES):
            node = self._live()[(n + attempt) % len(self._live())]
            try:
                r = node.post("/queue", json={"url": self.sink.url_for(f"/o/{key}"),
                                              "params": {"key": key, "i": str(i)},
                                              "ordering_key": key}, timeout=10)
            except requests.RequestException:
                r = None
            if r is not None and r.status_code == 200:
                self.accepted[r.json()["id"]] = (key, i)
                return
            if r is not None and r.status_code not in (503,):
                raise HarnessError(f"enqueue refused: {r.status_code} {r.text[:200]}")
            time.sleep(0.25)
        raise HarnessError(f"{key} #{i}: no node took it in {ENQUEUE_TRIES} tries")

    def _live(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n is not self.victim]

    def _kill_owner(self, kill: Callable[[NodeProcess], None]) -> None:
        first = next(t for t, (k, _) in self.accepted.items() if k == self.keys[0])
        owner = self.nodes[0].task(first)["replicas"][0]
        self.victim = next(n for n in self.nodes if n.node_id == owner)
        kill(self.victim)
        self.killed_at = time.time()

    def wait_delivered(self, timeout: float = DEADLINE) -> None:
        wait_until(lambda: not self.lost(), timeout,
                   what=f"every accepted task delivered ({len(self.lost())} not yet)")

    # ------------------------------------------------------------ the record
    def _by_key(self) -> dict[str, list[tuple[Request, int]]]:
        out: dict[str, list[tuple[Request, int]]] = {k: [] for k in self.keys}
        for key in self.keys:
            for r in self.sink.requests(f"/o/{key}"):
                got = self.accepted.get(r.task_id or "")
                if got is not None:
                    out[key].append((r, got[1]))
        return out

    def lost(self) -> list[str]:
        done = {r.task_id for k in self.keys for r in self.sink.requests(f"/o/{k}")
                if r.done is not None}
        return sorted(t for t in self.accepted if t not in done)

    def overlaps(self) -> list[str]:
        """Two deliveries of two tasks of one key at once."""
        out = []
        for key, reqs in self._by_key().items():
            spans = sorted((r.time, r.done or time.time(), i) for r, i in reqs)
            for (a0, a1, ai), (b0, _, bi) in zip(spans, spans[1:]):
                if ai != bi and b0 < a1:
                    out.append(f"{key}: #{bi} started {a1 - b0:.3f} s before #{ai} ended")
        return out

    def order_faults(self) -> list[str]:
        """A task that started before the one enqueued before it had been delivered."""
        out = []
        for key, reqs in self._by_key().items():
            first_done: dict[int, float] = {}
            for r, i in reqs:
                if r.done is not None:
                    first_done[i] = min(first_done.get(i, r.done), r.done)
            for r, i in reqs:
                if i > 0 and first_done.get(i - 1, float("inf")) > r.time:
                    out.append(f"{key}: #{i} started before #{i - 1} was delivered")
        return out

    def stall(self) -> float | None:
        """Seconds from the kill to the next delivery start of the killed owner's key."""
        if self.killed_at is None:
            return None
        starts = [r.time for r, _ in self._by_key()[self.keys[0]] if r.time > self.killed_at]
        return round(min(starts) - self.killed_at, 3) if starts else None

    def report(self) -> dict[str, Any]:
        return {"tasks": len(self.accepted), "keys": len(self.keys),
                "killed": self.victim.node_id if self.victim else None,
                "stall_s": self.stall(), "overlaps": len(self.overlaps()),
                "order_faults": len(self.order_faults()), "lost": len(self.lost()),
                "deliveries": sum(len(v) for v in self._by_key().values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--per-key", type=int, default=30)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if any("=" not in kv for kv in args.node_env):
        parser.error("--node-env wants KEY=VALUE")
    env = {"MIYAMOTO_REPLICATION": "2", **dict(kv.split("=", 1) for kv in args.node_env)}
    workdir = tempfile.mkdtemp(prefix="miyamoto-ordering-")
    nodes = plan_cluster(workdir, ["n1", "n2", "n3"], extra_args=["--log-level", "warning"],
                         own_session=True, raw_env=env)
    sink = Sink().start()
    stream = Stream(nodes, sink, args.keys, args.per_key, args.delay)
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait_ready(60.0)
        wait_converged(nodes, 60.0)
        stream.run(kill=lambda n: n.kill())
        stream.wait_delivered()
    except HarnessError as e:
        print(json.dumps({"error": str(e).splitlines()[0], **stream.report(), "logs": workdir}))
        return 1
    finally:
        stop_all(nodes, 5.0)
        sink.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(stream.report()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
