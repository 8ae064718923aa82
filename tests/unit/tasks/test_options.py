"""A task's lifetime fields (``miyamoto.tasks.options``) at their documented edges: what an
enqueue may ask (a ValidationError naming the field beyond) and what a peer's or the
journal's copy may hold (a DecodeError)."""

from __future__ import annotations

import pytest

from miyamoto.tasks import options
from miyamoto.tasks.checks import ValidationError
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(30)

NOW, DAY = 1_000_000.0, 86400.0


def parse(**fields):
    return options.parse(fields, eta=NOW, now=NOW, max_delay=10 * DAY)


def refused(field: str, why: str, **fields) -> None:
    with pytest.raises(ValidationError) as e:
        parse(**fields)
    assert e.value.field == field and why in str(e.value), str(e.value)


def test_retry_delays_each_up_to_thirty_days_at_most_twenty() -> None:
    assert parse(retry_delays=[0, 30 * DAY]) == {"retry_delays": (0.0, 30 * DAY)}
    refused("retry_delays[1]", "must be in [0, 2.592e+06] seconds",
            retry_delays=[1, 30 * DAY + 1])
    refused("retry_delays[0]", "must be in [0, 2.592e+06]", retry_delays=[-1])
    assert parse(retry_delays="1, 10,60")["retry_delays"] == (1.0, 10.0, 60.0)
    assert len(parse(retry_delays=[1] * 20)["retry_delays"]) == 20
    refused("retry_delays", "has more than 20 delays", retry_delays=[1] * 21)
    for empty in ([], "", " ", {"a": 1}):
        refused("retry_delays", "must be a non-empty list", retry_delays=empty)


def test_a_peers_retry_delays_and_lease_are_checked_the_same() -> None:
    kw = {"retry_delays": [0, 30 * DAY], "lease": 7 * DAY}
    options.check_decoded(kw)
    assert kw["retry_delays"] == (0.0, 30 * DAY)
    for bad in ({"retry_delays": [30 * DAY + 1]}, {"retry_delays": [-1]},
                {"retry_delays": [1] * 21}, {"retry_delays": [True]},
                {"lease": 7 * DAY + 1}, {"lease": 0}, {"expires_at": float("nan")},
                {"accepted": -1}):
        with pytest.raises(DecodeError):
            options.check_decoded(dict(bad))
    options.check_decoded({"retry_delays": [1] * 20, "accepted": 0, "lease": None})


def test_a_lease_up_to_seven_days_and_async_alone_takes_the_default() -> None:
    assert parse(lease=7 * DAY) == {"lease": 7 * DAY}
    refused("lease", "must be in (0, 604800] seconds (7 days)", lease=7 * DAY + 1)
    refused("lease", "must be in (0, 604800]", lease=0)
    assert parse(**{"async": True}) == {"lease": 300.0}
    assert parse(**{"async": " Yes "}) == {"lease": 300.0}
    assert parse(**{"async": "off"}) == {} and parse(**{"async": False}) == {}
    refused("async", "must be true or false", **{"async": "maybe"})
    refused("async", "must be true or false", **{"async": 1})
    refused("lease", "is given with async false", lease=10, **{"async": "false"})
    assert parse(lease="60", **{"async": "true"}) == {"lease": 60.0}
    assert options.check_lease(7 * DAY) and not options.check_lease(True)


def test_a_lifetime_ends_after_the_task_is_due_and_within_twice_the_max_delay() -> None:
    assert parse(ttl=20 * DAY) == {"expires_at": NOW + 20 * DAY}
    refused("ttl", "must be in (0, 1.728e+06] seconds", ttl=20 * DAY + 1)
    refused("ttl", "must be in (0,", ttl=0)
    assert parse(expires_at=NOW + 20 * DAY) == {"expires_at": NOW + 20 * DAY}
    refused("expires_at", "is more than 1.728e+06 s in the future",
            expires_at=NOW + 20 * DAY + 1)
    refused("expires_at", "is in the past", expires_at=NOW)
    # expires_at wins over ttl
    assert parse(expires_at=NOW + 5, ttl=100) == {"expires_at": NOW + 5}
    with pytest.raises(ValidationError) as e:
        options.parse({"ttl": 5}, eta=NOW + 5, now=NOW, max_delay=DAY)
    assert e.value.field == "ttl" and "ends before the task is due" in str(e.value)
    with pytest.raises(ValidationError) as e:
        options.parse({"expires_at": NOW + 5}, eta=NOW + 6, now=NOW, max_delay=DAY)
    assert e.value.field == "expires_at"
    assert options.parse({"ttl": 6}, eta=NOW + 5, now=NOW, max_delay=DAY) == \
        {"expires_at": NOW + 6}


def test_the_delay_before_each_retry_then_the_last_one_again() -> None:
    delays = (1.0, 10.0, 60.0)
    assert [options.next_delay(delays, n) for n in (1, 2, 3, 4, 9)] == [1, 10, 60, 60, 60]
