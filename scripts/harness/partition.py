"""Partition scenarios on real processes in network namespaces (``harness.netns``).

Why: the pause and kill scenarios (``harness.chaos``) stop a whole process; a partition
leaves every process running and breaks links only, so both sides act on what they see.
Three plans, each on a fresh 5-node cluster (replication 2) under a paced enqueue stream
aimed at the nodes of the reachable side only (the victims get no enqueues):

- ``follower``: one follower's cluster link is cut for ``cut_s`` (10 s) and healed;
- ``leader``: the leader and one follower (a minority) are split from the other three
  for ``cut_s``: the old leader must step down and the three must elect one;
- ``flap``: one follower's link goes down ``flap_down`` s and up ``flap_up`` s,
  ``flap_times`` times.

The victims keep their control link (HTTP and sink) throughout, so the test process sees
both sides. Each task has a ``countdown`` drawn from ``countdown`` (1-3 s), so many copies
come due during the cut. After healing: one roster again (all nodes agree), every
acknowledged task delivered (``drain_s`` deadline), ``grace_s`` more for late copies,
then the counts. ``in_flight_bound`` is the sink's arrivals in the ``window_s`` (1 s)
before each cut began: the duplicates the design allows ("only a delivery in flight when
the cut began may be repeated"). ``duplicates_started_after_cut`` is the strict count:
duplicates whose first attempt started, by the ``start`` in the copies' histories (the
namespaces share one clock), more than ``AROUND_S`` after a cut's commands were done
(``cut_commands_ms``; a split moves links one by one). ``scripts/partition.py`` prints
the report as JSON; ``tests/nodes/test_partitions.py`` asserts on it.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from .netns import CONTROL_NET, Net
from .nodes import CLUSTER_KEYS, NodeProcess, ProcessRegistry, stop_all, write_ini
from .sink import Sink
from .views import probe_view, wait_converged
from .waits import HarnessError

HOOK = "/hook"
POLL = 0.1
AROUND_S = 0.05  # an attempt that started this soon after a cut was made was cleared before it
PLANS = ("follower", "leader", "flap")

# The test suite's fast timings (tests/conftest.py FAST_OPTIONS) and retries.
FAST_NODE_OPTIONS: dict[str, Any] = {
    "replica_offset": 1.0, "replication_timeout": 2.0, "heartbeat_interval": 0.1,
    "failure_timeout": 1.0, "election_timeout_min": 0.3, "election_timeout_max": 0.6,
    "shutdown_timeout": 5.0, "log_level": "info",
}
FAST_DEFAULT_QUEUE = {"min_backoff": 0.05, "max_backoff": 0.5, "max_doublings": 3, "timeout": 5}


@dataclass
class Options:
    plan: str = "follower"
    nodes: int = 5
    replication: int = 2
    rate: float = 100.0
    countdown: tuple[float, float] = (1.0, 3.0)
    healthy_s: float = 4.0  # stream before the fault
    after_s: float = 4.0  # stream after the heal
    cut_s: float = 10.0
    flap_down: float = 2.0
    flap_up: float = 2.0
    flap_times: int = 5
    window_s: float = 1.0
    converge_s: float = 30.0
    drain_s: float = 40.0
    grace_s: float = 3.0
    startup_s: float = 30.0
    node_options: dict[str, Any] = field(default_factory=lambda: dict(FAST_NODE_OPTIONS))
    seed: int | None = None
    workdir: str | None = None


class Load:
    """``rate`` enqueues/s over ``targets()`` (read afresh per request), from a pool;
    bounded by ``max_tasks`` and ``max_seconds``. ``acked`` maps task id -> seq."""

    def __init__(self, targets: Callable[[], list[NodeProcess]], url: str, rate: float,
                 countdown: tuple[float, float], max_seconds: float, rng: random.Random) -> None:
        self.targets, self.url, self.rate = targets, url, rate
        self.countdown, self.max_seconds, self.rng = countdown, max_seconds, rng
        self.max_tasks = int(rate * max_seconds) + 1
        self.acked: dict[str, int] = {}
        self.sent = 0
        self.errors: Counter = Counter()
        self.run = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._local = threading.local()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(int(rate * 6) + 8, thread_name_prefix="enqueue")
        self._pacer = threading.Thread(target=self._pace, name="enqueue-pacer", daemon=True)

    def start(self) -> "Load":
        self._pacer.start()
        return self

    def join(self, timeout: float) -> None:
        """Wait for the pacer to finish its bounded run, then for the requests sent."""
        self._pacer.join(timeout)
        self._stop.set()
        self._pool.shutdown(wait=True)  # each request has a 5 s timeout

    def stop(self) -> None:
        self._stop.set()
        self._pacer.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _pace(self) -> None:
        t0 = time.monotonic()
        for seq in range(self.max_tasks):
            due = t0 + seq / self.rate
            if due - t0 > self.max_seconds or self._stop.wait(max(0.0, due - time.monotonic())):
                break
            nodes = self.targets()
            cd = round(self.rng.uniform(*self.countdown), 3)
            self._pool.submit(self._send, nodes[seq % len(nodes)], seq, cd)

    def _send(self, node: NodeProcess, seq: int, countdown: float) -> None:
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = requests.Session()
            s.trust_env = False
        body = {"url": self.url, "countdown": countdown,
                "params": {"seq": str(seq), "run": self.run}}
        try:
            r = s.post(node.url + "/queue", json=body, timeout=5.0)
            tid = r.json().get("id") if r.status_code == 200 else None
            kind = None if tid else f"HTTP {r.status_code}"
        except (requests.RequestException, ValueError) as e:
            tid, kind = None, type(e).__name__
        with self._lock:
            self.sent += 1
            if tid:
                self.acked[str(tid)] = seq
            else:
                self.errors[kind] += 1


class PartitionScenario:
    """Owns a Net, 5 nodes in it, a sink on the root address and the load; ``run()``."""

    def __init__(self, opts: Options, log: Callable[[str], None] = lambda m: None,
                 registry: ProcessRegistry | None = None) -> None:
        if opts.plan not in PLANS:
            raise ValueError(f"plan is one of {PLANS}, not {opts.plan!r}")
        self.opts, self.log, self.registry = opts, log, registry
        self.seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 31)
        self.rng = random.Random(self.seed)
        self.workdir = Path(opts.workdir or tempfile.mkdtemp(prefix=f"miyamoto-partition-{opts.plan}-"))
        self.net: Net | None = None
        self.sink: Sink | None = None
        self.nodes: list[NodeProcess] = []
        self.load: Load | None = None
        self.victims: list[str] = []
        self.cuts: list[float] = []  # time.time() at each cut (its commands begin)
        self.cuts_done: list[float] = []  # ... and once its commands are done
        self.events: dict[str, Any] = {}

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "PartitionScenario":
        try:
            self.net = Net()
            self.sink = Sink(host=self.net.root_ip).start()
            self._start_cluster()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        stop_all(self.nodes, timeout=10.0)
        for n in self.nodes:
            n.close()
        if self.sink is not None:
            self.sink.stop()
        if self.net is not None:
            self.net.close()

    def _start_cluster(self) -> None:
        o, net = self.opts, self.net
        assert net is not None
        opts = dict(o.node_options)
        opts.update({"replication": o.replication, "insecure_http": "true",
                     "target_allow": f"{CONTROL_NET}.0.0/16",
                     "curve_public": CLUSTER_KEYS[0], "curve_secret": CLUSTER_KEYS[1]})
        ini = write_ini(self.workdir / "node.ini",
                        {"miyamoto": opts, "queue:default": FAST_DEFAULT_QUEUE})
        ids = [chr(ord("a") + i) for i in range(o.nodes)]
        hosts = [net.add_host(i) for i in ids]
        self.nodes = [net.node(h, self.workdir, config=ini, registry=self.registry) for h in hosts]
        seeds = [n.cluster_addr for n in self.nodes]
        for n in self.nodes:
            n.seeds = seeds
            n.start()
        for n in self.nodes:
            n.wait_ready(o.startup_s)
        view = wait_converged(self.nodes, o.startup_s)
        self.log(f"{o.plan}: 5 nodes up in {self.workdir} (leader {view.get('leader')}, "
                 f"block {net.block}, seed {self.seed})")

    # ------------------------------------------------------------ the run
    def _leader(self) -> str:
        view = wait_converged(self.nodes, self.opts.converge_s)
        return str(view["leader"])

    def _targets(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.node_id not in self.victims]

    def run(self) -> dict[str, Any]:
        o = self.opts
        leader = self._leader()
        followers = [n.node_id for n in self.nodes if n.node_id != leader]
        if o.plan == "leader":
            self.victims = [leader, self.rng.choice(followers)]
            fault_s = o.cut_s
        else:
            self.victims = [self.rng.choice(followers)]
            fault_s = o.cut_s if o.plan == "follower" else o.flap_times * (o.flap_down + o.flap_up)
        assert self.sink is not None
        self.load = Load(self._targets, self.sink.url_for(HOOK), o.rate, o.countdown,
                         o.healthy_s + fault_s + o.after_s, self.rng)
        t0 = time.time()
        self.load.start()
        time.sleep(o.healthy_s)  # the healthy stretch the window before the cut looks at
        self.log(f"{o.plan}: cutting {self.victims} (leader {leader})")
        if o.plan == "flap":
            self._flap()
        else:
            self._cut_and_watch(leader)
        healed_at = time.time()
        self.load.join(o.after_s + 30.0)
        self.log(f"{o.plan}: healed; stream done: sent {self.load.sent}, "
                 f"acknowledged {len(self.load.acked)}, errors {dict(self.load.errors)}")
        converge = self._converge(healed_at)
        drain = self._drain()
        time.sleep(o.grace_s)  # late copies of the cut side would fire now
        return self.report(t0, leader, converge, drain)

    def _flap(self) -> None:
        """``Net.flap``, with the time each cut's commands are done."""
        o, net = self.opts, self.net
        assert net is not None
        for _ in range(o.flap_times):
            self.cuts.append(time.time())
            net.cut(self.victims[0])
            self.cuts_done.append(time.time())
            time.sleep(o.flap_down)
            net.heal(self.victims[0])
            time.sleep(o.flap_up)

    def _cut_and_watch(self, leader: str) -> None:
        """Cut (follower) or split (leader + one follower); until the heal, watch the old
        leader step down and the majority elect a leader of its own."""
        o, net = self.opts, self.net
        assert net is not None
        majority = [n for n in self.nodes if n.node_id not in self.victims]
        self.cuts.append(time.time())
        if o.plan == "leader":
            net.split([n.node_id for n in majority], self.victims)
        else:
            net.cut(self.victims[0])
        self.cuts_done.append(time.time())
        end = self.cuts[0] + o.cut_s
        while time.time() < end:  # observing, not waiting: the cut lasts cut_s whatever
            now = time.time() - self.cuts[0]
            old = probe_view(next(n for n in self.nodes if n.node_id == leader), 1.0)
            if "stepdown_s" not in self.events and old is not None and \
                    (old.get("role") != "leader" or old.get("leader") != leader):
                self.events["stepdown_s"] = round(now, 2)
            views = [probe_view(n, 1.0) for n in majority]
            leaders = {v.get("leader") if v else None for v in views}
            if "majority_leader_s" not in self.events and len(leaders) == 1 and \
                    leaders <= {n.node_id for n in majority}:
                self.events["majority_leader_s"] = round(now, 2)
                self.events["majority_leader"] = leaders.pop()
            time.sleep(min(POLL, max(0.0, end - time.time())))
        net.heal()

    def _converge(self, healed_at: float) -> float | None:
        try:
            wait_converged(self.nodes, self.opts.converge_s)
        except HarnessError as e:
            self.log(f"{self.opts.plan}: no single roster {self.opts.converge_s:g}s after the heal: {e}")
            return None
        return round(time.time() - healed_at, 2)

    def _drain(self) -> float | None:
        assert self.load is not None and self.sink is not None
        t = time.monotonic()
        while time.monotonic() < t + self.opts.drain_s:
            seen = self.sink.by_task_id(HOOK)
            if all(tid in seen for tid in self.load.acked):
                return round(time.monotonic() - t, 2)
            time.sleep(0.2)
        return None

    # ------------------------------------------------------------ counting
    def _first_starts(self, task_ids: list[str]) -> dict[str, float]:
        """The earliest attempt start of each task, from its copies' histories on every
        node (GET /tasks/ID); a task no node can tell about counts as started now."""
        firsts = {t: time.time() for t in task_ids}
        s = requests.Session()
        s.trust_env = False  # namespace addresses never go through a proxy
        for n in self.nodes:
            for tid in task_ids:
                try:
                    r = s.get(f"{n.url}/tasks/{tid}", timeout=5.0)
                    history = (r.json().get("history") or []) if r.status_code == 200 else []
                except (requests.RequestException, ValueError):
                    continue
                starts = [h["start"] for h in history
                          if isinstance(h, dict) and isinstance(h.get("start"), (int, float))]
                if starts:
                    firsts[tid] = min(firsts[tid], *starts)
        return firsts

    def report(self, t0: float, leader: str, converge: float | None,
               drain: float | None) -> dict[str, Any]:
        assert self.load is not None and self.sink is not None
        acked = set(self.load.acked)
        reqs = self.sink.requests(HOOK)
        counts = self.sink.by_task_id(HOOK)
        window = sum(1 for r in reqs for c in self.cuts if c - self.opts.window_s <= r.time <= c)
        dup_tasks = [t for t, k in counts.items() if k > 1]
        # a duplicate whose first attempt started (by the clock of the node that made it,
        # which all namespaces share) more than AROUND_S after a cut's commands were done,
        # or before the window_s before a cut began, was not in flight at a cut: it is one
        # the design forbids ("neither side of a cut delivers what the other side will").
        # Its arrival at the sink says less: on a loaded box it lags the start by 0.1 s+.
        firsts = self._first_starts(dup_tasks)
        unexplained = [t for t in dup_tasks if not any(
            c - self.opts.window_s <= firsts[t] <= done + AROUND_S
            for c, done in zip(self.cuts, self.cuts_done))]
        by_ip = {n.http_host: n.node_id for n in self.nodes}
        dup_detail = []  # (task, [(seconds from t0, node that delivered)]) of a few
        for tid in (sorted(unexplained) + sorted(set(dup_tasks) - set(unexplained)))[:10]:
            dup_detail.append([tid, [(round(r.time - t0, 2), by_ip.get(r.client, r.client))
                                     for r in sorted(reqs, key=lambda r: r.time) if r.task_id == tid]])
        return {
            "plan": self.opts.plan, "seed": self.seed, "nodes": self.opts.nodes,
            "replication": self.opts.replication, "rate": self.opts.rate,
            "leader_before": leader, "victims": self.victims,
            "sent": self.load.sent, "acknowledged": len(acked),
            "not_acknowledged": dict(self.load.errors),
            "delivered": sum(1 for t in acked if t in counts),
            "lost": sum(1 for t in acked if t not in counts),
            "lost_ids": sorted(t for t in acked if t not in counts)[:10],
            "deliveries": len(reqs),
            "duplicates": sum(counts[t] - 1 for t in dup_tasks),
            "duplicated_tasks": len(dup_tasks),
            "duplicate_samples": dup_detail,
            "duplicates_started_after_cut": len(unexplained),
            "unacknowledged_delivered": sum(1 for t in counts if t not in acked),
            "in_flight_bound": window,
            "cuts_at_s": [round(c - t0, 2) for c in self.cuts],
            "cut_commands_ms": [round(1000 * (d - c)) for c, d in zip(self.cuts, self.cuts_done)],
            "first_starts_s": {t[:8]: round(firsts[t] - t0, 3) for t in sorted(dup_tasks)[:10]},
            **self.events,
            "one_roster_after_heal_s": converge,
            "drain_s": drain,
            "elapsed_s": round(time.time() - t0, 1),
            "workdir": str(self.workdir),
        }
