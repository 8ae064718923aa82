"""This node's own stalls (miyamoto.delivery.stalls) and the dispatcher's use of them: an
attempt with no answer that ran across one is not counted against its target's breaker.
A real node paused with SIGSTOP is in tests/nodes/test_delivery_node.py."""

from __future__ import annotations

import time

import pytest

from dispatchkit import FakeClock
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.delivery.stalls import Stalls

H = "http://h:80"


@pytest.mark.timeout(10)
def test_a_gap_between_looks_beyond_the_threshold_is_a_stall():
    s = Stalls(100.0, threshold=1.0)
    assert s.note(100.5) == 0.0 and s.note(101.4) == 0.0  # gaps of 0.5 and 0.9 s
    assert not s.spanned(100.0, 101.4)
    assert s.note(106.4) == pytest.approx(5.0)  # paused 5 s
    assert s.ended == 106.4 and s.length == pytest.approx(5.0)


@pytest.mark.timeout(10)
def test_an_attempt_spans_a_stall_that_ended_after_it_began_and_no_earlier_one():
    s = Stalls(100.0, threshold=1.0)
    s.note(106.0)
    assert s.spanned(99.0, 106.1)  # in flight when the pause came
    assert not s.spanned(106.05, 106.3)  # begun after the resume


@pytest.mark.timeout(10)
def test_a_stall_the_ticker_has_not_seen_yet_is_noted_by_the_attempt_that_ends_it():
    """After a resume the timeouts may fire before the ticker's turn: the attempt's end
    itself sees the gap since the ticker's last look."""
    s = Stalls(100.0, threshold=1.0)
    assert s.spanned(99.5, 105.0)  # no look since 100.0
    assert s.ended == 105.0 and s.length == pytest.approx(5.0)
    assert not s.spanned(105.2, 105.6)  # and the next one, begun after, is not forgiven


def _dispatcher(failures: int) -> Dispatcher:
    return Dispatcher(lambda task_id: None, lambda name: QueueConfig(name=name), 8,
                      FakeClock(), breaker_failures=failures, breaker_cooldown=30.0)


@pytest.mark.timeout(10)
def test_dispatcher_does_not_count_failures_across_its_own_pause_against_the_target():
    d = _dispatcher(2)
    now = time.monotonic()
    d.stalls = Stalls(now - 10.0)  # the ticker last looked 10 s ago: we were paused
    for _ in range(5):  # five timeouts of attempts begun before the pause
        d.outcome(H, None, now - 11.0)
    assert d.stalls.forgiven == 5
    assert d.breakers.get(H) is None or d.breakers.get(H).failures == 0
    d.outcome(H, None, time.monotonic() + 0.01)  # one begun after it: counted
    d.outcome(H, None)  # and one with no begin time (as before)
    assert d.targets()[0]["state"] == "open"


@pytest.mark.timeout(10)
def test_dispatcher_counts_answers_and_failures_outside_a_pause_as_before():
    d = _dispatcher(2)
    now = time.monotonic()
    d.stalls = Stalls(now - 10.0)
    d.outcome(H, 503, now - 11.0)  # an answer across the pause is the target's own
    d.stalls.note(time.monotonic())
    d.outcome(H, None, time.monotonic())
    assert d.stalls.forgiven == 0 and d.targets()[0]["state"] == "open"
