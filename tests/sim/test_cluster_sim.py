"""The composed cluster on virtual time (tests/sim/cluster_sim.py): seeded runs of three
or five real nodes under network, pause, crash and clock faults, checked at every
delivery start and at the end (seeds 0-249 here, 250-499 in test_cluster_sim_seeds.py,
so the suite's two workers share them); and bugs planted in the composition are caught."""

from __future__ import annotations

import os
import sys

import gevent
import pytest

from miyamoto.cluster import layer
from miyamoto.replicas.effects import Update

sys.path.insert(0, os.path.dirname(__file__))
import cluster_sim as cs  # noqa: E402

_run = cs.run_seed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(5))
def test_seeded_runs_keep_the_rules(chunk: int) -> None:
    for seed in range(chunk * 50, (chunk + 1) * 50):
        _run(seed)


@pytest.mark.timeout(120)
def test_a_fault_free_run_delivers_every_acknowledged_task_once() -> None:
    sim = _run(10_001, ())
    c = sim.checker
    assert len(c.acked) >= 15
    assert all(sum(ok for _, _, ok in c.deliveries[t]) == 1 for t in c.acked)
    assert len(c.leaders) >= 1


@pytest.mark.timeout(120)
def test_the_same_seed_replays_the_same_run() -> None:
    a, b = cs.scenario(7), cs.scenario(7)
    assert dict(a.checker.deliveries) == dict(b.checker.deliveries)
    assert a.network.sent == b.network.sent


@pytest.mark.timeout(300)
def test_a_composition_that_drops_the_siblings_pushes_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the cluster layer ignores the sibling machine's Update effects
    that move a copy's fire time (a sibling's claim, retry, released claim). The
    checker must fail within a bounded number of seeds."""
    carry_out = layer.Cluster.carry_out

    def planted(self: layer.Cluster, effects: object) -> None:
        carry_out(self, [e for e in effects  # type: ignore[attr-defined]
                         if not (isinstance(e, Update) and e.state is None)])
    monkeypatch.setattr(layer.Cluster, "carry_out", planted)
    for seed in range(25):
        try:
            cs.scenario(seed)
        except cs.SafetyViolation:
            return
    pytest.fail("the planted bug was not caught in 25 seeds")


@pytest.mark.timeout(300)
def test_a_composition_that_delivers_without_asking_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the cluster layer's hook lets every due copy go without stepping
    the sibling machine (no ASK, no claim). A slow delivery then outlives the offset and
    the next copy goes too, with no fault to excuse it: the rule checked at each delivery
    start must say so, though the engine swallows what the worker twin raises."""
    monkeypatch.setattr(layer._Hooks, "claim", lambda self, t: True)
    for seed in range(25):
        try:
            cs.scenario(seed, ())
        except cs.SafetyViolation as e:
            assert "again" in str(e)  # a duplicate, not a lost task
            return
    pytest.fail("the planted bug was not caught in 25 seeds")


@pytest.mark.timeout(120)
def test_each_stranger_is_logged_and_a_joiners_early_clocks_are_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """A chatty stranger used to spend the ten logged drops, so a later stranger went
    unlogged; and a joiner's drops of the members' CLOCK before its roster were counted."""
    from miyamoto.wire.verbs import Verb

    def main() -> tuple[int, int]:  # the layer's own door for drops, on a real node
        cs.gevent.get_hub().threadpool = cs.InlinePool()
        sim = cs.Sim(3, 3)
        try:
            sim.start()
            joiner = sim.nodes["n1"].cluster
            joiner._members = frozenset({"n2", "n3"})  # a roster that does not name us yet
            joiner._stranger("n2", Verb.CLOCK)
            quiet = joiner.strangers
            joiner._members = frozenset({"n1", "n2", "n3"})
            for _ in range(20):
                joiner._stranger("chatty", Verb.CLOCK)
            joiner._stranger("stranger", Verb.CANCEL)
            joiner._stranger("stranger", Verb.CANCEL)
            return quiet, joiner.strangers
        finally:
            sim.stop()
    with caplog.at_level("WARNING", logger="miyamoto.cluster.layer"):
        quiet, counted = cs.run_virtual(main, start=cs.START)
    lines = [r.getMessage() for r in caplog.records if "not a roster member" in r.getMessage()]
    assert quiet == 0 and counted == 22
    assert sum("'chatty'" in line for line in lines) == 1
    assert sum("dropped CANCEL from 'stranger'" in line for line in lines) == 1


