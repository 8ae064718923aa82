"""Pull queues in the engine, on a fake clock and an in-memory journal: a due copy of a
pull queue waits in the pool (never POSTed), a lease is an accepted attempt with a
token, ack ends it, nack retries it after its delay, a lease that runs out is a failed
attempt with the backoff, extend moves its end, and a leased copy is not leased twice."""

from __future__ import annotations

import pytest

from enginekit import memory_engine
from miyamoto.delivery import completion
from miyamoto.engine.engine import Engine, Hooks
from miyamoto.errors import Conflict
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class NoWorker:
    """A delivery client that fails the test if anything is POSTed."""

    guard = None

    def request(self, *a, **kw):
        raise AssertionError("a pull queue's task was POSTed")

    def close(self) -> None: ...


class Told(Hooks):
    def __init__(self):
        self.leases: list[tuple[str, float]] = []
        self.claims = 0

    def claim(self, task: Task) -> bool:
        self.claims += 1
        return True

    def accepted(self, task: Task, lease: float) -> None:
        self.leases.append((task.id, lease))


@pytest.fixture
def parts():
    hooks = Told()
    with memory_engine(NOW, hooks, NoWorker()) as (e, clock):
        e.set_queue_settings({"q": {"mode": "pull"}})
        yield e, clock, hooks


def _due(engine: Engine, task_id: str = "t1", **kw) -> None:
    engine.add(Task(id=task_id, queue="q", url="", eta=NOW, created=NOW, fire_at=NOW,
                    params={"a": "1"}, **kw))
    engine._due(task_id)


def _grant(engine: Engine, task: Task, token: str) -> completion.Grant:
    return completion.verify(engine.completion_key, task.id, token, engine.clock())


def test_a_lease_is_an_accepted_attempt_with_a_token(parts) -> None:
    engine, clock, hooks = parts
    _due(engine)
    assert engine.pull.waiting("q") == 1
    (t, token), = engine.lease("q", 10, 30.0).leased
    assert (t.state, t.attempts, t.accepted, t.fire_at) == (State.RUNNING, 1, 1, NOW + 30)
    assert hooks.leases == [("t1", 30.0)] and hooks.claims == 1
    assert engine.lease("q", 10, 30.0).leased == []  # not leased twice
    grant = _grant(engine, t, token)
    done = engine.complete(grant, completion.Report("succeeded"))
    assert done.state == State.SUCCEEDED
    with pytest.raises(Conflict):
        engine.complete(grant, completion.Report("succeeded"))


def test_nack_retries_after_its_delay_counting_an_attempt(parts) -> None:
    engine, clock, hooks = parts
    _due(engine)
    (t, token), = engine.lease("q", 1, 30.0).leased
    back = engine.nack(_grant(engine, t, token), 7.0)
    assert (back.state, back.attempts, back.fire_at) == (State.SCHEDULED, 1, NOW + 7)
    clock["now"] = NOW + 7
    engine._due("t1")
    (t2, token2), = engine.lease("q", 1, 30.0).leased
    assert (t2.attempts, t2.accepted) == (2, 2) and token2 != token
    with pytest.raises(Conflict):  # the first lease's token is over
        engine.nack(_grant(engine, t, token), None)


def test_a_lease_that_runs_out_is_a_failed_attempt_with_backoff(parts) -> None:
    engine, clock, hooks = parts
    _due(engine, max_attempts=2)
    (t, token), = engine.lease("q", 1, 10.0).leased
    clock["now"] = NOW + 10
    engine._due("t1")  # the lease's end
    back = engine.get("t1")
    assert back.state == State.SCHEDULED and back.attempts == 1 and back.fire_at > NOW + 10
    assert "lease ran out" in back.last["error"]
    clock["now"] = back.fire_at
    engine._due("t1")
    (t2, token2), = engine.lease("q", 1, 10.0).leased
    clock["now"] += 10
    engine._due("t1")
    assert engine.get("t1").state == State.FAILED  # max_attempts 2


def test_extend_moves_the_lease_end_and_claims_again(parts) -> None:
    engine, clock, hooks = parts
    _due(engine)
    (t, token), = engine.lease("q", 1, 10.0).leased
    clock["now"] = NOW + 5
    t2 = engine.heartbeat(_grant(engine, t, token), 100.0)
    assert t2.fire_at == NOW + 105 and hooks.leases[-1] == ("t1", 100.0)
    clock["now"] = NOW + 10
    engine._due("t1")  # the old end: nothing happens
    assert engine.get("t1").state == State.RUNNING


def test_priority_then_due_order_and_max_tasks(parts) -> None:
    engine, clock, hooks = parts
    _due(engine, "low", priority=1)
    _due(engine, "high", priority=9)
    _due(engine, "mid", priority=5)
    leased = engine.lease("q", 2, 30.0).leased
    assert [t.id for t, _ in leased] == ["high", "mid"]
    assert [t.id for t, _ in engine.lease("q", 5, 30.0).leased] == ["low"]


def test_a_paused_queue_leases_nothing(parts) -> None:
    engine, clock, hooks = parts
    _due(engine)
    engine.pause("q", True)
    assert engine.lease("q", 1, 30.0).leased == []
    engine.pause("q", False)
    assert len(engine.lease("q", 1, 30.0).leased) == 1


def test_a_pull_copy_handed_to_the_dispatcher_goes_to_the_pool(parts) -> None:
    """A copy queued for delivery before its queue became pull is not POSTed."""
    engine, clock, hooks = parts
    engine.add(Task(id="t1", queue="q", url="http://w.example/", eta=NOW, created=NOW,
                    fire_at=NOW))
    assert engine._begin("t1") is None and engine.pull.waiting("q") == 1


def test_a_cancelled_or_expired_copy_is_skipped(parts) -> None:
    engine, clock, hooks = parts
    _due(engine, "gone")
    engine.cancel("gone")
    _due(engine, "late", expires_at=NOW + 1)
    clock["now"] = NOW + 2
    assert engine.lease("q", 5, 30.0).leased == []
    assert engine.get("late").state == State.EXPIRED


def test_restart_keeps_a_lease_that_has_not_ended() -> None:
    """A leased copy read back from the journal after a restart is still leased (its
    token still acks) until its lease's end."""
    hooks = Told()
    with memory_engine(NOW, hooks, NoWorker()) as (e, clock):
        e.set_queue_settings({"q": {"mode": "pull"}})
        _due(e)
        (t, token), = e.lease("q", 1, 30.0).leased
        again = Engine(e.config, e.journal, client=NoWorker(), clock=lambda: clock["now"],
                       hooks=hooks)
        again.set_queue_settings({"q": {"mode": "pull"}})
        again.start()
        try:
            kept = again.get("t1")
            assert (kept.state, kept.accepted) == (State.RUNNING, 1)
            done = again.complete(completion.verify(e.completion_key, "t1", token, NOW),
                                  completion.Report("succeeded"))
            assert done.state == State.SUCCEEDED
        finally:
            again.stop(0.1)
