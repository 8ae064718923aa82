"""A node's Prometheus metrics (GET /metrics), in prometheus_client's exposition.

Each ``Node`` has one ``Metrics`` with its own ``CollectorRegistry``: tests and the
simulators run several nodes in one process, and the global default registry would mix
them. Two kinds of series, both cheap on the per-task path:

- Counters and gauges the parts already keep (``engine.stats``, ``journal.commits``,
  ``transport.stats``, the live copies, the roster) are read at scrape time by
  ``NodeCollector``; nothing is counted twice.
- What only the moment itself knows (how long an attempt took, how late the first
  attempt came, how long a journal commit took, and an attempt's outcome) is observed
  where it happens, into plain ints and lists (``Histogram``): a bisect and two
  additions, no lock (one gevent thread does all of it). prometheus_client's own
  ``Histogram`` takes a lock and adds a ``_created`` series per child; emitting ours
  as ``HistogramMetricFamily`` gives the same exposition without either.

Labels are bounded sets: ``queue`` (at most ``MAX_QUEUES`` of them, the rest are counted
as ``OTHER``, and ``miyamoto_queues_unlabelled`` says how many queues that is), ``verb`` (``protocol.Verb``, plus ``invalid`` for what did not decode),
``direction``, ``state``, ``outcome``, ``status_class`` (``2xx``...``5xx``, ``error``
for no response), ``role`` and ``peer`` (the roster), ``origin`` (at most
``MAX_TARGET_LABELS`` target origins, each ``scheme://host:port``: never a path or a
query, and a URL carries no credentials, ``validate`` refuses them). Never a task id or
a URL.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any, Iterator, Mapping, Protocol, Sized

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, \
                              generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, \
                                   Metric
from prometheus_client.registry import Collector

from miyamoto.config.settings import Config
from miyamoto.delivery.breaker import Breakers, BreakerState
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.store.journal import Journal
from miyamoto.version import __version__
from miyamoto.wire.transport import Transport

log = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE_LATEST", "Histogram", "Metrics", "NodeCollector", "Scraped",
           "status_class"]

# Enqueue (or due time) to first attempt: a local delivery takes ms, a copy that stands
# in for a lost sibling is replica_offset (5 s) late, a backlog behind a rate limit more.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# One attempt against the target: up to its timeout (30 s by default).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)
# One group commit of the journal (fsync included when sync_full).
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5)
MAX_QUEUES = 200  # queues are made on first use: bound the label set anyway
MAX_TARGET_LABELS = 100  # target origins with a breaker series: not closed first, then recent
OTHER = "_other"
ROLES = ("joining", "follower", "candidate", "leader", "left")
LIVE_STATES = ("scheduled", "running")


def status_class(status: int | None) -> str:
    """``2xx`` for 204, ``error`` when there was no HTTP answer at all."""
    if status is None or not 100 <= status <= 599:
        return "error"
    return f"{status // 100}xx"


class Histogram:
    """One label set's buckets: counts per bucket (not cumulative), a sum, a count."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, i.e. Prometheus's "le" bucket
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last, as HistogramMetricFamily wants."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class TaskCounts(Protocol):
    """The engine's counters (``engine.Stats``)."""
    stored: int
    succeeded: int
    failed: int
    retried: int
    cancelled: int
    expired: int
    attempts: int


class QueueNames(Protocol):
    """The queues the engine holds (``miyamoto.engine.queues.Queues``)."""

    def __len__(self) -> int: ...
    def names(self) -> list[str]: ...


class EngineView(Protocol):
    """What the scrape reads of the engine (``miyamoto.engine.engine.Engine``), which
    reports into ``Metrics`` and so cannot be imported here."""

    @property
    def stats(self) -> TaskCounts: ...
    @property
    def live(self) -> Sized: ...  # the live copies held in memory
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def queues(self) -> QueueNames: ...
    def live_depth(self) -> Mapping[tuple[str, str], int]: ...  # (queue, state) ->
    def oldest_due(self) -> Mapping[str, float]: ...  # queue -> seconds overdue


class ClusterView(Protocol):
    """What the scrape reads of the cluster layer (``miyamoto.cluster.layer.Cluster``)."""
    leader_changes: int
    strangers: int
    transport: Transport

    def info(self) -> dict[str, Any]: ...


