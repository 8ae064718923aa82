"""What a node takes from its peers and answers them (``miyamoto.cluster.queries``):
a peer's nack, its replace's changes and delay, a lease handed to a worker, the blocked
keys and the pauses it reports, a task's copies merged into one view. The engine is a
stub recording what it was asked; the checks and merges are the real ones."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from miyamoto.cluster.queries import (IDS_FLAG, IDS_PREFIX, Queries,
                                      _leased, _opt_delay, _replace_changes, leased_ok,
                                      merge_history)
from miyamoto.tasks.task import State, Task
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(10)

NOW = 1_000_000.0


class Requests:
    def __init__(self, answers: dict[str, Any]):
        self.answers = answers

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        return {m: a for m, a in self.answers.items() if m in members}


class Peers:
    def others(self) -> list[str]:
        return ["b", "c"]

    def replay(self, task_id: str) -> None:
        pass


class Engine:
    """Records the holds asked of it; no lines, no copies of its own."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []
        self.paused: dict[str, bool] = {"mail": False, "sms": True}
        self.lines = SimpleNamespace(queues=lambda: [])
        self.dispatcher = SimpleNamespace(
            view=lambda q: SimpleNamespace(paused=self.paused.get(q, False)))

    def _held(self, op: str, grant, more: Any) -> Any:
        self.asked.append((op, more))
        return Task(id=grant.task_id, queue="q", url="http://w.example/x", eta=NOW,
                    created=NOW, fire_at=NOW)

    def nack(self, grant, delay):
        return self._held("nack", grant, delay)

    def heartbeat(self, grant, lease):
        return self._held("heartbeat", grant, lease)

    def pause(self, queue: str, paused: bool) -> None:
        self.asked.append(("pause", (queue, paused)))
        self.paused[queue] = paused

    def get(self, task_id: str):
        return None

    def list(self, queue: str, state, limit: int) -> list[Task]:
        self.asked.append(("list", (queue, state.value, limit)))
        return []


def queries(answers: dict[str, Any], engine: Engine | None = None) -> Queries:
    return Queries("a", engine or Engine(), Requests(answers), Peers(),  # type: ignore[arg-type]
                   timeout=1.0, offset=1.0, clock=lambda: NOW)


def test_a_peers_nack_gives_the_task_back_with_its_delay_in_range() -> None:
    engine = Engine()
    q = queries({}, engine)
    grant = {"id": "t1", "run": 0, "attempt": 1}
    assert q.serve("nack", dict(grant, delay=30))["id"] == "t1"
    assert q.serve("nack", dict(grant))["id"] == "t1"
    assert q.serve("heartbeat", dict(grant, lease=60))["id"] == "t1"
    assert engine.asked == [("nack", 30), ("nack", None), ("heartbeat", 60)]
    for bad in (-1, 31 * 86400, "5", True):
        with pytest.raises(DecodeError, match="nack delay"):
            q.serve("nack", dict(grant, delay=bad))
    assert len(engine.asked) == 3


def test_a_peers_replace_changes_and_delay_are_checked() -> None:
    ok = {"params": {"a": "1", "b": ["2", "3"]}, "body": "x", "content_type": "text/plain"}
    assert _replace_changes({"changes": ok}) == ok
    assert _replace_changes({"changes": {"body": "y"}}) == \
        {"params": {}, "body": "y", "content_type": None}
    for bad in ({"url": "http://elsewhere"}, {"body": "y", "queue": "q"}, "body", None):
        with pytest.raises(DecodeError):
            _replace_changes({"changes": bad})
    assert _opt_delay({"delay": 5}) == 5.0 and _opt_delay({}) is None
    for bad in (-1, 1e9, True, "5"):
        with pytest.raises(DecodeError, match="delay"):
            _opt_delay({"delay": bad})


