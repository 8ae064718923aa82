"""A node's own copies of tasks, from stored to ended.

The engine owns the live tasks (scheduled or running) in memory, the scheduler that
times them, the dispatcher that runs them, and the journal that makes every change
durable. What an attempt's outcome means (success, a retry at a time, the final
failure) is ruled by the pure ``retry.decide``; the engine carries it out. What
clients do to a copy (cancel, delete, rerun, purge, pause) and what they read of
them (counts, lists) go through the same class, since every such change must keep
memory, the scheduler and the journal in step just as a delivery does. It knows
nothing of the cluster: the replication layer hands it, when it is built,
``Hooks`` (tell the sibling replicas) and ``spawn_task`` (where callback tasks go).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

import gevent
import gevent.event
import gevent.pool
import ujson

from miyamoto.config.settings import Config, QueueConfig
from miyamoto.delivery import completion
from miyamoto.delivery.attempt import Outcome, build_request
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.delivery.egress import egress_of
from miyamoto.delivery.fairness import origin
from miyamoto.delivery.flow import spec_of
from miyamoto.delivery.httpclient import HTTPClient
from miyamoto.delivery.identity import Identity
from miyamoto.delivery.retry import ACCEPTED_STATUS, Action, Decision, decide, is_success, reported
from miyamoto.delivery.targets import TargetGuard
from miyamoto.delivery.types import DeliveryError
from miyamoto.engine import browse
from miyamoto.engine.history import Latency, Rates
from miyamoto.engine.expiry import Expiries, copy_expiry
from miyamoto.engine.pull import PullPool, Taken
from miyamoto.engine.ordering import Lines
from miyamoto.engine.queues import Queues
from miyamoto.engine.scheduler import Scheduler
from miyamoto.engine.window import Window
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.metrics import Metrics
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import CLOUDTASKS, State, Task, add_attempt, new_id
from miyamoto.tracing import traces

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 60.0
_SCHEDULED, _RUNNING = State.SCHEDULED.value, State.RUNNING.value  # an Enum's .value: ~1 us
_LIVE = (_SCHEDULED, _RUNNING)
NAMES_MAX = 100_000  # name reservations remembered in memory; the journal has them all
PURGE_PAGE = 1000  # copies cancelled per journal read of a purge


class Hooks:
    """What the engine tells the rest of the cluster; a single node tells nobody."""

    def claim(self, task: Task) -> bool:
        """About to deliver; False vetoes it (the copy was already dealt with)."""
        return True

    def may_expire(self, task: Task) -> bool:
        """Its expiry came while it waits: False if a sibling may be delivering it (the
        hooks pushed it back past that sibling's claim)."""
        return True

    def done(self, task: Task) -> None: ...
    def accepted(self, task: Task, lease: float) -> None:
        """A long task's worker holds it ``lease`` more seconds (its 202, a heartbeat)."""
    def retried(self, task: Task) -> None: ...
    def failed(self, task: Task) -> None: ...

    def paged(self, task_ids: list[str]) -> None:
        """Copies read from the journal, written before ``live.ask_mark``: they ask first."""


QUEUE_TARGETS = 4  # target origins remembered per queue (Stats.targets)


@dataclass
class Stats:
    stored: int = 0
    attempts: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    expired: int = 0  # copies this node ended as expired (one per task: the first tells)
    # per queue since this node started: first copies stored, deliveries, final failures;
    # GET /queues sums them over the cluster ("totals") and the dashboard turns the
    # differences of successive reads into rates (the state counts cannot: they shrink
    # when tasks are deleted, retried or swept)
    totals: dict[str, dict[str, int]] = field(default_factory=dict)
    # the same events per second over the last hour, and the queues' latencies
    # (engine.history): what the console's chart and queue table show on load
    rates: Rates = field(default_factory=Rates)
    latency: Latency = field(default_factory=Latency)
    # per queue, the target origins of its latest attempts (a few): the console shows
    # their breakers next to the queue
    targets: dict[str, dict[str, None]] = field(default_factory=dict)

    def count(self, queue: str, what: str, now: float) -> None:
        c = self.totals.setdefault(queue, {"enqueued": 0, "delivered": 0, "failed": 0})
        c[what] += 1
        self.rates.add(what, now)

    def attempted(self, queue: str, target: str) -> None:
        seen = self.targets.setdefault(queue, {})
        if target not in seen:
            seen[target] = None
            if len(seen) > QUEUE_TARGETS:
                del seen[next(iter(seen))]

    def forget(self, queue: str) -> None:
        self.totals.pop(queue, None)
        self.latency.forget(queue)
        self.targets.pop(queue, None)


class Engine:
    """Every change to this node's copies: storing, delivering, a sibling's news and
    a client's operations, each made in memory and in the journal together."""

    def __init__(self, config: Config, journal: Journal,
                 client: HTTPClient | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 hooks: Hooks | None = None, spawn_task: Callable[[Task], None] | None = None,
                 metrics: Metrics | None = None, identity: Identity | None = None):
        self.config = config
        # the deliveries' signing keys and OIDC tokens (the node shares its one with the API)
        self.identity = identity or Identity.from_config(config)
        self.metrics = metrics or Metrics()  # per-attempt observations (/metrics)
        self.journal = journal
        # The target rules the delivery client enforces at connect: the node builds them
        # with its own endpoints, the cluster adds the members', and the API checks
        # enqueued URLs against the same guard (a client without one gets the config's).
        self.targets = getattr(client, "guard", None) or TargetGuard.from_config(config)
        self.client = client or HTTPClient(concurrency=min(config.concurrency, 256),
                                            guard=self.targets)
        self.clock = clock
        self.rng = rng or random.Random()
        self.scheduler = Scheduler(self._due, clock)
        # every live copy by id; in memory only those due within the window
        self.hooks = hooks or Hooks()
        self.live = Window(journal, self.scheduler, config.memory_window, clock,
                           on_paged=self.hooks.paged)
        # recent name reservations (a bounded cache of the journal's names table)
        self.names: collections.OrderedDict[tuple[str, str], tuple[str, float]] = \
            collections.OrderedDict()
        # queue settings made through the API (checked), by queue: over the config's
        self._api: dict[str, dict[str, Any]] = {}
        self._resolved: dict[str, QueueConfig] = {}  # the queues with API settings, resolved
        self.dispatcher = Dispatcher(self._attempt, self._queue_settings, config.concurrency,
                                     clock, max_per_host=config.max_per_host,
                                     breaker_failures=config.breaker_failures,
                                     breaker_cooldown=config.breaker_cooldown,
                                     begin=self._begin)
        self.spawn_task: Callable[[Task], None] = spawn_task or self._spawn_local
        self.queues = Queues(config.queues, config.max_queues, config.auto_create_queues,
                             config.queue_idle_expiry)
        self.stats = Stats()
        self.expiries = Expiries()  # due copies with an expires_at, waiting to start
        self.lines = Lines(self._blocks)  # the ordering keys' lines of this node's copies
        # signs and checks long tasks' completion tokens (never logged)
        self.completion_key = completion.key_of(config.completion_secret, config.signing_secret,
                                                 config.curve_secret)
        self.pull = PullPool()  # pull queues' due copies, waiting for a lease
        self._expiry_wake = gevent.event.Event()
        self._group = gevent.pool.Group()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load the copies due within the window (and those that were running), not the
        backlog: the pager reads the rest as it comes due."""
        running, paused = self.journal.load_running()
        for t in self.journal.load_ordered():  # every key's line, whatever its fire times
            self.lines.note(t.evolve(state=State.SCHEDULED) if t.state == State.RUNNING
                            else t, keep_failed=True)
        self.live.ask_mark = self.journal.last_rowid()  # what the last run wrote
        self.live.fill()
        now = self.clock()
        for t in running:  # it was being delivered when we died: deliver again
            if t.id in self.live.mem:
                continue
            if t.accepted and t.fire_at > now:  # a worker holds it (a 202, a pull lease):
                self.live[t.id] = t  # its token still reports, or its lease runs out
            else:
                self.live[t.id] = t.evolve(state=State.SCHEDULED, fire_at=now)
        for queue, is_paused in paused.items():
            self.dispatcher.pause(queue, is_paused)
            self.queues.note(queue, now)
        for queue in self.journal.counts():  # what the journal holds keeps its queue
            self.queues.note(queue, now)
        if self.live.mem:
            log.info("engine: reloaded %d tasks due within %g s", len(self.live.mem),
                     self.live.span)
        self.scheduler.start()
        self.dispatcher.start()
        self._group.spawn(self._sweep_loop)
        self._group.spawn(self._expiry_loop)
        self._group.spawn(self.live.run)

    def stop(self, timeout: float) -> None:
        """Stop timing and starting tasks; let deliveries in flight finish within timeout."""
        self.scheduler.stop()
        self._group.kill()
        self.dispatcher.stop(timeout)
        self.client.close()

    def _sweep_loop(self) -> None:
        period = min(SWEEP_INTERVAL, max(1.0, self.config.retention))
        if self.config.queue_idle_expiry > 0:
            period = min(period, max(1.0, self.config.queue_idle_expiry / 2))
        while True:
            gevent.sleep(period)
            now = self.clock()
            try:
                self.expire_queues(now)
            except Exception:
                log.exception("engine: queue expiry failed")
            try:
                removed = self.journal.sweep(now, self.config.retention)
            except Exception:
                log.exception("engine: journal sweep failed")
                continue
            for key in [k for k, v in self.names.items() if v[1] <= now]:
                del self.names[key]
            self._forget_swept_blockers()
            # Swept names: a lookup finds none in the journal
            if removed:
                log.debug("engine: swept %d expired records", removed)

    def expire_queues(self, now: float) -> list[str]:
        """Forget the idle auto-created queues that hold nothing: no live or failed copy
        here, not paused, no delivery waiting or in flight (``queues.Queues.expire``)."""
        busy = {q for q, c in self.journal.counts().items()
                if any(c.get(s.value) for s in (State.SCHEDULED, State.RUNNING, State.FAILED))}
        busy.update(n for n, q in self.dispatcher.queues.items()
                    if q.paused or q.inflight or len(q.ready))
        gone = self.queues.expire(now, busy)
        for name in gone:
            self.dispatcher.forget(name)
            self.stats.forget(name)
        if gone:
            log.info("engine: %d idle queues expired (queue_idle_expiry %g s), e.g. %s",
                     len(gone), self.config.queue_idle_expiry, gone[0])
        return gone

    def queue_config(self, name: str) -> QueueConfig:
        """The queue's config; reading it creates no queue state (GET /queues lists
        the queues that have state, so a read must not make one appear)."""
        return self.dispatcher.queue_config(name)

    def api_settings(self, name: str) -> dict[str, Any] | None:
        """What the API set for the queue (PUT /queues/<name>), as in effect here."""
        return self._api.get(name)

    def set_queue_settings(self, settings: dict[str, dict[str, Any]]) -> list[str]:
        """The queue settings the API made, every queue's (checked), replacing the last
        ones: each overrides its config's field by field, in effect at once (the
        bucket, the limit, retries and timeouts of attempts that start from now), and
        the queues they name exist. Returns the queues whose settings changed; pausing
        is the caller's (a resume restaggers copies: ``cluster.queries``)."""
        changed = sorted(n for n in set(settings) | set(self._api)
                         if settings.get(n) != self._api.get(n))
        self._api = {n: dict(v) for n, v in settings.items()}
        self._resolved = {}
        self.queues.define(self._api, self.clock())
        for name in changed:
            self.dispatcher.reconfigure(name)
            if not self.is_pull(name):  # a pull queue made push: its waiting copies go
                for task_id in self.pull.drain(name):
                    self._due(task_id)
        for name in self.lines.queues():  # failed copies in a queue that does not block
            if not self._blocks(name):    # (no more, or read back at a start) leave
                self._wake_ordered(self.lines.release_failed(name))
        return changed

    def is_pull(self, name: str) -> bool:
        """A pull queue's tasks are leased by workers (``lease``), never POSTed."""
        return self._queue_settings(name).mode == "pull"

    def _queue_settings(self, name: str) -> QueueConfig:
        """The config's settings of the queue, overridden by the API's (resolved once:
        GET /queues reads a thousand, and dataclasses.replace costs ~20 us)."""
        api = self._api.get(name)
        if not api:
            return self.config.queue(name)
        q = self._resolved.get(name)
        if q is None:
            q = self._resolved[name] = dataclasses.replace(self.config.queue(name), **api)
        return q

    # ------------------------------------------------------------ storing
    def name_holder(self, queue: str, name: str) -> tuple[str, float] | None:
        """(id, expiry) of the reservation of ``name``: memory's recent ones, else the
        journal's index (the names of tasks outside the window are only there)."""
        held = self.names.get((queue, name))
        return held if held is not None else self.journal.name_holder(queue, name)

    def check_name(self, task: Task, held: tuple[str, float] | None = None) -> None:
        if task.name is None:
            return
        if held is None:
            held = self.name_holder(task.queue, task.name)
        if held is not None and held[1] > self.clock() and held[0] != task.id:
            raise Duplicate(held[0])

    def _reserve(self, key: tuple[str, str], held: tuple[str, float]) -> None:
        self.names[key] = held
        self.names.move_to_end(key)
        while len(self.names) > NAMES_MAX:
            self.names.popitem(last=False)  # the journal has it (or it is still pending there)

    def add(self, task: Task, *, wait: bool = True, hold: bool = False) -> Task:
        """Store a new copy (durably when wait) and time it; Duplicate if the name is
        taken. ``hold``: store it but do not time it until ``release`` (an enqueue that
        still waits for other replicas may yet be refused)."""
        admitted = self.admit(task)
        if admitted is not task:
            return admitted  # a repeated STORE of the same copy
        if wait:
            self.settle([task], hold)
        else:
            self._settled(task, hold)
        return task

    def admit(self, task: Task) -> Task:
        """The first half of ``add``, which does not block: the copy, checked, is handed
        to the journal (its name reserved) but not committed, and not live until
        ``settle`` (news about it waits, but an ASK finds it among the journal's pending
        writes). Returns the copy held already instead, if this one is a repeat."""
        existing = self.live.mem.get(task.id)
        if existing is None and not self.live.holds(task):
            existing = self.live.get(task.id)  # beyond the window: only the journal knows
        if existing is not None:
            return existing  # a repeated STORE of the same copy
        self.queues.note(task.queue, self.clock())  # the enqueue's node judged the cap
        self.check_name(task)  # may read the journal: then look again at memory's names
        if task.name is not None and (task.queue, task.name) in self.names:
            self.check_name(task, self.names[(task.queue, task.name)])
        expires = self._name_expiry(task)
        if expires is not None:
            self._reserve((task.queue, task.name), (task.id, expires))  # type: ignore[arg-type]
        self.live.storing.add(task.id)
        try:
            self.journal.put(task, name_expires=expires)
        except Exception as e:
            self._refused(task, e)
        return task

    def settle(self, tasks: list[Task], hold: bool = False) -> None:
        """The second half: one commit for every copy ``admit`` took, then each is live.
        Unavailable (every one withdrawn) if the journal could not commit them."""
        start = time.time_ns() if traces.on else 0
        try:
            self.journal.flush()
        except Exception as e:
            for t in tasks[1:]:
                self._withdraw(t)
            self._refused(tasks[0], e)
        for t in tasks:
            self._settled(t, hold)
        if traces.on:
            traces.stored(tasks, self.config.node, start)

    def _name_expiry(self, task: Task) -> float | None:
        """A name is held for dedup_window from the enqueue; a Cloud Tasks task's from
        its schedule time if later, as Cloud Tasks holds a name while its task waits (a
        task due tomorrow is still found, and not made twice, by its name)."""
        if task.name is None:
            return None
        start = max(task.created, task.eta) if task.face == CLOUDTASKS else task.created
        return start + self.config.dedup_window

    def _withdraw(self, task: Task) -> None:
        """A copy the journal refused: its name released, its record never committed."""
        if task.name is not None:
            self.names.pop((task.queue, task.name), None)
        # the caller hears "not stored": the record must not be committed later
        self.journal.withdraw(task)
        self.live.storing.discard(task.id)

    def _refused(self, task: Task, e: Exception) -> NoReturn:
        self._withdraw(task)
        # debug: the journal logs why it cannot write once, not once per refused task
        log.debug("task %s not stored: journal write failed: %s", task.id, e)
        raise Unavailable("the journal could not store the task") from e

    def _settled(self, task: Task, hold: bool) -> None:
        self.live.storing.discard(task.id)
        if hold:
            self.live.pin(task)
        else:
            self.live[task.id] = task  # timed if due within the window, else journal only
        self._order(task)
        self.stats.stored += 1
        if task.replica == 0:
            self.stats.count(task.queue, "enqueued", self.clock())

    def release(self, task_id: str) -> None:
        """Time a copy stored with ``hold`` (or leave it to the journal, if due later)."""
        self.live.release(task_id)

    def _spawn_local(self, task: Task) -> None:
        self.add(task, wait=False)

    # ------------------------------------------------------------ running
    def _due(self, task_id: str) -> None:
        t = self.live.mem.get(task_id)
        if t is not None and t.accepted and t.state == State.RUNNING:
            if t.fire_at <= self.clock() + 0.001:  # its lease ran out: a failed attempt
                log.info("task %s: the lease of attempt %d ran out", t.id, t.accepted)
                self._report(t, Outcome(ok=False, error="the worker's lease ran out",
                                        at=self.clock(), start=self.clock(),
                                        node=self.config.node))
            return
        if t is not None and t.state == State.SCHEDULED:
            if t.expires_at is not None and self._expires(t):
                return
            if t.ordering_key is not None and not self.lines.may_start(t):
                return  # it waits behind its key's line: woken when its turn comes
            if self.is_pull(t.queue):
                self.pull.add(t.queue, task_id, t.priority, t.fire_at)
                return
            self.dispatcher.submit(t.queue, task_id, origin(t.url), t.priority, spec_of(t))

    # ------------------------------------------------------------ expiry
    def _expires(self, t: Task) -> bool:
        """True if due copy ``t`` has expired (it is ended); else its expiry is noted,
        so that it ends then if it still waits (a pause, a limit, a breaker, a key)."""
        at = copy_expiry(t, self.config.replica_offset)
        if at is None:
            return False
        if at <= self.clock():
            if self.hooks.may_expire(t):
                self._expire(t)
            return True  # ended, or pushed back past a sibling's claim: timed again
        if self.expiries.add(t.id, at):
            self._expiry_wake.set()  # the earliest now: the loop's wait is too long
        return False

    def _expiry_loop(self) -> None:
        while True:
            at = self.expiries.next_at()
            self._expiry_wake.wait(None if at is None else max(0.0, at - self.clock()))
            self._expiry_wake.clear()
            try:
                self.expire_due(self.clock())
            except Exception:
                log.exception("engine: task expiry failed")

    def expire_due(self, now: float) -> int:
        """End the waiting copies whose expiry has come; returns how many. A copy pushed
        back meanwhile (a sibling's claim: it may be delivering) is judged when due."""
        n = 0
        for task_id in self.expiries.pop_due(now):
            t = self.live.mem.get(task_id)
            if t is not None and t.state == State.SCHEDULED and t.fire_at <= now \
                    and self.hooks.may_expire(t):
                self._expire(t)
                n += 1
        return n

    def _expire(self, t: Task) -> None:
        self.expiries.discard(t.id)
        t = t.evolve(state=State.EXPIRED, finished=self.clock())
        self._end(t)
        self._expired(t)

    def _expired(self, t: Task) -> None:
        """Copy ``t`` ended as expired here: counted, the siblings told (their copies
        end as expired: FAILED news), the failure_callback called, like a failure."""
        self.stats.expired += 1
        log.info("task %s expired (not started by %s, after %d attempts)", t.id,
                 t.expires_at, t.attempts)
        self.hooks.failed(t)
        if t.failure_callback:
            self._callback(t, t.failure_callback)

    def _begin(self, task_id: str,
               pulled: float | None = None) -> tuple[Task, float, float | None] | None:
        """The part of a delivery that does not block (the dispatcher calls it before it
        spends a greenlet; ``lease`` with ``pulled``, the lease's span, which the
        siblings' holds must cover): may the copy go now? Its siblings are asked (their
        answers time it again), or it is marked running: (copy, start, first-attempt
        delay)."""
        t = self.live.mem.get(task_id)
        if t is None or t.state != State.SCHEDULED:
            return None
        if pulled is None and self.is_pull(t.queue):  # made a pull queue while it waited
            self.pull.add(t.queue, task_id, t.priority, t.fire_at)
            return None
        if t.fire_at > self.clock() + 0.001:  # pushed back (a sibling's claim) while it waited
            self.scheduler.schedule(task_id, t.fire_at)
            return None
        if t.expires_at is not None and self._expires(t):  # it waited past its expiry
            return None
        if t.ordering_key is not None and not self.lines.may_start(t):
            return None  # another of its key went first: woken when its turn comes
        if not self.hooks.claim(t if pulled is None else t.evolve(lease=pulled)):
            return None  # the hooks rescheduled, ended or dropped the copy
        t = self.live.mem.get(task_id)
        now = self.clock()
        if t is None or t.state != State.SCHEDULED or t.fire_at > now + 0.001:
            return None  # changed while the claim was made; whoever changed it rescheduled it
        self.scheduler.cancel(task_id)
        first_delay = None if t.first_attempt else now - t.eta  # due to first attempt
        t = t.evolve(state=State.RUNNING, first_attempt=t.first_attempt or now)
        self.live[task_id] = t
        self._order(t)
        self.stats.attempts += 1
        log.debug("task %s: attempt %d, copy %d of %s", task_id, t.attempts + 1, t.replica,
                  ",".join(t.replicas))
        return t, now, first_delay

    def _attempt(self, begun: tuple[Task, float, float | None]) -> bool:
        """The HTTP attempt of a copy ``_begin`` marked running, and its outcome."""
        t, now, first_delay = begun
        started = time.monotonic()
        span = trace = None
        try:
            q = self.queue_config(t.queue)
            timeout = t.timeout or q.timeout
            if traces.on:  # the attempt's span; the target gets its traceparent
                span, trace = traces.attempt(t, t.method, self.config.node)
            secrets, ed25519 = self.identity.signing(q)
            method, url, headers, body = build_request(
                t, now, secrets, trace, self.config.qstash_current_signing_key, ed25519,
                self.identity.bearer(t, q, now))
            if t.lease is not None:  # a long task: where its worker reports
                headers.update(self._completion_headers(t, now))
            resp = self.client.request(method, url, body=body, headers=headers, timeout=timeout,
                                       egress=egress_of(q))
            outcome = Outcome(ok=is_success(resp.status), status=resp.status,
                              headers=resp.headers, body=resp.body, at=self.clock(),
                              start=now, node=self.config.node)
        except DeliveryError as e:
            outcome = Outcome(ok=False, error=str(e), at=self.clock(), start=now,
                              node=self.config.node)
        except Exception as e:  # never leave a copy RUNNING: a failed attempt is retried
            log.exception("task %s: attempt failed unexpectedly", t.id)
            outcome = Outcome(ok=False, error=f"{type(e).__name__}: {e}", at=self.clock(),
                              start=now, node=self.config.node)
        if span is not None:
            traces.attempted(span, outcome.status, outcome.error)
        target = origin(t.url)
        self.dispatcher.outcome(target, outcome.status, started)  # the target's breaker
        self.stats.attempted(t.queue, target)
        action = self.finish(t.id, outcome)
        self.metrics.attempt(t.queue, outcome.status, action.value if action else "record",
                             time.monotonic() - started, first_delay)
        return True

    def _completion_headers(self, t: Task, now: float) -> dict[str, str]:
        """The URLs of attempt ``t.attempts + 1``: its token lets the worker report (and
        heartbeat) for this attempt only, for a lease's longest span after it."""
        token = completion.mint(self.completion_key, t.id, t.reruns, t.attempts + 1,
                                now + completion.TOKEN_LIFETIME)
        base = self.config.public_base
        return {"X-Task-Complete-Url": completion.url(base, t.id, token),
                "X-Task-Heartbeat-Url": completion.url(base, t.id, token, "heartbeat"),
                "X-Task-Lease": f"{t.lease:g}"}

    def finish(self, task_id: str, outcome: Outcome) -> Action | None:
        """Record an attempt's outcome: carry out what ``retry.decide`` rules for it."""
        t = self.live.get(task_id)
        if t is None:
            return None
        return self._carry_out(
            decide(t, outcome, self.queue_config(t.queue), self.clock(), self.rng), outcome)

    def _report(self, t: Task, outcome: Outcome) -> Action:
        """The end of long task ``t``'s accepted attempt (a report, or its lease's end)."""
        return self._carry_out(
            reported(t, outcome, self.queue_config(t.queue), self.clock(), self.rng), outcome)

    def _carry_out(self, decision: Decision, outcome: Outcome) -> Action:
        t = decision.task
        task_id = t.id
        if decision.action is Action.ACCEPTED:
            self.journal.put(t)
            self.live[task_id] = t  # timed to its lease's end
            self.hooks.accepted(t, t.fire_at - self.clock())
        elif decision.action is Action.RECORD:  # it ended while this attempt ran
            self._end(t)
        elif decision.action is Action.SUCCEEDED:
            self._end(t)
            self.stats.succeeded += 1
            now = self.clock()
            self.stats.count(t.queue, "delivered", now)
            if not t.reruns:  # a rerun's eta is long past: not a latency
                self.stats.latency.add(t.queue, now - t.eta, now)
            self.hooks.done(t)
            if t.callback:
                self._callback(t, t.callback)
        elif decision.action is Action.FAILED:
            self._end(t)
            self.stats.failed += 1
            self.stats.count(t.queue, "failed", self.clock())
            log.info("task %s failed after %d attempts (last: %s)", t.id, t.attempts,
                     outcome.status or outcome.error)
            self.hooks.failed(t)
            if t.failure_callback:
                self._callback(t, t.failure_callback)
        elif decision.action is Action.EXPIRED:  # its retry would start too late
            self._end(t)
            self._expired(t)
        else:
            self.journal.put(t)
            self.live[task_id] = t  # a retry due beyond the window leaves memory
            self._order(t)  # still its key's head: the next waits for its retries
            self.stats.retried += 1
            self.hooks.retried(t)
        return decision.action

    def complete(self, grant: completion.Grant, report: completion.Report) -> Task:
        """A long task's worker reports the outcome of its accepted attempt; Conflict
        when that attempt is over (reported, its lease ran out, the task ended)."""
        t = self._accepted(grant)
        now = self.clock()
        ok = report.state == "succeeded"
        body = b"" if report.result is None else ujson.dumps(report.result).encode()
        self._report(t, Outcome(ok=ok, status=ACCEPTED_STATUS, body=body, at=now, start=now,
                                error=None if ok else "the worker reported failure",
                                node=self.config.node))
        return self.live.get(t.id) or self.journal.get(t.id) or t

    def heartbeat(self, grant: completion.Grant, lease: float | None) -> Task:
        """Extend a long task's lease from now (its own ``lease`` unless given); the
        siblings are claimed again so that their copies keep waiting."""
        t = self._accepted(grant)
        lease = lease or t.lease or completion.LEASE_FALLBACK
        t = t.evolve(fire_at=self.clock() + lease)
        self.journal.put(t)
        self.live[t.id] = t
        self.hooks.accepted(t, lease)
        return t

    # ------------------------------------------------------------ pull queues
    def lease(self, queue: str, max_tasks: int, lease_s: float) -> Taken:
        """Up to ``max_tasks`` of the pull queue's due copies, each leased for
        ``lease_s``: an attempt that the siblings let go (``Hooks.claim``, as a delivery
        asks) and that is accepted at once, as a long task's 202 is (``Hooks.accepted``
        claims the lease from the siblings; its end is a failed attempt): (copy, token)
        pairs, and the copies whose siblings are being asked (they come back to the pool
        when answered). Nothing while the queue is paused."""
        taken = Taken()
        out = taken.leased
        if self.dispatcher.view(queue).paused:
            return taken
        q = self.queue_config(queue)
        tried = 0
        while len(out) < max_tasks and tried < 4 * max_tasks + 16:
            task_id = self.pull.take(queue)
            if task_id is None:
                break
            tried += 1
            begun = self._begin(task_id, pulled=lease_s)
            if begun is None:  # stale, pushed back, expired, or asking its siblings
                t = self.live.mem.get(task_id)
                taken.asking += (t is not None and t.state == State.SCHEDULED
                                 and t.fire_at <= self.clock() + 0.001)
                continue
            t, now, first_delay = begun
            outcome = Outcome(ok=True, status=ACCEPTED_STATUS, at=now, start=now,
                              node=self.config.node, error="leased by a worker")
            decision = decide(t.evolve(lease=lease_s), outcome, q, now, self.rng)
            self._carry_out(decision, outcome)
            leased = decision.task
            token = completion.mint(self.completion_key, leased.id, leased.reruns,
                                    leased.accepted, now + completion.TOKEN_LIFETIME)
            self.metrics.attempt(queue, ACCEPTED_STATUS, "leased", 0.0, first_delay)
            out.append((leased, token))
        return taken

    def pull_wait(self, queue: str, timeout: float) -> None:
        """Wait up to ``timeout`` for a due copy of pull queue ``queue`` (a paused
        queue's copies do not count: it is looked at again in a while)."""
        if self.dispatcher.view(queue).paused:
            gevent.sleep(min(max(0.0, timeout), 0.5))
        else:
            self.pull.wait(queue, timeout)

    def nack(self, grant: completion.Grant, delay: float | None) -> Task:
        """A worker gives a leased task back: a failed attempt, retried after ``delay``
        seconds (else the backoff) while attempts last; Conflict once the lease is over."""
        t = self._accepted(grant)
        now = self.clock()
        outcome = Outcome(ok=False, at=now, start=now, node=self.config.node,
                          error="the worker gave it back (nack)")
        self._carry_out(reported(t, outcome, self.queue_config(t.queue), now, self.rng, delay),
                        outcome)
        return self.live.get(t.id) or self.journal.get(t.id) or t

    def _accepted(self, grant: completion.Grant) -> Task:
        t = self.live.get(grant.task_id)
        if (t is None or t.state != State.RUNNING or t.accepted != grant.attempt
                or t.reruns != grant.run):
            raise Conflict("this attempt is over: it was reported, its lease ran out, or "
                           "the task ended")
        return t

    def _end(self, t: Task) -> None:
        self.live.forget(t.id)
        self.journal.put(t)
        self._order(t)

    # ------------------------------------------------------------ ordering keys
    def ordered(self, task: Task) -> Task:
        """A new copy of an ordered task with no place in its key's line yet, given the
        next (this node owns the key: it holds the task's first copy)."""
        if task.ordering_key is None or task.ordering_seq:
            return task
        return task.evolve(ordering_seq=self.lines.next_seq(task.queue, task.ordering_key,
                                                            self.clock()))

    def _blocks(self, queue: str) -> bool:
        return self.queue_config(queue).ordering_on_failure == "block"

    def _order(self, t: Task) -> None:
        """Copy ``t`` changed: its key's line follows, and a copy whose turn came is timed."""
        if t.ordering_key is not None:
            self._wake_ordered(self.lines.note(t))

    def _forget_swept_blockers(self) -> None:
        """A failed task that blocks its key and was swept (``retention``) holds it no
        more: nobody could retry or delete it now."""
        for queue in self.lines.queues():
            for _, task_id in self.lines.blocked(queue):
                if self.journal.get(task_id) is None:
                    log.info("task %s: swept after retention, its ordering key goes on",
                             task_id)
                    self._wake_ordered(self.lines.remove(task_id))

    def _wake_ordered(self, task_ids: list[str]) -> None:
        for task_id in task_ids:  # (one due later is paged in, and timed, when due)
            c = self.live.mem.get(task_id)
            if c is not None and c.state == State.SCHEDULED and task_id not in self.live.pinned:
                self.scheduler.schedule(task_id, c.fire_at)

    def ordering_view(self, t: Task) -> dict[str, Any] | None:
        """What a task view shows of its key here: the blocker, how many wait in line."""
        if t.ordering_key is None:
            return None
        return {"key": t.ordering_key, "seq": t.ordering_seq,
                "blocked_by": self.lines.blocker(t.queue, t.ordering_key),
                "waiting_for": None if t.state.ended else self.lines.ahead(t),
                "in_line": self.lines.waiting(t.queue, t.ordering_key)}

    def _callback(self, t: Task, url: str) -> None:
        """Tell ``url`` the outcome, as a task of its own in the same queue."""
        now = self.clock()
        body = ujson.dumps({"task": t.summary(), "state": t.state.value,
                            "response": t.last}, ensure_ascii=False)
        cb = Task(id=new_id(), queue=t.queue, url=url, method="POST", body=body,
                  content_type="application/json", eta=now, created=now, fire_at=now,
                  timeout=self.config.callback_timeout,
                  headers={"X-Task-Callback-For": t.id})
        try:
            self.spawn_task(cb)
        except Exception:
            log.exception("task %s: could not store its callback task", t.id)

    # ------------------------------------------------------------ sibling updates
    def apply_remote(self, task_id: str, *, state: State | None = None,
                     fire_at: float | None = None, attempts: int | None = None,
                     last: dict | None = None, earliest: bool = False,
                     exact: bool = False, attempt: dict | None = None) -> Task | None:
        """Bring this copy in step with what a sibling replica did; None if unknown.

        fire_at pushes the copy later (a claim), or sets it exactly when a state is
        given or ``exact`` (a retry, a released claim), or pulls it earlier with
        ``earliest`` (a hand-off, an answered ASK)."""
        t = self.live.get(task_id)
        if t is None:
            return None
        changes: dict = {}
        if attempts is not None and attempts > t.attempts:
            changes["attempts"] = attempts
        if last is not None:
            changes["last"] = last
        if attempt is not None:  # the sibling's attempt, in our copy's history too
            changes["history"] = add_attempt(t.history, attempt)
        if state is not None and state.ended:
            was = t.state
            t = t.evolve(state=state, finished=self.clock(), **changes)
            if was == State.RUNNING:
                self.live[task_id] = t  # our own attempt's finish() ends it
            else:
                self._end(t)
            return t
        if fire_at is not None and t.state == State.SCHEDULED:
            if earliest:
                changes["fire_at"] = min(fire_at, t.fire_at)
            elif state is None and not exact:
                changes["fire_at"] = max(fire_at, t.fire_at)
            else:
                changes["fire_at"] = fire_at
        if changes:
            t = t.evolve(**changes)
            self.journal.put(t)
            self.live[task_id] = t  # timed again, or journal only if pushed beyond the window
        return t

    def set_replicas(self, task_id: str, replicas: tuple[str, ...], me: str) -> None:
        """The replica set changed (a lost member's copy was restored elsewhere), our
        copy's or its ended record's: a restore that finished after our attempt ended
        left the record naming the lost member, which told that member, back from a
        restart, its stale copy was still one of the task's."""
        if me not in replicas:
            return
        t = self.live.get(task_id)
        ended = t is None
        t = self.journal.get(task_id) if ended else t
        if t is None or (ended and not t.state.ended):
            return
        t = t.evolve(replicas=replicas, replica=replicas.index(me))
        self.journal.put(t)
        if not ended:
            self.live[task_id] = t

    def drop(self, task_id: str) -> None:
        """Forget a stale copy whose task lives on elsewhere, live or the record of an
        ended one; tell nobody."""
        t = self.live.pop(task_id, None)
        if t is not None or self.journal.get(task_id) is not None:
            self.journal.delete(task_id)
        self._wake_ordered(self.lines.remove(task_id))

    def take_end(self, task_id: str, state: State, reruns: int, attempts: int,
                 last: dict | None, finished: float) -> Task | None:
        """Our ended copy is of an earlier run (``Task.reruns``) than a sibling's end:
        record that end instead (None: no ended copy of an earlier run here)."""
        t = None if task_id in self.live.mem else self.journal.get(task_id)
        if t is None or not t.state.ended or t.reruns >= reruns or not state.ended:
            return None
        t = t.evolve(state=state, reruns=reruns, attempts=attempts, last=last,
                     finished=finished, first_attempt=None, expires_at=None)
        self.journal.put(t)
        return t

    # ------------------------------------------------------------ what clients do
    def cancel(self, task_id: str) -> Task | None:
        """Cancel this copy; None if unknown. Conflict if it already ended."""
        t = self.live.get(task_id)
        if t is None:
            ended = self.journal.get(task_id)
            if ended is None:
                return None
            if ended.state == State.CANCELLED:
                return ended
            raise Conflict(f"task is already {ended.state.value}")
        now = self.clock()
        was = t.state
        t = t.evolve(state=State.CANCELLED, finished=now)
        self.stats.cancelled += 1
        if was == State.RUNNING:
            self.live[task_id] = t  # finish() ends it when the attempt returns
            self.journal.put(t)
        else:
            self._end(t)
        return t

    def delete(self, task_id: str) -> Task | None:
        """DELETE /tasks/<id> on this copy: a failed one's record is removed (the dead
        letter is dealt with) and returned; a live one is cancelled, a cancelled one
        returned as is. None if unknown; Conflict if it succeeded (``cancel``)."""
        if task_id not in self.live.mem:
            t = self.journal.get(task_id)
            if t is not None and t.state == State.FAILED:
                self.journal.delete(task_id)
                self._wake_ordered(self.lines.remove(task_id))  # a blocker no more
                return t
        return self.cancel(task_id)

    def abort(self, task_id: str) -> None:
        """Undo a copy whose enqueue was refused: cancel it and free its name."""
        t = self.live.get(task_id)
        if t is None:
            return
        if t.name is not None and (self.name_holder(t.queue, t.name) or ("",))[0] == task_id:
            self.names.pop((t.queue, t.name), None)
            self.journal.release_name(t.queue, t.name)
        try:
            self.cancel(task_id)
        except Conflict:
            pass

    def rerun(self, task_id: str, *, wait: bool = True, delay: float = 0.0,
              resend: bool = False, reruns: int | None = None) -> Task | None:
        """Run a task again now: a failed, cancelled or expired one with a fresh set of
        attempts (and no expiry: the new run is not bound by the old one's), a scheduled
        one at once. ``resend``: an ended task only, a succeeded one too (POST
        /tasks/<id>/resend). ``reruns``: the run it becomes (a sibling's, joined; the
        next one by default). None if unknown; Conflict if running or succeeded
        (resend: if not ended)."""
        now = self.clock() + delay
        t = self.live.get(task_id)
        if t is not None:
            if resend:
                raise Conflict(f"task is {t.state.value}: only an ended task is resent")
            if t.state != State.SCHEDULED:
                raise Conflict(f"task is {t.state.value}")
            t = t.evolve(fire_at=now)
            self.journal.put(t)
            self.live[task_id] = t
            return t
        t = self.journal.get(task_id)
        if t is None:
            return None
        if t.state == State.SUCCEEDED and not resend:
            raise Conflict("task already succeeded")
        t = t.evolve(state=State.SCHEDULED, fire_at=now, attempts=0, first_attempt=None,
                     finished=None, expires_at=None,
                     reruns=t.reruns + 1 if reruns is None else reruns)
        self.live.storing.add(task_id)  # news meanwhile waits (replayed by the caller)
        try:
            self.journal.put(t, wait=wait)
        finally:
            self.live.storing.discard(task_id)
        self.live[task_id] = t
        self._order(t)  # back in its key's line (a blocker: at its head again)
        return t

    def replace(self, task_id: str, changes: dict[str, Any], delay: float | None,
                revision: str, offset: float = 0.0) -> Task | None:
        """A repeat of its name replaces this copy's ``changes`` (params, body,
        content_type) and, with ``delay``, its eta (now + delay; the copy fires
        ``offset`` x its replica later), unless the copy holds an equal or newer
        ``revision`` already (``tasks/repeat.py``). None if unknown; Conflict once the
        task has started (an attempt made or running) or ended."""
        t = self.live.get(task_id)
        if t is None:
            ended = self.journal.get(task_id)
            if ended is None:
                return None
            raise Conflict(f"task is already {ended.state.value}: it cannot be replaced")
        if t.state != State.SCHEDULED or t.attempts:
            raise Conflict("task has started: it cannot be replaced")
        if revision <= t.revision:
            return t  # a repeated or overtaken replace
        if delay is not None:
            eta = self.clock() + delay
            changes = dict(changes, eta=eta, fire_at=eta + t.replica * offset)
        t = t.evolve(revision=revision, **changes)
        self.journal.put(t)
        self.live[task_id] = t  # timed again, or journal only if pushed beyond the window
        return t

    def purge(self, queue: str) -> int:
        """Cancel every scheduled copy of the queue on this node; returns how many
        of them were first copies (replica 0), i.e. distinct tasks cluster-wide."""
        first = 0
        done: set[str] = set()
        while True:  # a page at a time from the journal: most copies may be only there
            page = self.journal.list(queue, State.SCHEDULED.value, PURGE_PAGE)
            ended = 0
            for t in page:
                t = self.live.mem.get(t.id, t)  # memory's record is the newer
                if t.state != State.SCHEDULED or t.id in done:
                    continue
                done.add(t.id)
                self._end(t.evolve(state=State.CANCELLED, finished=self.clock()))
                self.stats.cancelled += 1
                ended += 1
                first += t.replica == 0
            if not ended:  # done (or the journal cannot write: the rest stay)
                return first

    def pause(self, queue: str, paused: bool) -> None:
        self.queues.note(queue, self.clock())
        self.dispatcher.pause(queue, paused)
        self.journal.set_paused(queue, paused)


    # ------------------------------------------------------------ reads
    def get(self, task_id: str) -> Task | None:
        t = self.live.mem.get(task_id)
        return t if t is not None else self.journal.get(task_id)

    def queue_counts(self, primary_only: bool = False) -> dict[str, dict[str, int]]:
        """The journal's counters, with its live rows split by memory into running (an
        attempt's start is not journaled) and scheduled."""
        counts = self.journal.counts(primary_only)
        for q, c in counts.items():  # (the states' values read once: a queue each, 1000s)
            pending = c.pop(_SCHEDULED, 0) + c.pop(_RUNNING, 0)
            running = min(pending, self.live.running_in(q, primary_only))
            if running:
                c[_RUNNING] = running
            if pending > running:
                c[_SCHEDULED] = pending - running
        for name in self.dispatcher.queues:
            counts.setdefault(name, {})
        return counts

    def copy_states(self, limit: int) -> dict[str, dict[str, list[str]]] | None:
        """queue -> state -> the ids of this node's copies (running ones as memory has
        them), or None past ``limit`` copies: what a cluster de-duplicates by id."""
        rows = self.journal.states(limit)
        if rows is None:
            return None
        running = {t.id for t in self.live.values() if t.state == State.RUNNING}
        out: dict[str, dict[str, list[str]]] = {}
        for q, s, task_id in rows:
            if s == _SCHEDULED and task_id in running:
                s = _RUNNING
            out.setdefault(q, {}).setdefault(s, []).append(task_id)
        return out

    def live_depth(self) -> dict[tuple[str, str], int]:
        """(queue, state) -> this node's live copies, in memory or not (/metrics)."""
        return {(q, s): n for q, c in self.queue_counts().items() for s, n in c.items()
                if s in _LIVE}

    def oldest_due(self) -> dict[str, float]:
        """queue -> seconds its oldest due copy that has not started has been due (/metrics:
        a queue that stops delivering shows here). Due copies are all in memory (the
        window pages them in ahead), so this is one pass over it: 20 ms per 100,000 (a
        scrape every 15 s: 0.1 % of a core at that size)."""
        now = self.clock()
        oldest: dict[str, float] = {}
        scheduled = State.SCHEDULED
        for t in self.live.values():
            if t.fire_at <= now and t.state is scheduled:
                q = t.queue
                if t.fire_at < oldest.get(q, now):
                    oldest[q] = t.fire_at
        return {q: now - at for q, at in oldest.items()}

    def browse(self, flt: browse.Filter, after: browse.Key | None, limit: int) -> browse.Page:
        """A page of this node's first copies (``engine.browse``): running ones from
        memory (the journal does not record an attempt's start), the rest from the
        journal, scheduled ones as memory has them now."""
        if flt.state == State.RUNNING:
            rows = sorted(((t.fire_at, t) for t in self.live.values()
                           if t.state == State.RUNNING and flt.queue in (None, t.queue)),
                          key=lambda r: (r[0], r[1].id))
            if after is not None:
                rows = [r for r in rows if (r[0], r[1].id) > after]
            return browse.local_page(rows, None, flt, limit)
        rows, last, read = self.journal.browse(flt.state.value, flt.queue, after,
                                               browse.SCAN_ROWS, flt.keeps_raw, limit,
                                               flt.label, flt.since, flt.until)
        # read to the end: fewer rows than asked for, and not cut at the limit
        done = read < browse.SCAN_ROWS and len(rows) < limit
        if flt.state == State.SCHEDULED:  # memory's copy is the newer (it may be running)
            rows = [(at, self.live.mem.get(t.id, t)) for at, t in rows]
        return browse.local_page(rows, None if done else last, flt, limit)

    def list(self, queue: str, state: State, limit: int) -> list[Task]:
        if state == State.RUNNING:  # running copies are all in memory
            out = [t for t in self.live.values() if t.queue == queue and t.state == state]
        elif state == State.SCHEDULED:  # memory's record of a copy is the newer
            running = self.live.running_in(queue, False)
            out = [self.live.mem.get(t.id, t) for t in
                   self.journal.list(queue, state.value, limit + running)]
            out = [t for t in out if t.state == state]
        else:
            return self.journal.list(queue, state.value, limit)
        out.sort(key=lambda t: t.fire_at)
        return out[:limit]
