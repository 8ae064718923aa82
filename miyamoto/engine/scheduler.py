"""One heap and one timer greenlet for every delayed task.

A million delayed tasks cost a million small heap entries, not a million greenlets.
Entries are never removed from the middle of the heap: rescheduling or cancelling a
key just bumps its sequence number, and a popped entry whose sequence no longer
matches is skipped (lazy deletion). The heap is rebuilt when stale entries dominate.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from typing import Callable

import gevent
import gevent.event

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, on_due: Callable[[str], None], clock: Callable[[], float] = time.time):
        self._on_due = on_due
        self._clock = clock
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, int] = {}  # key -> sequence of its current entry
        self._seq = itertools.count()
        self._wake = gevent.event.Event()
        self._greenlet: gevent.Greenlet | None = None

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, key: str, when: float) -> None:
        """(Re)schedule ``key`` to fire at ``when``; replaces any earlier time."""
        seq = next(self._seq)
        self._live[key] = seq
        head = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (when, seq, key))
        if head is None or when < head:
            self._wake.set()
        if len(self._heap) > 2 * len(self._live) + 1024:
            self._compact()

    def cancel(self, key: str) -> None:
        self._live.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._live.get(e[2]) == e[1]]
        heapq.heapify(self._heap)

    def pop_due(self, now: float, limit: int = 1000) -> list[str]:
        """Keys due at ``now`` (at most ``limit``), removed from the schedule."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(out) < limit:
            _, seq, key = heapq.heappop(heap)
            if self._live.get(key) == seq:
                del self._live[key]
                out.append(key)
        return out

    def next_time(self) -> float | None:
        heap = self._heap
        while heap and self._live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # ------------------------------------------------------------ the timer greenlet
    def start(self) -> None:
        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None

    def _run(self) -> None:
        while True:
            now = self._clock()
            for key in self.pop_due(now):
                try:
                    self._on_due(key)
                except Exception:
                    log.exception("scheduler: handler for %s failed", key)
            nxt = self.next_time()
            if nxt is not None and nxt <= self._clock():
                gevent.sleep(0)  # more are due: let others run, then carry on
                continue
            self._wake.clear()
            self._wake.wait(None if nxt is None else max(0.0, nxt - self._clock()))
