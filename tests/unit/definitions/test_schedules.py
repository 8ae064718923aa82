"""What a schedule's ``cron`` takes (croniter's own words, aliases, no never-firing
expression, seconds last only when asked for), its view's RFC 3339 times, and the
leader's loop over a stored schedule that cannot fire. Pure: a fake clock, a stub of the
definitions, no node (the real-node tests are in tests/nodes/test_schedules.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from miyamoto.definitions import schedules as s
from miyamoto.tasks.validate import Limits, ValidationError

NOW = 1700000000.0  # 2023-11-14 22:13:20 UTC
TASK = {"url": "http://127.0.0.1:9/w"}


def test_parse_schedule_names_the_field() -> None:
    ok = s.parse_schedule({"name": "n", "every": 5, "task": {"url": "http://127.0.0.1:9/w"}},
                          limits=Limits(), now=100.5, catch_up="last")
    assert ok["every"] == 5 and ok["timezone"] == "UTC" and ok["created"] == 100
    bad = [({"name": "n", "every": 5, "task": {"url": "ftp://x"}}, "task.url"),
           ({"name": "n", "every": 5, "task": {"url": "http://x/", "nope": 1}}, "task.nope"),
           ({"name": "n", "cron": "61 * * * *", "task": {"url": "http://x/"}}, "cron"),
           ({"name": "n", "cron": "* * * * *", "every": 1, "task": {"url": "http://x/"}}, "cron"),
           ({"name": "n", "every": 0, "task": {"url": "http://x/"}}, "every"),
           ({"name": "n", "every": 1, "timezone": "Mars/Base", "task": {"url": "http://x/"}},
            "timezone"),
           ({"name": "a b", "every": 1, "task": {"url": "http://x/"}}, "name"),
           ({"name": "n", "every": 1, "catch_up": "all", "task": {"url": "http://x/"}},
            "catch_up"),
           ({"name": "n", "every": 1, "task": {"url": "http://x/", "name": "x"}}, "task.name")]
    for body, field in bad:
        with pytest.raises(ValidationError) as e:
            s.parse_schedule(body, limits=Limits(), now=100.0, catch_up="last")
        assert e.value.field == field, (body, e.value)


def test_ticks_with_a_fake_clock() -> None:
    every = {"every": 10, "created": 0, "paused": False, "catch_up": "last"}
    assert s.latest(every, 1005.0) == 1000.0
    assert s.upcoming(every, 1005.0, 3) == [1010.0, 1020.0, 1030.0]
    # 03:00 in Paris is 02:00 UTC in winter: 2023-11-14 02:00 UTC = 1699927200
    cron = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "created": 0, "paused": False,
            "catch_up": "last"}
    assert s.latest(cron, 1700000000.0) == 1699927200.0
    assert s.latest(cron, 1699927200.0) == 1699927200.0  # a tick is due at its own second
    assert s.upcoming(cron, 1700000000.0, 1) == [1699927200.0 + 86400]
    seconds = {"cron": "* * * * * */5", "timezone": "UTC", "created": 0}
    assert s.latest(seconds, 1700000003.0) == 1700000000.0


def test_due_follows_cursor_and_catch_up() -> None:
    v = {"every": 1, "created": 100, "paused": False, "catch_up": "last"}
    assert s.due(v, None, 100.2) == 100.0
    assert s.due(v, {"tick": 100.0}, 100.9) is None     # fired already
    assert s.due(v, {"tick": 100.0}, 150.5) == 150.0    # a gap: the newest tick, once
    none = dict(v, catch_up="none")
    assert s.due(none, {"tick": 100.0}, 150.5) == 150.0  # within GRACE of its time
    cron_gap = {"cron": "0 3 * * *", "timezone": "UTC", "created": 0, "paused": False,
                "catch_up": "none"}
    assert s.due(cron_gap, None, 1699930800.0 + 3600) is None  # missed an hour ago: skipped
    assert s.due(dict(cron_gap, catch_up="last"), None, 1699930800.0 + 3600) == 1699930800.0
    assert s.due(dict(v, paused=True), None, 100.2) is None
    assert s.due(v, None, 99.5) is None  # no tick before the schedule was made


def post(**fields: Any) -> dict[str, Any]:
    return s.parse_schedule({"name": "n", "task": TASK, **fields}, limits=Limits(), now=NOW,
                            catch_up="last")


def refused(**fields: Any) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        post(**fields)
    return e.value


@pytest.mark.parametrize("cron,words", [
    ("61 * * * *", "bad minute field '61': [61 * * * *] is not acceptable, out of range"),
    ("0 25 * * *", "bad hour field '25'"),
    ("0 0 32 * *", "bad day of month field '32'"),
    ("0 0 1 13 *", "bad month field '13'"),
    ("0 0 * * 8", "bad day of week field '8'"),
    ("*/0 * * * *", "bad minute field '*/0'"),
    ("a b c d e", "bad minute field 'a'"),
])
def test_a_bad_field_is_named_in_croniters_words(cron: str, words: str) -> None:
    e = refused(cron=cron)
    assert e.field == "cron" and words in e.message, e.message


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *"])
def test_a_cron_that_never_fires_is_refused(cron: str) -> None:
    e = refused(cron=cron)
    assert e.field == "cron" and "never fire" in e.message, e.message


def test_a_rare_cron_is_taken() -> None:
    assert post(cron="0 0 29 2 *")["cron"] == "0 0 29 2 *"  # leap days: every 4 years


@pytest.mark.parametrize("alias", ["@hourly", "@daily", "@DAILY", "@midnight", "@weekly",
                                   "@monthly", "@yearly", "@annually"])
def test_aliases_are_taken(alias: str) -> None:
    value = post(cron=alias, timezone="Europe/Paris")
    assert value["cron"] == alias.lower()
    assert s.upcoming(value, NOW, 1)[0] > NOW


def test_daily_ticks_at_local_midnight() -> None:
    value = post(cron="@daily", timezone="Europe/Paris")
    # 2023-11-15 00:00 in Paris (UTC+1) is 2023-11-14 23:00 UTC
    assert s.upcoming(value, NOW, 1) == [1700002800.0]


def test_an_unknown_alias_is_refused() -> None:
    e = refused(cron="@reboot")
    assert e.field == "cron" and "@daily" in e.message


def test_six_fields_are_refused_unless_seconds_last_is_asked_for() -> None:
    e = refused(cron="*/5 * * * * *")
    assert e.field == "cron" and "cron_seconds_last" in e.message and "every" in e.message
    value = post(cron="*/5 * * * * *", cron_seconds_last=True)
    assert value["cron_seconds_last"] is True
    # seconds last: every second of every fifth minute, as asked
    assert s.upcoming(value, NOW, 2) == [1700000100.0, 1700000101.0]
    assert s.view(dict(value, created=0), None, NOW)["cron_seconds_last"] is True


@pytest.mark.parametrize("fields,field", [
    ({"cron": "* * * * *", "cron_seconds_last": True}, "cron_seconds_last"),
    ({"cron": "@daily", "cron_seconds_last": True}, "cron_seconds_last"),
    ({"cron": "* * * * * *", "cron_seconds_last": "yes"}, "cron_seconds_last"),
    ({"every": 5, "cron_seconds_last": True}, "cron_seconds_last"),
    ({"cron": "* * * * * * *"}, "cron"),
    ({"cron": "* * * *"}, "cron"),
    ({"cron": ""}, "cron"),
    ({"cron": 5}, "cron"),
])
def test_the_field_at_fault_is_named(fields: dict, field: str) -> None:
    assert refused(**fields).field == field


def test_next_runs_are_rfc3339_in_the_schedules_time_zone() -> None:
    value = post(cron="0 3 * * *", timezone="Europe/Paris")
    shown = s.view(value, None, NOW)
    assert shown["next_at"][:2] == ["2023-11-15T03:00:00+01:00", "2023-11-16T03:00:00+01:00"]
    assert shown["next"][0] == 1700013600.0  # the same instant in unix seconds
    every = s.view(post(every=60), None, NOW)
    assert every["next_at"][0] == "2023-11-14T22:14:00+00:00"
    assert s.view(dict(value, paused=True), None, NOW)["next_at"] == []


def test_a_stored_cron_that_never_fires_shows_with_its_error() -> None:
    # stored before such a cron was refused, or by an older peer: seen, so it can be deleted
    value = dict(post(cron="0 3 * * *"), cron="0 0 31 2 *")
    shown = s.view(value, None, NOW)
    assert shown["next"] == [] and "never fires" in shown["error"]


class _Defs:
    """The definitions as the Ticker reads them: one leader's ready machine."""

    def __init__(self, schedules: dict[str, dict]):
        self.schedules = schedules
        self.written: list = []
        self.machine = SimpleNamespace(
            ready=True, items=lambda kind: sorted(self.schedules.items()),
            get=lambda kind, name: None)

    def write(self, changes: list) -> None:
        self.written.append(changes)


def test_a_schedule_that_cannot_fire_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    never = dict(post(cron="0 3 * * *"), name="never", cron="0 0 31 2 *")
    fired: list = []
    defs = _Defs({"never": never})
    ticker = s.Ticker(defs, enqueue=lambda t: fired.append(t) or t, may_fire=lambda: True,  # type: ignore[arg-type]
                      limits=Limits(), clock=lambda: NOW)
    with caplog.at_level(logging.WARNING, logger="miyamoto.definitions.schedules"):
        for _ in range(25):  # 5 s of the leader's rounds
            ticker.fire_due()
    lines = [r for r in caplog.records if "never" in r.getMessage()]
    assert len(lines) == 1 and "cannot fire" in lines[0].getMessage()
    assert fired == [] and defs.written == []
    defs.schedules["never"] = dict(never, cron="0 0 30 2 *")  # replaced, still bad: said again
    with caplog.at_level(logging.WARNING, logger="miyamoto.definitions.schedules"):
        ticker.fire_due()
    assert len([r for r in caplog.records if "never" in r.getMessage()]) == 2
