"""Expiry (tasks' expires_at) in the engine, on a fake clock and an in-memory journal:
a copy due after its expiry ends at once, one that waits to start (a paused queue,
here) ends when its time comes, a retry that would start too late ends at its
attempt; each counts, tells the siblings as a failure and calls its failure_callback."""

from __future__ import annotations

import pytest

from enginekit import memory_engine
from miyamoto.delivery.attempt import Outcome
from miyamoto.engine.engine import Engine, Hooks
from miyamoto.engine.expiry import Expiries, copy_expiry
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class Told(Hooks):
    def __init__(self):
        self.failed_news: list[Task] = []

    def failed(self, task: Task) -> None:
        self.failed_news.append(task)


@pytest.fixture
def parts():
    hooks = Told()
    with memory_engine(NOW, hooks) as (e, clock):
        yield e, clock, hooks


def _task(**kw) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
                fire_at=NOW, expires_at=NOW + 10, failure_callback="http://w.example/dead")
    base.update(kw)
    return Task(**base)


def _ended_as_expired(engine: Engine, hooks: Told) -> None:
    assert "t1" not in engine.live.mem
    assert engine.journal.get("t1").state == State.EXPIRED
    assert engine.stats.expired == 1
    assert [t.state for t in hooks.failed_news] == [State.EXPIRED]
    assert [t.url for t in engine.live.values()] == ["http://w.example/dead"]  # its callback


def test_a_copy_due_after_its_expiry_ends_as_expired_without_an_attempt(parts):
    engine, clock, hooks = parts
    engine.add(_task())
    clock["now"] = NOW + 11
    engine._due("t1")
    _ended_as_expired(engine, hooks)
    assert engine.stats.attempts == 0


def test_a_copy_waiting_behind_a_paused_queue_expires_when_its_time_comes(parts):
    engine, clock, hooks = parts
    engine.pause("q", True)
    engine.add(_task())
    engine._due("t1")  # handed to the dispatcher: it waits there, paused
    assert engine.expiries.next_at() == NOW + 10
    clock["now"] = NOW + 9.9
    assert engine.expire_due(clock["now"]) == 0 and engine.live["t1"].state == State.SCHEDULED
    clock["now"] = NOW + 10
    assert engine.expire_due(clock["now"]) == 1
    _ended_as_expired(engine, hooks)
    engine.pause("q", False)
    assert engine._begin("t1") is None  # its place in the ready line starts nothing


def test_a_retry_that_would_start_after_the_expiry_ends_the_task_at_its_attempt(parts):
    engine, clock, hooks = parts
    engine.add(_task(retry_delays=(30.0,)))
    begun = engine._begin("t1")
    assert begun is not None
    engine.finish("t1", Outcome(ok=False, status=500, headers={}, body=b"", at=NOW))
    _ended_as_expired(engine, hooks)
    assert engine.journal.get("t1").attempts == 1


def test_a_copy_pushed_back_by_a_sibling_claim_is_judged_when_due_again(parts):
    engine, clock, hooks = parts
    engine.add(_task())
    engine._due("t1")
    engine.apply_remote("t1", fire_at=NOW + 20)  # a sibling claims: it may be delivering
    clock["now"] = NOW + 10
    assert engine.expire_due(clock["now"]) == 0  # not ended under the sibling's attempt
    clock["now"] = NOW + 20
    engine._due("t1")
    _ended_as_expired(engine, hooks)


def test_a_copy_pushed_back_to_its_expiry_is_due_then_and_ends(parts):
    engine, clock, hooks = parts
    engine.add(_task())
    engine._due("t1")  # waiting to start (a paused queue): its expiry noted
    engine.apply_remote("t1", fire_at=NOW + 10)  # a claim whose lease ends at the expiry
    clock["now"] = NOW + 10
    assert engine.expire_due(clock["now"]) == 1  # due at that moment, so it ends
    _ended_as_expired(engine, hooks)


def test_a_task_without_expiry_is_never_noted():
    e = Expiries()
    assert copy_expiry(_task(expires_at=None), 5.0) is None
    assert copy_expiry(_task(replica=2), 5.0) == NOW + 20  # copy i expires i offsets later
    assert e.add("a", 5.0) and not e.add("a", 5.0) and e.add("b", 3.0) and not e.add("c", 9.0)
    e.discard("b")
    assert e.next_at() == 5.0 and e.pop_due(6.0) == ["a"] and len(e) == 1


def test_stale_entries_do_not_grow_the_heap_past_twice_the_live_ones():
    e = Expiries()
    for i in range(5000):
        e.add(f"t{i}", float(i))
        e.discard(f"t{i}")
    e.add("x", 1.0)
    assert len(e._heap) <= 2 * 1024 + 2


def test_resend_runs_an_ended_task_again_under_its_id_and_refuses_a_live_one(parts):
    from miyamoto.errors import Conflict

    engine, clock, hooks = parts
    engine.add(_task())
    with pytest.raises(Conflict, match="only an ended task"):
        engine.rerun("t1", resend=True)
    clock["now"] = NOW + 11
    engine._due("t1")  # expired
    again = engine.rerun("t1", resend=True)
    assert again.state == State.SCHEDULED and again.reruns == 1 and again.attempts == 0
    assert again.expires_at is None  # the new run is not bound by the old one's expiry
    engine._begin("t1")
    engine.finish("t1", Outcome(ok=True, status=200, headers={}, body=b"", at=clock["now"]))
    assert engine.journal.get("t1").state == State.SUCCEEDED
    with pytest.raises(Conflict, match="succeeded"):
        engine.rerun("t1")  # retry stays for what did not succeed
    assert engine.rerun("t1", resend=True).reruns == 2  # resend takes a succeeded one too
