"""miyamoto.cli.times: RFC 3339 and relative times for the CLI's output, and --eta's input."""

from __future__ import annotations

import pytest

from miyamoto.cli.times import parse_time, readable, relative, rfc3339

NOW = 1796178133.035  # 2026-12-02T02:22:13.035Z


def test_rfc3339_in_utc_with_milliseconds_only_when_there_are_some():
    assert rfc3339(1796178133.0) == "2026-12-02T02:22:13Z"
    assert rfc3339(NOW) == "2026-12-02T02:22:13.035Z"
    assert rfc3339(1796178133.9996) == "2026-12-02T02:22:14Z"  # rounds up a whole second
    assert rfc3339(0) == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("at,text", [
    (NOW + 4, "in 4.0 s"), (NOW - 3.25, "3.2 s ago"), (NOW, "in 0.0 s"),
    (NOW + 125, "in 2 min 5 s"), (NOW - 7260, "2 h 1 min ago"), (NOW + 2 * 86400 + 3600, "in 2 d 1 h"),
    (None, "-"), ("soon", "-"), (True, "-"), (float("nan"), "-"),
])
def test_relative(at, text):
    assert relative(at, NOW) == text


def test_readable_shows_the_apis_unix_times_as_rfc3339_and_nothing_else():
    task = {"id": "x", "eta": NOW, "created": 1796178033.0, "finished": None, "attempts": 3,
            "history": [{"start": 1796178100.5, "duration": 0.25, "status": 500}],
            "copies": [{"next_attempt": NOW, "replica": 0}],
            "last_response": {"status": 500, "at": 1796178100.75, "body": "1796178100"},
            "timeout": 30.0, "priority": 5, "paused": False}
    shown = readable(task)
    assert shown["eta"] == "2026-12-02T02:22:13.035Z"
    assert shown["created"] == "2026-12-02T02:20:33Z" and shown["finished"] is None
    assert shown["history"] == [{"start": "2026-12-02T02:21:40.500Z", "duration": 0.25,
                                 "status": 500}]
    assert shown["copies"][0]["next_attempt"] == "2026-12-02T02:22:13.035Z"
    assert shown["last_response"]["at"] == "2026-12-02T02:21:40.750Z"
    assert shown["last_response"]["body"] == "1796178100"  # a string stays a string
    assert (shown["attempts"], shown["timeout"], shown["priority"], shown["paused"]) == \
        (3, 30.0, 5, False)
    schedule = {"name": "n", "every": 60, "next": [1796178180.0, 1796178240.0], "last_tick": None}
    assert readable(schedule)["next"] == ["2026-12-02T02:23:00Z", "2026-12-02T02:24:00Z"]
    assert readable(schedule)["every"] == 60
    assert readable([{"retry_at": 1796178133.0}]) == [{"retry_at": "2026-12-02T02:22:13Z"}]
    assert readable({"eta": 1e300}) == {"eta": 1e300}  # beyond what a date can say: as is


@pytest.mark.parametrize("text,t", [
    ("1796178133.035", NOW), ("2026-12-02T02:22:13.035Z", NOW),
    ("2026-12-02T03:22:13.035+01:00", NOW), ("2026-12-02T02:22:13.035", NOW),
])
def test_eta_takes_unix_seconds_or_rfc3339(text, t):
    assert parse_time(text) == pytest.approx(t)


def test_a_bad_eta_says_what_it_takes():
    with pytest.raises(ValueError, match="neither unix seconds nor an RFC 3339 time"):
        parse_time("tomorrow")


@pytest.mark.parametrize("span,text", [
    (59.9, "59.9 s"), (60, "1 min 0 s"), (3599, "59 min 59 s"), (3600, "1 h 0 min"),
    (86399, "23 h 59 min"), (86400, "1 d 0 h"),
])
def test_relative_moves_to_the_next_unit_exactly_at_it(span, text):
    assert relative(NOW + span, NOW) == f"in {text}"
    assert relative(NOW - span, NOW) == f"{text} ago"


def test_relative_reads_the_clock_when_not_given_now():
    import time

    assert relative(time.time() + 7200.5) == "in 2 h 0 min"
    assert relative(time.time() - 7199.5).endswith(" ago")


def test_only_a_number_a_date_can_show_is_a_time():
    last = 253402300799.0  # 9999-12-31T23:59:59Z
    assert readable({"eta": last}) == {"eta": "9999-12-31T23:59:59Z"}
    assert readable({"eta": 0}) == {"eta": "1970-01-01T00:00:00Z"}
    for v in (last + 1, -1, -0.5, True, float("inf"), "1796178133"):
        assert readable({"eta": v}) == {"eta": v}, v
    assert relative(last + 1, NOW) == "-" and relative(-1, NOW) == "-"
