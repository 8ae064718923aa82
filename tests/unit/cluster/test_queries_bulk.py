"""The bulk operations over the cluster (``miyamoto.cluster.queries``): retrying or
deleting every failed task of a queue (``failed``) and resending the ended tasks a
filter picks (``resend_many``), on a real engine and journal file, the peers' answers
given; each task counted once over the nodes (``bulk_total``)."""

from __future__ import annotations

import sqlite3
from typing import Any, Iterator

import pytest

from miyamoto.cluster.queries import Queries
from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0
OFFSET = 7.0


class Requests:
    def __init__(self, answers: dict[str, Any]):
        self.answers = answers
        self.asked: list[tuple[str, dict]] = []

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        self.asked.append((op, args))
        return self.answers


class Peers:
    def __init__(self) -> None:
        self.replayed: list[str] = []

    def others(self) -> list[str]:
        return ["b"]

    def replay(self, task_id: str) -> None:
        self.replayed.append(task_id)


def _copy(i: int, state: State, replica: int = 0, finished: float = NOW - 100,
          url: str = "http://w.example/x", queue: str = "q") -> Task:
    return Task(id=f"t{i}", queue=queue, url=url, eta=NOW - 200, created=NOW - 300,
                fire_at=NOW - 200, state=state, finished=finished, attempts=3,
                replica=replica, replicas=("a", "b"))


@pytest.fixture
def node(tmp_path) -> Iterator[tuple[Engine, Journal]]:
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    journal = Journal(str(tmp_path))
    journal.open()
    # t0, t1: first copies here; t2: this node holds the second copy; t3 another queue;
    # t4 succeeded, t5 cancelled (with t6 to resend: an ended task of another target)
    journal.put_many([_copy(0, State.FAILED), _copy(1, State.FAILED),
                      _copy(2, State.FAILED, replica=1),
                      _copy(3, State.FAILED, queue="r"),
                      _copy(4, State.SUCCEEDED, finished=NOW - 50),
                      _copy(5, State.SUCCEEDED, finished=NOW - 10),
                      _copy(6, State.SUCCEEDED, finished=NOW - 30, url="http://other.example/y")],
                     wait=True)
    try:
        yield Engine(cfg, journal, clock=lambda: NOW), journal
    finally:
        journal.close()


def queries(engine: Engine, answers: dict[str, Any]) -> tuple[Queries, Requests, Peers]:
    req, peers = Requests(answers), Peers()
    return (Queries("a", engine, req, peers,  # type: ignore[arg-type]
                    timeout=1.0, offset=OFFSET, clock=lambda: NOW), req, peers)


