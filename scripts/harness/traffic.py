"""A steady stream of enqueues, paced, round-robin over the nodes, from threads.

Each node has its own lane (a thread pool), so a paused node's requests, which hang
until their timeout, do not hold back the others'. What was acknowledged (200 with an
id) is what a client may expect to be delivered; a request that timed out may still
have been stored, so its delivery is "unacknowledged", not a duplicate or a loss.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import requests

from .nodes import NodeProcess

ERROR_SAMPLES = 5


class Stream:
    """``rate`` enqueues/s of tasks aimed at ``target_url`` until ``stop()``, ``max_tasks``
    or ``max_seconds``, whichever comes first. ``acked`` maps task id -> seq."""

    def __init__(self, nodes: Sequence[NodeProcess], target_url: str, *, rate: float = 100.0,
                 max_tasks: int = 100_000, max_seconds: float = 600.0,
                 request_timeout: float = 5.0, run: str = "") -> None:
        self.nodes = list(nodes)
        self.target_url = target_url
        self.rate = rate
        self.max_tasks = max_tasks
        self.max_seconds = max_seconds
        self.request_timeout = request_timeout
        self.run = run
        self.acked: dict[str, int] = {}
        self.sent = 0  # requests that got an answer or an error (not those cancelled at stop)
        self.errors = 0
        self.error_kinds: Counter = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._local = threading.local()
        # enough threads for a lane whose node hangs every request until its timeout
        per_lane = max(4, int(rate / max(1, len(self.nodes)) * request_timeout * 1.5) + 4)
        self._lanes = [ThreadPoolExecutor(per_lane, thread_name_prefix=f"enqueue-{n.node_id}")
                       for n in self.nodes]
        self._pacer = threading.Thread(target=self._pace, name="enqueue-pacer", daemon=True)

    def start(self) -> "Stream":
        self._pacer.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop sending; wait (at most ``timeout``) for the requests already sent."""
        self._stop.set()
        self._pacer.join(timeout)
        for lane in self._lanes:
            lane.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + timeout
        for lane in self._lanes:  # shutdown(wait=True) has no timeout: join its threads
            for t in list(getattr(lane, "_threads", ())):
                t.join(max(0.0, deadline - time.monotonic()))

    def _pace(self) -> None:
        t0 = time.monotonic()
        for seq in range(self.max_tasks):
            due = t0 + seq / self.rate
            if due - t0 > self.max_seconds:
                break
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            self._lanes[seq % len(self.nodes)].submit(self._send, self.nodes[seq % len(self.nodes)], seq)

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _send(self, node: NodeProcess, seq: int) -> None:
        body = {"url": self.target_url, "params": {"seq": str(seq), "run": self.run}}
        try:
            r = self._session().post(node.url + "/queue", json=body,
                                     timeout=self.request_timeout)
            task_id = r.json().get("id") if r.status_code == 200 else None
            kind = None if task_id else f"HTTP {r.status_code}: {r.text[:80]}"
        except (requests.RequestException, ValueError) as e:
            task_id, kind = None, type(e).__name__
        with self._lock:
            self.sent += 1
            if task_id:
                self.acked[str(task_id)] = seq
            else:
                self.errors += 1
                self.error_kinds[kind] += 1

    def summary(self) -> dict[str, object]:
        with self._lock:
            out: dict[str, object] = {"sent": self.sent, "acknowledged": len(self.acked),
                                      "enqueue_errors": self.errors}
            if self.error_kinds:
                out["enqueue_error_samples"] = dict(self.error_kinds.most_common(ERROR_SAMPLES))
        return out
