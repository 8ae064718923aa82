"""A steady stream of enqueues, paced, round-robin over the nodes, from threads.

Each node has its own lane (a thread pool), so a paused node's requests, which hang
until their timeout, do not hold back the others'. What was acknowledged (200 with an
id) is what a client may expect to be delivered; a request that timed out may still
have been stored, so its delivery is "unacknowledged", not a duplicate or a loss.

``client="one-node"`` posts with plain requests to the lane's node and nothing else, as a
client that knows one node does; ``client="failover"`` goes through ``miyamoto.Client``
with every node's URL, the lane's first, so a refused connection or a 503 moves the
request to another node as the client's retry policy allows. ``named`` gives each task
a name (run and seq), which makes an enqueue safe to repeat after a 503. A failover's
409 duplicate is an acknowledgement: an earlier try of the same name was stored (its
answer was lost), and the 409 names that task's id. ``enqueue_errors`` is what failed at
the client, after its retries.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import requests

from miyamoto.client import Client, DuplicateTask, MiyamotoError

from .nodes import NodeProcess

ERROR_SAMPLES = 5


class Stream:
    """``rate`` enqueues/s of tasks aimed at ``target_url`` until ``stop()``, ``max_tasks``
    or ``max_seconds``, whichever comes first. ``acked`` maps task id -> seq."""

    def __init__(self, nodes: Sequence[NodeProcess], target_url: str, *, rate: float = 100.0,
                 max_tasks: int = 100_000, max_seconds: float = 600.0,
                 request_timeout: float = 5.0, run: str = "", client: str = "one-node",
                 named: bool = False) -> None:
        if client not in ("one-node", "failover"):
            raise ValueError(f"client must be one-node or failover, not {client!r}")
        self.nodes = list(nodes)
        self.client = client
        self.named = named
        self.duplicate_acks = 0  # failover: a retry's 409 naming the stored try
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

    def _client(self, lane: int) -> Client:
        """This thread's Client: every node, the lane's first (a thread serves one lane)."""
        c = getattr(self._local, "client", None)
        if c is None:
            urls = [n.url for n in self.nodes[lane:] + self.nodes[:lane]]
            c = self._local.client = Client(urls, timeout=self.request_timeout)
        return c

    def _send(self, node: NodeProcess, seq: int) -> None:
        body: dict = {"url": self.target_url, "params": {"seq": str(seq), "run": self.run}}
        if self.named:
            body["name"] = f"{self.run}-{seq}"
        dup = False
        if self.client == "failover":
            try:
                task_id, kind = self._client(self.nodes.index(node)).enqueue(**body)["id"], None
            except DuplicateTask as e:
                task_id, kind, dup = e.id, None if e.id else "409 without an id", True
            except MiyamotoError as e:
                task_id, kind = None, f"{type(e).__name__} {e.status}: {e.message[:60]}"
        else:
            try:
                r = self._session().post(node.url + "/queue", json=body,
                                         timeout=self.request_timeout)
                task_id = r.json().get("id") if r.status_code == 200 else None
                kind = None if task_id else f"HTTP {r.status_code}: {r.text[:80]}"
            except (requests.RequestException, ValueError) as e:
                task_id, kind = None, type(e).__name__
        self._count(seq, task_id, kind, dup)

    def _count(self, seq: int, task_id: str | None, kind: str | None, dup: bool) -> None:
        with self._lock:
            self.sent += 1
            self.duplicate_acks += dup
            if task_id:
                self.acked[str(task_id)] = seq
            else:
                self.errors += 1
                self.error_kinds[kind] += 1

    def summary(self) -> dict[str, object]:
        with self._lock:
            out: dict[str, object] = {"client": self.client, "named": self.named,
                                      "sent": self.sent, "acknowledged": len(self.acked),
                                      "enqueue_errors": self.errors,
                                      "duplicate_acks": self.duplicate_acks}
            if self.error_kinds:
                out["enqueue_error_samples"] = dict(self.error_kinds.most_common(ERROR_SAMPLES))
        return out