@pytest.mark.timeout(120)
def test_a_task_due_now_costs_its_sibling_a_store_a_stored_and_a_done() -> None:
    """The healthy path's messages, counted on the composed cluster: the ASK rides in the
    STORE and its answer in the STORED, and only a delivery still running a quarter
    ask_lease after it started sends a CLAIM (the simulated worker is slow one time in
    ten). Six messages per task before: STORE, STORED, ASK, ANSWER, CLAIM, DONE."""
    from collections import Counter

    def main() -> tuple[Counter, int, int]:
        cs.gevent.get_hub().threadpool = cs.InlinePool()
        sim = cs.Sim(21, 3, fail=0.0)
        try:
            sim.start()
            sim.run_until(cs.BOOT)
            sim.network.verbs = Counter()
            for i in range(90):
                sim.enqueue(sim.ids[i % 3], 0.0)
                sim.run_until(cs.BOOT + 0.02 * (i + 1))
            for k in range(40):
                if sim.checker.all_delivered():
                    break
                sim.run_until(cs.BOOT + 2.0 + 0.25 * k)
            sim.run_until(sim.now() - cs.START + 3.0)  # the slow ones end, their DONE goes
            starts = sim.checker.starts
            return sim.network.verbs, len(sim.checker.acked), starts
        finally:
            sim.stop()
    verbs, acked, starts = cs.run_virtual(main, start=cs.START)
    assert acked >= 80 and starts == acked, (acked, starts)  # each delivered once
    per_task = {v: verbs[v] / acked for v in ("STORE", "STORED", "DONE", "ASK", "ANSWER",
                                              "CLAIM")}
    for verb in ("STORE", "STORED", "DONE"):  # (a refused enqueue's STORE counts too)
        assert per_task[verb] == pytest.approx(1.0, abs=0.05), per_task
    assert per_task["ASK"] + per_task["ANSWER"] <= 0.05, per_task
    assert per_task["CLAIM"] <= 0.25, per_task


@pytest.mark.timeout(120)
def test_a_crashed_member_shows_as_down_with_when_it_was_last_heard() -> None:
    """GET /cluster's ``down``: a member the roster dropped stays listed, with when it
    was dropped and last heard (the leader hears every member), until it rejoins."""
    def main() -> tuple[list, list, list]:  # (the leader's down, [crash time, id], after)
        gevent.get_hub().threadpool = cs.InlinePool()
        sim = cs.Sim(4242, 3)
        try:
            sim.start()
            sim.run_until(cs.BOOT + 1.0)
            victim = next(i for i, nd in sim.nodes.items()  # a follower: the leader stays
                          if nd.cluster.info()["role"] == "follower")
            sim.crash(victim, 8.0)
            crashed = sim.now()
            sim.run_until(cs.BOOT + 5.0)
            views = [nd.cluster.info() for nd in sim.nodes.values()
                     if nd.up and nd.cluster is not None]
            leader = next(v for v in views if v["role"] == "leader")
            down = leader["down"]
            healed_at = cs.BOOT + 15.0
            sim.run_until(healed_at)
            after = [nd.cluster.info()["down"] for nd in sim.nodes.values()
                     if nd.cluster is not None]
            return down, [crashed, victim], after
        finally:
            sim.stop()
    down, (crashed, victim), after = cs.run_virtual(main, start=cs.START)
    assert [d["id"] for d in down] == [victim], down
    d = down[0]
    assert d["http"] and d["down_since"] >= crashed
    # heard within a heartbeat or two before the crash; the drop came failure_timeout later
    assert crashed - 1.0 <= d["last_heard_at"] <= crashed + 0.01, (d, crashed)
    assert d["last_heard"] >= d["down_since"] - d["last_heard_at"] - 0.01
    assert after == [[], [], []]  # it rejoined: no longer down anywhere


