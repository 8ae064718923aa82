"""Who may deliver now: per-queue token buckets and concurrency limits, one pool.

Due tasks wait in their queue's ready line. One pump greenlet moves them into a
bounded greenlet pool while their queue is not paused, has a token, and is under its
``max_concurrent``; the pool bounds the node's deliveries in flight. Nothing here
knows HTTP: ``run(task_id)`` is the engine's.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable

import gevent
import gevent.event
import gevent.pool

from miyamoto.config import QueueConfig
from miyamoto.ratelimit import TokenBucket

log = logging.getLogger(__name__)


class QueueState:
    """A queue's config plus its runtime: bucket, ready line, in-flight count."""

    def __init__(self, config: QueueConfig, now: float, share: int = 1):
        self.config = config
        self.paused = config.paused
        self.bucket = TokenBucket(config.rate / max(1, share), config.burst, now)
        self.ready: collections.deque[str] = collections.deque()
        self.inflight = 0

    def set_share(self, members: int) -> None:
        """A queue's rate is shared among the live members of the cluster."""
        self.bucket.configure(self.config.rate / max(1, members), self.config.burst)


class Dispatcher:
    def __init__(self, run: Callable[[str], bool | None], queue_config: Callable[[str], QueueConfig],
                 concurrency: int, clock: Callable[[], float] = time.time):
        self._run = run
        self._queue_config = queue_config
        self._clock = clock
        self.concurrency = concurrency
        self.busy = 0  # deliveries in flight; counted here, not read off the pool, so a
        #               finishing delivery's wake-up always sees its slot free
        self.group = gevent.pool.Group()
        self.queues: dict[str, QueueState] = {}
        self._active: set[str] = set()  # queues with ready tasks
        self._share = 1
        self._wake = gevent.event.Event()
        self._greenlet: gevent.Greenlet | None = None
        self._stopping = False

    def queue(self, name: str) -> QueueState:
        """The queue's state, created on first use."""
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(self._queue_config(name), self._clock(), self._share)
        return q

    def view(self, name: str) -> QueueState:
        """The queue's state for reading; a look at an unknown queue creates nothing."""
        return self.queues.get(name) or QueueState(self._queue_config(name), self._clock())

    def queue_config(self, name: str) -> QueueConfig:
        """The queue's config for reading: its state's when it has one (no lookup on the
        delivery path), else the config's; a look at an unknown queue creates nothing."""
        q = self.queues.get(name)
        return q.config if q is not None else self._queue_config(name)

    def set_share(self, members: int) -> None:
        self._share = max(1, members)
        for q in self.queues.values():
            q.set_share(self._share)

    def submit(self, queue: str, task_id: str) -> None:
        """A due task joins its queue's ready line. Copies cancelled or pushed back
        meanwhile stay in the line and are skipped by ``run``: removing them here
        would cost a pass over the line for every cancel."""
        self.queue(queue).ready.append(task_id)
        self._active.add(queue)
        self._wake.set()

    def pause(self, queue: str, paused: bool) -> None:
        self.queue(queue).paused = paused
        self._wake.set()

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._pump)

    def stop(self, timeout: float) -> None:
        """Stop starting deliveries; give those in flight ``timeout`` seconds, then kill."""
        self._stopping = True
        if self._greenlet is not None:
            self._greenlet.kill()
        self.group.join(timeout=timeout)
        self.group.kill(timeout=1)

    def _pump(self) -> None:
        while not self._stopping:
            self._wake.clear()
            wait = self._dispatch_ready()
            if wait == 0.0:
                gevent.sleep(0)
                continue
            self._wake.wait(wait)

    def _dispatch_ready(self) -> float | None:
        """Start what may start; return how long to wait (None: until woken)."""
        wait: float | None = None
        for name in list(self._active):
            q = self.queues[name]
            if not q.ready:
                self._active.discard(name)
                continue
            if q.paused:
                continue
            limit = q.config.max_concurrent
            while q.ready and q.inflight < limit:
                if self.busy >= self.concurrency:
                    return None  # a finishing delivery wakes us
                now = self._clock()
                if not q.bucket.take(now):
                    w = q.bucket.wait_time(now)
                    wait = w if wait is None else min(wait, w)
                    break
                task_id = q.ready.popleft()
                q.inflight += 1
                self.busy += 1
                self.group.spawn(self._deliver, q, task_id)
        return wait

    def _deliver(self, q: QueueState, task_id: str) -> None:
        try:
            if self._run(task_id) is False:  # not delivered (held, moved, ended)
                q.bucket.refund()
        except Exception:
            log.exception("dispatch: delivery of %s failed unexpectedly", task_id)
        finally:
            q.inflight -= 1
            self.busy -= 1
            self._wake.set()