class Scraped(Protocol):
    """What the scrape reads of a node; ``miyamoto.node.Node`` is one."""

    @property
    def node_id(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def engine(self) -> EngineView: ...
    @property
    def cluster(self) -> ClusterView: ...


class Metrics:
    """What the hot paths observe, and the registry /metrics renders.

    The engine calls ``attempt`` once per delivery attempt, the journal ``commit`` once
    per group commit; ``watch(node)`` adds the scrape-time collector of everything else.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.first_attempt: dict[str, Histogram] = {}  # queue ->
        self.duration: dict[str, Histogram] = {}  # queue ->
        self.attempts: dict[tuple[str, str, str], int] = {}  # (queue, outcome, class) ->
        self.commit = Histogram(COMMIT_BUCKETS)
        self._queues: set[str] = set()

    def queue_label(self, queue: str) -> str:
        if queue in self._queues:
            return queue
        if len(self._queues) >= MAX_QUEUES:
            return OTHER
        self._queues.add(queue)
        return queue

    def attempt(self, queue: str, status: int | None, outcome: str, seconds: float,
                first_delay: float | None) -> None:
        """One attempt ended: its outcome (retry.Action's value), the target's status,
        how long it took; ``first_delay``: due time to this attempt, for a first one."""
        q = self.queue_label(queue)
        key = (q, outcome, status_class(status))
        self.attempts[key] = self.attempts.get(key, 0) + 1
        h = self.duration.get(q)
        if h is None:
            h = self.duration[q] = Histogram(DURATION_BUCKETS)
        h.observe(seconds)
        if first_delay is not None:
            h = self.first_attempt.get(q)
            if h is None:
                h = self.first_attempt[q] = Histogram(LATENCY_BUCKETS)
            h.observe(max(0.0, first_delay))

    def journal_commit(self, seconds: float) -> None:
        self.commit.observe(seconds)

    def watch(self, node: Scraped) -> None:
        """Collect the node's own counters at scrape time, and the process's (CPU, RSS,
        open files: prometheus_client's ProcessCollector)."""
        self.registry.register(NodeCollector(node, self))
        ProcessCollector(registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _histograms(name: str, doc: str, by_queue: dict[str, Histogram]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["queue"], unit="seconds")
    for queue, h in sorted(by_queue.items()):
        fam.add_metric([queue], h.buckets(), h.total)
    return fam


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _breakers(breakers: Breakers) -> Iterator[Metric]:
    """The target origins' circuit breakers: the open and half-open ones first, then the
    most recently attempted, at most ``MAX_TARGET_LABELS`` of them."""
    items = list(reversed(breakers.items()))  # most recent first
    items.sort(key=lambda kv: kv[1].state is BreakerState.CLOSED)  # stable: not closed first
    fam = GaugeMetricFamily("miyamoto_target_breaker_state", "1 for a target origin's "
                            "circuit breaker state (the origins attempted recently, not "
                            f"closed first, at most {MAX_TARGET_LABELS})",
                            labels=["origin", "state"])
    for origin, b in items[:MAX_TARGET_LABELS]:
        for state in BreakerState:
            fam.add_metric([origin, state.value], int(b.state is state))
    yield fam
    counts = GaugeMetricFamily("miyamoto_target_breakers", "target origins known to this "
                               "node by breaker state", labels=["state"])
    for state in BreakerState:
        counts.add_metric([state.value], sum(1 for _, b in items if b.state is state))
    yield counts
    yield CounterMetricFamily("miyamoto_target_breaker_opens", "times a target's circuit "
                              "breaker opened (or reopened after a failed probe)",
                              value=breakers.opens)


class NodeCollector(Collector):
    """Reads a node's parts at scrape time (a scrape every 15 s costs one pass over the
    live copies, for the per-queue depths, and no SQL)."""

    def __init__(self, node: Scraped, metrics: Metrics):
        self.node = node
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._tasks()
        yield from self._queues()
        yield from self._journal()
        yield from self._cluster()
        yield from _breakers(self.node.engine.dispatcher.breakers)  # per origin, bounded
        info = GaugeMetricFamily("miyamoto_info", "this node's version and id",
                                 labels=["version", "node"])
        info.add_metric([__version__, self.node.node_id], 1)
        yield info

    def _tasks(self) -> Iterator[Metric]:
        s = self.node.engine.stats
        yield _counter("miyamoto_tasks_stored", "copies of tasks this node stored (per copy: "
                       "a sum over nodes counts each task once per replica)", s.stored)
        yield _counter("miyamoto_tasks_succeeded", "tasks this node delivered with a 2xx (one "
                       "copy delivers: a sum over nodes counts tasks)", s.succeeded)
        yield _counter("miyamoto_tasks_failed", "tasks that ran out of attempts in a "
                       "delivery by this node (a sum over nodes counts tasks)", s.failed)
        yield _counter("miyamoto_retries", "failed attempts scheduled again", s.retried)
        yield _counter("miyamoto_tasks_cancelled", "copies cancelled here (per copy: each "
                       "replica of a cancelled task counts)", s.cancelled)
        yield _counter("miyamoto_tasks_expired", "tasks not started by their expires_at, "
                       "ended by this node (the first copy to expire tells the others: a "
                       "sum over nodes counts tasks)", s.expired)
        yield _counter("miyamoto_attempts_started", "delivery attempts started", s.attempts)
        yield _gauge("miyamoto_tasks_live", "copies scheduled or running on this node "
                     "(per copy; GET /queues counts tasks)",
                     sum(self.node.engine.live_depth().values()))
        yield _gauge("miyamoto_tasks_in_memory", "live copies held in memory (those due "
                     "within memory_window, and running ones)", len(self.node.engine.live))
        yield _gauge("miyamoto_deliveries_in_flight", "attempts waiting on their target",
                     self.node.engine.dispatcher.busy)
        m = self.metrics
        attempts = CounterMetricFamily(
            "miyamoto_attempts", "ended delivery attempts by queue, outcome (what the task "
            "does next: succeeded, retry, failed, record) and the target's status class",
            labels=["queue", "outcome", "status_class"])
        for (queue, outcome, cls), n in sorted(m.attempts.items()):
            attempts.add_metric([queue, outcome, cls], n)
        yield attempts
        yield _histograms("miyamoto_delivery_duration", "one attempt against its target, "
                          "request to answer (or error)", m.duration)
        yield _histograms("miyamoto_first_attempt_delay", "a task's due time (its enqueue "
                          "time when it has no delay) to its first attempt", m.first_attempt)

    def _queues(self) -> Iterator[Metric]:
        engine, m = self.node.engine, self.metrics
        depth: dict[tuple[str, str], int] = {}
        for (queue, state), n in engine.live_depth().items():
            key = (m.queue_label(queue), state)
            depth[key] = depth.get(key, 0) + n
        states = dict(engine.dispatcher.queues)
        declared = [*self.node.config.queues, *states]  # a quiet queue shows its zeros
        names = {m.queue_label(q) for q in declared} | {q for q, _ in depth}
        fam = GaugeMetricFamily("miyamoto_queue_tasks", "this node's live copies by queue "
                                "and state (per copy: a sum over nodes counts each task once "
                                "per replica; GET /queues counts tasks)", labels=["queue", "state"])
        for q in sorted(names):
            for state in LIVE_STATES:
                fam.add_metric([q, state], depth.get((q, state), 0))
        yield fam
        held = engine.queues
        yield _gauge("miyamoto_queues", "queues this node holds (declared, and those "
                     "enqueues created: at most max_queues)", len(held))
        omitted = sum(1 for q in held.names() if m.queue_label(q) == OTHER)
        yield _gauge("miyamoto_queues_unlabelled", f"queues whose series are summed under "
                     f"queue=\"{OTHER}\": the per-queue series stop at {MAX_QUEUES} queues",
                     omitted)
        ready = GaugeMetricFamily("miyamoto_queue_ready", "due copies waiting for a "
                                  "delivery slot or a rate token", labels=["queue"])
        paused = GaugeMetricFamily("miyamoto_queue_paused", "1 if the queue is paused",
                                   labels=["queue"])
        sums: dict[str, list[int]] = {}
        for name, qs in sorted(states.items()):
            row = sums.setdefault(m.queue_label(name), [0, 0])
            row[0] += len(qs.ready)
            row[1] = max(row[1], int(bool(qs.paused)))
        for q, (n_ready, is_paused) in sums.items():
            ready.add_metric([q], n_ready)
            paused.add_metric([q], is_paused)
        yield ready
        yield paused
        late: dict[str, float] = dict.fromkeys(names, 0.0)
        for name, seconds in engine.oldest_due().items():
            q = m.queue_label(name)
            late[q] = max(late.get(q, 0.0), seconds)
        oldest = GaugeMetricFamily("miyamoto_queue_oldest_due_seconds", "how long the "
                                   "queue's oldest due copy that has not started has been "
                                   "due (0: none is waiting)", labels=["queue"])
        for q in sorted(late):
            oldest.add_metric([q], late[q])
        yield oldest

    def _journal(self) -> Iterator[Metric]:
        yield _counter("miyamoto_journal_commits", "group commits of the journal",
                       self.node.journal.commits)
        h = self.metrics.commit
        fam = HistogramMetricFamily("miyamoto_journal_commit_duration", "one group commit, "
                                    "handed to SQLite's thread until committed", unit="seconds")
        fam.add_metric([], h.buckets(), h.total)
        yield fam
        yield _gauge("miyamoto_journal_healthy", "1 while the journal can write (else /readyz "
                     "and enqueues answer 503)", int(self.node.journal.health.ok))

    def _cluster(self) -> Iterator[Metric]:
        cluster = self.node.cluster
        info: dict[str, Any] = cluster.info()
        members = info.get("members", [])
        yield _gauge("miyamoto_cluster_members", "members in this node's roster", len(members))
        yield _gauge("miyamoto_cluster_term", "the election term this node is in",
                     info.get("term") or 0)
        role = GaugeMetricFamily("miyamoto_cluster_role", "1 for this node's role in the "
                                 "cluster", labels=["role"])
        current = info.get("role")
        for name in ROLES if current in ROLES or current is None else (*ROLES, str(current)):
            role.add_metric([name], int(name == current))
        yield role
        yield _counter("miyamoto_cluster_leader_changes", "times this node saw a new leader",
                       cluster.leader_changes)
        offsets = GaugeMetricFamily("miyamoto_peer_clock_offset_seconds",
                                    "a member's wall clock minus ours", labels=["peer"])
        for mem in members:
            if mem["id"] != self.node.node_id and mem.get("clock_offset") is not None:
                offsets.add_metric([str(mem["id"])], mem["clock_offset"])
        yield offsets
        clock = info.get("clock") or {}
        yield _gauge("miyamoto_cluster_clock_offset_seconds", "the cluster's clock minus ours "
                     "(absolute etas and schedule ticks are judged on the cluster's)",
                     clock.get("offset", 0.0))
        yield _gauge("miyamoto_cluster_clock_placed", "1 while a majority of members have a "
                     "clock estimate that agrees (else absolute etas are judged on our "
                     "own clock, and this node fires no schedule)",
                     int(clock.get("placed", True)))
        yield _gauge("miyamoto_cluster_clock_skewed", "1 while our clock is beyond "
                     "max_clock_skew from the cluster's (this node then does not lead)",
                     int(clock.get("skewed", False)))
        yield from self._transport(cluster.transport, cluster.strangers, cluster.spoofed)

    @staticmethod
    def _transport(transport: Transport, strangers: int, spoofed: int) -> Iterator[Metric]:
        stats = transport.stats
        fam = CounterMetricFamily("miyamoto_cluster_messages", "cluster messages by verb and "
                                  "direction (dropped: not sent, or received and malformed); "
                                  "a BATCH frame counts once as BATCH, and each message in it "
                                  "by its own verb",
                                  labels=["verb", "direction"])
        for (verb, direction), n in sorted(stats.messages.items()):
            fam.add_metric([verb, direction], n)
        yield fam
        yield _counter("miyamoto_cluster_handler_errors", "received messages whose handling "
                       "raised", stats.handler_errors)
        yield _counter("miyamoto_cluster_auth_refused", "peers refused at the cluster port "
                       "for their key: a CURVE handshake with another key pair, or a key the "
                       "ZAP check does not admit", stats.auth_refused)
        yield _counter("miyamoto_cluster_zap_denied", "peers refused by the ZAP key check "
                       "(a part of miyamoto_cluster_auth_refused_total, kept for dashboards "
                       "that use it)", stats.zap_denied)
        yield _counter("miyamoto_cluster_strangers", "messages dropped: the sender is not a "
                       "member", strangers)
        yield _counter("miyamoto_cluster_spoofed", "messages dropped: under a member's id, "
                       "from another key than the one it joined with", spoofed)
        yield _counter("miyamoto_cluster_stale", "frames dropped as replays: from an earlier "
                       "incarnation of their sender, or with a sequence number seen before "
                       "(the direction \"stale\" of miyamoto_cluster_messages, by verb)",
                       stats.stale)
