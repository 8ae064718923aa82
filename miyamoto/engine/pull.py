"""The due copies of pull queues, waiting for a worker to lease them.

A pull queue's copy is never POSTed: when it comes due the engine puts it here instead
of handing it to the dispatcher, and ``POST /queues/<name>/lease`` takes the best of
them (the highest priority, then the earliest due) and starts an attempt with each that
the siblings let go (``Engine.lease``). An entry is only a hint: the copy's record in
memory says whether it is still due (it may have been leased, cancelled, expired or
pushed back meanwhile), so an entry is checked as it is taken, never removed early.
A waiter's long poll waits on the queue's event, set when an entry comes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import gevent.event

from miyamoto.tasks.task import Task

WAIT_MAX = 60.0  # s: the longest long poll (wait_s)
LEASE_MIN, LEASE_MAX = 1.0, 7 * 86400.0  # s: a lease's span (lease_s), as a long task's
TASKS_MAX = 100  # tasks one lease request may take (max_tasks)
DELAY_MAX = 30 * 86400.0  # s: the longest wait a nack asks before the retry


def within(v: Any, lo: float, hi: float) -> bool:
    """``v`` is a number (not a bool) in [lo, hi]."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and lo <= v <= hi)


@dataclass
class Taken:
    """What one look at a pull queue's due copies gave: the leases (copy, token), and
    how many copies are asking their siblings (they come back once answered)."""

    leased: list[tuple[Task, str]] = field(default_factory=list)
    asking: int = 0


class PullPool:
    """Per pull queue, a heap of (priority, due at, seq, task id) and an event."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[int, float, int, str]]] = {}
        self._events: dict[str, gevent.event.Event] = {}
        self._seq = itertools.count()

    def add(self, queue: str, task_id: str, priority: int, due: float) -> None:
        """Copy ``task_id`` is due and waits for a lease (priority 0-9: 9 first)."""
        heapq.heappush(self._heaps.setdefault(queue, []),
                       (-priority, due, next(self._seq), task_id))
        self.event(queue).set()

    def take(self, queue: str) -> str | None:
        """The best waiting entry of ``queue`` (to be checked by the caller), or None."""
        heap = self._heaps.get(queue)
        if not heap:
            if queue in self._heaps:
                del self._heaps[queue]
            self.event(queue).clear()
            return None
        return heapq.heappop(heap)[3]

    def drain(self, queue: str) -> list[str]:
        """Every waiting entry of ``queue`` (it became a push queue: the dispatcher's now)."""
        heap = self._heaps.pop(queue, [])
        return [e[3] for e in sorted(heap)]

    def waiting(self, queue: str) -> int:
        """Entries of ``queue`` (an upper bound of its copies waiting: some are stale)."""
        return len(self._heaps.get(queue, ()))

    def event(self, queue: str) -> gevent.event.Event:
        ev = self._events.get(queue)
        if ev is None:
            ev = self._events[queue] = gevent.event.Event()
        return ev

    def wait(self, queue: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for an entry of ``queue``; True if one came."""
        return self.event(queue).wait(max(0.0, timeout))