@pytest.mark.timeout(120)
def test_one_clock_far_off_delivers_no_eta_and_no_tick_early_or_late() -> None:
    """One node of three at +30 s, -8 s or -60 s from the start, whichever it is: every
    absolute-eta task (enqueued on every node) and every tick of a schedule reaches the
    worker within cs.EARLY before and cs.LATE after its true time, and the skewed node
    fires no tick. In seed 1, n1 is the first leader: a skewed leader hands over."""
    for offset in (30.0, -8.0, -60.0):
        for victim in ("n1", "n2", "n3"):
            sim = cs.skew_scenario(1, victim, offset)
            c = sim.checker
            assert sum(not k.startswith("schedule:") for k in c.lateness) >= 30
            assert c.leaders[min(c.leaders)] == "n1"
            if victim == "n1":  # it led first, and handed over
                assert c.leaders[max(c.leaders)] != "n1", c.leaders


@pytest.mark.timeout(60)
def test_an_eta_judged_on_the_local_clock_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the enqueue takes a client's eta on the taking node's own clock
    (offset 0), as before: a node 30 s ahead sends its tasks 30 s early."""
    monkeypatch.setattr(layer.Cluster, "clock_offset", lambda self: 0.0)
    with pytest.raises(cs.SafetyViolation, match="early"):
        cs.skew_scenario(1, "n2", 30.0)


@pytest.mark.timeout(60)
def test_a_skewed_leader_ticking_on_its_own_clock_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the leader 30 s ahead keeps leading and judges ticks on its own
    clock (no step-down, no offset in the ticker), as before: every tick 30 s early."""
    from miyamoto.definitions import schedules
    from miyamoto.membership.machine import Membership
    init = schedules.Ticker.__init__

    def planted(self: schedules.Ticker, *a: object, **kw: object) -> None:
        init(self, *a, **dict(kw, offset=lambda: 0.0))  # type: ignore[arg-type]
    monkeypatch.setattr(schedules.Ticker, "__init__", planted)
    monkeypatch.setattr(Membership, "_clock_skew", lambda self, off, now: [])
    monkeypatch.setattr(layer.Cluster, "may_fire", lambda self: self.in_contact())
    with pytest.raises(cs.SafetyViolation, match="schedule:tick.*early"):
        cs.skew_scenario(1, "n1", 30.0)


@pytest.mark.timeout(120)
def test_expired_tasks_end_on_every_copy_and_are_counted_once() -> None:
    """Tasks that wait behind a paused queue past their expires_at, on the composed
    cluster: every copy ends as expired (copy 0 expires first, its FAILED news says so
    and ends copy 1 before its own expiry, one replica_offset later), none is delivered,
    and each task is counted once over the nodes (the failure_callback's count too)."""
    from miyamoto.tasks.task import State

    def main() -> tuple[int, list[str], int, int]:
        cs.gevent.get_hub().threadpool = cs.InlinePool()
        sim = cs.Sim(22, 3, fail=0.0)
        try:
            sim.start()
            sim.run_until(cs.BOOT)
            for nd in sim.nodes.values():
                nd.cluster.engine.pause("default", True)
            for i in range(12):
                nd = sim.nodes[sim.ids[i % 3]]
                t = sim.task(0.0)
                now = nd.clock.wall()

                def client(c=nd.cluster, t=t, now=now) -> None:
                    stored = c.enqueue(t.evolve(eta=now, created=now, fire_at=now,
                                                expires_at=now + 1.0))
                    sim.checker.acked.add(stored.id)
                cs.gevent.spawn(client)
            sim.run_until(cs.BOOT + 5.0)
            engines = [nd.cluster.engine for nd in sim.nodes.values()]
            states = [e.get(tid).state.value for tid in sorted(sim.checker.acked)
                      for e in engines if e.get(tid) is not None]
            return (len(sim.checker.acked), states, sum(e.stats.expired for e in engines),
                    sim.checker.starts)
        finally:
            sim.stop()
    acked, states, expired, starts = cs.run_virtual(main, start=cs.START)
    assert acked == 12 and starts == 0
    assert states == [State.EXPIRED.value] * 24, states  # replication 2: two copies each
    assert expired == 12
