"""A pull queue's pool of due copies (engine/pull.py) on its own: the order entries are
taken in, the event a long poll waits on, and the bounds a worker's request is checked
against. The engine's use of it (leases, nack, extend) is test_engine_pull.py."""

from __future__ import annotations

import math

import gevent
import pytest

from miyamoto.engine import pull
from miyamoto.engine.pull import PullPool, within
from miyamoto.tasks import options

pytestmark = pytest.mark.timeout(10)


def test_entries_come_by_priority_then_due_time_then_arrival() -> None:
    p = PullPool()
    p.add("q", "low", 0, 10.0)
    p.add("q", "late", 9, 20.0)
    p.add("q", "early", 9, 5.0)
    p.add("q", "twin", 9, 5.0)  # same priority and time: after the one that came first
    p.add("r", "other", 5, 1.0)
    assert p.waiting("q") == 4 and p.waiting("r") == 1 and p.waiting("none") == 0
    assert [p.take("q") for _ in range(5)] == ["early", "twin", "late", "low", None]
    assert p.take("never-used") is None
    assert p.drain("r") == ["other"] and p.drain("r") == [] and p.waiting("r") == 0


def test_the_event_is_set_by_an_entry_and_cleared_by_a_look_that_finds_none() -> None:
    p = PullPool()
    assert p.wait("q", 0) is False  # nothing came
    p.add("q", "t1", 0, 1.0)
    assert p.wait("q", 0) is True
    assert p.take("q") == "t1"
    assert p.wait("q", 0) is True  # an entry is a hint: the next look finds it gone
    assert p.take("q") is None
    assert p.wait("q", -5) is False  # cleared (and a past deadline is no wait)


def test_a_long_poll_wakes_when_an_entry_comes() -> None:
    p = PullPool()
    waiter = gevent.spawn(p.wait, "q", 5.0)
    gevent.sleep(0)
    p.add("q", "t1", 0, 1.0)
    assert waiter.get(timeout=1) is True


def test_within_takes_finite_numbers_in_the_closed_range_only() -> None:
    for v in (0, 0.0, 5, 30.5, 60):
        assert within(v, 0, 60) is True, v
    for v in (-0.1, 60.01, math.inf, -math.inf, math.nan, True, False, "5", None, [1]):
        assert within(v, 0, 60) is False, v


def test_the_bounds_a_worker_may_ask() -> None:
    # a long poll of at most a minute (a client's usual HTTP timeout covers it); a
    # nack's delay as long as any retry delay an enqueue may ask (30 days)
    assert pull.WAIT_MAX == 60.0
    assert pull.DELAY_MAX == options.RETRY_DELAY_MAX == 30 * 86400.0
    assert (pull.LEASE_MIN, pull.LEASE_MAX) == (1.0, options.LEASE_MAX)
    assert pull.TASKS_MAX == 100