def reread(tmp_path, task_id: str) -> str | None:
    """The copy's state as committed to the journal file (what a restart reads)."""
    db = sqlite3.connect(f"file:{tmp_path / 'journal.sqlite3'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
    finally:
        db.close()
    return row[0] if row else None


def test_retrying_failed_tasks_reruns_each_copy_at_its_offset_and_counts_tasks_once(
        node, tmp_path) -> None:
    engine, _ = node
    # b touched t2's first copy and t9's (whose other copy is elsewhere) and t1's second
    q, req, peers = queries(engine, {"b": {"count": 2, "more": False,
                                           "ids": ["t2", "t9", "t1"]}})
    assert q.failed("q", "retry") == {"count": 4, "more": False}  # t0, t1, t2, t9
    assert req.asked == [("failed", {"queue": "q", "action": "retry"})]
    for i, replica in ((0, 0), (1, 0), (2, 1)):
        t = engine.get(f"t{i}")
        assert t.state == State.SCHEDULED and t.reruns == 1, t
        assert t.fire_at == NOW + replica * OFFSET, t  # the second copy one offset late
        assert reread(tmp_path, f"t{i}") == "scheduled"
    assert sorted(peers.replayed) == ["t0", "t1", "t2"]  # news kept while it had ended
    assert engine.get("t3").state == State.FAILED  # another queue's: left alone
    assert engine.get("t4").state == State.SUCCEEDED


def test_deleting_failed_tasks_removes_them_here_and_on_the_journal(node, tmp_path) -> None:
    engine, _ = node
    q, req, peers = queries(engine, {"b": {"count": 1, "more": True, "ids": ["t8"]}})
    assert q.failed("q", "delete") == {"count": 4, "more": True}  # t0, t1, t2 here; t8
    for i in (0, 1, 2):
        assert engine.get(f"t{i}") is None and reread(tmp_path, f"t{i}") is None
    assert peers.replayed == []  # nothing was rerun
    assert engine.get("t3").state == State.FAILED


def test_a_node_s_own_answer_counts_first_copies_and_lists_every_copy(node) -> None:
    engine, _ = node
    q, _, _ = queries(engine, {})
    got = q.failed_local("q", "retry")
    assert (got["count"], got["more"], sorted(got["ids"])) == (2, False, ["t0", "t1", "t2"])
    assert q.failed_local("q", "retry") == {"count": 0, "more": False, "ids": []}


def test_more_says_a_node_had_more_failed_copies_than_one_request_takes(
        node, monkeypatch) -> None:
    engine, _ = node
    monkeypatch.setattr("miyamoto.cluster.queries.BULK_MAX", 2)
    q, _, _ = queries(engine, {})
    got = q.failed_local("q", "delete")
    assert got["more"] is True and len(got["ids"]) == 2, got
    assert sum(engine.get(f"t{i}") is None for i in (0, 1, 2)) == 2
    got = q.failed_local("q", "delete")
    assert got["more"] is False and len(got["ids"]) == 1, got


def test_resend_many_picks_by_target_and_end_time_and_reruns_what_it_picks(node) -> None:
    engine, _ = node
    q, req, peers = queries(engine, {"b": {"count": 1, "more": False, "ids": ["t7"]}})
    f = {"state": "succeeded", "target": "http://w.example", "since": NOW - 50,
         "until": NOW - 10}
    # t4 ended at since (in), t5 at until (out), t6 in range but another target
    assert q.resend_many("q", f) == {"count": 2, "more": False}  # t4 here, t7 on b
    assert req.asked == [("resend_many", {"queue": "q", **f})]
    assert engine.get("t4").state == State.SCHEDULED and engine.get("t4").fire_at == NOW
    assert engine.get("t5").state == State.SUCCEEDED
    assert engine.get("t6").state == State.SUCCEEDED
    assert peers.replayed == ["t4"]


def test_resend_many_without_bounds_takes_every_ended_copy_of_the_state(node) -> None:
    engine, _ = node
    q, _, peers = queries(engine, {})
    got = q.resend_many_local("q", {"state": "succeeded"})
    assert (got["count"], got["more"], sorted(got["ids"])) == (3, False, ["t4", "t5", "t6"])
    assert sorted(peers.replayed) == ["t4", "t5", "t6"]
    got = q.resend_many_local("q", {"state": "failed", "until": NOW - 100})
    assert got == {"count": 0, "more": False, "ids": []}  # ended at until: not before it


@pytest.mark.parametrize("action", ["retry", "delete", "resend"])
def test_a_bulk_operation_commits_its_copies_together(node, monkeypatch, action) -> None:
    """Ten thousand failed copies must not cost ten thousand commits: one for them all."""
    engine, journal = node
    commits: list[int] = []
    real = journal._commit

    def counted(rows, *rest):
        commits.append(len(rows))
        return real(rows, *rest)

    monkeypatch.setattr(journal, "_commit", counted)
    q, _, _ = queries(engine, {})
    if action == "resend":
        got = q.resend_many_local("q", {"state": "succeeded"})
    else:
        got = q.failed_local("q", action)
    assert len(got["ids"]) == 3 and len(commits) == 1, (got, commits)


def test_exactly_a_request_s_worth_of_copies_is_all_done_and_no_more(node, monkeypatch) -> None:
    engine, _ = node
    monkeypatch.setattr("miyamoto.cluster.queries.BULK_MAX", 3)
    q, _, _ = queries(engine, {})
    got = q.resend_many_local("q", {"state": "succeeded"})  # t4, t5, t6: three
    assert (got["more"], sorted(got["ids"])) == (False, ["t4", "t5", "t6"]), got
    got = q.failed_local("q", "retry")  # t0, t1, t2: three
    assert (got["more"], sorted(got["ids"])) == (False, ["t0", "t1", "t2"]), got


def test_resend_many_since_takes_what_ended_after_it(node) -> None:
    engine, _ = node
    q, _, _ = queries(engine, {})
    got = q.resend_many_local("q", {"state": "succeeded", "since": NOW - 40})
    assert sorted(got["ids"]) == ["t5", "t6"]  # ended at NOW - 10 and NOW - 30; t4 before


def test_a_peers_resend_many_picks_by_target_when_it_names_one(node) -> None:
    engine, _ = node
    q, _, _ = queries(engine, {})
    got = q.serve("resend_many", {"queue": "q", "state": "succeeded",
                                  "target": "http://w.example"})
    assert sorted(got["ids"]) == ["t4", "t5"]  # t6 is another target's
    assert engine.get("t6").state == State.SUCCEEDED
    got = q.serve("resend_many", {"queue": "q", "state": "succeeded"})  # no target: any
    assert got["ids"] == ["t6"]
