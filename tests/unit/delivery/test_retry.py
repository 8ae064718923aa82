"""The retry decision (miyamoto/delivery/retry.py) with a fixed clock and rng, and the engine
carrying each decision out (journal, scheduler, callbacks) on an in-memory journal."""

from __future__ import annotations

import email.utils

import pytest

from miyamoto.config import settings as config_mod
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.attempt import Outcome
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.delivery.retry import Action, decide, is_success, reported
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class FixedRng:
    """An rng whose random() is always ``value``: 0.5 is no jitter, 0 is -10%, ~1 is +10%."""

    def __init__(self, value: float = 0.5):
        self.value = value
        self.calls = 0

    def random(self) -> float:
        self.calls += 1
        return self.value


def running(**kw) -> Task:
    """A copy in the middle of an attempt, as the engine holds it when finish() runs."""
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW - 10, created=NOW - 10,
                fire_at=NOW - 1, state=State.RUNNING, first_attempt=NOW - 1)
    base.update(kw)
    return Task(**base)


def answer(status: int | None, headers: dict[str, str] | None = None,
           error: str | None = None) -> Outcome:
    """An outcome built the way Engine._attempt builds it."""
    if status is None:
        return Outcome(ok=False, error=error or "connection refused", at=NOW)
    return Outcome(ok=is_success(status), status=status, headers=headers or {}, body=b"r",
                   at=NOW)


Q = QueueConfig(name="q", max_attempts=25, min_backoff=10, max_backoff=300, max_doublings=3)

# ================================================================ success


@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_a_2xx_succeeds_and_records_the_attempt(status):
    d = decide(running(attempts=2, executions=1), answer(status), Q, NOW, FixedRng())
    assert d.action is Action.SUCCEEDED
    assert d.task.state == State.SUCCEEDED and d.task.finished == NOW
    assert d.task.attempts == 3 and d.task.executions == 2
    assert d.task.last["status"] == status and d.task.last["body"] == "r"
    assert d.retry_at is None


@pytest.mark.parametrize("status", [100, 199, 300, 301, 304, 400, 404, 429, 500, 503])
def test_anything_but_a_2xx_is_a_failed_attempt(status):
    d = decide(running(), answer(status), Q, NOW, FixedRng())
    assert d.action is Action.RETRY
    assert d.task.state == State.SCHEDULED and d.task.executions == 1


def test_no_response_is_a_failed_attempt_that_is_not_an_execution():
    d = decide(running(executions=4), answer(None, error="timed out"), Q, NOW, FixedRng())
    assert d.action is Action.RETRY
    assert d.task.attempts == 1 and d.task.executions == 4
    assert d.task.last["error"] == "timed out" and d.task.last["status"] is None


def test_success_on_the_last_allowed_attempt_still_succeeds():
    d = decide(running(attempts=24), answer(200), Q, NOW, FixedRng())
    assert d.action is Action.SUCCEEDED


# ================================================================ retry times


def test_retry_times_follow_the_backoff_formula():
    # Cloud Tasks' example: min 10 s, max 300 s, max_doublings 3; rng 0.5 = no jitter
    expected = [10, 20, 40, 80, 160, 240, 300, 300]
    got = []
    for n, _ in enumerate(expected):
        d = decide(running(attempts=n), answer(500), Q, NOW, FixedRng(0.5))
        assert d.action is Action.RETRY and d.task.fire_at == d.retry_at
        got.append(round(d.retry_at - NOW, 9))
    assert got == expected


@pytest.mark.parametrize("value,factor", [(0.0, 0.9), (0.25, 0.95), (0.5, 1.0),
                                          (0.999999, 1.1)])
def test_retry_jitter_is_within_ten_percent(value, factor):
    d = decide(running(attempts=1), answer(503), Q, NOW, FixedRng(value))
    assert d.retry_at - NOW == pytest.approx(20 * factor, abs=1e-4)


def test_retry_after_seconds_is_honoured_instead_of_the_backoff():
    d = decide(running(attempts=5), answer(429, {"Retry-After": "7"}), Q, NOW, FixedRng(0.0))
    assert d.retry_at == NOW + 7  # no jitter, not backoff(6) = 240


def test_retry_after_header_name_is_case_insensitive_and_zero_means_now():
    d = decide(running(), answer(503, {"retry-after": "0"}), Q, NOW, FixedRng())
    assert d.retry_at == NOW


def test_retry_after_http_date_is_honoured():
    when = email.utils.formatdate(NOW + 42, usegmt=True)
    d = decide(running(), answer(503, {"Retry-After": when}), Q, NOW, FixedRng())
    assert d.retry_at == pytest.approx(NOW + 42, abs=1)


