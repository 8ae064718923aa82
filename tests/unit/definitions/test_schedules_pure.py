"""Recurring schedules, in-process: a schedule's stored value, its ticks on a fake clock,
which tick is due, and the leader's Ticker firing them through a one-member definitions
set in memory. Real nodes firing them: tests/nodes/test_schedules_node.py."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

from dispatchkit import wait_for
from miyamoto.definitions import schedules as s
from miyamoto.definitions.sync import DefSync
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, ValidationError

pytestmark = pytest.mark.timeout(30)

LIMITS = Limits()
TASK = {"url": "http://127.0.0.1:9/w"}


def parse(**body: Any) -> dict[str, Any]:
    return s.parse_schedule(dict({"name": "n", "every": 5, "task": TASK}, **body),
                            limits=LIMITS, now=100.5, catch_up="last")


def test_every_runs_from_one_second_to_a_year() -> None:
    assert parse(every=1)["every"] == 1
    year = 366 * 86400  # a leap year: the bound the API publishes
    assert parse(every=year)["every"] == year
    for bad in (0, year + 1, 1.5, True, "5"):
        with pytest.raises(ValidationError) as e:
            parse(every=bad)
        assert e.value.field == "every", bad


def test_parse_schedule_names_the_field() -> None:
    url = {"url": "http://x/"}
    bad = [({"name": "n", "every": 5, "task": {"url": "ftp://x"}}, "task.url"),
           ({"name": "n", "every": 5, "task": {"url": "http://x/", "nope": 1}}, "task.nope"),
           ({"name": "n", "cron": "61 * * * *", "task": url}, "cron"),
           ({"name": "n", "cron": "* * * *", "task": url}, "cron"),
           ({"name": "n", "cron": "* * * * * * *", "task": url}, "cron"),
           ({"name": "n", "cron": 5, "task": url}, "cron"),
           ({"name": "n", "cron": "* * * * *", "every": 1, "task": url}, "cron"),
           ({"name": "n", "task": url}, "cron"),
           ({"name": "n", "every": 1, "timezone": "Mars/Base", "task": url}, "timezone"),
           ({"name": "n", "every": 1, "timezone": "", "task": url}, "timezone"),
           ({"name": "n", "every": 1, "timezone": 3, "task": url}, "timezone"),
           ({"name": "n", "every": 1, "timezone": "A" * 65, "task": url}, "timezone"),
           ({"name": "a b", "every": 1, "task": url}, "name"),
           ({"every": 1, "task": url}, "name"),
           ({"name": "n", "every": 1, "catch_up": "all", "task": url}, "catch_up"),
           ({"name": "n", "every": 1, "paused": "yes", "task": url}, "paused"),
           ({"name": "n", "every": 1, "task": "http://x/"}, "task"),
           ({"name": "n", "every": 1}, "task"),
           ({"name": "n", "every": 1, "task": {"url": "http://x/", "name": "x"}}, "task.name"),
           ({"name": "n", "every": 1, "task": {"url": "http://x/", "eta": 5}}, "task.eta"),
           ({"name": "n", "every": 1, "task": url, "zz": 1, "aa": 2}, "aa")]
    for body, field in bad:
        with pytest.raises(ValidationError) as e:
            s.parse_schedule(body, limits=LIMITS, now=100.0, catch_up="last")
        assert e.value.field == field, (body, e.value)
    with pytest.raises(ValidationError) as e:
        s.parse_schedule(["n"], limits=LIMITS, now=100.0, catch_up="last")
    assert e.value.field == "body"


def test_check_name_takes_1_to_100_of_the_safe_characters() -> None:
    for ok in ("a", "A-z_0.9", "n" * s.NAME_CHARS):
        assert s.check_name(ok) == ok
    for bad in ("", "n" * (s.NAME_CHARS + 1), "a/b", "a b", "é", None, 5):
        with pytest.raises(ValidationError) as e:
            s.check_name(bad, "topic")
        assert e.value.field == "topic", bad


def test_ticks_with_a_fake_clock() -> None:
    every = {"every": 10, "created": 0, "paused": False, "catch_up": "last"}
    assert s.latest(every, 1005.0) == 1000.0
    assert s.latest(every, 1000.0) == 1000.0
    assert s.upcoming(every, 1005.0, 3) == [1010.0, 1020.0, 1030.0]
    assert s.upcoming(every, 1000.0, 1) == [1010.0]  # strictly after now
    assert len(s.upcoming(every, 1005.0)) == 5
    # 03:00 in Paris is 02:00 UTC in winter: 2023-11-14 02:00 UTC = 1699927200
    cron = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "created": 0, "paused": False,
            "catch_up": "last"}
    assert s.latest(cron, 1700000000.0) == 1699927200.0
    assert s.latest(cron, 1699927200.0) == 1699927200.0  # a tick is due at its own second
    assert s.latest(cron, 1699927199.5) == 1699927200.0 - 86400
    assert s.upcoming(cron, 1700000000.0, 1) == [1699927200.0 + 86400]
    assert len(s.upcoming(cron, 1700000000.0)) == 5
    seconds = {"cron": "* * * * * */5", "timezone": "UTC", "created": 0}
    assert s.latest(seconds, 1700000003.0) == 1700000000.0
    assert s.latest(dict(every, created=1001), 1005.0) is None  # made after the tick
    assert s.latest(dict(every, created=1000), 1005.0) == 1000.0
    assert s.latest({"every": 10}, 1005.0) == 1000.0  # no created: any tick counts


def test_due_follows_cursor_and_catch_up() -> None:
    v = {"every": 1, "created": 100, "paused": False, "catch_up": "last"}
    assert s.due(v, None, 100.2) == 100.0
    assert s.due(v, {"tick": 100.0}, 100.9) is None     # fired already
    assert s.due(v, {"tick": 99.0}, 100.9) == 100.0
    assert s.due(v, {}, 100.9) == 100.0                 # a cursor without a tick
    assert s.due(v, {"tick": 100.0}, 150.5) == 150.0    # a gap: the newest tick, once
    none = dict(v, catch_up="none")
    assert s.due(none, {"tick": 100.0}, 150.5) == 150.0  # within GRACE of its time
    ten = dict(none, every=10)
    assert s.due(ten, {"tick": 100.0}, 110.0 + s.GRACE) == 110.0  # GRACE late still fires
    assert s.due(ten, {"tick": 100.0}, 110.5 + s.GRACE) is None
    cron_gap = {"cron": "0 3 * * *", "timezone": "UTC", "created": 0, "paused": False,
                "catch_up": "none"}
    assert s.due(cron_gap, None, 1699930800.0 + 3600) is None  # missed an hour ago: skipped
    assert s.due(dict(cron_gap, catch_up="last"), None, 1699930800.0 + 3600) == 1699930800.0
    assert s.due(dict(v, paused=True), None, 100.2) is None
    assert s.due(v, None, 99.5) is None  # no tick before the schedule was made


# ---------------------------------------------------------------- the Ticker

class Enqueue:
    """The node's enqueue: stores the task, or raises what a test set up."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.raise_: Exception | None = None

    def __call__(self, task: Task) -> Task:
        if self.raise_ is not None:
            raise self.raise_
        self.tasks.append(task)
        return task


