"""Replaces of a held task racing from every node, on the composed cluster in virtual
time (tests/sim/cluster_sim.py): every copy ends with the same version, the one with
the greatest revision, whatever order the network delivered them in; and a copy that
applied any revision it heard, not only a newer one, is caught."""

from __future__ import annotations

import os
import sys

import pytest

from miyamoto.engine.engine import Engine
from miyamoto.tasks import repeat

sys.path.insert(0, os.path.dirname(__file__))
import cluster_sim as cs  # noqa: E402

TASKS = 12


def _race(seed: int) -> tuple[list[tuple[str, list[str], str]], int]:
    """(task id, each copy's params' "by", the winner's "by") per task; delivery starts."""
    def main() -> tuple[list[tuple[str, list[str], str]], int]:
        cs.gevent.get_hub().threadpool = cs.InlinePool()
        sim = cs.Sim(seed, 3, fail=0.0)
        try:
            sim.start()
            sim.run_until(cs.BOOT)
            while not all(len(nd.cluster.ring()) == 3 for nd in sim.nodes.values()):
                sim.run_until(sim.now() - cs.START + 0.1)
            ids = []
            for i in range(TASKS):
                nd = sim.nodes[sim.ids[i % 3]]
                now = nd.clock.wall()
                t = sim.task(3.0).evolve(name=f"n{i}", eta=now + 3.0, created=now,
                                         fire_at=now + 3.0)

                def client(c=nd.cluster, t=t) -> None:
                    sim.checker.acked.add(c.enqueue(t).id)
                cs.gevent.spawn(client)
                ids.append(t.id)
            sim.run_until(sim.now() - cs.START + 0.5)  # every enqueue acknowledged
            assert len(sim.checker.acked) == TASKS
            winners: dict[str, tuple[str, str]] = {}
            for tid in ids:
                for k, nd in enumerate(sim.nodes.values()):
                    rev = repeat.stamp(int(nd.clock.wall() * 1e9) + k, f"{tid}-{nd.id}")
                    if rev > winners.get(tid, ("", ""))[0]:
                        winners[tid] = (rev, nd.id)
                    cs.gevent.spawn(nd.cluster.queries.replace, tid,
                                    {"params": {"by": nd.id}, "body": None,
                                     "content_type": None}, 2.0, rev)
            sim.run_until(sim.now() - cs.START + 1.0)  # the replaces have landed; none is due yet
            out = []
            for tid in ids:
                copies = [nd.cluster.engine.get(tid) for nd in sim.nodes.values()]
                out.append((tid, sorted(c.params.get("by", "-") for c in copies
                                        if c is not None), winners[tid][1]))
            sim.run_until(sim.now() - cs.START + 6.0)
            sim.checker.at_end()  # every acknowledged task delivered once
            return out, sim.checker.starts
        finally:
            sim.stop()
    return cs.run_virtual(main, start=cs.START)


@pytest.mark.timeout(120)
def test_racing_replaces_leave_every_copy_with_the_newest() -> None:
    got, starts = _race(5)
    for tid, by, winner in got:
        assert by == [winner, winner], (tid, by, winner)  # replication 2
    assert starts == TASKS


@pytest.mark.timeout(120)
def test_a_copy_that_applies_an_older_revision_is_caught(monkeypatch) -> None:
    real = Engine.replace

    def any_order(self, task_id, changes, delay, revision, offset=0.0):
        t = self.live.get(task_id)
        if t is not None:  # forget the revision held: the last one heard wins
            self.live[task_id] = t.evolve(revision="")
        return real(self, task_id, changes, delay, revision, offset)
    monkeypatch.setattr(Engine, "replace", any_order)
    got, _ = _race(5)
    assert any(by != [winner, winner] for _, by, winner in got), got