def test_retry_after_is_capped_at_max_backoff():
    d = decide(running(), answer(429, {"Retry-After": "86400"}), Q, NOW, FixedRng())
    assert d.retry_at == NOW + Q.max_backoff


def test_retry_after_garbage_falls_back_to_the_backoff():
    d = decide(running(attempts=2), answer(503, {"Retry-After": "soon"}), Q, NOW, FixedRng())
    assert d.retry_at == NOW + 40


# ================================================================ running out


def test_queue_max_attempts():
    q = QueueConfig(name="q", max_attempts=3)
    assert decide(running(attempts=1), answer(500), q, NOW, FixedRng()).action is Action.RETRY
    d = decide(running(attempts=2), answer(500), q, NOW, FixedRng())
    assert d.action is Action.FAILED
    assert d.task.state == State.FAILED and d.task.finished == NOW and d.task.attempts == 3
    assert d.task.last["status"] == 500 and d.retry_at is None


def test_task_max_attempts_overrides_the_queue_both_ways():
    q = QueueConfig(name="q", max_attempts=3)
    more = running(attempts=3, max_attempts=5)
    assert decide(more, answer(500), q, NOW, FixedRng()).action is Action.RETRY
    assert decide(more.evolve(attempts=4), answer(500), q, NOW, FixedRng()).action \
        is Action.FAILED
    fewer = running(attempts=0, max_attempts=1)
    assert decide(fewer, answer(None), Q, NOW, FixedRng()).action is Action.FAILED


def test_max_retry_duration_counts_from_the_first_attempt():
    q = QueueConfig(name="q", max_attempts=100, max_retry_duration=60)
    young = running(attempts=3, first_attempt=NOW - 59.9)
    assert decide(young, answer(500), q, NOW, FixedRng()).action is Action.RETRY
    old = running(attempts=3, first_attempt=NOW - 60)
    assert decide(old, answer(500), q, NOW, FixedRng()).action is Action.FAILED
    unknown = running(attempts=3, first_attempt=None)
    assert decide(unknown, answer(500), q, NOW, FixedRng()).action is Action.RETRY


def test_no_max_retry_duration_means_no_time_limit():
    q = QueueConfig(name="q", max_attempts=100, max_retry_duration=0)
    ancient = running(attempts=3, first_attempt=NOW - 10 * 365 * 86400)
    assert decide(ancient, answer(500), q, NOW, FixedRng()).action is Action.RETRY


# ================================================================ an attempt that raced an end


@pytest.mark.parametrize("ended", [State.CANCELLED, State.SUCCEEDED, State.FAILED])
@pytest.mark.parametrize("status", [200, 500, None])
def test_a_copy_that_ended_during_its_attempt_only_records_the_attempt(ended, status):
    t = running(state=ended, finished=NOW - 0.5, attempts=2, executions=2)
    d = decide(t, answer(status), QueueConfig(name="q", max_attempts=3), NOW, FixedRng())
    assert d.action is Action.RECORD and d.retry_at is None
    assert d.task.state == ended and d.task.finished == NOW - 0.5  # the end stands
    assert d.task.attempts == 3 and d.task.executions == 2 + (status is not None)


def test_an_ended_copy_without_a_finish_time_gets_now():
    t = running(state=State.CANCELLED, finished=None)
    assert decide(t, answer(200), Q, NOW, FixedRng()).task.finished == NOW


# ================================================================ the engine carries it out


@pytest.fixture
def engine():
    cfg = config_mod.load(env={}, flags={"data_dir": ":memory:"})
    journal = Journal(":memory:")
    journal.open()
    clock = {"now": NOW}
    e = Engine(cfg, journal, clock=lambda: clock["now"], rng=FixedRng(0.5))
    yield e
    journal.close()


def _start_attempt(engine: Engine, **kw) -> Task:
    """Store a copy and put it in the RUNNING state the way _run does, without HTTP."""
    t = engine.add(Task(id="t1", queue="default", url="http://w.example/x", eta=NOW,
                        created=NOW, fire_at=NOW, **kw))
    t = t.evolve(state=State.RUNNING, first_attempt=NOW)
    engine.live[t.id] = t
    engine.scheduler.cancel(t.id)
    return t


def test_engine_reschedules_a_retry(engine):
    _start_attempt(engine)
    engine.finish("t1", answer(500))
    t = engine.live["t1"]
    assert t.state == State.SCHEDULED and t.attempts == 1
    assert t.fire_at == NOW + engine.config.queue("default").min_backoff
    assert engine.scheduler.next_time() == t.fire_at
    assert engine.journal.get("t1") == t
    assert engine.stats.retried == 1