def defs_alone() -> DefSync:
    """A one-member cluster's definitions, in memory: a majority alone, so ready at once."""
    d = DefSync("a", ":memory:", lambda *a, **k: True, "tcp://x:1",
                monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
    d.tick("a", 1, ("a",))
    assert d.machine.ready
    return d


def ticker(defs: DefSync, enqueue: Enqueue, now: list[float]) -> s.Ticker:
    return s.Ticker(defs, enqueue, lambda: True, LIMITS, clock=lambda: now[0])


def put(defs: DefSync, name: str, **value: Any) -> None:
    defs.write([("schedule", name, dict({"name": name, "every": 10, "created": 0,
                                        "timezone": "UTC", "catch_up": "last",
                                        "paused": False, "task": TASK}, **value))])


def test_the_ticker_fires_each_due_tick_once_and_records_it() -> None:
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "a")
    put(defs, "b", every=100)
    put(defs, "p", paused=True)
    t = ticker(defs, enq, now)
    t.fire_due()
    assert sorted(x.name for x in enq.tasks) == ["schedule:a:1000", "schedule:b:1000"]
    assert t.fired == 2
    ids = {x.name: x.id for x in enq.tasks}
    assert defs.machine.get("cursor", "a") == {"tick": 1000.0, "ids": [ids["schedule:a:1000"]]}
    t.fire_due()  # the same second again: nothing new
    assert len(enq.tasks) == 2 and t.fired == 2
    now[0] = 1012.0
    t.fire_due()
    assert [x.name for x in enq.tasks[2:]] == ["schedule:a:1010"]
    assert len(defs.machine.get("cursor", "a")["ids"]) == 2
    assert defs.machine.get("cursor", "p") is None


