"""Per-target circuit breakers: the pure state machine with a fake clock
(miyamoto.delivery.breaker) and the dispatcher's use of it. A real node whose queue has
a dead target and a healthy one is in tests/nodes/test_delivery_node.py.
"""

from __future__ import annotations

import gevent
import pytest

from dispatchkit import FakeClock
from miyamoto.delivery.breaker import MAX_COOLDOWN_FACTOR, BreakerState, Breakers, is_failure
from miyamoto.config.settings import ConfigError, QueueConfig, load
from miyamoto.delivery.dispatch import Dispatcher

H, G = "http://h:80", "http://g:80"
OPEN, HALF, CLOSED = BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED


# ================================================================ units: the state machine


def _fail(b: Breakers, origin: str, n: int, now: float) -> None:
    for _ in range(n):
        b.record(origin, True, now)


@pytest.mark.timeout(10)
def test_breaker_opens_after_consecutive_failures_then_probes_once():
    b = Breakers(3, 30.0)
    assert b.blocked_until(H, 0.0) is None and b.get(H) is None  # unknown: closed
    _fail(b, H, 2, 0.0)
    b.record(H, False, 0.5)  # a success in between resets the count
    _fail(b, H, 2, 1.0)
    assert b.get(H).state is CLOSED and b.get(H).failures == 2 and b.opens == 0
    b.record(H, True, 1.0)
    assert b.get(H).state is OPEN and b.get(H).retry_at == 31.0 and b.opens == 1
    assert b.blocked_until(H, 30.9) == 31.0 and b.blocked_until(G, 30.9) is None
    _fail(b, H, 5, 10.0)  # attempts started before it opened: they change nothing
    assert b.get(H).retry_at == 31.0 and b.opens == 1
    assert b.blocked_until(H, 31.0) is None and b.get(H).state is HALF
    assert b.started(H) is True  # the probe
    assert b.blocked_until(H, 31.0) == float("inf")  # one probe at a time: its end wakes
    assert b.started(G) is False


@pytest.mark.timeout(10)
def test_breaker_failed_probes_double_the_cooldown_up_to_the_cap_and_success_closes():
    b = Breakers(1, 2.0)
    now = 0.0
    b.record(H, True, now)
    cooldowns = []
    for _ in range(6):
        now = b.get(H).retry_at
        assert b.blocked_until(H, now) is None and b.started(H)
        b.record(H, True, now)  # the probe failed
        cooldowns.append(b.get(H).retry_at - now)
    assert cooldowns == [4.0, 8.0, 16.0, 20.0, 20.0, 20.0]  # capped at 10x
    assert max(cooldowns) == 2.0 * MAX_COOLDOWN_FACTOR and b.opens == 7
    now = b.get(H).retry_at
    assert b.blocked_until(H, now) is None and b.started(H)
    b.record(H, False, now)  # the probe got an answer
    assert b.get(H).state is CLOSED and b.get(H).failures == 0 and b.get(H).retry_at is None
    b.record(H, True, now)  # one failure after closing: threshold 1 opens with the base
    assert b.get(H).retry_at - now == 2.0


@pytest.mark.timeout(10)
def test_breaker_a_probe_that_did_not_go_lets_another_go():
    b = Breakers(1, 1.0)
    b.record(H, True, 0.0)
    assert b.blocked_until(H, 1.0) is None and b.started(H)
    b.ended(H)  # the copy was held or ended: no outcome
    assert b.blocked_until(H, 1.0) is None and b.started(H)


@pytest.mark.timeout(10)
def test_breaker_what_counts_as_a_failure_and_disabled_and_bounded():
    assert is_failure(None) and is_failure(500) and is_failure(503) and is_failure(429)
    assert not is_failure(200) and not is_failure(404) and not is_failure(400)
    assert not is_failure(302)
    off = Breakers(0, 1.0)
    _fail(off, H, 100, 0.0)
    assert off.blocked_until(H, 0.0) is None and off.items() == []
    lru = Breakers(5, 1.0, size=3)
    for i in range(10):
        lru.record(f"http://h{i}:80", True, 0.0)
    assert [o for o, _ in lru.items()] == ["http://h7:80", "http://h8:80", "http://h9:80"]


@pytest.mark.timeout(10)
def test_breaker_options_are_validated():
    c = load(env={}, flags={"breaker_failures": "0", "breaker_cooldown": "0.5"})
    assert c.breaker_failures == 0 and c.breaker_cooldown == 0.5
    assert load(env={}).breaker_failures == 10 and load(env={}).breaker_cooldown == 30.0
    for flags, name in (({"breaker_failures": "-1"}, "breaker_failures"),
                        ({"breaker_failures": "x"}, "breaker_failures"),
                        ({"breaker_cooldown": "0"}, "breaker_cooldown"),
                        ({"breaker_cooldown": "nan"}, "breaker_cooldown")):
        with pytest.raises(ConfigError, match=name):
            load(env={}, flags=flags)


# ================================================================ units: the dispatcher


class Runs:
    """A run whose deliveries end at once; the test reports outcomes itself."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __call__(self, task_id: str) -> None:
        self.started.append(task_id)


def _pass(d: Dispatcher) -> float | None:
    wait = d.dispatch_ready()
    gevent.sleep(0)
    gevent.sleep(0)
    return wait


@pytest.mark.timeout(10)
def test_dispatch_an_open_breaker_spends_no_token_blocks_no_other_target_and_probes_once():
    runs, clock = Runs(), FakeClock()
    qc = QueueConfig(name="q", rate=0.001, burst=4)  # four tokens, then one per 1000 s
    d = Dispatcher(runs, lambda name: qc, 64, clock, breaker_failures=2, breaker_cooldown=5.0)
    for _ in range(2):
        d.outcome(H, 503)
    assert [t["state"] for t in d.targets()] == ["open"]
    for i in range(5):
        d.submit("q", f"h{i}", H)
    d.submit("q", "g0", G)
    wait = _pass(d)
    assert runs.started == ["g0"]  # H's tasks wait aside, G's goes: one token spent
    assert wait == pytest.approx(5.0)  # the breaker's timer
    assert d.queue("q").ready.waiting_on() == [H]
    clock.now += 5.0
    _pass(d)
    assert runs.started == ["g0", "h0"]  # half open: one probe, with the second token
    assert d.targets()[0]["state"] == "half_open"
    d.outcome(H, None)  # the probe failed (its delivery ended already)
    _pass(d)
    assert runs.started == ["g0", "h0"]
    t = d.targets()[0]
    assert t["state"] == "open" and t["retry_at"] == pytest.approx(clock.now + 10.0)
    clock.now += 10.0
    _pass(d)
    assert runs.started == ["g0", "h0", "h1"]
    d.outcome(H, 200)  # the target is back
    _pass(d)  # one token left: one more goes; then the bucket's wait, not the breaker's
    assert runs.started == ["g0", "h0", "h1", "h2"] and d.targets()[0]["state"] == "closed"
