"""A fast load generator and its report, for the benchmark (gevent: import it only from a
program that has monkey-patched).

``Enqueuer`` sends tasks numbered 0..n-1 round-robin over the nodes from keep-alive
``geventhttpclient`` connections, either as fast as ``connections`` greenlets can or at a
fixed rate; ``Load`` is what it sent and got back. The ``*_report`` functions turn a
``Load`` and a ``fastsink.Sink`` into the bench's result keys.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import gevent
import gevent.pool
import ujson
from geventhttpclient import HTTPClient

from .fastsink import Sink
from .procfs import dir_bytes, mb, proc_status_kb
from .waits import LOCALHOST

POLL = 0.05  # seconds between checks of the sink while waiting
ERROR_SAMPLES = 5
clock = time.perf_counter


@dataclass
class Load:
    """What the enqueue side sent and got back, indexed by seq."""

    n: int
    send_at: list[float] = field(init=False)
    ids: list[str | None] = field(init=False)
    rtt: list[float] = field(default_factory=list)
    errors: int = 0
    not_sent: int = 0
    error_kinds: Counter = field(default_factory=Counter)
    first_send: float = 0.0
    last_done: float = 0.0

    def __post_init__(self) -> None:
        self.send_at = [0.0] * self.n
        self.ids = [None] * self.n

    @property
    def acked(self) -> int:
        return sum(1 for i in self.ids if i is not None)

    def acked_seqs(self) -> Iterator[int]:
        return (s for s, i in enumerate(self.ids) if i is not None)


class Enqueuer:
    """Sends tasks numbered 0..n-1 round-robin over the nodes, keep-alive, pooled."""

    def __init__(self, nodes: Sequence[Any], sink_url: str, run: str, *, tasks: int,
                 connections: int = 50, request_timeout: float = 30.0,
                 queue: str | None = None, countdown: float | None = None,
                 json: bool = False, qstash: bool = False) -> None:
        self.load = Load(tasks)
        self.path = "/queue" + (f"/{quote(queue, safe='')}" if queue else "")
        # QStash's face: the same form body, published to the sink's URL (201, messageId)
        self.qstash = qstash
        if qstash:
            self.path = (f"/v2/enqueue/{quote(queue, safe='')}/" if queue
                         else "/v2/publish/") + sink_url
        self.countdown = countdown
        self.json = json
        self.sink_url = sink_url
        self.run = run
        self.clients = [
            HTTPClient(LOCALHOST, urlsplit(n.url).port, concurrency=connections,
                       connection_timeout=request_timeout,
                       network_timeout=request_timeout)
            for n in nodes]
        self.headers = {"Content-Type": "application/json" if self.json
                        else "application/x-www-form-urlencoded"}
        self._form_prefix = self._make_form_prefix()

    def _make_form_prefix(self) -> bytes:
        parts = [f"task.url={quote(self.sink_url, safe='')}"]
        if self.countdown is not None:
            parts.append(f"task.countdown={self.countdown:g}")
        parts.append(f"run={self.run}")
        return ("&".join(parts) + "&seq=").encode()

    def body(self, seq: int) -> bytes:
        if self.qstash:
            return f"run={self.run}&seq={seq}".encode()
        if not self.json:
            return self._form_prefix + str(seq).encode()
        doc: dict[str, Any] = {"url": self.sink_url,
                               "params": {"run": self.run, "seq": str(seq)}}
        if self.countdown is not None:
            doc["countdown"] = self.countdown
        return ujson.dumps(doc).encode()

    def _error(self, kind: str) -> None:
        self.load.errors += 1
        self.load.error_kinds[kind[:160]] += 1

    def send(self, seq: int) -> None:
        """One enqueue; records its start time, its task id on 200, or an error."""
        client = self.clients[seq % len(self.clients)]
        body = self.body(seq)
        start = clock()
        self.load.send_at[seq] = start
        if not self.load.first_send:
            self.load.first_send = start
        try:
            resp = client.post(self.path, body=body, headers=self.headers)
            data = resp.read()
            status = resp.status_code
        except Exception as exc:  # noqa: BLE001 - every failure of one request is one error
            self._error(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.load.last_done = max(self.load.last_done, clock())
        self.load.rtt.append(clock() - start)
        if status != (201 if self.qstash else 200):
            self._error(f"HTTP {status}: {data[:120]!r}")
            return
        try:
            task_id = ujson.loads(data)["messageId" if self.qstash else "id"]
        except (ValueError, KeyError, TypeError):
            self._error(f"HTTP 200 without an id: {data[:120]!r}")
            return
        self.load.ids[seq] = str(task_id)

    def run_fast(self, connections: int, time_limit: float) -> None:
        """`connections` greenlets pull the next seq until all are sent or time is up."""
        counter = itertools.count()
        deadline = clock() + time_limit

        def worker() -> None:
            for seq in counter:
                if seq >= self.load.n:
                    return
                if clock() > deadline:
                    self.load.not_sent += 1
                    continue
                self.send(seq)

        gevent.joinall([gevent.spawn(worker) for _ in range(connections)])

    def run_paced(self, rate: float, connections: int, time_limit: float) -> None:
        """Start one enqueue every 1/rate s (at most `connections` in flight)."""
        pool = gevent.pool.Pool(connections)
        t0 = clock()
        deadline = t0 + time_limit
        for seq in range(self.load.n):
            if clock() > deadline:
                self.load.not_sent = self.load.n - seq
                break
            delay = t0 + seq / rate - clock()
            if delay > 0:
                gevent.sleep(delay)
            pool.spawn(self.send, seq)
        pool.join()

    def close(self) -> None:
        for c in self.clients:
            c.close()



def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def ms_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    values = sorted(seconds)
    return {k: None if v is None else round(v * 1000, 2)
            for k, v in (("p50", percentile(values, 0.50)), ("p99", percentile(values, 0.99)),
                         ("max", values[-1] if values else None))}


def any_alive(nodes: Sequence[Any]) -> bool:
    """False once every node the bench started has exited (True for --server nodes)."""
    started = [n.proc for n in nodes if n.proc is not None]
    return not started or any(p.poll() is None for p in started)


def node_exits(nodes: Sequence[Any]) -> dict[str, int]:
    """Exit codes of started nodes that died before the bench stopped them."""
    return {n.node_id: n.proc.returncode for n in nodes
            if n.proc is not None and n.proc.poll() is not None}


def wait_deliveries(sink: Sink, load: Load, nodes: Sequence[Any], timeout: float,
                    log: Any) -> None:
    """Until every acknowledged seq reached the sink, `timeout` s pass or all nodes died."""
    pending = {str(s) for s in load.acked_seqs()}
    deadline = clock() + timeout
    next_report = clock() + 2.0
    first_at = sink.stats.first_at
    while pending and clock() < deadline:
        pending = {s for s in pending if s not in first_at}
        if pending and not any_alive(nodes):
            log(f"every node exited; {len(pending)} tasks undelivered")
            return
        if clock() >= next_report:
            log(f"delivered {sink.stats.delivered}, waiting for {len(pending)}")
            next_report = clock() + 2.0
        gevent.sleep(POLL)


def delivery_report(sink: Sink, load: Load) -> dict[str, Any]:
    """lost / duplicated / latency / rates from what was sent and what arrived."""
    stats = sink.stats
    latencies, lost, mismatched = [], 0, 0
    for seq in load.acked_seqs():
        key = str(seq)
        at = stats.first_at.get(key)
        if at is None:
            lost += 1
            continue
        latencies.append(at - load.send_at[seq])
        delivered_id = stats.id_of_seq.get(key)
        if delivered_id is not None and delivered_id != load.ids[seq]:
            mismatched += 1
    span = stats.last_at - load.first_send if stats.delivered else 0.0
    return {
        "delivered": stats.delivered,
        "delivered_per_s": round(stats.delivered / span, 1) if span > 0 else None,
        "latency_ms": ms_summary(latencies),
        "lost": lost,
        "duplicated": len(stats.duplicated_seqs()),
        "duplicated_ids": len(stats.duplicated_ids()),
        "id_mismatch": mismatched,
        "foreign_deliveries": stats.foreign,
    }


def replicas_per_task(metrics: dict[str, float], acked: int) -> float | None:
    """Copies stored per acknowledged task, from the nodes' tasks_stored_total."""
    stored = metrics.get("tasks_stored_total")
    return None if stored is None or not acked else round(stored / acked, 2)