def test_a_lease_says_how_long_it_has_left_and_a_peers_lease_is_checked() -> None:
    t = Task(id="t1", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
             fire_at=NOW + 0.5, replicas=("a", "b"))
    d = _leased(t, "tok", NOW)
    assert d["lease_left"] == 0.5 and d["lease_until"] == NOW + 0.5 and d["node"] == "a"
    assert _leased(t, "tok", NOW + 3)["lease_left"] == 0.0  # already over: none left
    assert leased_ok(d) is True
    for k, v in (("token", None), ("attempt", "1"), ("lease_left", -1.0), ("params", [])):
        assert leased_ok(dict(d, **{k: v})) is False, k


def test_at_most_a_hundred_blocked_keys_of_a_queue_are_shown() -> None:
    many = [[f"k{i:04d}", f"t{i}"] for i in range(150)]
    got = queries({"b": {"q": many[:60]}, "c": {"q": many[60:]}}).blocked()
    assert [d["key"] for d in got["q"]] == [f"k{i:04d}" for i in range(100)]


def test_a_rejoining_node_takes_the_cluster_s_pauses() -> None:
    engine = Engine()
    q = queries({"b": {"mail": True, "sms": False, "web": False, 7: True}}, engine)
    q.sync_pauses("b")
    assert engine.paused == {"mail": True, "sms": False}
    assert sorted(engine.asked) == [("pause", ("mail", True)),
                                               ("pause", ("sms", False))]  # web runs already


def test_a_peers_counts_with_its_flag_first_still_count_each_task_once() -> None:
    engine = SimpleNamespace(
        queue_counts=lambda primary_only=False: {"q": {"succeeded": 1}},
        copy_states=lambda limit: {"q": {"succeeded": ["t1"]}},
        stats=SimpleNamespace(totals={}, targets={},
                              latency=SimpleNamespace(buckets=lambda now: {})),
        dispatcher=SimpleNamespace(targets=lambda: []))
    # b holds t1's other copy (a restored first one) and t2; its flag comes first
    b = {IDS_FLAG: True, "q": {"succeeded": 2, IDS_PREFIX + "succeeded": ["t1", "t2"]}}
    got = queries({"b": b}, engine).queue_counts()["q"]  # type: ignore[arg-type]
    assert got["succeeded"] == 2, got  # t1 once, t2: not the 3 first copies


def copy(state: str, attempts: int, replica: int) -> dict[str, Any]:
    return {"id": "t1", "queue": "q", "state": state, "attempts": attempts,
            "replica": replica, "history": []}


ENDED = ("succeeded", "failed", "cancelled", "expired")


@pytest.mark.parametrize("more,less", [(x, y) for x in ENDED for y in ENDED if x != y])
def test_among_ended_copies_the_one_that_knows_most_attempts_is_shown(more, less) -> None:
    # every ended state ranks alike: the copy that ended after more attempts knows more
    got = queries({"b": copy(less, 1, 0), "c": copy(more, 3, 1)}).get_task("t1")
    assert (got["state"], got["attempts"]) == (more, 3)
    assert [c["state"] for c in got["copies"]] == [less, more]


def test_an_ended_copy_is_shown_over_a_running_one() -> None:
    got = queries({"b": copy("running", 3, 0), "c": copy("cancelled", 1, 1)}).get_task("t1")
    assert got["state"] == "cancelled"


def test_a_peers_replace_params_must_be_text() -> None:
    for bad in ({"a": 1}, {"a": ["1", 2]}, ["a"], {"a": None}):
        with pytest.raises(DecodeError, match="params are not text"):
            _replace_changes({"changes": {"params": bad}})
    assert _opt_delay({"delay": 0}) == 0.0  # due now: in range, like 1e8 s
    assert _opt_delay({"delay": 1e8}) == 1e8


