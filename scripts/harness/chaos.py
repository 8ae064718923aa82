"""Fault scenarios on real processes: SIGSTOP/SIGCONT pauses and kill -9 with restarts,
under a steady enqueue stream, counting every delivery at a sink by ``X-Task-Id``.

``Scenario`` is a context manager that owns everything it starts (the sink, the nodes,
the stream) and stops all of it on exit, error or Ctrl-C. Default node timings on
purpose (replica_offset 5 s, heartbeat 0.5 s, failure timeout 3 s): the faults are
meant to meet the cluster as a user runs it. ``scripts/chaos.py`` is the command line;
``tests/nodes/test_pause.py`` runs the pause plan.

Duplicates are extra deliveries of one task id. Each is charged to the fault that came
last before it; a fault's ``in_flight`` is the victim's ``miyamoto_deliveries_in_flight``
sampled right before the signal (and ``sink_in_flight`` the sink's requests received but
not yet answered then): the duplicates the design allows.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .nodes import NodeProcess, ProcessRegistry, plan_cluster, stop_all
from .sink import Sink
from .traffic import Stream
from .views import metrics, probe_view, wait_converged
from .waits import HarnessError

HOOK = "/hook"
POLL = 0.2


@dataclass
class Options:
    """One scenario run. ``pauses`` are roles ("leader" / "follower") paused in order."""

    mode: str = "pause"
    seed: int | None = None
    nodes: int = 3
    replication: int = 2
    rate: float = 100.0
    pause_s: float = 10.0
    pauses: Sequence[str] = ("leader", "leader", "follower", "follower")
    gap_s: float = 3.0  # healthy stream after the cluster agrees again, between faults
    duration_s: float = 120.0  # kill mode
    kill_every: tuple[float, float] = (4.0, 8.0)
    restart_after: tuple[float, float] = (2.0, 5.0)
    reconverge_s: float = 30.0
    drain_s: float = 90.0
    grace_s: float = 6.0
    startup_s: float = 30.0
    node_env: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    workdir: str | None = None
    client: str = "one-node"  # the stream's: "one-node" (plain requests) or "failover"
    named: bool = False  # the stream's tasks carry names (safe to repeat after a 503)


@dataclass
class Fault:
    kind: str  # "pause" | "kill"
    node: str
    role: str
    at: float  # time.time() when the signal was sent
    in_flight: int | None
    sink_in_flight: int
    back_at: float | None = None
    reconverge_s: float | None = None
    duplicates: int = 0
    sampled_at: float = 0.0
    around: int = 0  # deliveries that reached the sink between the sample and the signal

    def report(self, t0: float) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "role": self.role,
                "at_s": round(self.at - t0, 2), "in_flight": self.in_flight,
                "started_around_signal": self.around,
                "sink_in_flight": self.sink_in_flight, "duplicates": self.duplicates,
                "back_after_s": None if self.back_at is None else round(self.back_at - self.at, 2),
                "reconverge_s": self.reconverge_s}


AROUND_S = 0.02  # a request on its way when the signal went


class Scenario:
    """Start a cluster and a sink; ``run()`` streams, injects the faults, drains, reports."""

    def __init__(self, opts: Options, log: Callable[[str], None] = lambda m: None,
                 registry: ProcessRegistry | None = None) -> None:
        self.opts = opts
        self.log = log
        self.registry = registry  # a test's: its nodes' logs go into a failure report
        self.seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 31)
        self.rng = random.Random(self.seed)
        self.workdir = Path(opts.workdir or tempfile.mkdtemp(prefix=f"miyamoto-chaos-{opts.mode}-"))
        self.sink = Sink()
        self.nodes: list[NodeProcess] = []
        self.faults: list[Fault] = []
        self.stream: Stream | None = None
        self.t0 = time.time()

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Scenario":
        self.sink.start()
        try:
            self._start_cluster()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start_cluster(self) -> None:
        o = self.opts
        ids = [chr(ord("a") + i) for i in range(o.nodes)]
        args = ["--replication", str(o.replication), "--log-level", o.log_level]
        self.nodes = plan_cluster(self.workdir, ids, extra_args=args, raw_env=o.node_env,
                                  own_session=True, registry=self.registry)
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            n.wait_ready(o.startup_s)
        view = wait_converged(self.nodes, o.startup_s)
        self.log(f"cluster up in {self.workdir}: leader {view.get('leader')}, seed {self.seed}")

    def close(self) -> None:
        if self.stream is not None:
            self.stream.stop(timeout=10.0)
        stop_all(self.nodes, timeout=10.0)
        for n in self.nodes:
            n.close()
        self.sink.stop()

    # ------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        o = self.opts
        longest = (len(o.pauses) * (o.pause_s + o.reconverge_s + o.gap_s) if o.mode == "pause"
                   else o.duration_s + max(o.restart_after) + o.gap_s) + 60.0
        self.stream = Stream(self.nodes, self.sink.url_for(HOOK), rate=o.rate,
                             max_tasks=int(o.rate * longest), max_seconds=longest,
                             run=uuid.uuid4().hex[:12], client=o.client, named=o.named)
        load0 = os.getloadavg()[0]
        self.t0 = time.time()
        self.stream.start()
        time.sleep(o.gap_s)  # a healthy stretch first: the baseline before any fault
        if o.mode == "pause":
            for role in o.pauses:
                self.pause_one(role)
        elif o.mode == "kill":
            self.kill_loop()
        else:
            raise ValueError(f"unknown mode {o.mode!r}")
        self.stream.stop()
        self.log(f"stream stopped: {self.stream.summary()}")
        self._all_back()
        drain = self._drain()
        time.sleep(o.grace_s)  # late copies of a stalled node would fire now
        return self.report(load0, drain)

    def _running(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.running and not n.paused]

    def leader(self) -> str | None:
        for n in self._running():
            view = probe_view(n)
            if view and view.get("leader"):
                return view["leader"]
        return None

    def _victim(self, role: str) -> NodeProcess:
        leader = self.leader()
        live = self._running()
        if role == "leader":
            pick = [n for n in live if n.node_id == leader]
        elif role == "follower":
            pick = [n for n in live if n.node_id != leader]
        else:
            pick = live
        if not pick:
            raise HarnessError(f"no {role} to fault (leader {leader}, live "
                               f"{[n.node_id for n in live]})")
        return self.rng.choice(pick)

    def _fault(self, kind: str, node: NodeProcess, role: str) -> Fault:
        """Sample what is in flight, then signal at once."""
        sampled_at = time.time()
        sample = metrics(node, timeout=1.0) or {}
        in_flight = sample.get("deliveries_in_flight")
        sink_in_flight = self.sink.inflight
        if kind == "pause":
            node.pause()
        else:
            node.kill()
        fault = Fault(kind, node.node_id, role, time.time(),
                      None if in_flight is None else int(in_flight), sink_in_flight,
                      sampled_at=sampled_at)
        self.faults.append(fault)
        self.log(f"{kind} {role} {node.node_id} (in flight {fault.in_flight})")
        return fault

    def _arrivals(self, start: float, end: float) -> int:
        """Deliveries (of any node) that reached the sink in [start, end]: a delivery the
        victim started after its /metrics sample and before the signal is among them."""
        return sum(1 for r in self.sink.requests(HOOK) if start <= r.time <= end)

    def pause_one(self, role: str) -> None:
        node = self._victim(role)
        fault = self._fault("pause", node, role)
        time.sleep(self.opts.pause_s)  # the fault itself: a fixed freeze
        fault.around = self._arrivals(fault.sampled_at, fault.at + AROUND_S)
        node.resume()
        fault.back_at = time.time()
        fault.reconverge_s = self._reconverge()
        time.sleep(self.opts.gap_s)

    def _reconverge(self) -> float | None:
        t = time.monotonic()
        try:
            wait_converged(self.nodes, self.opts.reconverge_s)
        except HarnessError as e:
            if any(not n.running for n in self.nodes):
                raise
            self.log(f"cluster did not agree again within {self.opts.reconverge_s:g}s: {e}")
            return None
        return round(time.monotonic() - t, 2)

    def kill_loop(self) -> None:
        """kill -9 a random node every ``kill_every`` s; restart it ``restart_after`` s later."""
        o = self.opts
        end = time.monotonic() + o.duration_s
        next_kill = time.monotonic() + self.rng.uniform(*o.kill_every)
        for _ in range(int(o.duration_s / min(o.kill_every)) + 1):
            time.sleep(max(0.0, next_kill - time.monotonic()))
            if time.monotonic() >= end:
                break
            node = self._victim("any")
            fault = self._fault("kill", node, "leader" if node.node_id == self.leader() else "follower")
            back = fault.at + self.rng.uniform(*o.restart_after)
            next_kill = time.monotonic() + self.rng.uniform(*o.kill_every)
            time.sleep(max(0.0, back - time.time()))
            node.start()
            fault.back_at = time.time()
            next_kill = max(next_kill, time.monotonic())

    def _all_back(self) -> None:
        for n in self.nodes:
            if n.paused:
                n.resume()
            if not n.running:
                n.start()
        for n in self.nodes:
            n.wait_ready(self.opts.startup_s)

    def _drain(self) -> float | None:
        """Seconds until every acknowledged task reached the sink (None: not by drain_s)."""
        assert self.stream is not None
        t = time.monotonic()
        deadline = t + self.opts.drain_s
        while time.monotonic() < deadline:
            seen = self.sink.by_task_id(HOOK)
            missing = sum(1 for tid in self.stream.acked if tid not in seen)
            if not missing:
                return round(time.monotonic() - t, 2)
            time.sleep(POLL)
        return None

    # ------------------------------------------------------------ counting
    def _charge_duplicates(self, deliveries: list) -> tuple[int, int]:
        """(extra deliveries, tasks delivered more than once) of the sink's ``deliveries``
        in time order; charges each to a fault."""
        seen: set[str] = set()
        dup_ids: set[str] = set()
        extra = 0
        for req in deliveries:
            tid = req.task_id or ""
            if tid not in seen:
                seen.add(tid)
                continue
            extra += 1
            dup_ids.add(tid)
            earlier = [f for f in self.faults if f.at <= req.time]
            if earlier:
                earlier[-1].duplicates += 1
        return extra, len(dup_ids)

    def report(self, load0: float, drain: float | None) -> dict[str, Any]:
        assert self.stream is not None
        acked = set(self.stream.acked)
        counts = self.sink.by_task_id(HOOK)
        deliveries = sorted(self.sink.requests(HOOK), key=lambda r: r.time)
        extra, dup_tasks = self._charge_duplicates(deliveries)
        before_faults = extra - sum(f.duplicates for f in self.faults)
        in_flight = [f.in_flight for f in self.faults]
        out: dict[str, Any] = {"mode": self.opts.mode, "seed": self.seed,
                               "nodes": self.opts.nodes, "replication": self.opts.replication,
                               "rate": self.opts.rate}
        out.update(self.stream.summary())
        out.update({
            "delivered": sum(1 for t in acked if t in counts),
            "lost": sum(1 for t in acked if t not in counts),
            "duplicates": extra,
            "duplicated_tasks": dup_tasks,
            "duplicated_acknowledged": sum(1 for t in acked if counts.get(t, 0) > 1),
            "duplicate_rate": round(dup_tasks / len(counts), 4) if counts else None,
            "deliveries": sum(counts.values()),
            "unacknowledged_delivered": sum(1 for t in counts if t not in acked),
            "in_flight_at_faults": sum(n for n in in_flight if n is not None),
            "in_flight_unknown": in_flight.count(None),  # victims that did not answer /metrics
            "started_around_faults": sum(f.around for f in self.faults),
            "duplicates_before_faults": before_faults,
            "drain_s": drain,
            "elapsed_s": round(time.time() - self.t0, 1),
            "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "faults": [f.report(self.t0) for f in self.faults],
            "duplicate_deliveries": self._duplicate_times(deliveries, counts),
            "workdir": str(self.workdir),
        })
        return out

    def _duplicate_times(self, deliveries: list, counts: dict[str, int],
                         most: int = 60) -> dict[str, list]:
        """For up to ``most`` duplicated tasks, when each delivery reached the sink (s
        from the start) and its X-Task-Retry-Count: what tells a sibling's copy firing
        after its hold from a restarted node's reloaded copy."""
        dup = {t for t, n in counts.items() if n > 1}
        out: dict[str, list] = {}
        for req in deliveries:
            tid = req.task_id or ""
            if tid in dup and (tid in out or len(out) < most):
                out.setdefault(tid, []).append(
                    [round(req.time - self.t0, 3), req.headers.get("X-Task-Retry-Count")])
        return out
