"""miyamoto.delivery.ratelimit: the token bucket on an injected clock: burst, rate, the
clock going back, refunds, and the wait until the next token."""

from __future__ import annotations

import pytest

from miyamoto.delivery.ratelimit import TokenBucket


def test_bucket_burst_then_rate():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    assert b.take(0.0)
    assert not b.take(0.0)
    assert b.wait_time(0.0) == pytest.approx(0.2)
    assert not b.take(0.1)
    assert b.wait_time(0.1) == pytest.approx(0.1)
    assert b.take(0.2)
    assert not b.take(0.2)


def test_bucket_burst_saves_up_to_burst():
    b = TokenBucket(rate=1, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    # a long idle time saves at most `burst` tokens
    assert [b.take(1000.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait_time(1000.0) == pytest.approx(1.0)


def test_bucket_rate_bound_over_time():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    t, taken = 0.0, 0
    while t <= 10.0:
        while b.take(t):
            taken += 1
        t += 0.013
    assert 49 <= taken <= 51  # 1 + 5/s * 10 s


def test_bucket_zero_rate_is_unlimited():
    b = TokenBucket(rate=0, burst=1, now=0.0)
    assert all(b.take(0.0) for _ in range(1000))
    assert b.wait_time(0.0) == 0.0


def test_bucket_clock_going_back_adds_nothing():
    b = TokenBucket(rate=1, burst=1, now=10.0)
    assert b.take(10.0)
    assert not b.take(5.0)
    assert not b.take(10.5)
    assert b.take(11.0)


def test_bucket_configure():
    b = TokenBucket(rate=1, burst=10, now=0.0)
    b.configure(rate=2, burst=2)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.wait_time(0.0) == pytest.approx(0.5)
    assert TokenBucket(rate=1, burst=0, now=0).burst == 1


def test_bucket_configure_to_a_burst_of_one_keeps_one_token():
    b = TokenBucket(rate=1, burst=10, now=0.0)
    b.configure(rate=1, burst=1)
    assert b.burst == 1
    assert [b.take(0.0) for _ in range(2)] == [True, False]


def test_bucket_refund_gives_a_token_back_up_to_the_burst():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    b.refund()
    assert [b.take(0.0) for _ in range(2)] == [True, False]
    b.refund()
    b.refund()
    b.refund()  # never more than the burst
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]


def test_bucket_refund_at_rate_zero_saves_nothing_for_later():
    b = TokenBucket(rate=1, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    b.configure(rate=0, burst=3)
    b.refund()  # unlimited: nothing to give back
    b.configure(rate=1, burst=3)
    assert not b.take(0.0)


def test_bucket_wait_time_refills_by_itself():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    assert b.take(0.0)
    assert b.wait_time(0.1) == pytest.approx(0.1)  # no take() in between
    assert b.wait_time(0.0) == pytest.approx(0.1)  # the clock going back adds nothing


def test_bucket_wait_time_is_zero_with_a_token_or_more():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)
    assert b.wait_time(0.5) == 0.0  # 1.5 tokens
    assert b.take(0.5)
    assert b.wait_time(0.5) == pytest.approx(0.5)


def test_bucket_wait_time_at_rate_zero_with_an_empty_bucket():
    b = TokenBucket(rate=1, burst=1, now=0.0)
    assert b.take(0.0)
    b.configure(rate=0, burst=1)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)
