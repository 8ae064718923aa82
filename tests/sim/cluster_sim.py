"""A deterministic simulator of the whole composed cluster layer, on virtual time.

N nodes in one process, each the real ``Cluster`` (membership, siblings, definitions,
coordinator, queries, requests, clocks) around the real ``Engine`` (window, scheduler,
dispatcher, retry) and the real ``Journal`` on a real SQLite file, over twins of three
edges (``twins.py``): the transport, the journal's database thread, the delivery client.
Everything runs on ``vloop.VirtualLoop``, and every random draw of the network, the
faults and the worker comes from one seeded ``random.Random``: a seed is a replay.

The network (``Network``) delays, loses, reorders and duplicates frames, and cuts links
two-way or one-way. A paused node's inbound and outbound frames and its worker's answers
are held until it resumes, and its clocks stand still meanwhile (then jump, as a real
process's do after SIGSTOP). A crash kills every greenlet of the node, makes its journal
refuse further calls (what was not committed is lost) and, later, a new node is built
on the same data dir. Per-node clock offsets are a fault too.

The checker (``Checker``) states the rules; see its docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import random
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from typing import Any, Callable

import gevent
import gevent.event
import ujson
from greenlet import greenlet

from miyamoto.cluster.layer import Cluster
from miyamoto.config.settings import QueueConfig, load
from miyamoto.definitions.schedules import Ticker, parse_schedule
from miyamoto.engine.engine import Engine
from miyamoto.replicas import placement
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, build_task
from miyamoto.wire.outbox import unbatch
from miyamoto.wire.verbs import Verb

sys.path.insert(0, os.path.dirname(__file__))
from twins import FakeWorker, InlineDb, InlinePool, SimTransport  # noqa: E402
from vloop import run_virtual  # noqa: E402

log = logging.getLogger(__name__)

START = 1_800_000_000.0
EARLY = 0.1  # s: how early an absolute eta or a tick may reach the worker (estimates' error)
LATE = 1.0   # s: how late, with one clock off and no other fault
_NEWS = (Verb.DONE.value.encode(), Verb.FAILED.value.encode())
_BATCH = Verb.BATCH.value.encode()


class SafetyViolation(AssertionError):
    pass


def _address(node_id: str) -> str:
    return f"tcp://{node_id}.sim:6000"


# ------------------------------------------------------------------ the network
class Network:
    """One network for all nodes: per-link FIFO with drawn delays, unless a fault says
    otherwise. ``cuts`` holds directed links (src, dst) that carry nothing."""

    def __init__(self, sim: Sim, rng: random.Random, *, delay: tuple[float, float],
                 loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0):
        self.sim = sim
        self.rng = rng
        self.delay = delay
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self.cuts: set[tuple[str, str]] = set()
        self.ports: dict[str, SimTransport] = {}
        self.by_address: dict[str, str] = {}
        self.held_out: dict[str, list[tuple[str, list[bytes]]]] = defaultdict(list)
        self.held_in: dict[str, list[tuple[str, list[bytes]]]] = defaultdict(list)
        self._link_free: dict[tuple[str, str], float] = {}
        self.sent = self.lost = 0
        self.verbs: Counter[str] | None = None  # set to a Counter: messages sent, by verb

    def register(self, node_id: str) -> None:
        self.by_address[_address(node_id)] = node_id

    def attach(self, node_id: str, transport: SimTransport) -> None:
        self.ports[node_id] = transport

    def detach(self, node_id: str) -> None:
        self.ports.pop(node_id, None)
        self.held_in.pop(node_id, None)
        self.held_out.pop(node_id, None)

    def knows(self, address: str) -> bool:
        return address in self.by_address

    def send(self, src: str, address: str, frames: list[bytes]) -> bool:
        dst = self.by_address[address]
        if src in self.sim.paused:
            self.held_out[src].append((dst, frames))
            return True
        self._transmit(src, dst, frames)
        return True

    def _transmit(self, src: str, dst: str, frames: list[bytes]) -> None:
        now = self.sim.now()
        self.sent += 1
        if self.verbs is not None:
            self._count(frames)
        news = self.sim.checker.news_in(frames)
        if (src, dst) in self.cuts:
            for tid in news:
                self.sim.checker.news_cut.add((tid, src, dst))
            return
        if self.rng.random() < self.loss:
            self.lost += 1
            for tid in news:
                self.sim.checker.news_lost.add((tid, src))
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            at = now + self.rng.uniform(*self.delay)
            if self.rng.random() < self.reorder:
                at += self.rng.uniform(0, 5 * self.delay[1])  # overtaken by later frames
            else:
                at = max(at, self._link_free.get((src, dst), 0.0))
                self._link_free[(src, dst)] = at
            self.sim.at(at - now, self._arrive, src, dst, frames)

    def _count(self, frames: list[bytes]) -> None:
        assert self.verbs is not None
        verb, raw = frames
        if verb == _BATCH:
            self.verbs.update(v.value for v, _ in unbatch(ujson.loads(raw)))
        else:
            self.verbs[verb.decode()] += 1

    def _arrive(self, src: str, dst: str, frames: list[bytes]) -> None:
        port = self.ports.get(dst)
        if port is None:  # the node is down: what was on its way is gone
            return
        if dst in self.sim.paused:
            self.held_in[dst].append((src, frames))
            return
        self.sim.checker.news_arrived(src, dst, frames)
        port.deliver(src, frames)

    def resume(self, node_id: str) -> None:
        held_in, self.held_in[node_id] = self.held_in[node_id], []
        held_out, self.held_out[node_id] = self.held_out[node_id], []
        for src, frames in held_in:
            self._arrive(src, node_id, frames)
        for dst, frames in held_out:
            self._transmit(node_id, dst, frames)


# ------------------------------------------------------------------ one node
class NodeClock:
    """A node's wall clock and monotonic clock: the loop's time plus its offset, standing
    still while the node is paused."""

    def __init__(self, sim: Sim, offset: float, mono_base: float):
        self.sim = sim
        self.offset = offset
        self.mono_base = mono_base
        self.frozen: float | None = None

    def _now(self) -> float:
        return self.frozen if self.frozen is not None else self.sim.now()

    def wall(self) -> float:
        return self._now() + self.offset

    def mono(self) -> float:
        return self._now() - START + self.mono_base


class SimNode:
    """One node's incarnation: its parts, built on its data dir, started in a root
    greenlet whose spawn tree owns every greenlet the node spawns (crash kills them)."""

    def __init__(self, sim: Sim, node_id: str, data_dir: str, seeds: list[str]):
        self.sim = sim
        self.id = node_id
        self.data_dir = data_dir
        self.seeds = seeds
        self.clock = NodeClock(sim, 0.0, 1000.0 + 17 * len(sim.nodes))
        self.up = False
        self.incarnation = 0
        self.cluster: Cluster | None = None
        self.db: InlineDb | None = None
        self.tree: dict | None = None
        self.root: gevent.Greenlet | None = None
        self.ticker: Ticker | None = None

    def config(self) -> Any:
        cfg = load(env={}, flags={
            "node": self.id, "http": "127.0.0.1:8088", "cluster": _address(self.id),
            "seeds": ",".join(_address(s) for s in self.seeds), "data_dir": self.data_dir,
            "insecure_cluster": "true", "zone": self.id, **self.sim.options})
        q = QueueConfig(max_backoff=2.0, min_backoff=0.2, timeout=self.sim.timeout,
                        max_attempts=25, mode=self.sim.mode)
        return dataclasses.replace(cfg, queues={"default": q})

    def start(self) -> None:
        self.incarnation += 1
        started = gevent.event.Event()
        root = gevent.Greenlet(self._run, started)
        root.spawn_tree_locals = self.tree = {"node": self.id, "inc": self.incarnation}
        self.root = root
        root.start()
        started.wait()

    def _run(self, started: gevent.event.Event) -> None:
        sim, clock = self.sim, self.clock
        self.db = InlineDb()
        journal = Journal(self.data_dir, db=self.db, monotonic=clock.mono)
        rng = random.Random(sim.rng.random())
        worker = FakeWorker(sim, self.id, sim.draw_delivery)
        config = self.config()
        c = Cluster(config, journal,
                    functools.partial(Engine, config, journal, worker, clock=clock.wall, rng=rng),
                    clock=clock.wall, monotonic=clock.mono, rng=rng,
                    transport=lambda node_id, bind, on_message, *, curve, boot, node_key:
                        SimTransport(sim.network, node_id, bind, on_message))
        self.cluster = c
        journal.open()
        c.engine.start()
        c.defs.load()
        c.start()
        c.defs.start()
        if sim.schedules:  # as Node builds it (only where asked: it adds a loop's timers)
            self.ticker = Ticker(c.defs, c.enqueue, c.may_fire, Limits(), clock.wall,
                                 offset=c.clock_offset)
            gevent.spawn(self.ticker.run)
        self.up = True
        started.set()
        gevent.event.Event().wait()  # the root lives as long as the node

    def crash(self) -> None:
        """kill -9: the journal refuses at once, every greenlet of the node dies."""
        assert self.db is not None and self.cluster is not None
        self.up = False
        self.db.crash()
        self.cluster.transport.stop()
        # every greenlet of the tree holds its dict: the collector's referrers of it are
        # the greenlets a scan of all objects finds, in the same order, without a pass in
        # Python over the whole heap (that scan was a fifth of a run's time)
        mine = [g for g in gc.get_referrers(self.tree) if isinstance(g, greenlet)
                and getattr(g, "spawn_tree_locals", None) is self.tree and not g.dead
                and g is not gevent.getcurrent()]
        gevent.killall(mine, block=True)
        # the lock must go, as the kernel drops a dead process's flock; close() commits
        # nothing now (the runner refuses) and the connection goes with the objects
        gevent.spawn(_close_quietly, self.cluster.journal)
        self.cluster = None


def _close_quietly(journal: Journal) -> None:
    try:
        journal.close()
    except Exception:
        pass


# ------------------------------------------------------------------ the checker
class Checker:
    """The sibling protocol's rules, checked at every delivery start and at the end.

    - A task delivered successfully by node O and started again (by O or another node N)
      must have an excuse, else ``SafetyViolation``. The excuses, and why:
      * a fault touched O between its start and N's start: O crashed or paused, or a
        cut (one-way or two-way) had O on one side. O's outcome (DONE) may not have
        left it, or been held, and the cluster may have dropped O and re-homed its
        copies: the protocol promises at-least-once, not exactly-once, across faults;
      * the lossy network lost O's news of the task (DONE/FAILED) on its way to anyone
        (``miyamoto.replicas`` restores a copy from what a sibling knew);
      * N itself crashed after the start of O's delivery (O == N included): a copy's end
        is written lazily, so a restart may find it still scheduled.
      A duplicated or reordered frame is no excuse, nor is a clock offset within
      ``max_clock_skew``: the protocol must cope with both.
    - One leader per term: no two nodes name different leaders for one term.
    - On time (the clock scenario, ``skew_scenario``): a task with an absolute eta, and a
      schedule's tick, first reaches the worker no more than ``EARLY`` before its time by
      the true clock, and (no fault but the one clock) no more than ``LATE`` after it.
    - At the end, after the faults heal, every acknowledged task was delivered, and every
      acknowledged definition is on a majority.
    """

    def __init__(self, sim: Sim):
        self.sim = sim
        self.deliveries: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
        self.in_flight: dict[tuple[str, str], float] = {}
        self.faults: list[tuple[str, float, float]] = []  # (node, from, to)
        self.crashes: list[tuple[str, float]] = []
        self.cuts: list[tuple[str, float, float]] = []  # (node, from, to): cut links only
        self.news_lost: set[tuple[str, str]] = set()  # (task, sender)
        self.news_cut: set[tuple[str, str, str]] = set()
        self.news_seen: dict[tuple[str, str, str], float] = {}
        self.leaders: dict[int, str] = {}
        self.acked: set[str] = set()
        self.defs_acked: set[str] = set()
        self.excused: dict[str, int] = defaultdict(int)
        self.starts = 0
        # a rule broken at a delivery start is raised inside the node's own greenlet,
        # where the engine takes it for a failed attempt: kept here, raised at the end
        self.violations: list[SafetyViolation] = []
        self.due: dict[str, float] = {}  # task id or "schedule:<name>:<tick>" -> true time
        self.lateness: dict[str, float] = {}  # its first delivery start minus that
        self.late_bound: float | None = None  # checked only where no fault excuses it

    # ---------------------------------------------------------- what the network saw
    @staticmethod
    def _news(frames: list[bytes]) -> list[str]:
        verb, raw = frames
        if verb in _NEWS:
            return [ujson.loads(raw)["id"]]
        if verb == _BATCH:
            return [p["id"] for v, p in unbatch(ujson.loads(raw))
                    if v in (Verb.DONE, Verb.FAILED)]
        return []

    def news_in(self, frames: list[bytes]) -> list[str]:
        return self._news(frames)

    def news_arrived(self, src: str, dst: str, frames: list[bytes]) -> None:
        for tid in self._news(frames):
            self.news_seen.setdefault((tid, src, dst), self.sim.now())

    # ---------------------------------------------------------- faults
    def fault(self, node: str, start: float, end: float) -> None:
        self.faults.append((node, start, end))

    def _touched(self, node: str, start: float, end: float) -> bool:
        return any(n == node and a <= end and b >= start for n, a, b in self.faults)

    # ---------------------------------------------------------- the rules
    def started(self, node: str, task_id: str, ok: bool) -> None:
        now = self.sim.now()
        self.starts += 1
        self.deliveries[task_id].append((node, now, ok))
        self.in_flight[(node, task_id)] = now
        try:
            self.leader_per_term()
            for other, start, was_ok in self.deliveries[task_id][:-1]:
                if was_ok:
                    self._excuse(node, task_id, other, start, now)
        except SafetyViolation as e:
            self.violations.append(e)
            raise

    def _excuse(self, node: str, task_id: str, other: str, start: float, now: float) -> None:
        if any(n == node and start <= at <= now for n, at in self.crashes):
            self.excused["its node crashed since"] += 1
        elif self._touched(other, start, now):
            self.excused["a fault touched the first node"] += 1
        elif (task_id, other) in self.news_lost:
            self.excused["its news was lost"] += 1
        else:
            seen = self.news_seen.get((task_id, other, node))
            raise SafetyViolation(
                f"{node} delivers {task_id} again at {now - START:.3f}: {other} delivered it "
                f"at {start - START:.3f}, no fault touched {other} since, and its news "
                + ("reached " + node + f" at {seen - START:.3f}" if seen else "was not lost"))

    def timed(self, node: str, task_id: str, name: str | None) -> None:
        key = name if name is not None and name.startswith("schedule:") else task_id
        due = float(key.rsplit(":", 1)[1]) if key.startswith("schedule:") \
            else self.due.get(task_id)
        if due is None or key in self.lateness:
            return
        now = self.sim.now()
        self.lateness[key] = late = now - due
        if late < -EARLY or (self.late_bound is not None and late > self.late_bound):
            e = SafetyViolation(f"{node} delivers {key} at {now - START:.3f}, "
                                f"{abs(late):.3f} s {'early' if late < 0 else 'late'} by the "
                                f"true clock (offsets {self.sim.offsets()})")
            self.violations.append(e)
            raise e

    def ended(self, node: str, task_id: str) -> None:
        self.in_flight.pop((node, task_id), None)

    def leader_per_term(self) -> None:
        for nd in self.sim.nodes.values():
            c = nd.cluster
            if not nd.up or c is None or c.membership is None:
                continue
            r = c.membership.roster
            for term, leader in ((r.term, r.leader),
                                 (c.membership.term, nd.id if c.membership.is_leader else None)):
                if leader is None:
                    continue
                was = self.leaders.setdefault(term, leader)
                if was != leader:
                    raise SafetyViolation(f"two leaders in term {term}: {was} and {leader}")

    def _missing(self) -> list[str]:
        return sorted(t for t in self.acked
                      if not any(ok for _, _, ok in self.deliveries.get(t, [])))

    def all_delivered(self) -> bool:
        return not self._missing()

    def at_end(self) -> None:
        if self.violations:
            raise self.violations[0]
        missing = self._missing()
        if missing:
            raise SafetyViolation(f"{len(missing)} acknowledged tasks never delivered: "
                                  f"{missing[:3]}")
        nodes = [nd for nd in self.sim.nodes.values() if nd.cluster is not None]
        for name in sorted(self.defs_acked):
            holders = sum(1 for nd in nodes
                          if nd.cluster.defs.machine.get("topic", name) is not None)
            if holders * 2 <= len(self.sim.nodes):
                raise SafetyViolation(f"acknowledged topic {name} is on {holders} of "
                                      f"{len(self.sim.nodes)} nodes")


class OrderChecker:
    """The ordering keys' rules, over the worker's record of every delivery (its start,
    and its end as the worker saw it: the answer sent, or the node gone):

    - one at a time: no two deliveries of two tasks of one key overlap (the same task
      twice is the sibling rules' business, above);
    - in order, none skipped: a delivery of a task starts only after every acknowledged
      task of its key with a lower ``ordering_seq`` was delivered successfully;
    - enqueue order: a task acknowledged before another's enqueue began has the lower
      seq (the owner numbers them, and a new owner numbers after every copy it holds);
    - none stuck: every acknowledged task was delivered (``Checker.at_end``), and no key
      waits longer than ``stall_bound`` (one lease and the time to see a member gone)
      between one task's end (or the next one's acknowledgement) and the next one's start.
    """

    def __init__(self, sim: Sim):
        self.sim = sim
        self.keys: dict[str, str] = {}  # task id -> ordering key
        self.seqs: dict[str, int] = {}  # acknowledged task id -> its seq
        self.enqueued: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.spans: list[list[Any]] = []  # [task id, node, start, end | None, ok, seq]
        self._open: dict[tuple[str, str], list[Any]] = {}
        self.stall_bound: float | None = None
        self.max_stall = 0.0

    def started(self, node: str, task_id: str, ok: bool) -> None:
        if task_id not in self.keys:
            return
        c = self.sim.nodes[node].cluster
        copy = c.engine.live.get(task_id) if c is not None else None
        span = [task_id, node, self.sim.now(), None, ok, copy.ordering_seq if copy else 0]
        self.spans.append(span)
        self._open[(node, task_id)] = span

    def answered(self, node: str, task_id: str) -> None:
        span = self._open.pop((node, task_id), None)
        if span is not None and span[3] is None:
            span[3] = self.sim.now()

    def check(self) -> None:
        by_key: dict[str, list[list[Any]]] = defaultdict(list)
        for span in self.spans:
            if span[3] is None:
                span[3] = self.sim.now()
            by_key[self.keys[span[0]]].append(span)
        for key, spans in sorted(by_key.items()):
            self._one_at_a_time(key, spans)
            self._in_order(key, spans)
        self._enqueue_order()

    def _one_at_a_time(self, key: str, spans: list[list[Any]]) -> None:
        spans = sorted(spans, key=lambda sp: sp[2])
        for i, a in enumerate(spans):
            for b in spans[i + 1:]:
                if b[2] >= a[3]:
                    break
                if b[0] != a[0]:
                    raise SafetyViolation(
                        f"key {key}: {b[1]} starts {b[0]} at {b[2] - START:.3f} while {a[1]} "
                        f"delivers {a[0]} ({a[2] - START:.3f}-{a[3] - START:.3f})")

    def _in_order(self, key: str, spans: list[list[Any]]) -> None:
        done: dict[str, float] = {}  # task id -> the end of its first successful delivery
        for sp in spans:
            if sp[4]:
                done[sp[0]] = min(done.get(sp[0], sp[3]), sp[3])
        mine = sorted((self.seqs[t], t) for t in self.seqs if self.keys[t] == key)
        for sp in spans:
            for seq, earlier in mine:
                if seq >= sp[5] or earlier == sp[0]:
                    break
                if done.get(earlier, float("inf")) > sp[2]:
                    raise SafetyViolation(
                        f"key {key}: {sp[1]} starts {sp[0]} (seq {sp[5]}) at "
                        f"{sp[2] - START:.3f} before {earlier} (seq {seq}) was delivered")
        self._stalls(spans, done, mine)

    def _stalls(self, spans: list[list[Any]], done: dict[str, float],
                mine: list[tuple[int, str]]) -> None:
        first_start: dict[str, float] = {}
        for sp in spans:
            first_start.setdefault(sp[0], sp[2])
        for (_, a), (_, b) in zip(mine, mine[1:]):
            if a not in done or b not in first_start:
                continue
            ready = max(done[a], self.acked[b])
            stall = first_start[b] - ready
            self.max_stall = max(self.max_stall, stall)
            if self.stall_bound is not None and stall > self.stall_bound:
                raise SafetyViolation(f"{b} started {stall:.3f} s after {a} ended "
                                      f"(bound {self.stall_bound:g} s)")

    def _enqueue_order(self) -> None:
        acked = sorted(self.seqs, key=lambda t: self.acked[t])
        for a in acked:
            for b in acked:
                if self.keys[a] == self.keys[b] and self.acked[a] < self.enqueued[b] \
                        and self.seqs[a] >= self.seqs[b]:
                    raise SafetyViolation(f"{a} was acknowledged before {b} was enqueued, "
                                          f"but numbered after it")


# ------------------------------------------------------------------ the simulation
class Sim:
    def __init__(self, seed: int, n: int = 3, *, delay: tuple[float, float] = (0.001, 0.02),
                 loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
                 fail: float = 0.1, timeout: float = 2.0, options: dict | None = None,
                 schedules: bool = False, mode: str = "push"):
        self.seed = seed
        self.mode = mode  # the default queue's: pull (pull_sim.py) leases, never POSTs
        self.schedules = schedules  # each node runs the schedules' Ticker
        self.rng = random.Random(seed)
        self.loop = gevent.get_hub().loop
        self.fail = fail
        self.timeout = timeout
        self.options = {"replication": "2", "min_replicas": "2", "replica_offset": "1.0",
                        "replication_timeout": "1.0", "heartbeat_interval": "0.4",
                        "failure_timeout": "1.6", "election_timeout_min": "0.8",
                        "election_timeout_max": "1.6", "claim_lease": "5",
                        "memory_window": "30", "log_level": "WARNING", **(options or {})}
        self.checker = Checker(self)
        self.order = OrderChecker(self)
        self.network = Network(self, self.rng, delay=delay, loss=loss, dup=dup,
                               reorder=reorder)
        self.paused: set[str] = set()
        # tmpfs where there is one: the journal and the definitions file fsync, and a disk
        # made that most of a run's cost
        self.dir = tempfile.mkdtemp(prefix="miyamoto-sim-",
                                    dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.ids = [f"n{i + 1}" for i in range(n)]
        self.nodes: dict[str, SimNode] = {}
        for node_id in self.ids:
            self.network.register(node_id)
            data = os.path.join(self.dir, node_id)
            os.mkdir(data)
            # each seeded with all the others, as a cluster started together is
            self.nodes[node_id] = SimNode(self, node_id, data,
                                          [o for o in self.ids if o != node_id])
        self._resumed = gevent.event.Event()
        self._k = 0

    # ---------------------------------------------------------- time
    def now(self) -> float:
        return self.loop.now()

    def at(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        t = self.loop.timer(max(0.0, delay))
        t.start(fn, *args)

    def run_until(self, t: float) -> None:
        gevent.sleep(max(0.0, START + t - self.now()))

    # ---------------------------------------------------------- the worker
    def draw_delivery(self) -> tuple[str, float]:
        r = self.rng.random()
        latency = self.rng.uniform(0.002, 0.2)
        if r < self.fail * 0.3:
            return "refused", 0.001
        if r < self.fail * 0.8:
            return "error", latency
        if r < self.fail:
            return "hang", self.timeout
        if r < self.fail + 0.1:  # slow, but within the timeout: it outlives the offset
            return "ok", self.rng.uniform(0.5, 0.9 * self.timeout)
        return "ok", latency

    def delivery_started(self, node: str, task_id: str, ok: bool,
                         name: str | None = None) -> None:
        self.order.started(node, task_id, ok)
        self.checker.timed(node, task_id, name)
        self.checker.started(node, task_id, ok)

    def delivery_answered(self, node: str, task_id: str) -> None:
        self.order.answered(node, task_id)

    def delivery_ended(self, node: str, task_id: str) -> None:
        self.order.answered(node, task_id)  # (killed with its node: over for the worker)
        self.checker.ended(node, task_id)

    def wait_running(self, node: str) -> None:
        while node in self.paused:
            self._resumed.wait()

    # ---------------------------------------------------------- lifecycle and faults
    def start(self) -> None:
        for nd in self.nodes.values():
            nd.start()

    def pause(self, node: str, duration: float) -> None:
        nd = self.nodes[node]
        if node in self.paused or not nd.up:
            return
        self.paused.add(node)
        nd.clock.frozen = self.now()
        self.checker.fault(node, self.now(), self.now() + duration)
        self.at(duration, self._resume, node)

    def _resume(self, node: str) -> None:
        self.paused.discard(node)
        self.nodes[node].clock.frozen = None
        self.network.resume(node)
        self._resumed.set()
        self._resumed = gevent.event.Event()

    def crash(self, node: str, down: float) -> None:
        nd = self.nodes[node]
        if not nd.up or node in self.paused:
            return
        now = self.now()
        self.checker.fault(node, now, now + down)
        self.checker.crashes.append((node, now))
        nd.crash()
        gevent.spawn_later(down, self._restart, node)

    def _restart(self, node: str) -> None:
        self.nodes[node].start()

    def cut(self, links: set[tuple[str, str]], duration: float) -> None:
        now = self.now()
        new = links - self.network.cuts
        self.network.cuts |= new
        for a, b in new:
            for node in (a, b):
                self.checker.fault(node, now, now + duration)
                self.checker.cuts.append((node, now, now + duration))
        self.at(duration, self._heal, new)

    def _heal(self, links: set[tuple[str, str]]) -> None:
        self.network.cuts -= links

    def set_offset(self, node: str, offset: float) -> None:
        self.nodes[node].clock.offset = offset

    def offsets(self) -> dict[str, float]:
        return {i: nd.clock.offset for i, nd in self.nodes.items() if nd.clock.offset}

    # ---------------------------------------------------------- clients
    def task(self, countdown: float) -> Task:
        self._k += 1
        now = self.now()
        return Task(id=f"{self.seed:06d}-{self._k:05d}", queue="default",
                    url="http://worker.sim/hook", body="x", eta=now + countdown,
                    created=now, fire_at=now + countdown)

    def enqueue(self, node: str, countdown: float, key: str | None = None) -> None:
        """Enqueue on ``node`` in a client greenlet; acknowledged once it returns.
        ``key``: the task's ordering key."""
        nd = self.nodes[node]
        if not nd.up or nd.cluster is None:
            return
        c = nd.cluster
        t = self.task(countdown).evolve(ordering_key=key)
        if key is not None:
            self.order.keys[t.id] = key
            self.order.enqueued[t.id] = self.now()

        def client() -> None:
            try:
                stored = c.enqueue(t.evolve(eta=nd.clock.wall() + countdown,
                                            created=nd.clock.wall(),
                                            fire_at=nd.clock.wall() + countdown))
            except Exception as e:  # refused: not acknowledged
                log.debug("enqueue %s refused: %s", t.id, e)
                return
            self.checker.acked.add(stored.id)
            if key is not None:
                self.order.seqs[stored.id] = stored.ordering_seq
                self.order.acked[stored.id] = self.now()
        gevent.spawn(client)

    def enqueue_eta(self, node: str, delay: float) -> None:
        """A client with a true clock asks for an absolute eta ``delay`` s from now, as
        the API builds it (``build_task`` with the node's offset to the cluster's)."""
        nd = self.nodes[node]
        if not nd.up or nd.cluster is None:
            return
        c, eta = nd.cluster, self.now() + delay
        t = self.task(delay)

        def client() -> None:
            task = build_task({"url": t.url, "body": "x", "eta": eta}, path_queue=None,
                              idempotency_key=None, limits=Limits(), now=nd.clock.wall(),
                              offset=c.clock_offset())
            self.checker.due[t.id] = eta
            try:
                stored = c.enqueue(task.evolve(id=t.id))
            except Exception as e:
                log.debug("enqueue %s refused: %s", t.id, e)
                return
            self.checker.acked.add(stored.id)
        gevent.spawn(client)

    def put_schedule(self, node: str, name: str, every: int) -> None:
        nd = self.nodes[node]
        assert nd.cluster is not None
        value = parse_schedule({"name": name, "every": every,
                                "task": {"url": "http://worker.sim/tick", "body": "x"}},
                               limits=Limits(), now=self.now(), catch_up="none")
        status, _ = nd.cluster.defs.op("put", "schedule", name, value)
        assert status == 200, status

    def put_topic(self, node: str, name: str) -> None:
        nd = self.nodes[node]
        if not nd.up or nd.cluster is None:
            return
        defs = nd.cluster.defs

        def client() -> None:
            try:
                status, _ = defs.op("put", "topic", name, {"urls": ["http://worker.sim/t"]})
            except Exception as e:
                log.debug("topic %s refused: %s", name, e)
                return
            if status == 200:
                self.checker.defs_acked.add(name)
        gevent.spawn(client)

    def heal_all(self) -> None:
        self.network.cuts.clear()
        for node in list(self.paused):
            self._resume(node)
        for nd in self.nodes.values():
            nd.clock.offset = 0.0

    def stop(self) -> None:
        for nd in self.nodes.values():
            if nd.up:
                nd.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ seeded runs
