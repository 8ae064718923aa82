"""A peer's STOREs in two halves (Engine.admit, Engine.settle): admitted copies are
visible to an ASK at once and committed together; a failed commit refuses them all and
commits none later (a real SQLite file)."""

from __future__ import annotations

import sqlite3

import pytest

from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.errors import Unavailable
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import CLOUDTASKS, Task

pytestmark = pytest.mark.timeout(30)


def _task(i: int, name: str | None = None) -> Task:
    return Task(id=f"t{i}", queue="q", url="http://127.0.0.1:9/", name=name, eta=1e12,
                fire_at=1e12, created=1.0)


@pytest.fixture
def parts(tmp_path):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    journal = Journal(str(tmp_path))
    journal.open()
    yield Engine(cfg, journal), journal, tmp_path
    journal.close()


def _reopened(path) -> tuple[list[str], dict]:
    again = Journal(str(path))
    again.open()
    tasks, names, _ = again.load()
    again.close()
    return sorted(t.id for t in tasks), names


def test_admitted_copies_are_seen_by_an_ask_at_once_and_committed_in_one_group(parts):
    engine, journal, _ = parts
    copies = [_task(i) for i in range(5)]
    for t in copies:
        assert engine.admit(t) is t
    # an ASK looks the copy up at once (among the journal's pending writes): no read
    assert engine.get("t3") is copies[3]
    assert engine.live.get("t3") is None  # other news waits until the copy is stored
    commits = journal.commits
    engine.settle(copies)
    # one group for the five (on a loaded box the lazy flush may take them first, and
    # settle's own flush then commits what is left: nothing), never one commit a copy
    assert journal.commits - commits in (1, 2)
    assert all(engine.live.get(t.id) is not None for t in copies)
    # a repeat (the copies are due beyond the window: only the journal holds them) is
    # answered with the copy held, not handed to the journal again
    repeat = _task(3)
    held = engine.admit(repeat)
    assert held is not repeat and held.id == "t3" and engine.stats.stored == 5
    assert "t3" not in engine.live.storing


def test_a_failed_settle_refuses_every_copy_and_commits_none_of_them_later(parts, monkeypatch):
    engine, journal, path = parts
    real_commit = journal._commit
    calls = {"n": 0}

    def failing_once(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return real_commit(*args)

    monkeypatch.setattr(journal, "_commit", failing_once)
    copies = [_task(1, name="a"), _task(2, name="b")]
    for t in copies:
        engine.admit(t)
    with pytest.raises(Unavailable):
        engine.settle(copies)
    assert engine.live.get("t1") is None and engine.live.get("t2") is None
    assert engine.live.storing == set()
    engine.add(_task(3))  # the next group commits, without the refused ones or their names
    journal.close()
    assert _reopened(path) == (["t3"], {})


def test_a_stored_copy_keeps_its_queue_and_an_idle_empty_one_expires(tmp_path):
    """Engine + a real journal: a copy's queue is held while the copy lives (even past
    queue_idle_expiry), forgotten once idle and empty, and known again after a restart
    from what the journal holds."""
    now = [1000.0]
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path), "queue_idle_expiry": "60"})
    journal = Journal(str(tmp_path))
    journal.open()
    engine = Engine(cfg, journal, clock=lambda: now[0])
    engine.add(_task(1))
    engine.add(Task(id="t2", queue="gone", url="http://127.0.0.1:9/", eta=1e12, fire_at=1e12,
                    created=1.0))
    assert "q" in engine.queues and "gone" in engine.queues
    now[0] += 61
    assert engine.expire_queues(now[0]) == []  # both hold a scheduled copy
    engine.purge("gone")
    engine.pause("q", True)
    engine.purge("q")
    assert engine.expire_queues(now[0]) == ["gone"]  # q is paused: an admin's act stays
    assert engine.queues.names() == ["default", "q"] and "gone" not in engine.dispatcher.queues
    engine.pause("q", False)
    now[0] += 61
    assert engine.expire_queues(now[0]) == ["q"]
    journal.close()
    # a restart knows the queues whose copies the journal holds
    journal = Journal(str(tmp_path))
    journal.open()
    engine = Engine(cfg, journal, clock=lambda: now[0])
    engine.add(_task(3))
    engine.stop(0)
    journal.close()
    journal = Journal(str(tmp_path))
    journal.open()
    engine = Engine(cfg, journal, clock=lambda: now[0])
    engine.start()
    try:
        assert "q" in engine.queues
    finally:
        engine.stop(0)
        journal.close()


def test_a_cloud_tasks_name_is_held_past_its_schedule_time_a_native_one_from_its_enqueue(parts):
    engine, _, _ = parts
    window = engine.config.dedup_window
    native, cloud = _task(1, name="a"), _task(2, name="b").evolve(face=CLOUDTASKS)
    engine.add(native)
    engine.add(cloud)
    assert engine.name_holder("q", "a") == ("t1", 1.0 + window)
    assert engine.name_holder("q", "b") == ("t2", 1e12 + window)  # eta + window


def test_abort_undoes_a_refused_enqueue_s_copy_and_frees_its_name(parts):
    engine, journal, _ = parts
    engine.add(_task(1, name="inv-1"), wait=True)
    assert engine.name_holder("q", "inv-1")[0] == "t1"
    engine.abort("t1")
    assert engine.get("t1").state.value == "cancelled"
    assert engine.name_holder("q", "inv-1") is None  # the name may be used again
    engine.abort("t1")  # already ended: nothing more
    engine.abort("t-unknown")  # no copy here: nothing to undo
    engine.add(_task(2, name="inv-1"), wait=True)
    assert engine.name_holder("q", "inv-1")[0] == "t2"
