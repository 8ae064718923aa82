"""The queues a node holds: declared ones, those enqueues create up to max_queues, none
with auto_create_queues off, idle auto-created ones forgotten, paging by name."""

from __future__ import annotations

import pytest

from miyamoto.engine.queues import Queues, page
from miyamoto.tasks.checks import ValidationError

pytestmark = pytest.mark.timeout(10)


def test_enqueues_create_queues_up_to_the_cap() -> None:
    q = Queues(["default", "mail"], max_queues=4, auto_create=True, idle_expiry=60)
    for name in ("default", "mail", "a", "b", "a"):
        q.admit(name, 0.0)
    assert len(q) == 4 and q.names() == ["a", "b", "default", "mail"]
    with pytest.raises(ValidationError) as e:
        q.admit("c", 0.0)
    assert e.value.field == "queue" and e.value.status == 400
    assert "max_queues (4)" in e.value.message and "'c'" in e.value.message
    q.admit("a", 1.0)  # a queue it holds still takes tasks
    q.note("from-a-sibling", 1.0)  # a copy stored here is never refused for its queue
    assert "from-a-sibling" in q and len(q) == 5


def test_without_auto_create_only_declared_queues_take_tasks() -> None:
    q = Queues(["default"], max_queues=10, auto_create=False, idle_expiry=60)
    q.admit("default", 0.0)
    with pytest.raises(ValidationError, match="auto_create_queues is off") as e:
        q.admit("other", 0.0)
    assert e.value.field == "queue" and "other" not in q


def test_idle_auto_created_queues_expire_unless_busy() -> None:
    q = Queues(["default"], max_queues=10, auto_create=True, idle_expiry=60)
    q.admit("idle", 0.0)
    q.admit("busy", 0.0)
    q.admit("recent", 30.0)
    assert q.expire(59.0, busy=()) == []
    assert q.expire(60.0, busy={"busy"}) == ["idle"]
    assert q.names() == ["busy", "default", "recent"]
    assert sorted(q.expire(1000.0, busy=())) == ["busy", "recent"]
    assert q.names() == ["default"]  # a declared queue never expires
    q.admit("idle", 1000.0)  # and a forgotten one comes back with its next enqueue
    assert "idle" in q
    never = Queues([], max_queues=10, auto_create=True, idle_expiry=0)
    never.admit("x", 0.0)
    assert never.expire(1e9, busy=()) == []


def test_pages_by_name() -> None:
    names = [f"q{i:03d}" for i in range(25)]
    got, cursor = page(names, 10)
    assert got == names[:10] and cursor == "q009"
    got, cursor = page(names, 10, cursor)
    assert got == names[10:20] and cursor == "q019"
    got, cursor = page(names, 10, cursor)
    assert got == names[20:] and cursor is None
    assert page(names, 25) == (names, None)
    assert page(names, 10, "q0045") == (names[5:15], "q014")  # a cursor gone meanwhile
    assert page([], 10) == ([], None)


def test_queues_made_through_the_api_exist_whatever_auto_create_says() -> None:
    q = Queues(["default"], max_queues=3, auto_create=False, idle_expiry=60)
    q.define(["made", "default"], 0.0)
    q.admit("made", 1.0)  # takes tasks although auto_create_queues is off
    assert q.names() == ["default", "made"] and len(q) == 2
    assert q.expire(1000.0, busy=()) == []  # never idle while the API's settings hold
    q.room_for("made")
    q.room_for("another")  # the third of max_queues 3
    q.define(["made", "another"], 2.0)
    with pytest.raises(ValidationError, match=r"max_queues \(3\)") as e:
        q.room_for("fourth")
    assert e.value.field == "queue"
    q.define([], 10.0)  # settings deleted: ordinary queues again, idle from now
    assert q.names() == ["another", "default", "made"]
    assert q.expire(69.0, busy=()) == [] and sorted(q.expire(70.0, busy=())) == ["another", "made"]
    assert q.names() == ["default"]