FAULTS = ("pause", "crash", "cut", "oneway", "offset")
BOOT = 2.0  # simulated seconds for a cluster to form (a leader, a roster of all)
QUIET = 2.0
DRAIN = 10.0  # after the last enqueue: the faults heal at 1 s, crashed nodes are back by 3 s


def scenario(seed: int, faults: tuple[str, ...] = FAULTS, *, n: int | None = None,
             length: float = 3.0, plant: Callable[[], Any] | None = None) -> Sim:
    """One seeded run: a cluster forms, takes enqueues and a few faults for ``length``
    simulated seconds, heals, drains, and is checked throughout and at the end."""
    def main() -> Sim:
        gevent.get_hub().threadpool = InlinePool()
        rng = random.Random(seed ^ 0x5EED)
        size = n or rng.choice([3, 3, 3, 3, 3, 5])
        sim = Sim(seed, size, delay=(0.0005, rng.choice([0.005, 0.02, 0.05])),
                  loss=rng.choice([0.0, 0.0, 0.01, 0.03]), dup=rng.choice([0.0, 0.0, 0.01]),
                  reorder=rng.choice([0.0, 0.0, 0.02]))
        try:
            return _drive(sim, rng, faults, length)
        finally:
            sim.stop()
    if plant is not None:
        with plant():
            return run_virtual(main, start=START)
    return run_virtual(main, start=START)