def test_the_ticker_keeps_the_last_ids_only() -> None:
    defs, enq, now = defs_alone(), Enqueue(), [5.0]
    put(defs, "a", every=1)
    t = ticker(defs, enq, now)
    for i in range(s.LAST_IDS + 3):
        now[0] = 5.0 + i
        t.fire_due()
    ids = defs.machine.get("cursor", "a")["ids"]
    assert len(ids) == 10 and ids == [x.id for x in enq.tasks][-10:]  # the last ten


def test_a_duplicate_tick_records_the_original_id() -> None:
    """A leader that died after the enqueue, before the cursor: the next one's enqueue is
    answered duplicate, and the cursor takes the original's id without firing twice."""
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "a")
    enq.raise_ = Duplicate("orig-1")
    t = ticker(defs, enq, now)
    t.fire_due()
    assert defs.machine.get("cursor", "a") == {"tick": 1000.0, "ids": ["orig-1"]}
    assert t.fired == 0


@pytest.mark.parametrize("error", [Unavailable("too few replicas"),
                                   ValidationError("url", "refused")])
def test_a_tick_not_enqueued_is_tried_again(error: Exception) -> None:
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "a")
    enq.raise_ = error
    t = ticker(defs, enq, now)
    t.fire_due()
    assert defs.machine.get("cursor", "a") is None and t.fired == 0
    enq.raise_ = None
    t.fire_due()
    assert [x.name for x in enq.tasks] == ["schedule:a:1000"]


def test_a_bad_stored_value_is_skipped_and_the_others_fire() -> None:
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "bad", every="ten")
    put(defs, "good")
    ticker(defs, enq, now).fire_due()
    assert [x.name for x in enq.tasks] == ["schedule:good:1000"]


def test_unconfirmed_cursors_are_survived() -> None:
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "a")
    t = ticker(defs, enq, now)

    def refuse(changes: list) -> None:
        raise Unavailable("no majority")
    defs.write = refuse  # type: ignore[method-assign]
    t.fire_due()  # logged; the name dedupes the next try
    assert len(enq.tasks) == 1 and defs.machine.get("cursor", "a") is None


def test_the_ticker_loop_fires_once_allowed_and_outlives_a_failed_round(monkeypatch) -> None:
    monkeypatch.setattr(s, "PERIOD", 0.001)
    defs, enq, now = defs_alone(), Enqueue(), [1005.0]
    put(defs, "a")
    asked: list[int] = []

    def may_fire() -> bool:  # no, then a round that fails, then yes
        asked.append(1)
        if len(asked) == 2:
            raise RuntimeError("a round failed")
        return len(asked) > 2
    g = gevent.spawn(s.Ticker(defs, enq, may_fire, LIMITS, clock=lambda: now[0]).run)
    try:
        wait_for(lambda: enq.tasks)
        assert [x.name for x in enq.tasks] == ["schedule:a:1000"] and len(asked) >= 3
    finally:
        g.kill()