def test_merged_history_keeps_each_well_typed_attempt_once_newest_first() -> None:
    a1, a2, b1 = ({"start": 10, "node": "a"}, {"start": 30.5, "node": "a"},
                  {"start": 20, "node": "b"})
    ill = [{"start": "10", "node": "a"}, {"start": 40, "node": 7}, {"start": None},
           {"node": "c"}, "junk"]
    assert merge_history([[a1, a2, *ill], [b1, dict(a1)], "junk"]) == [a2, b1, a1]


class Live:
    """A node's live copies, and the fire times the restagger asks for."""

    def __init__(self, *copies: Task) -> None:
        self.live = {t.id: t for t in copies}
        self.moved: dict[str, float] = {}
        self.paused: list[tuple[str, bool]] = []

    def apply_remote(self, task_id: str, *, fire_at: float) -> None:
        self.moved[task_id] = fire_at

    def pause(self, queue: str, paused: bool) -> None:
        self.paused.append((queue, paused))


def test_a_resumed_queue_fires_its_overdue_later_copies_an_offset_apart_from_now() -> None:
    def copy(i: str, replica: int, fire_at: float, queue: str = "q") -> Task:
        return Task(id=i, queue=queue, url="http://w.example/x", eta=NOW - 50, created=NOW - 60,
                    fire_at=fire_at, replicas=("a", "b", "c"), replica=replica)
    engine = Live(copy("due1", 1, NOW - 40), copy("due2", 2, NOW + 1.5),  # before now + 2
                  copy("first", 0, NOW - 40), copy("later", 1, NOW + 5),
                  copy("other", 1, NOW - 40, queue="r"))
    queries({}, engine).control_local("q", "resume")  # type: ignore[arg-type]
    assert engine.moved == {"due1": NOW + 1.0, "due2": NOW + 2.0}  # offset 1 s per replica
    assert engine.paused == [("q", False)]


def test_a_peers_list_asks_for_one_to_a_thousand_copies_of_a_state() -> None:
    engine = Engine()
    q = queries({}, engine)
    for limit in (1, 1000):
        assert q.serve("list", {"queue": "q", "state": "failed", "limit": limit}) == []
    for bad in ({"state": "failed", "limit": 0}, {"state": "failed", "limit": 1001},
                {"state": "lost", "limit": 5}):
        with pytest.raises(DecodeError):
            q.serve("list", dict(bad, queue="q"))
    assert engine.asked == [("list", ("q", "failed", 1)), ("list", ("q", "failed", 1000))]


class PullEngine(Engine):
    """A pull queue with no due copy here: every lease comes from the peers."""

    def lease(self, queue: str, n: int, lease_s: float) -> SimpleNamespace:
        self.asked.append(("lease", (queue, n, lease_s)))
        return SimpleNamespace(leased=[], asking=False)


def test_a_worker_gets_only_the_peers_well_formed_leases_and_no_more_than_it_asked() -> None:
    t = Task(id="t1", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
             fire_at=NOW + 30, replicas=("b", "a"))
    good = [_leased(t.evolve(id=f"t{i}"), f"tok{i}", NOW) for i in (1, 2, 3)]
    bad = dict(good[0], id="t0", token=None)  # no token: a worker could not answer it
    q = queries({"b": [bad, *good]}, PullEngine())
    got = q.lease("q", 2, 30.0, 0.0)
    assert [d["id"] for d in got] == ["t1", "t2"]
    assert all(d["lease_until"] == NOW + 30 for d in got)


def test_a_task_list_takes_the_copies_it_lacks_from_the_peers_lists_only() -> None:
    def summary(task_id: str, at: float) -> dict[str, Any]:
        return {"id": task_id, "state": "failed", "finished": at}
    answers = {"b": [summary("t2", NOW - 5), summary("t1", NOW - 9), {"id": 7}, "t9"],
               "c": {"id": "t3", "state": "failed", "finished": NOW}}
    got = queries(answers).list_tasks("q", State.FAILED, 10)
    assert [s["id"] for s in got] == ["t1", "t2"]  # by end time; c's answer is no list
