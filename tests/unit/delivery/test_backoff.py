"""miyamoto.delivery.backoff: the retry delay (doubling, then linear, capped), its jitter,
and Retry-After read as seconds or as an HTTP date."""

from __future__ import annotations

import email.utils
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.backoff import backoff, jittered, retry_after


def q(**kw) -> QueueConfig:
    return QueueConfig(**kw)


def test_backoff_doubles_from_min_backoff():
    c = q(min_backoff=0.5, max_backoff=3600, max_doublings=16)
    assert [backoff(n, c) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_backoff_cloud_tasks_example():
    # Cloud Tasks docs: min 10 s, max 300 s, max_doublings 3 -> 10, 20, 40, 80, 160, 240, 300, 300
    c = q(min_backoff=10, max_backoff=300, max_doublings=3)
    assert [backoff(n, c) for n in range(1, 9)] == [10, 20, 40, 80, 160, 240, 300, 300]


def test_backoff_linear_phase_after_max_doublings():
    c = q(min_backoff=1, max_backoff=1e9, max_doublings=2)
    # doubling: 1, 2, 4 (n = 1..3 = max_doublings + 1); then +4 per attempt
    assert [backoff(n, c) for n in range(1, 8)] == [1, 2, 4, 8, 12, 16, 20]


def test_backoff_zero_doublings_is_linear():
    c = q(min_backoff=3, max_backoff=1e9, max_doublings=0)
    assert [backoff(n, c) for n in range(1, 5)] == [3, 6, 9, 12]


def test_backoff_cap():
    c = q(min_backoff=1, max_backoff=5, max_doublings=16)
    assert [backoff(n, c) for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]
    assert backoff(10_000, c) == 5
    assert backoff(10_000, q(min_backoff=1, max_backoff=7, max_doublings=3)) == 7


def test_backoff_attempt_below_one_is_the_first_delay():
    c = q(min_backoff=2, max_backoff=100)
    assert backoff(0, c) == backoff(1, c) == 2


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 100), st.floats(0, 10_000), st.integers(0, 20), st.integers(1, 200))
def test_backoff_properties(min_b, extra, doublings, n):
    c = q(min_backoff=min_b, max_backoff=min_b + extra, max_doublings=doublings)
    d = backoff(n, c)
    assert 0 <= d <= c.max_backoff
    assert backoff(n + 1, c) >= d  # never shrinks
    assert d >= min(c.min_backoff, c.max_backoff)


class FixedRng:
    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


def test_jitter_bounds():
    assert jittered(10.0, FixedRng(0.0)) == pytest.approx(9.0)
    assert jittered(10.0, FixedRng(0.5)) == pytest.approx(10.0)
    assert jittered(10.0, FixedRng(0.999999)) == pytest.approx(11.0, abs=1e-4)
    assert jittered(0.0, FixedRng(0.7)) == 0.0


def test_jitter_is_within_ten_percent_and_spread():
    rng = random.Random(42)
    values = [jittered(100.0, rng) for _ in range(2000)]
    assert all(90.0 <= v <= 110.0 for v in values)
    assert min(values) < 92 and max(values) > 108  # really jittered, both ways
    assert 99 < sum(values) / len(values) < 101


def test_retry_after_seconds():
    assert retry_after("1", 0.0, 60) == 1.0
    assert retry_after(" 2.5 ", 0.0, 60) == 2.5
    assert retry_after("120", 0.0, 60) == 60  # capped at max_backoff
    assert retry_after("-5", 0.0, 60) == 0.0
    assert retry_after("inf", 0.0, 60) == 60


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "1 2", "Mon, 99 Foo 2020"])
def test_retry_after_garbage_is_ignored(value):
    assert retry_after(value, 1000.0, 60) is None


def test_retry_after_http_date():
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after(date, now, 3600) == pytest.approx(30, abs=1)
    assert retry_after(date, now, 10) == 10
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after(past, now, 3600) == 0.0