def test_a_schedule_larger_than_a_definition_may_be_is_413() -> None:
    """A peer refuses a definition above 512 KiB as JSON: one the leader took anyway
    would never reach a majority (503 after the timeout) and never sync."""
    from miyamoto.definitions.messages import MAX_VALUE
    body = "x" * (MAX_VALUE - 200)
    ok = parse(task={"url": "http://127.0.0.1:9/w", "body": body})
    assert len(ok["task"]["body"]) == len(body)
    with pytest.raises(ValidationError) as e:
        parse(task={"url": "http://127.0.0.1:9/w", "body": body + "x" * 400})
    assert e.value.field == "task" and e.value.status == 413
    assert "512 KiB" in e.value.message
    with pytest.raises(ValidationError) as e:  # non-ASCII is measured as a peer reads it
        parse(task={"url": "http://127.0.0.1:9/w", "body": "é" * (MAX_VALUE // 5)})
    assert e.value.status == 413


def test_a_tick_is_due_by_the_clusters_clock_and_its_task_at_once_by_ours() -> None:
    """A leader 30 s ahead fired every tick 30 s early: the tick is judged on the
    cluster's clock (ours plus the offset), the task it enqueues is due now on ours."""
    defs, enq, now = defs_alone(), Enqueue(), [1035.0]  # the cluster's clock reads 1005
    put(defs, "a")
    t = s.Ticker(defs, enq, lambda: True, LIMITS, clock=lambda: now[0], offset=lambda: -30.0)
    t.fire_due()
    assert [x.name for x in enq.tasks] == ["schedule:a:1000"]
    assert enq.tasks[0].fire_at == 1035.0
    now[0] = 1039.9  # the cluster's 1009.9: tick 1010 is not due yet
    t.fire_due()
    assert len(enq.tasks) == 1
    now[0] = 1040.0
    t.fire_due()
    assert [x.name for x in enq.tasks][-1] == "schedule:a:1010"


def test_parse_schedule_fills_the_defaults() -> None:
    assert parse() == {"name": "n", "created": 100, "every": 5, "timezone": "UTC",
                       "catch_up": "last", "paused": False, "task": TASK}
    assert s.parse_schedule({"name": "n", "every": 5, "task": TASK}, limits=LIMITS,
                            now=100.5, catch_up="none")["catch_up"] == "none"
    v = s.parse_schedule({"name": "n", "cron": " 0  3 * * * ", "timezone": "Europe/Paris",
                          "catch_up": "none", "paused": True, "task": TASK},
                         limits=LIMITS, now=100.5, catch_up="last")
    assert (v["cron"], v["timezone"], v["catch_up"], v["paused"]) == (
        "0 3 * * *", "Europe/Paris", "none", True)
    assert "every" not in v
    with pytest.raises(ValidationError) as e:  # six fields only when asked for by name
        s.parse_schedule({"name": "n", "cron": "* * * * * */5", "task": TASK},
                         limits=LIMITS, now=100.5, catch_up="last")
    assert e.value.field == "cron" and "cron_seconds_last" in str(e.value)
    six = s.parse_schedule({"name": "n", "cron": "* * * * * */5", "cron_seconds_last": True,
                            "task": TASK}, limits=LIMITS, now=100.5, catch_up="last")
    assert six["cron"] == "* * * * * */5"


def test_view_is_what_get_schedules_answers() -> None:
    v = parse(every=10)
    assert s.view(v, {"tick": 100.0, "ids": ["t1"]}, 105.0) == {
        "name": "n", "every": 10, "timezone": "UTC", "catch_up": "last", "paused": False,
        "next": [110.0, 120.0, 130.0, 140.0, 150.0], "last_tick": 100.0,
        "next_at": ["1970-01-01T00:01:50+00:00", "1970-01-01T00:02:00+00:00",
                    "1970-01-01T00:02:10+00:00", "1970-01-01T00:02:20+00:00",
                    "1970-01-01T00:02:30+00:00"],
        "last_task_ids": ["t1"], "task": TASK}
    shown = s.view(dict(v, paused=True), None, 105.0)
    assert shown["next"] == [] and shown["last_tick"] is None and shown["last_task_ids"] == []
    assert shown["next_at"] == []
    cron = s.view({"name": "c", "cron": "0 3 * * *", "timezone": "UTC", "catch_up": "last",
                   "paused": False, "task": TASK}, None, 1699920000.0)
    assert cron["cron"] == "0 3 * * *" and "every" not in cron
    assert cron["next"][0] == 1699930800.0
    paris = s.view({"name": "c", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                    "catch_up": "last", "paused": False, "task": TASK}, None, 1699920000.0)
    assert paris["next_at"][0] == "2023-11-14T03:00:00+01:00"  # in the schedule's own zone


def test_without_an_offset_a_tick_is_due_on_our_own_clock() -> None:
    """No offset given: the cluster's clock is ours, so a tick at 20 is not due at 19.5."""
    defs, enq, now = defs_alone(), Enqueue(), [19.5]
    put(defs, "a", every=10, catch_up="none", created=15)
    t = ticker(defs, enq, now)
    t.fire_due()
    assert enq.tasks == []
    now[0] = 20.0
    t.fire_due()
    assert len(enq.tasks) == 1