def test_engine_ends_a_success_and_stores_its_callback(engine):
    _start_attempt(engine, callback="http://w.example/cb")
    engine.finish("t1", answer(204))
    assert "t1" not in engine.live and "t1" not in engine.scheduler
    assert engine.journal.get("t1").state == State.SUCCEEDED
    assert engine.stats.succeeded == 1
    callbacks = [t for t in engine.live.values() if t.url == "http://w.example/cb"]
    assert len(callbacks) == 1 and callbacks[0].headers == {"X-Task-Callback-For": "t1"}


def test_engine_fails_an_exhausted_task_and_stores_its_failure_callback(engine):
    _start_attempt(engine, max_attempts=1, failure_callback="http://w.example/dead")
    engine.finish("t1", answer(None))
    assert "t1" not in engine.live
    assert engine.journal.get("t1").state == State.FAILED
    assert engine.stats.failed == 1
    assert [t.url for t in engine.live.values()] == ["http://w.example/dead"]


def test_engine_keeps_the_end_of_a_copy_cancelled_during_its_attempt(engine):
    _start_attempt(engine, callback="http://w.example/cb")
    engine.cancel("t1")
    engine.finish("t1", answer(200))
    assert engine.live == {}  # ended, and no callback for a cancelled task
    stored = engine.journal.get("t1")
    assert stored.state == State.CANCELLED and stored.attempts == 1
    assert engine.stats.succeeded == 0


# ================================================================ a task's own retry delays and expiry


def test_retry_delays_replace_the_backoff_and_the_last_one_repeats():
    t = running(retry_delays=(1.0, 10.0, 60.0))
    rng = FixedRng(0.99)  # no jitter on the task's own delays
    assert [decide(t.evolve(attempts=n), answer(500), Q, NOW, rng).retry_at - NOW
            for n in range(5)] == [1.0, 10.0, 60.0, 60.0, 60.0]
    assert rng.calls == 0


def test_retry_after_wins_over_retry_delays_and_max_attempts_still_ends_it():
    t = running(retry_delays=(1.0,))
    d = decide(t, answer(503, {"Retry-After": "7"}), Q, NOW, FixedRng())
    assert d.retry_at == NOW + 7
    d = decide(t.evolve(max_attempts=2, attempts=1), answer(500), Q, NOW, FixedRng())
    assert d.action is Action.FAILED


def test_a_retry_that_would_start_at_or_after_the_expiry_expires_the_task():
    t = running(retry_delays=(10.0,), expires_at=NOW + 10)
    d = decide(t, answer(500), Q, NOW, FixedRng())
    assert d.action is Action.EXPIRED and d.task.state == State.EXPIRED
    assert d.task.finished == NOW and d.task.attempts == 1 and d.retry_at is None
    d = decide(t.evolve(expires_at=NOW + 10.5), answer(500), Q, NOW, FixedRng())
    assert d.action is Action.RETRY and d.retry_at == NOW + 10
    # a success is a success, however late
    assert decide(t.evolve(expires_at=NOW - 1), answer(200), Q, NOW, FixedRng()).action \
        is Action.SUCCEEDED


# ================================================================ long tasks (a lease)


def test_a_202_of_a_task_with_a_lease_is_accepted_and_counted():
    d = decide(running(lease=600.0), answer(202), Q, NOW, FixedRng())
    assert d.action is Action.ACCEPTED
    assert d.task.state == State.RUNNING and d.task.fire_at == NOW + 600
    assert d.task.attempts == 1 and d.task.accepted == 1 and d.task.last["status"] == 202


def test_a_200_of_a_task_with_a_lease_is_a_success_and_a_202_without_one_too():
    assert decide(running(lease=600.0), answer(200), Q, NOW, FixedRng()).action \
        is Action.SUCCEEDED
    assert decide(running(), answer(202), Q, NOW, FixedRng()).action is Action.SUCCEEDED


def test_a_report_ends_the_accepted_attempt_without_counting_it_again():
    t = decide(running(lease=600.0), answer(202), Q, NOW, FixedRng()).task
    ok = reported(t, Outcome(ok=True, status=202, body=b'{"n":1}', at=NOW), Q, NOW + 5,
                  FixedRng())
    assert ok.action is Action.SUCCEEDED and ok.task.attempts == 1 and ok.task.accepted == 0
    assert ok.task.last["body"] == '{"n":1}'
    bad = reported(t, Outcome(ok=False, error="lease ran out", at=NOW), Q, NOW + 5, FixedRng())
    assert bad.action is Action.RETRY and bad.task.attempts == 1
    assert bad.task.state == State.SCHEDULED and bad.task.fire_at == NOW + 5 + Q.min_backoff
    last = reported(t.evolve(max_attempts=1), Outcome(ok=False, at=NOW), Q, NOW, FixedRng())
    assert last.action is Action.FAILED
