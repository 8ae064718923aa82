"""A copy kept in step with what its siblings did (Engine.apply_remote, set_replicas,
drop), on a fake clock and an in-memory journal: a claim only pushes a copy later, an
answered ASK or a hand-off only pulls it earlier, a retry sets it; an ended state ends
it; what is applied is in the journal too."""

from __future__ import annotations

import pytest

from enginekit import memory_engine
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


@pytest.fixture
def engine():
    with memory_engine(NOW) as (e, _clock):
        yield e


def _task(**kw) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 30, replicas=("x", "y", "z"), replica=1)
    base.update(kw)
    return Task(**base)


def test_a_peers_claim_pushes_a_copy_later_never_earlier(engine) -> None:
    engine.add(_task())
    engine.apply_remote("t1", fire_at=NOW + 10)  # a claim whose lease ends sooner
    assert engine.get("t1").fire_at == NOW + 30
    assert engine.journal.get("t1").fire_at == NOW + 30
    engine.apply_remote("t1", fire_at=NOW + 50)
    assert engine.get("t1").fire_at == NOW + 50
    assert engine.journal.get("t1").fire_at == NOW + 50


def test_an_earliest_time_pulls_a_copy_earlier_never_later(engine) -> None:
    engine.add(_task())
    engine.apply_remote("t1", fire_at=NOW + 60, earliest=True)
    assert engine.get("t1").fire_at == NOW + 30
    engine.apply_remote("t1", fire_at=NOW + 5, earliest=True)
    assert engine.get("t1").fire_at == NOW + 5
    assert engine.journal.get("t1").fire_at == NOW + 5


def test_a_retry_or_an_exact_time_sets_the_fire_time_either_way(engine) -> None:
    engine.add(_task())
    engine.apply_remote("t1", fire_at=NOW + 5, exact=True)  # a released claim
    assert engine.get("t1").fire_at == NOW + 5
    t = engine.apply_remote("t1", state=State.SCHEDULED, fire_at=NOW + 2, attempts=1,
                            last={"status": 500})  # a sibling's failed attempt: retry
    assert t.fire_at == NOW + 2 and t.attempts == 1 and t.last == {"status": 500}
    stored = engine.journal.get("t1")
    assert stored.fire_at == NOW + 2 and stored.attempts == 1


def test_attempts_only_grow_and_a_sibling_attempt_joins_the_history(engine) -> None:
    engine.add(_task(attempts=3))
    t = engine.apply_remote("t1", attempts=2)
    assert t.attempts == 3
    t = engine.apply_remote("t1", attempt={"at": NOW, "status": 503, "node": "x"})
    assert [a["status"] for a in t.history] == [503]
    assert engine.journal.get("t1").history == t.history


def test_an_ended_state_ends_a_waiting_copy_and_a_running_one_when_it_returns(engine) -> None:
    engine.add(_task())
    t = engine.apply_remote("t1", state=State.SUCCEEDED)
    assert t.state == State.SUCCEEDED and t.finished == NOW
    assert "t1" not in engine.live.mem
    assert engine.journal.get("t1").state == State.SUCCEEDED
    assert engine.apply_remote("t1", fire_at=NOW) is None  # no live copy any more
    # a running copy stays live for its own attempt's finish, marked ended
    engine.add(_task(id="t2"))
    engine.live["t2"] = engine.live.get("t2").evolve(state=State.RUNNING)
    engine.apply_remote("t2", state=State.FAILED)
    assert engine.live.get("t2").state == State.FAILED


def test_a_fire_time_does_not_move_a_copy_that_is_running(engine) -> None:
    engine.add(_task())
    engine.live["t1"] = engine.live.get("t1").evolve(state=State.RUNNING)
    engine.apply_remote("t1", fire_at=NOW + 90)
    engine.apply_remote("t1", fire_at=NOW + 1, earliest=True)
    assert engine.get("t1").fire_at == NOW + 30


def test_unknown_copies_are_none_and_nothing_is_written(engine) -> None:
    assert engine.apply_remote("nope", fire_at=NOW) is None
    assert engine.journal.get("nope") is None
    engine.set_replicas("nope", ("a", "b"), "a")
    engine.drop("nope")
    assert engine.get("nope") is None


def test_a_restored_replica_set_renumbers_this_copy(engine) -> None:
    engine.add(_task())
    engine.set_replicas("t1", ("x", "w", "y"), "y")
    t = engine.get("t1")
    assert t.replicas == ("x", "w", "y") and t.replica == 2
    assert engine.journal.get("t1").replica == 2
    engine.set_replicas("t1", ("x", "w", "v"), "y")  # not ours any more: left alone
    assert engine.get("t1").replicas == ("x", "w", "y")


def test_a_dropped_copy_is_gone_from_memory_and_the_journal(engine) -> None:
    engine.add(_task())
    engine.drop("t1")
    assert engine.get("t1") is None and engine.journal.get("t1") is None


def test_the_record_of_an_ended_copy_moved_away_is_dropped_too(engine) -> None:
    engine.journal.put(_task(state=State.SUCCEEDED, finished=NOW - 5), wait=True)
    engine.drop("t1")  # a rejoin's probe heard the task was re-homed without us
    assert engine.get("t1") is None and engine.journal.get("t1") is None


def test_an_ended_copy_of_an_earlier_run_takes_a_later_runs_end(engine) -> None:
    engine.journal.put(_task(state=State.SUCCEEDED, attempts=1, finished=NOW - 50), wait=True)
    t = engine.take_end("t1", State.FAILED, 1, 3, {"status": 500}, NOW - 2)
    assert t is not None
    got = engine.journal.get("t1")
    assert (got.state, got.reruns, got.attempts, got.last, got.finished) == \
        (State.FAILED, 1, 3, {"status": 500}, NOW - 2)
    # an end of the same run or an earlier one changes nothing; nor does a live copy
    assert engine.take_end("t1", State.SUCCEEDED, 1, 9, None, NOW) is None
    assert engine.take_end("t1", State.SUCCEEDED, 0, 9, None, NOW) is None
    assert engine.journal.get("t1").attempts == 3
    engine.add(_task(id="t2"))
    assert engine.take_end("t2", State.SUCCEEDED, 5, 1, None, NOW) is None
    assert engine.get("t2").state == State.SCHEDULED


def test_a_restore_renumbers_the_record_of_an_ended_copy_too(engine) -> None:
    engine.journal.put(_task(state=State.SUCCEEDED, finished=NOW - 5), wait=True)
    engine.set_replicas("t1", ("x", "w", "y"), "y")  # the restore ended after our attempt
    got = engine.journal.get("t1")
    assert got.replicas == ("x", "w", "y") and got.replica == 2 and got.state == State.SUCCEEDED