def _drive(sim: Sim, rng: random.Random, faults: tuple[str, ...], length: float) -> Sim:
    sim.start()
    sim.run_until(BOOT)
    fault_at = sorted(rng.uniform(BOOT, BOOT + length) for _ in range(rng.randint(1, 3)))
    t = BOOT
    topics = 0
    while t < BOOT + length:
        t += 0.05
        sim.run_until(t)
        while fault_at and fault_at[0] <= t and faults:
            fault_at.pop(0)
            _fault(sim, rng, rng.choice(faults))
        if rng.random() < 0.35:
            sim.enqueue(rng.choice(sim.ids), rng.choice([0.0, 0.0, 0.3, 2.0]))
        if rng.random() < 0.01:
            topics += 1
            sim.put_topic(rng.choice(sim.ids), f"topic{topics}")
    sim.run_until(t + 1.0)
    sim.heal_all()
    # drain: at most DRAIN, but a run whose every acknowledged task was delivered may
    # stop QUIET seconds later (every copy behind it fires within the replica offset)
    quiet = None
    while sim.now() < START + t + DRAIN:
        sim.run_until(sim.now() - START + 0.25)
        if quiet is None and sim.checker.all_delivered() and \
                all(nd.up for nd in sim.nodes.values()):
            quiet = sim.now() + QUIET
        if quiet is not None and sim.now() >= quiet:
            break
    sim.checker.at_end()
    return sim


