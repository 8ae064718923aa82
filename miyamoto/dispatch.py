"""Who may deliver now: per-queue token buckets and limits, per-target limits, one pool.

Due tasks wait in their queue's ready line. One pump greenlet moves them into a
bounded greenlet pool while their queue is not paused, has a token and is under its
limit, and their target is under ``max_per_host``; the pool bounds the node's
deliveries in flight. No queue and no target can take every slot (``fairness``): a
queue takes at most its share of the pool, a stuck target at most ``max_per_host``,
and a task whose target is full waits aside without holding up its queue. Nothing
here knows HTTP: ``run(task_id)`` is the engine's.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import gevent
import gevent.event
import gevent.pool

from miyamoto.config import QueueConfig
from miyamoto.fairness import HostSlots, ReadyLine, queue_limit
from miyamoto.ratelimit import TokenBucket

log = logging.getLogger(__name__)


class QueueState:
    """A queue's config plus its runtime: bucket, ready line, in-flight count and limit."""

    def __init__(self, config: QueueConfig, now: float, share: int, concurrency: int):
        self.config = config
        self.paused = config.paused
        self.bucket = TokenBucket(config.rate / max(1, share), config.burst, now)
        self.ready = ReadyLine(config.name)
        self.inflight = 0
        self.limit = queue_limit(config, concurrency)

    def set_share(self, members: int) -> None:
        """A queue's rate is shared among the live members of the cluster."""
        self.bucket.configure(self.config.rate / max(1, members), self.config.burst)


class Dispatcher:
    def __init__(self, run: Callable[[str], bool | None], queue_config: Callable[[str], QueueConfig],
                 concurrency: int, clock: Callable[[], float] = time.time,
                 max_per_host: int | None = None):
        self._run = run
        self._queue_config = queue_config
        self._clock = clock
        self.concurrency = concurrency
        self.hosts = HostSlots(min(max_per_host or concurrency, concurrency))
        self.busy = 0  # deliveries in flight; counted here, not read off the pool, so a
        #               finishing delivery's wake-up always sees its slot free
        self.group = gevent.pool.Group()
        self.queues: dict[str, QueueState] = {}
        # queues with ready tasks, in turn order: a queue that started a task goes to the
        # back, so slots freed one at a time (a full pool, a full target) go round the
        # queues that wait for them instead of always to the same one
        self._active: dict[str, None] = {}
        self._share = 1
        self._wake = gevent.event.Event()
        self._greenlet: gevent.Greenlet | None = None
        self._stopping = False

    def queue(self, name: str) -> QueueState:
        """The queue's state, created on first use."""
        q = self.queues.get(name)
        if q is None:
            config = self._queue_config(name)
            q = self.queues[name] = QueueState(config, self._clock(), self._share, self.concurrency)
            if config.max_concurrent > self.concurrency:
                log.warning("queue %s: max_concurrent %d is above concurrency %d: it may take "
                            "every delivery slot of this node (limited to %d)", name,
                            config.max_concurrent, self.concurrency, q.limit)
        return q

    def view(self, name: str) -> QueueState:
        """The queue's state for reading; a look at an unknown queue creates nothing."""
        return self.queues.get(name) or QueueState(self._queue_config(name), self._clock(), 1,
                                                   self.concurrency)

    def queue_config(self, name: str) -> QueueConfig:
        """The queue's config for reading: its state's when it has one (no lookup on the
        delivery path), else the config's; a look at an unknown queue creates nothing."""
        q = self.queues.get(name)
        return q.config if q is not None else self._queue_config(name)

    def set_share(self, members: int) -> None:
        self._share = max(1, members)
        for q in self.queues.values():
            q.set_share(self._share)

    def submit(self, queue: str, task_id: str, host: str = "") -> None:
        """A due task for target ``host`` (``fairness.origin``) joins its queue's ready
        line. Copies cancelled or pushed back meanwhile stay in the line and are skipped
        by ``run``: removing them here would cost a pass over the line for every cancel."""
        self.queue(queue).ready.append(task_id, host)
        self._active[queue] = None
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
            wait = self.dispatch_ready()
            if wait == 0.0:
                gevent.sleep(0)
                continue
            self._wake.wait(wait)

    def dispatch_ready(self) -> float | None:
        """One pass of the pump: start what may start; return how long to wait (None:
        until woken). Tests drive it directly with a fake clock."""
        wait: float | None = None
        for name in list(self._active):
            q = self.queues[name]
            if not q.ready.startable():  # empty, or all its tasks wait for a full target
                del self._active[name]
                continue
            if q.paused:
                continue
            while q.inflight < q.limit:
                if self.busy >= self.concurrency:
                    return None  # a finishing delivery wakes us
                now = self._clock()
                if not q.bucket.take(now):
                    w = q.bucket.wait_time(now)
                    wait = w if wait is None else min(wait, w)
                    break
                pick = q.ready.take(self.hosts)
                if pick is None:  # every task it has waits for a full target
                    q.bucket.refund()  # (the token goes back: it spent no attempt)
                    if q.ready.startable():
                        wait = 0.0  # a long line is being set aside: yield, then go on
                    break
                task_id, host = pick
                del self._active[name]  # to the back of the turn order
                self._active[name] = None
                q.inflight += 1
                self.busy += 1
                self.hosts.take(host)
                self.group.spawn(self._deliver, q, task_id, host)
        return wait

    def _deliver(self, q: QueueState, task_id: str, host: str) -> None:
        try:
            if self._run(task_id) is False:  # not delivered (held, moved, ended)
                q.bucket.refund()
        except Exception:
            log.exception("dispatch: delivery of %s failed unexpectedly", task_id)
        finally:
            q.inflight -= 1
            self.busy -= 1
            for name in self.hosts.release(host):
                waiter = self.queues.get(name)
                if waiter is not None:
                    waiter.ready.wake(host)
                    self._active[name] = None
            self._wake.set()
