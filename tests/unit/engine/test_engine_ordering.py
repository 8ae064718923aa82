"""Ordering keys in the engine, on a fake clock: a key's tasks start one at a time in
their order (the dispatcher's ``begin`` refuses any but the head), an end of any kind
(success, final failure with ``continue``, cancel, expiry, delete) lets the next go,
a retry keeps the head, ``block`` holds the key until the failed task is run again or
deleted, and a restart rebuilds the lines from the journal."""

from __future__ import annotations

import pytest

from enginekit import memory_engine
from miyamoto.config import settings as config_mod
from miyamoto.delivery.attempt import Outcome
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


def _add(engine: Engine, task_id: str, key: str = "k", **kw) -> Task:
    t = Task(id=task_id, queue="q", url="http://w.example/x", eta=NOW, created=NOW,
             fire_at=NOW, ordering_key=key, **kw)
    return engine.add(engine.ordered(t))


def _ok(engine: Engine, task_id: str, ok: bool = True) -> None:
    engine.finish(task_id, Outcome(ok=ok, status=200 if ok else 500, at=NOW, start=NOW))


def _starts(engine: Engine, *ids: str) -> list[str]:
    return [i for i in ids if engine._begin(i) is not None]


@pytest.fixture
def parts():
    with memory_engine(NOW) as (e, clock):
        yield e, clock


def test_a_keys_tasks_start_one_at_a_time_in_enqueue_order(parts):
    engine, _ = parts
    for i in ("a", "b", "c"):
        _add(engine, i)
    _add(engine, "x", key="other")
    seqs = [engine.live["a"].ordering_seq, engine.live["b"].ordering_seq,
            engine.live["c"].ordering_seq]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert _starts(engine, "c", "b", "a", "x") == ["a", "x"]  # another key is not held
    assert engine.get("b").summary()["ordering_key"] == "k"
    assert engine.ordering_view(engine.get("b"))["waiting_for"] == "a"
    _ok(engine, "a", ok=False)  # a retry: still the head
    assert engine.live["a"].state == State.SCHEDULED and _starts(engine, "c", "b") == []
    engine.live["a"] = engine.live["a"].evolve(fire_at=NOW)
    assert _starts(engine, "a") == ["a"]
    _ok(engine, "a")
    assert "b" in engine.scheduler  # woken: timed again
    assert _starts(engine, "c", "b") == ["b"]


def test_a_final_failure_continues_by_default_and_a_cancel_releases(parts):
    engine, _ = parts
    _add(engine, "a", max_attempts=1)
    _add(engine, "b")
    _add(engine, "c")
    assert _starts(engine, "a") == ["a"]
    _ok(engine, "a", ok=False)
    assert engine.get("a").state == State.FAILED
    engine.cancel("b")  # waiting: cancelled, it leaves the line
    assert _starts(engine, "c") == ["c"]


def test_block_holds_the_key_until_the_failed_task_is_retried_or_deleted(parts):
    engine, _ = parts
    engine.set_queue_settings({"q": {"ordering_on_failure": "block"}})
    _add(engine, "a", max_attempts=1)
    _add(engine, "b")
    assert _starts(engine, "a") == ["a"]
    _ok(engine, "a", ok=False)
    assert engine.lines.blocked("q") == [("k", "a")]
    assert engine.ordering_view(engine.get("b"))["blocked_by"] == "a"
    assert _starts(engine, "b") == []
    engine.rerun("a")  # an operator retries it: it goes first
    assert _starts(engine, "b", "a") == ["a"]
    _ok(engine, "a", ok=False)
    assert _starts(engine, "b") == []
    assert engine.delete("a").state == State.FAILED  # the dead letter dealt with
    assert _starts(engine, "b") == ["b"]


def test_a_queue_set_back_to_continue_releases_its_blocked_keys(parts):
    engine, _ = parts
    engine.set_queue_settings({"q": {"ordering_on_failure": "block"}})
    _add(engine, "a", max_attempts=1)
    _add(engine, "b")
    _starts(engine, "a")
    _ok(engine, "a", ok=False)
    engine.set_queue_settings({"q": {"ordering_on_failure": "continue"}})
    assert engine.lines.blocked("q") == [] and _starts(engine, "b") == ["b"]


def test_a_task_waiting_behind_its_key_expires_and_releases_the_next(parts):
    engine, clock = parts
    _add(engine, "a")
    _add(engine, "b", expires_at=NOW + 5)
    _add(engine, "c")
    assert _starts(engine, "a") == ["a"]
    engine._due("b")  # due, but it waits behind a: its expiry is noted
    clock["now"] = NOW + 6
    assert engine.expire_due(clock["now"]) == 1
    assert engine.get("b").state == State.EXPIRED
    _ok(engine, "a")
    assert _starts(engine, "c") == ["c"]


def test_a_restart_rebuilds_the_lines_from_the_journal(tmp_path):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    clock = {"now": NOW}
    j = Journal(str(tmp_path))
    j.open()
    e = Engine(cfg, j, clock=lambda: clock["now"])
    e.set_queue_settings({"q": {"ordering_on_failure": "block"}})
    for i in ("a", "b", "c"):
        _add(e, i, max_attempts=1)
    e._begin("a")
    _ok(e, "a", ok=False)  # a blocks b and c
    j.close()
    j = Journal(str(tmp_path))
    j.open()
    try:
        e = Engine(cfg, j, clock=lambda: clock["now"])
        e.set_queue_settings({"q": {"ordering_on_failure": "block"}})
        e.start()
        assert e.lines.blocked("q") == [("k", "a")] and e.lines.waiting("q", "k") == 3
        assert _starts(e, "c", "b") == []
        e.delete("a")
        assert _starts(e, "c", "b") == ["b"]
        e.stop(1)
    finally:
        j.close()


def test_a_blocker_swept_after_its_retention_releases_its_key(parts):
    engine, clock = parts
    engine.set_queue_settings({"q": {"ordering_on_failure": "block"}})
    _add(engine, "a", max_attempts=1)
    _add(engine, "b")
    _starts(engine, "a")
    _ok(engine, "a", ok=False)
    engine._forget_swept_blockers()
    assert _starts(engine, "b") == []  # still in the journal: still the blocker
    engine.journal.flush()
    engine.journal.sweep(NOW + 10 * engine.config.retention, engine.config.retention)
    engine._forget_swept_blockers()
    assert engine.lines.blocked("q") == [] and _starts(engine, "b") == ["b"]