def _fault(sim: Sim, rng: random.Random, kind: str) -> None:
    victim = rng.choice(sim.ids)
    duration = rng.uniform(0.2, 3.0)
    if kind == "pause":
        sim.pause(victim, duration)
    elif kind == "crash":
        sim.crash(victim, rng.uniform(0.2, 3.0))
    elif kind == "cut":
        side = set(rng.sample(sim.ids, rng.randint(1, (len(sim.ids) - 1) // 2)))
        sim.cut({(a, b) for a in side for b in sim.ids if b not in side} |
                {(b, a) for a in side for b in sim.ids if b not in side}, duration)
    elif kind == "oneway":
        other = rng.choice([i for i in sim.ids if i != victim])
        sim.cut({(victim, other)}, duration)
    elif kind == "offset":
        sim.set_offset(victim, rng.uniform(-0.3, 0.3))


KEYS = ("k1", "k2", "k3")


def owner_of(sim: Sim, key: str, members: list[str]) -> str:
    """The ordering key's owner among ``members`` (as ``placement`` ranks them)."""
    probe = Task(id="-", queue="default", url="http://worker.sim/", ordering_key=key)
    return placement.ranked(sorted(members), placement.owner_key(probe))[0]  # type: ignore[arg-type]


def ordered_scenario(seed: int, faults: tuple[str, ...] = ("crash",), *,
                     length: float = 4.0) -> Sim:
    """Ordered tasks of a few keys enqueued on every node, 3 nodes, replication 2; the
    owner of one key crashes mid-stream (and ``faults`` add more), then it all heals
    and drains; the sibling rules and the ordering rules (``OrderChecker``) hold."""
    def main() -> Sim:
        gevent.get_hub().threadpool = InlinePool()
        rng = random.Random(seed ^ 0x0BDE)
        sim = Sim(seed, 3, delay=(0.0005, rng.choice([0.005, 0.02])),
                  loss=rng.choice([0.0, 0.0, 0.01]), fail=rng.choice([0.0, 0.1]))
        # one lease (an attempt's deadline and claim_lease) and the time to drop a member
        sim.order.stall_bound = sim.timeout + float(sim.options["claim_lease"]) + \
            float(sim.options["failure_timeout"])
        try:
            sim.start()
            sim.run_until(BOOT)
            victim = owner_of(sim, rng.choice(KEYS), sim.ids)
            crash_at = BOOT + rng.uniform(0.5, length - 1.0)
            t, crashed = BOOT, False
            while t < BOOT + length:
                t += 0.05
                sim.run_until(t)
                if not crashed and t >= crash_at:
                    crashed = True
                    sim.crash(victim, rng.uniform(0.5, 3.0))
                    if faults[1:] and rng.random() < 0.5:
                        _fault(sim, rng, rng.choice(faults[1:]))
                if rng.random() < 0.5:
                    sim.enqueue(rng.choice(sim.ids), rng.choice([0.0, 0.0, 0.0, 0.3]),
                                key=rng.choice(KEYS))
            sim.run_until(t + 1.0)
            sim.heal_all()
            sim.run_until(sim.now() - START + DRAIN + 5.0)
            sim.checker.at_end()
            sim.order.check()
            return sim
        finally:
            sim.stop()
    return run_virtual(main, start=START)


def run_ordered(seed: int, faults: tuple[str, ...] = ("crash",)) -> Sim:
    """``ordered_scenario`` with the replay command in the failure."""
    try:
        return ordered_scenario(seed, faults)
    except Exception as e:
        raise AssertionError(f"seed {seed} failed: {e}\nreplay: PYTHONHASHSEED=0 "
                             f"PYTHONPATH=$PWD .venv/bin/python tests/sim/cluster_sim.py "
                             f"{seed} {','.join(faults)} ordered") from e


def replay_command(seed: int, faults: tuple[str, ...] = FAULTS) -> str:
    return (f"PYTHONHASHSEED=0 PYTHONPATH=$PWD .venv/bin/python "
            f"tests/sim/cluster_sim.py {seed} {','.join(faults)}")


def run_seed(seed: int, faults: tuple[str, ...] = FAULTS) -> Sim:
    """``scenario`` with the replay command in the failure, for the test files."""
    try:
        return scenario(seed, faults)
    except Exception as e:
        raise AssertionError(f"seed {seed} failed: {e}\nreplay: {replay_command(seed, faults)}"
                             ) from e


def skew_scenario(seed: int, skewed: str, offset: float, *, length: float = 6.0) -> Sim:
    """One node's clock ``offset`` s off from the start and nothing else wrong: tasks with
    an absolute eta enqueued on every node, and a schedule ticking every second, must
    each reach the worker on time by the true clock (``Checker.timed``), whichever node
    took the task or leads; a node beyond max_clock_skew must fire no tick."""
    def main() -> Sim:
        gevent.get_hub().threadpool = InlinePool()
        rng = random.Random(seed ^ 0xC10C)
        sim = Sim(seed, 3, fail=0.0, schedules=True)
        sim.checker.late_bound = LATE
        sim.set_offset(skewed, offset)
        try:
            sim.start()
            while sim.now() - START < BOOT + 2.0:  # every clock placed; a skewed first
                sim.run_until(sim.now() - START + 0.05)  # leader has handed over
                sim.checker.leader_per_term()
            sim.put_schedule(rng.choice(sim.ids), "tick", 1)
            end = sim.now() - START + length
            while sim.now() - START < end:
                sim.run_until(sim.now() - START + 0.05)
                if rng.random() < 0.35:
                    sim.enqueue_eta(rng.choice(sim.ids), rng.choice([0.0, 0.3, 2.0, 3.0]))
            sim.run_until(sim.now() - START + 5.0)  # the last etas and copies
            sim.checker.at_end()
            ticks = [k for k in sim.checker.lateness if k.startswith("schedule:")]
            if len(ticks) < length - 1:
                raise SafetyViolation(f"{len(ticks)} ticks in {length:g} s")
            fired = sim.nodes[skewed].ticker.fired  # type: ignore[union-attr]
            if abs(offset) > float(sim.options.get("max_clock_skew", 1.0)) and fired:
                raise SafetyViolation(f"{skewed}, {offset:+g} s off, fired {fired} ticks")
            return sim
        finally:
            sim.stop()
    return run_virtual(main, start=START)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    s = int(sys.argv[1])
    kinds = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else FAULTS
    done = ordered_scenario(s, kinds) if sys.argv[3:] == ["ordered"] else scenario(s, kinds)
    print(f"seed {s}: ok, {done.checker.starts} delivery starts, "
          f"{len(done.checker.acked)} acknowledged, excused {dict(done.checker.excused)}")
