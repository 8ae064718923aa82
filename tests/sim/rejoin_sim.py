"""A restarted node rejoins: the whole composed cluster (``cluster_sim.Sim``) on virtual
time, with copies due far beyond the memory window and tasks that end while the node
is down, checked once the cluster has been quiet for a while after the rejoin.

The run: 3 real nodes, replication 2, a memory window of 5 s. Tasks due in 60 s (only
in the journals) and tasks due at once are enqueued on every node; once those are
delivered, one node is killed (kill -9) for long enough to be dropped from the roster,
so the survivors restore the copies it held; meanwhile a survivor resends every
succeeded task (a bulk resend: a new run of each, delivered and ended while the node is
down). The node restarts on its data dir and rejoins.

The checker (``RejoinChecker``), ``QUIET_AFTER`` seconds after the restart: no node holds

- a live copy of a task that was moved elsewhere (a sibling holds a copy whose replica
  set leaves this node out), or that ended on a sibling in the same run or a later one;
- the record of an ended copy of a task moved elsewhere, or of a run earlier than a
  sibling's end of the task.

Before the rejoin's reconciling (``replicas.effects.Reconcile``) the restarted node held
such copies until they came due (a label search showed the far ones twice) or forever
(a bulk resend of the ends before a time reran the stale ones). The network delays,
reorders and duplicates frames but loses none: a lost probe is not asked again (the copy
still asks when it comes due), so the property is for a network that delivers.
"""

from __future__ import annotations

import random
from typing import Callable, ContextManager

import gevent

from cluster_sim import BOOT, START, SafetyViolation, Sim  # noqa: E402
from twins import InlinePool  # noqa: E402
from vloop import run_virtual  # noqa: E402

from miyamoto.tasks.task import Task

FAR = 60.0  # s: the far tasks' countdown (beyond the window, and beyond the run)
QUIET_AFTER = 4.0  # s after the restart: the rejoin and its probes are over by then


class RejoinChecker:
    """The state of every copy the up nodes hold, live or ended, compared across nodes."""

    def __init__(self, sim: Sim):
        self.sim = sim

    def copies(self) -> dict[str, dict[str, Task]]:
        """node -> task id -> its copy (memory's record where newer than the journal's)."""
        out: dict[str, dict[str, Task]] = {}
        for nd in self.sim.nodes.values():
            c = nd.cluster
            if not nd.up or c is None:
                continue
            rows = c.journal.rows(0, c.journal.last_rowid(), 1_000_000)
            out[nd.id] = {t.id: c.engine.live.mem.get(t.id, t) for _, t in rows}
        return out

    def check(self, only: str | None = None, live_only: bool = False) -> None:
        """Raise on the first stale copy (of node ``only``, if given; live ones only,
        with ``live_only``)."""
        held = self.copies()
        for node, mine in held.items():
            if only not in (None, node):
                continue
            for task_id, t in mine.items():
                if live_only and t.state.ended:
                    continue
                for other, theirs in held.items():
                    d = theirs.get(task_id)
                    if other != node and d is not None and other in d.replicas:
                        stale = _stale(node, t, d)
                        if stale:
                            raise SafetyViolation(
                                f"{node} holds {'an ended' if t.state.ended else 'a live'} "
                                f"copy of {task_id} ({t.state.value}, run {t.reruns}, "
                                f"replicas {','.join(t.replicas)}) that {stale} on {other} "
                                f"({d.state.value}, run {d.reruns}, replicas "
                                f"{','.join(d.replicas)})")


def _stale(node: str, t: Task, d: Task) -> str:
    """Why ``node``'s copy ``t`` is stale beside a sibling's copy ``d`` ("": it is not)."""
    if node not in d.replicas:
        return "was moved elsewhere"
    if not t.state.ended and d.state.ended and d.reruns >= t.reruns:
        return "ended"
    if t.state.ended and d.state.ended and d.reruns > t.reruns:
        return "ended in a later run"
    return ""


def rejoin_scenario(seed: int, plant: Callable[[], ContextManager] | None = None) -> Sim:
    """One seeded run (see the module's docstring); raises SafetyViolation."""
    def main() -> Sim:
        gevent.get_hub().threadpool = InlinePool()
        rng = random.Random(seed ^ 0x4E70)
        sim = Sim(seed, 3, delay=(0.0005, rng.choice([0.005, 0.02])), loss=0.0,
                  dup=rng.choice([0.0, 0.01]), reorder=rng.choice([0.0, 0.02]),
                  fail=0.0, options={"memory_window": "5"})
        try:
            return _drive(sim, rng)
        finally:
            sim.stop()
    if plant is not None:
        with plant():
            return run_virtual(main, start=START)
    return run_virtual(main, start=START)


def _drive(sim: Sim, rng: random.Random) -> Sim:
    sim.start()
    sim.run_until(BOOT + 1.0)  # every node in the roster and in touch
    for i in range(24):
        node = sim.ids[i % 3]
        sim.enqueue(node, FAR if i % 2 else rng.choice([0.0, 0.2]))
    sim.run_until(BOOT + 4.0)  # the near tasks delivered, every copy ended
    victim, down = rng.choice(sim.ids), rng.uniform(3.5, 5.0)
    survivor = rng.choice([i for i in sim.ids if i != victim])
    sim.crash(victim, down)
    crashed = sim.now() - START
    sim.run_until(crashed + rng.uniform(0.0, 2.5))
    _resend_all(sim, survivor)
    sim.run_until(crashed + down)
    _until_ready(sim, victim, crashed + down + QUIET_AFTER)
    # ready: none of its live copies is one restored elsewhere while it was down (a
    # search on it right then showed them beside the new ones)
    RejoinChecker(sim).check(only=victim, live_only=True)
    sim.run_until(crashed + down + QUIET_AFTER)
    if sim.checker.violations:
        raise sim.checker.violations[0]
    if not all(nd.up for nd in sim.nodes.values()):
        raise SafetyViolation("a node did not come back")
    RejoinChecker(sim).check()
    return sim


def _until_ready(sim: Sim, node: str, deadline: float) -> None:
    """Run until ``node`` is back and its /readyz would say ready (``Cluster.ready``)."""
    while sim.now() - START < deadline:
        c = sim.nodes[node].cluster
        if sim.nodes[node].up and c is not None and c.membership is not None and c.ready()[0]:
            return
        sim.run_until(sim.now() - START + 0.01)
    raise SafetyViolation(f"{node} was not ready {QUIET_AFTER} s after its restart")


def _resend_all(sim: Sim, node: str) -> None:
    """A client's bulk resend of every succeeded task, on ``node`` (in its greenlet)."""
    c = sim.nodes[node].cluster
    assert c is not None
    for runs in sim.checker.deliveries.values():  # a new run is no duplicate of the last
        runs[:] = [(n, at, False) for n, at, _ in runs]

    def client() -> None:
        try:
            c.queries.resend_many("default", {"state": "succeeded"})
        except Exception:  # refused while the cluster is short of a member: fine
            pass
    gevent.spawn(client)


def replay_command(seed: int) -> str:
    return (f"PYTHONHASHSEED=0 PYTHONPATH=$PWD .venv/bin/python tests/sim/rejoin_sim.py "
            f"{seed}")


def run_seed(seed: int) -> Sim:
    try:
        return rejoin_scenario(seed)
    except Exception as e:
        raise AssertionError(f"seed {seed} failed: {e}\nreplay: {replay_command(seed)}") from e


if __name__ == "__main__":
    import sys
    s = int(sys.argv[1])
    done = rejoin_scenario(s)
    print(f"seed {s}: ok, {done.checker.starts} delivery starts")
