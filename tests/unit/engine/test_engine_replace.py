"""A repeat's new version of a held copy (Engine.replace), on a fake clock and an
in-memory journal: applied while the copy waits, only when newer, refused once started."""

from __future__ import annotations

import pytest

from enginekit import memory_engine
from miyamoto.errors import Conflict
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


@pytest.fixture
def parts():
    with memory_engine(NOW) as (e, clock):
        yield e, clock


def _task(**kw) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 31, params={"a": "1"}, name="n", replicas=("x", "y"), replica=1)
    base.update(kw)
    return Task(**base)


def test_a_waiting_copy_takes_a_newer_version_durably(parts) -> None:
    engine, _ = parts
    engine.add(_task())
    t = engine.replace("t1", {"params": {"a": "2"}, "body": None, "content_type": None},
                       40.0, "0002.r", offset=1.0)
    assert t.params == {"a": "2"} and t.eta == NOW + 40 and t.fire_at == NOW + 41
    assert engine.journal.get("t1").params == {"a": "2"}
    assert engine.journal.get("t1").revision == "0002.r"
    # an older (or the same) revision arriving late changes nothing
    old = engine.replace("t1", {"params": {"a": "old"}}, 5.0, "0001.r")
    assert old.params == {"a": "2"} and old.eta == NOW + 40
    assert engine.replace("t1", {"params": {"a": "3"}}, None, "0002.r").params == {"a": "2"}
    # only the eta: the params stay
    t = engine.replace("t1", {}, 50.0, "0003.r", offset=1.0)
    assert t.params == {"a": "2"} and t.fire_at == NOW + 51


def test_a_started_or_ended_copy_refuses(parts) -> None:
    engine, _ = parts
    engine.add(_task(attempts=1))  # a retry waiting: it has started
    with pytest.raises(Conflict, match="started"):
        engine.replace("t1", {}, 5.0, "0001.r")
    engine.add(_task(id="t2", name="m"))
    engine.cancel("t2")
    with pytest.raises(Conflict, match="cancelled"):
        engine.replace("t2", {}, 5.0, "0001.r")
    assert engine.replace("nope", {}, 5.0, "0001.r") is None
    engine.add(_task(id="t3", name="k"))
    engine.live["t3"] = engine.live.get("t3").evolve(state=State.RUNNING)
    with pytest.raises(Conflict, match="started"):
        engine.replace("t3", {}, 5.0, "0001.r")
