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
