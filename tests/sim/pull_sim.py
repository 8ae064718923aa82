"""Pull queues in the whole-cluster simulator (``cluster_sim.Sim``: the real composed
nodes on virtual time, with pauses, crashes, cuts, one-way cuts and clock offsets).

The default queue is in mode pull; a puller per node (a client outside the node, so a
crash of the node does not kill it, and one that waits while its node is paused, as a
SIGSTOPped node answers nothing) leases through that node's cluster layer as the HTTP
route does (``Queries.lease``: its own copies, then the peers'), works a while and then
acks, nacks, extends and acks, or walks away (its lease runs out). ``PullChecker``
states the rules, checked at every lease and at the end:

- No two leases of one task at once: a lease handed out while an earlier lease of the
  task is still live (not answered by its puller, and before its end on the holder's
  clock, which an offset fault may step: a lease is judged there) is a ``SafetyViolation``, unless the earlier lease's
  holder crashed since (a lease's journal write is not waited for: a restart may not
  find it, as a delivery in flight when its node died may be repeated) or a cut had
  its holder on one side while it lasted (the roster may re-home a task's copies on
  both sides of a cut: the sibling protocol's at-least-once across cuts, which the
  push checker excuses too). A pause, a clock offset, loss and duplication excuse
  nothing.
- None lost: at the end, after the faults heal and the pullers drain the queue, every
  acknowledged task was acked by a puller (or its holder has it succeeded: the ack
  reached it, the answer was lost on the way back).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import gevent

from cluster_sim import BOOT, FAULTS, START, SafetyViolation, Sim, _fault
from miyamoto.delivery import completion
from twins import InlinePool
from vloop import run_virtual

LEASE_S = 3.0
SLACK = 0.01  # s: a re-lease this close to the earlier lease's end is at its end
DRAIN = 40.0  # s: after the faults heal, walked-away leases run out and are leased again


@dataclass
class Lease:
    task_id: str
    holder: str  # the node whose copy was leased
    start: float  # true time
    end: float  # when its lease runs out, on the holder's clock (moved by an extend)
    attempt: int
    answered: bool = False  # its puller acked or nacked it (or tried to: no longer live)


class PullChecker:
    def __init__(self, sim: Sim):
        self.sim = sim
        self.leases: dict[str, list[Lease]] = defaultdict(list)
        self.done: set[str] = set()  # tasks a puller acked (the holder said succeeded)
        self.violations: list[SafetyViolation] = []
        self.count = 0
        self.excused: dict[str, int] = defaultdict(int)

    def leased(self, puller: str, d: dict[str, Any]) -> Lease:
        now = self.sim.now()
        self.count += 1
        holder = d.get("node") or "?"
        lease = Lease(d["id"], holder, now, self._lease_end(puller, holder, d), d["attempt"])
        for was in self.leases[lease.task_id]:
            if was.answered or was.end <= self.holder_now(was.holder) + SLACK:
                continue
            excuse = self._excuse(was, now)
            if excuse:
                self.excused[excuse] += 1
                continue
            e = SafetyViolation(
                f"{puller}'s lease of {lease.task_id} from {lease.holder} at "
                f"{now - START:.3f} (attempt {lease.attempt}) while {was.holder}'s lease of "
                f"attempt {was.attempt} from {was.start - START:.3f} lasts till "
                f"{was.end - START:.3f}, and {was.holder} did not crash since")
            self.violations.append(e)
        self.leases[lease.task_id].append(lease)
        return lease

    def _excuse(self, was: Lease, now: float) -> str:
        """Why an earlier lease still running may be leased again ("": it may not)."""
        c = self.sim.checker
        if any(n == was.holder and was.start <= at <= now for n, at in c.crashes):
            return "its holder crashed since"
        if any(n == was.holder and a <= now and b >= was.start for n, a, b in c.cuts):
            return "a cut touched its holder"
        return ""

    def _lease_end(self, puller: str, holder: str, d: dict[str, Any]) -> float:
        """The lease's end on its holder's clock: as its copy has it (the truth), else as
        the puller's node told it (its own clock: moved by the two offsets)."""
        nd = self.sim.nodes.get(holder)
        t = nd.cluster.engine.live.mem.get(d["id"]) if nd is not None and nd.cluster else None
        if t is not None and t.accepted == d["attempt"]:
            return t.fire_at
        return float(d["lease_until"]) - self._offset(puller) + self._offset(holder)

    def _offset(self, node: str) -> float:
        nd = self.sim.nodes.get(node)
        return nd.clock.offset if nd is not None else 0.0

    def _ended(self, task_id: str) -> bool:
        """A copy succeeded: a puller's ack reached its holder, the answer was lost."""
        return any(nd.cluster is not None and (t := nd.cluster.engine.get(task_id))
                   is not None and t.state.value == "succeeded"
                   for nd in self.sim.nodes.values())

    def holder_now(self, node: str) -> float:
        """``node``'s wall clock now, as it reads it once running (a pause's jump made)."""
        nd = self.sim.nodes.get(node)
        return self.sim.now() + (nd.clock.offset if nd is not None else 0.0)

    def at_end(self) -> None:
        if self.violations:
            raise self.violations[0]
        self.sim.checker.leader_per_term()
        # the tasks judged: an enqueue still in flight when the drain ends is acknowledged
        # only as the nodes stop, after this (a test reads this set, not the live one)
        self.judged = set(self.sim.checker.acked)
        missing = sorted(t for t in self.judged - self.done if not self._ended(t))
        if missing:
            raise SafetyViolation(f"{len(missing)} acknowledged tasks never acked by a "
                                  f"puller: {missing[:3]}")


