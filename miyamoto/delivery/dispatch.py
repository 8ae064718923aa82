"""Who may deliver now: per-queue token buckets and limits, per-target limits, one pool.

Due tasks wait in their queue's ready line. One pump greenlet moves them into a
bounded greenlet pool while their queue is not paused, has a token and is under its
limit, and their target is under ``max_per_host``; the pool bounds the node's
deliveries in flight. No queue and no target can take every slot (``fairness``): a
queue takes at most its share of the pool, a stuck target at most ``max_per_host``,
and a task whose target is full waits aside without holding up its queue.

The same set-aside serves two more gates: a target whose circuit breaker is open
(``breaker``; the engine reports each attempt's outcome through ``outcome``) and a full
flow-control key (``flow``). A gate that opens with time (a breaker's cooldown, a key's
next token) has a timer here; one that opens when a delivery ends is woken then. Among
a queue's tasks the highest priority goes first, with aging (``fairness``). Nothing
here knows HTTP: ``run(task_id)`` is the engine's. With ``begin``, the pump first
makes the non-blocking part of a delivery itself (``begin(task_id)``: the engine's
checks and its siblings' ASK) and spends a greenlet only on a task that goes, with
``run(begun)``: in a cluster every due copy first asks, and is started again once
answered, so that halves the greenlets per delivery.

A delivery runs on a *worker*: a greenlet bound to one target (``host``) that runs the
copies handed to it one after another, and waits parked between them, not a greenlet
per delivery. When its delivery ends, the worker makes the pump's pass itself (the
same ``dispatch_ready``: the same gates, turns and limits decide) and keeps the next
copy that pass starts for its own target, so a busy target's copies follow each other
on one greenlet with no switch between them (and, as the delivery client hands back
the connection checked in last, on one keep-alive connection); a copy for another
target goes to one of that target's parked workers, else to a new one. At most
``concurrency`` workers stay parked (the oldest is let go first). Measured under
``scripts/bench.py`` (one node, one sink): spawning a greenlet per delivery and
switching to the pump between deliveries was ~6 % of a node's CPU.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
from typing import Any, Callable

import gevent
import gevent.event
import gevent.pool
from gevent.hub import Waiter, get_hub

from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.breaker import Breakers, BreakerState, is_failure
from miyamoto.delivery.fairness import DEFAULT_PRIORITY, HostSlots, ReadyLine, queue_limit
from miyamoto.delivery.flow import Flow, FlowSpec, FlowTable
from miyamoto.delivery.ratelimit import TokenBucket
from miyamoto.delivery.stalls import INTERVAL, Stalls

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


class _Worker:
    """A delivery greenlet of one target: ``job`` is the copy it runs next (None:
    none), ``waiter`` what it waits on while parked."""

    __slots__ = ("host", "job", "waiter", "greenlet")

    def __init__(self, host: str, job: tuple):
        self.host = host
        self.job: tuple | None = job
        self.waiter: Waiter | None = None
        self.greenlet: Any = None


class Dispatcher:
    def __init__(self, run: Callable[[Any], bool | None], queue_config: Callable[[str], QueueConfig],
                 concurrency: int, clock: Callable[[], float] = time.time,
                 max_per_host: int | None = None, breaker_failures: int = 0,
                 breaker_cooldown: float = 30.0, begin: Callable[[str], Any] | None = None):
        self._run = run
        self._begin = begin
        self._queue_config = queue_config
        self._clock = clock
        self.concurrency = concurrency
        self.hosts = HostSlots(min(max_per_host or concurrency, concurrency))
        self.breakers = Breakers(breaker_failures, breaker_cooldown)
        self.stalls = Stalls(time.monotonic())  # ours: their failures are not the target's
        self._told_stall = float("-inf")  # the stall whose forgiven failures were logged
        self.flows = FlowTable()
        self.busy = 0  # deliveries in flight; counted here, not read off the pool, so a
        #               finishing delivery's wake-up always sees its slot free
        self.group = gevent.pool.Group()
        self.queues: dict[str, QueueState] = {}
        # queues with ready tasks, in turn order: a queue that started a task goes to the
        # back, so slots freed one at a time (a full pool, a full target) go round the
        # queues that wait for them instead of always to the same one
        self._active: dict[str, None] = {}
        self._share = 1
        # gates that open at a time (an open breaker, a flow key's next token): a heap of
        # (time, gate), one entry per gate (``_timer_at``), popped by the pump when due
        self._timers: list[tuple[float, str]] = []
        self._timer_at: dict[str, float] = {}
        self._now = 0.0  # the clock, read once per pump pass for every gate check
        self._wake = gevent.event.Event()
        self._greenlet: gevent.Greenlet | None = None
        self._watch: gevent.Greenlet | None = None
        self._stopping = False
        self._hub = get_hub()
        # parked workers: per target, the last parked last (it is woken first, so the
        # others age out), and all of them oldest first (the cap lets the oldest go)
        self._parked: dict[str, list[_Worker]] = {}
        self._idle: collections.OrderedDict[_Worker, None] = collections.OrderedDict()
        self._inline: _Worker | None = None  # the worker making a pass (``_refill``)

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

    def forget(self, name: str) -> None:
        """Drop an expired queue's state, unless it still has a task waiting or running."""
        q = self.queues.get(name)
        if q is not None and not q.inflight and not len(q.ready) and name not in self._active:
            del self.queues[name]

    def view(self, name: str) -> QueueState:
        """The queue's state for reading; a look at an unknown queue creates nothing."""
        return self.queues.get(name) or QueueState(self._queue_config(name), self._clock(), 1,
                                                   self.concurrency)

    def summary(self, name: str) -> tuple[QueueConfig, bool, int]:
        """(config, paused, limit) of a queue for reading, creating nothing and building
        no state: GET /queues reads a thousand of them."""
        q = self.queues.get(name)
        if q is not None:
            return q.config, q.paused, q.limit
        config = self._queue_config(name)
        return config, config.paused, queue_limit(config, self.concurrency)

    def queue_config(self, name: str) -> QueueConfig:
        """The queue's config for reading: its state's when it has one (no lookup on the
        delivery path), else the config's; a look at an unknown queue creates nothing."""
        q = self.queues.get(name)
        return q.config if q is not None else self._queue_config(name)

    def reconfigure(self, name: str) -> None:
        """The queue's settings changed (through the API): its bucket and limit follow at
        once. Its pause is set apart (``pause``): a change of settings is no resume."""
        q = self.queues.get(name)
        if q is None:
            return
        q.config = self._queue_config(name)
        q.set_share(self._share)
        q.limit = queue_limit(q.config, self.concurrency)
        self._wake.set()

    def set_share(self, members: int) -> None:
        self._share = max(1, members)
        for q in self.queues.values():
            q.set_share(self._share)
        self.flows.set_share(self._share)

    def submit(self, queue: str, task_id: str, host: str = "",
               priority: int = DEFAULT_PRIORITY, flow: FlowSpec | None = None) -> None:
        """A due task for target ``host`` (``fairness.origin``) joins its queue's ready
        line. Copies cancelled or pushed back meanwhile stay in the line and are skipped
        by ``run``: removing them here would cost a pass over the line for every cancel.
        ``flow``: the task's flow-control key and limits (the last seen set the key's)."""
        now = self._clock()
        if flow is not None:
            self.flows.configure(flow, now)
        self.queue(queue).ready.append(task_id, host, priority, now, flow)
        self._active[queue] = None
        self._wake.set()

    def outcome(self, host: str, status: int | None, began: float | None = None) -> None:
        """An attempt to ``host`` begun at ``began`` (monotonic) ended with ``status``
        (None: no HTTP answer): the target's breaker hears it, but not of an attempt
        with no answer that ran across a stall of this node's own (``stalls``)."""
        if status is None and began is not None and self.stalls.spanned(began, time.monotonic()):
            self.stalls.forgiven += 1
            if self._told_stall != self.stalls.ended:
                self._told_stall = self.stalls.ended
                log.info("breaker %s: attempts in flight across this node's own %.1f s "
                         "pause are not counted against their targets", host, self.stalls.length)
            return
        self.breakers.record(host, is_failure(status), self._clock())

    def targets(self) -> list[dict[str, Any]]:
        """GET /targets: the origins attempted recently, with breaker and slots."""
        out = []
        for host, b in self.breakers.items():
            out.append({"origin": host, "state": b.state.value, "failures": b.failures,
                        "inflight": self.hosts.busy.get(host, 0),
                        "retry_at": b.retry_at if b.state is BreakerState.OPEN else None})
        return out

    def pause(self, queue: str, paused: bool) -> None:
        self.queue(queue).paused = paused
        self._wake.set()

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._pump)
        self._watch = gevent.spawn(self._watch_stalls)

    def stop(self, timeout: float) -> None:
        """Stop starting deliveries; give those in flight ``timeout`` seconds, then kill."""
        self._stopping = True
        if self._greenlet is not None:
            self._greenlet.kill()
        if self._watch is not None:
            self._watch.kill()
        while self._idle:  # parked workers end (they run nothing more)
            self._unpark(next(iter(self._idle)))
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

    def _watch_stalls(self) -> None:
        while not self._stopping:
            self.stalls.note(time.monotonic())
            gevent.sleep(INTERVAL)

    def dispatch_ready(self) -> float | None:
        """One pass of the pump: start what may start; return how long to wait (None:
        until woken). Tests drive it directly with a fake clock."""
        self._now = now = self._clock()
        self._fire_timers(now)
        wait = self._start_ready()
        if self._timers:
            t = max(0.0, self._timers[0][0] - now)
            wait = t if wait is None else min(wait, t)
        return wait

    def _start_ready(self) -> float | None:
        wait: float | None = None
        for name in list(self._active):
            q = self.queues[name]
            if not q.ready.startable():  # empty, or all its tasks wait for a gate
                del self._active[name]
                continue
            if q.paused:
                continue
            while q.inflight < q.limit:
                if self.busy >= self.concurrency:
                    return None  # a finishing delivery wakes us
                now = self._now = self._clock()
                if not q.bucket.take(now):
                    w = q.bucket.wait_time(now)
                    wait = w if wait is None else min(wait, w)
                    break
                entry = q.ready.pick(self.hosts, self._gate)
                if entry is None:  # every task it has waits for a gate
                    q.bucket.refund()  # (the token goes back: it spent no attempt)
                    if q.ready.startable():
                        wait = 0.0  # a long line is being set aside: yield, then go on
                    break
                del self._active[name]  # to the back of the turn order
                self._active[name] = None
                self._start(q, entry[2], entry[3], entry[4])
        return wait

    def _start(self, q: QueueState, task_id: str, host: str, spec: FlowSpec | None) -> None:
        begun: Any = task_id
        if self._begin is not None:
            try:
                begun = self._begin(task_id)
            except Exception:
                log.exception("dispatch: delivery of %s failed unexpectedly", task_id)
                begun = None
            if begun is None:  # not delivered now (held, asking its siblings, ended)
                q.bucket.refund()
                return
        q.inflight += 1
        self.busy += 1
        self.hosts.take(host)
        probe = self.breakers.started(host)
        flow = None
        if spec is not None:
            flow = self.flows.flow(spec, self._now)
            flow.bucket.take(self._now)
            flow.inflight += 1
        self._hand(host, (q, begun, host, probe, spec, flow))

    def _hand(self, host: str, job: tuple) -> None:
        """Give a started copy to a worker of its target: the one making this pass, if
        it is that target's and has nothing next; else a parked one; else a new one."""
        w = self._inline
        if w is not None and w.job is None and w.host == host \
                and gevent.getcurrent() is w.greenlet:
            w.job = job
            return
        parked = self._parked.get(host)
        if parked:
            w = parked[-1]
            self._unpark(w)
            w.job = job
            return
        w = _Worker(host, job)
        w.greenlet = self.group.spawn(self._work, w)

    def _unpark(self, w: _Worker) -> None:
        """Take ``w`` off the parked lists and wake it (with no job, it ends)."""
        parked = self._parked[w.host]
        if parked[-1] is w:  # (the one woken for a copy: the last parked)
            parked.pop()
        else:
            parked.remove(w)
        if not parked:
            del self._parked[w.host]
        del self._idle[w]
        assert w.waiter is not None
        self._hub.loop.run_callback(w.waiter.switch, None)

    def _work(self, w: _Worker) -> None:
        """A worker's life: its copies one after another, parked between them."""
        while w.job is not None:
            job, w.job = w.job, None
            self._deliver(*job)
            self._refill(w)
            if w.job is None:
                self._park(w)

    def _refill(self, w: _Worker) -> None:
        """After a delivery: the pump's pass, made here (its copy for ``w``'s target
        stays with ``w``); the pump is woken only if something waits on time. A
        dispatcher not started makes no pass of its own (tests make each one)."""
        if self._stopping or self._greenlet is None:
            return
        self._inline = w
        try:
            wait = self.dispatch_ready()
        except Exception:
            log.exception("dispatch: a pass after a delivery failed unexpectedly")
            wait = 0.0
        finally:
            self._inline = None
        if wait is not None:
            self._wake.set()

    def _park(self, w: _Worker) -> None:
        """Wait for the next copy of ``w``'s target (none: the worker ends)."""
        if self._stopping:
            return
        if len(self._idle) >= self.concurrency:
            self._unpark(next(iter(self._idle)))
        self._parked.setdefault(w.host, []).append(w)
        self._idle[w] = None
        w.waiter = Waiter(self._hub)
        try:
            w.waiter.get()
        except BaseException:  # killed while parked: never handed a copy again
            if w in self._idle:
                self._parked[w.host].remove(w)
                if not self._parked[w.host]:
                    del self._parked[w.host]
                del self._idle[w]
            raise
        finally:
            w.waiter = None

    def _gate(self, host: str, spec: FlowSpec | None) -> str | None:
        """What keeps a task for ``host`` (and flow key ``spec``) from starting now: the
        gate it waits on (the host for a full target or an open breaker, the key's gate
        for a full key), or None. A gate that opens with time gets a timer."""
        if self.hosts.busy.get(host, 0) >= self.hosts.limit:
            return host
        until = self.breakers.blocked_until(host, self._now)
        if until is not None:
            self._timer(host, until)
            return host
        if spec is not None:
            until = self.flows.flow(spec, self._now).blocked_until(self._now)
            if until is not None:
                self._timer(spec.gate, until)
                return spec.gate
        return None

    def _timer(self, gate: str, at: float) -> None:
        """Wake the queues waiting on ``gate`` at ``at`` (inf: a delivery's end does)."""
        if at == float("inf"):
            return
        prev = self._timer_at.get(gate)
        if prev is None or at < prev:
            self._timer_at[gate] = at
            heapq.heappush(self._timers, (at, gate))

    def _fire_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, gate = heapq.heappop(timers)
            if self._timer_at.get(gate) == at:
                del self._timer_at[gate]
                self._wake_waiters(self.hosts.opened(gate), gate)

    def _wake_waiters(self, names: Any, gate: str) -> None:
        for name in names:
            waiter = self.queues.get(name)
            if waiter is not None:
                waiter.ready.wake(gate)
                self._active[name] = None

    def _deliver(self, q: QueueState, begun: Any, host: str, probe: bool,
                 spec: FlowSpec | None, flow: Flow | None) -> None:
        try:
            if self._run(begun) is False:  # not delivered (held, moved, ended)
                q.bucket.refund()
                if flow is not None:
                    flow.bucket.refund()
        except Exception:
            log.exception("dispatch: a delivery failed unexpectedly")
        finally:
            q.inflight -= 1
            self.busy -= 1
            if probe:
                self.breakers.ended(host)
            self._wake_waiters(self.hosts.release(host), host)
            if flow is not None and spec is not None:
                flow.inflight -= 1
                self._wake_waiters(self.hosts.opened(spec.gate), spec.gate)