def per_task_report(metrics: dict[str, float], cpu: dict[str, float], delivered: int,
                    switches: dict[str, dict[str, int]] | None = None,
                    ) -> dict[str, Any] | None:
    """What one delivered task cost the nodes: CPU ms (the bench's own excluded), journal
    commits, cluster messages sent (each one inside a BATCH counted), by verb, and the
    nodes' wakes and preemptions (``procfs.switch_delta``), when read."""
    nodes = [v for k, v in cpu.items() if k != "bench"]
    if not delivered or None in nodes:  # --server: a process not ours, its CPU unread
        return None
    node_cpu = sum(nodes)
    sent: dict[str, float] = {}
    for key, n in metrics.items():
        if key.startswith("cluster_messages_total{") and 'direction="sent"' in key:
            verb = key.split('verb="', 1)[1].split('"', 1)[0]
            sent[verb] = sent.get(verb, 0) + n
    sent.pop("BATCH", None)
    out: dict[str, Any] = {
        "cpu_ms": round(1000 * node_cpu / delivered, 3),
        "commits": round(metrics.get("journal_commits_total", 0) / delivered, 3),
        "messages": round(sum(sent.values()) / delivered, 3),
        "by_verb": {v: round(n / delivered, 3) for v, n in sorted(sent.items()) if n}}
    if switches:
        for kind in ("woke", "preempted"):
            out[kind] = round(sum(s[kind] for s in switches.values()) / delivered, 3)
    return out


def enqueue_report(load: Load) -> dict[str, Any]:
    span = load.last_done - load.first_send
    acked = load.acked
    out: dict[str, Any] = {
        "enqueued": acked,
        "enqueue_per_s": round(acked / span, 1) if span > 0 else None,
        "enqueue_errors": load.errors,
        "enqueue_ms": ms_summary(load.rtt),
    }
    if load.not_sent:
        out["not_sent"] = load.not_sent
    if load.error_kinds:
        out["enqueue_error_samples"] = dict(load.error_kinds.most_common(ERROR_SAMPLES))
    return out


def resources(nodes: Sequence[Any]) -> dict[str, Any]:
    return {
        "rss_peak_mb": {n.node_id: mb(proc_status_kb(n.pid, "VmHWM")) for n in nodes},
        "rss_mb": {n.node_id: mb(proc_status_kb(n.pid, "VmRSS")) for n in nodes},
        "journal_bytes": {n.node_id: dir_bytes(n.data_dir) for n in nodes},
    }