def _puller(sim: Sim, checker: PullChecker, node: str, rng: random.Random,
            stop: gevent.event.Event) -> None:
    """One worker, a client of ``node``: lease, work, answer; again until ``stop``."""
    while not stop.is_set():
        sim.wait_running(node)
        nd = sim.nodes[node]
        c = nd.cluster
        if not nd.up or c is None or c.membership is None:
            gevent.sleep(0.2)
            continue
        try:
            got = c.queries.lease("default", rng.randint(1, 3), LEASE_S, 1.0)
        except Exception:  # the node refused (not in the roster, stopping): try again
            gevent.sleep(0.2)
            continue
        sim.wait_running(node)  # a paused node's answer comes once it resumes
        for d in got:
            lease = checker.leased(node, d)
            gevent.spawn(_work, sim, checker, node, rng.random(), rng.uniform(0.05, 1.5),
                         lease, d["token"])
        if not got:
            gevent.sleep(0.05)


def _work(sim: Sim, checker: PullChecker, node: str, r: float, took: float, lease: Lease,
          token: str) -> None:
    gevent.sleep(took)
    if r < 0.15:
        return  # walks away: its lease runs out, the task is retried
    op: Callable[[Any], Any]
    if r < 0.3:
        op = _nack
    elif r < 0.45:
        if not _call(sim, node, lease, token, "heartbeat", LEASE_S):
            return
        gevent.sleep(took)
        op = _ack
    else:
        op = _ack
    op((sim, checker, node, lease, token))


def _ack(a: tuple) -> None:
    sim, checker, node, lease, token = a
    if _call(sim, node, lease, token, "complete", None):
        checker.done.add(lease.task_id)


def _nack(a: tuple) -> None:
    sim, checker, node, lease, token = a
    _call(sim, node, lease, token, "nack", 0.2)


def _call(sim: Sim, node: str, lease: Lease, token: str, op: str, arg: Any) -> bool:
    """Answer ``lease`` through ``node`` (any node routes it to the holder); True if
    the holder took it. Tried, it is no longer live whatever came back."""
    sim.wait_running(node)
    nd = sim.nodes[node]
    c = nd.cluster
    if not nd.up or c is None:
        return False
    if op != "heartbeat":
        lease.answered = True
    try:
        grant = completion.verify(c.engine.completion_key, lease.task_id, token,
                                  nd.clock.wall())
        if op == "complete":
            out = c.queries.complete(grant, completion.Report("succeeded"))
        elif op == "nack":
            out = c.queries.nack(grant, arg)
        else:
            out = c.queries.heartbeat(grant, arg)
    except Exception:
        lease.answered = True  # a conflict or a refusal: what it holds is not known
        return False
    if out is None:
        lease.answered = True
    elif op == "heartbeat" and isinstance(out.get("lease_until"), float):
        lease.end = out["lease_until"]  # the holder's copy's new end, on its clock
    return out is not None


def pull_scenario(seed: int, faults: tuple[str, ...] = FAULTS, *, length: float = 4.0,
                  plant: Callable[[], Any] | None = None) -> tuple[Sim, PullChecker]:
    """A seeded run of three nodes with a pull queue, its pullers and faults."""
    def main() -> tuple[Sim, PullChecker]:
        gevent.get_hub().threadpool = InlinePool()
        rng = random.Random(seed ^ 0x9011)
        sim = Sim(seed, 3, mode="pull", delay=(0.0005, rng.choice([0.005, 0.02])),
                  loss=rng.choice([0.0, 0.0, 0.01]), dup=rng.choice([0.0, 0.01]),
                  options={"completion_secret": "the-simulated-cluster-secret"})
        checker = PullChecker(sim)
        stop = gevent.event.Event()
        try:
            _drive(sim, checker, rng, faults, length, stop)
            return sim, checker
        finally:
            stop.set()
            sim.stop()
    if plant is not None:
        with plant():
            return run_virtual(main, start=START)
    return run_virtual(main, start=START)


def _drive(sim: Sim, checker: PullChecker, rng: random.Random, faults: tuple[str, ...],
           length: float, stop: gevent.event.Event) -> None:
    sim.start()
    sim.run_until(BOOT)
    pullers = [gevent.spawn(_puller, sim, checker, node, random.Random(rng.random()), stop)
               for node in sim.ids]
    fault_at = sorted(rng.uniform(BOOT, BOOT + length) for _ in range(rng.randint(1, 3)))
    t = BOOT
    while t < BOOT + length:
        t += 0.05
        sim.run_until(t)
        while fault_at and fault_at[0] <= t and faults:
            fault_at.pop(0)
            _fault(sim, rng, rng.choice(faults))
        if rng.random() < 0.3:
            sim.enqueue(rng.choice(sim.ids), rng.choice([0.0, 0.0, 0.3, 2.0]))
    sim.run_until(t + 1.0)
    sim.heal_all()
    while sim.now() < START + t + DRAIN:
        sim.run_until(sim.now() - START + 0.25)
        if all(t in checker.done or checker._ended(t) for t in sim.checker.acked) and \
                all(nd.up for nd in sim.nodes.values()):
            break
    stop.set()
    gevent.killall(pullers)
    checker.at_end()


if __name__ == "__main__":
    import logging
    import sys

    logging.basicConfig(level=logging.WARNING)
    s = int(sys.argv[1])
    kinds = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else FAULTS
    done_sim, done = pull_scenario(s, kinds)
    print(f"seed {s}: ok, {done.count} leases, {len(done_sim.checker.acked)} acknowledged, "
          f"excused {dict(done.excused)}")
