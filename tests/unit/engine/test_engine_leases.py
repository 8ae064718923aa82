"""Long tasks in the engine, on a fake clock, a fake worker and an in-memory journal: a
202 keeps the copy running until the worker reports at the URL its attempt carried, a
heartbeat extends the lease (and tells the siblings), a lease that runs out is a failed
attempt retried, and a report for an attempt that is over is a conflict."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest

from enginekit import memory_engine
from miyamoto.delivery import completion
from miyamoto.engine.engine import Engine, Hooks
from miyamoto.errors import Conflict
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


@dataclass
class Resp:
    status: int
    headers: dict = field(default_factory=dict)
    body: bytes = b""


class Worker:
    """Answers every request with ``status`` and keeps the headers it was sent."""

    guard = None

    def __init__(self, status: int = 202):
        self.status, self.sent = status, []

    def request(self, method, url, body=b"", headers=None, timeout=None, egress=None):
        self.sent.append(headers)
        return Resp(self.status)


class Told(Hooks):
    def __init__(self):
        self.leases: list[tuple[str, float]] = []
        self.news: list[State] = []

    def accepted(self, task: Task, lease: float) -> None:
        self.leases.append((task.id, lease))

    def done(self, task: Task) -> None:
        self.news.append(task.state)

    def retried(self, task: Task) -> None:
        self.news.append(task.state)


@pytest.fixture
def parts():
    hooks, worker = Told(), Worker()
    with memory_engine(NOW, hooks, worker, public_url="http://api.example:8088/") as (e, clock):
        yield e, clock, hooks, worker


def _attempt(engine: Engine, **kw) -> completion.Grant:
    """Store a long task, run one attempt of it, and read the grant its URL carries."""
    engine.add(Task(id="t1", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
                    fire_at=NOW, lease=600.0, **kw))
    begun = engine._begin("t1")
    assert begun is not None
    engine._attempt(begun)
    headers = engine.client.sent[-1]
    url = urlsplit(headers["X-Task-Complete-Url"])
    assert url.netloc == "api.example:8088" and url.path == "/tasks/t1/complete"
    assert headers["X-Task-Heartbeat-Url"].startswith("http://api.example:8088/tasks/t1/heartbeat?")
    token = parse_qs(url.query)["token"][0]
    return completion.verify(engine.completion_key, "t1", token, engine.clock())


def test_a_202_keeps_a_long_task_running_until_its_worker_reports(parts):
    engine, clock, hooks, _ = parts
    grant = _attempt(engine)
    t = engine.live["t1"]
    assert t.state == State.RUNNING and t.accepted == grant.attempt == 1
    assert hooks.leases == [("t1", 600.0)]
    assert engine.scheduler.next_time() == NOW + 600  # its lease's end is timed
    clock["now"] = NOW + 30
    t = engine.complete(grant, completion.Report("succeeded", {"rows": 3}))
    assert t.state == State.SUCCEEDED and t.attempts == 1 and t.last["body"] == '{"rows":3}'
    assert engine.journal.get("t1").state == State.SUCCEEDED and hooks.news == [State.SUCCEEDED]
    with pytest.raises(Conflict):  # a second report of the same attempt
        engine.complete(grant, completion.Report("failed"))


def test_a_completion_token_outlives_the_longest_lease_by_a_day(parts):
    engine, _, _, _ = parts
    grant = _attempt(engine)
    assert engine.stats.attempts == 1  # one attempt counted
    assert grant.expiry == NOW + 8 * 86400  # a report 7 days late is told "over", not 403
    token = parse_qs(urlsplit(engine.client.sent[-1]["X-Task-Complete-Url"]).query)["token"][0]
    late = completion.verify(engine.completion_key, "t1", token, NOW + 8 * 86400 - 1)
    assert late == grant


def test_a_heartbeat_extends_the_lease_and_claims_the_siblings_again(parts):
    engine, clock, hooks, _ = parts
    grant = _attempt(engine)
    clock["now"] = NOW + 500
    assert engine.heartbeat(grant, 900.0).fire_at == NOW + 1400
    assert hooks.leases[-1] == ("t1", 900.0)
    clock["now"] = NOW + 1300
    engine._due("t1")  # an old timer: the lease holds
    assert engine.live["t1"].state == State.RUNNING
    assert engine.journal.get("t1").fire_at == NOW + 1400


def test_a_lease_that_runs_out_is_a_failed_attempt_retried(parts):
    engine, clock, hooks, _ = parts
    grant = _attempt(engine)
    clock["now"] = NOW + 600
    engine._due("t1")
    t = engine.live["t1"]
    assert t.state == State.SCHEDULED and t.attempts == 1 and t.accepted == 0
    assert "lease ran out" in t.last["error"] and hooks.news == [State.SCHEDULED]
    with pytest.raises(Conflict):  # the worker's late report
        engine.complete(grant, completion.Report("succeeded"))
    with pytest.raises(Conflict):
        engine.heartbeat(grant, None)


def test_a_report_of_failure_retries_and_a_200_needs_no_report(parts):
    engine, clock, hooks, worker = parts
    grant = _attempt(engine)
    assert engine.complete(grant, completion.Report("failed")).state == State.SCHEDULED
    assert engine.live["t1"].last["error"] == "the worker reported failure"
    worker.status = 200
    engine.add(Task(id="t2", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
                    fire_at=NOW, lease=60.0))
    engine._attempt(engine._begin("t2"))
    assert engine.journal.get("t2").state == State.SUCCEEDED


def test_a_task_without_a_lease_gets_no_completion_url_and_its_202_succeeds(parts):
    engine, _, _, worker = parts
    engine.add(Task(id="t3", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
                    fire_at=NOW))
    engine._attempt(engine._begin("t3"))
    assert "X-Task-Complete-Url" not in worker.sent[-1]
    assert engine.journal.get("t3").state == State.SUCCEEDED
