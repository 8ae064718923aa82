"""The cluster-wide queue counts (``miyamoto.cluster.queries``): each task counted once,
at its most advanced copy, when every node sent its copies' ids; the sums of first
copies otherwise. The engine and the peers are stubs; the merge is the real one."""

from __future__ import annotations

from typing import Any

import pytest
import ujson

from miyamoto.cluster.queries import COPIES_PREFIX, IDS_FLAG, IDS_PREFIX, Queries, attempt_over
from miyamoto.delivery import completion
from miyamoto.engine import browse
from miyamoto.engine.engine import Stats
from miyamoto.errors import Conflict, Unavailable
from miyamoto.tasks import redact
from miyamoto.tasks.task import State, Task
from miyamoto.wire import checks
from miyamoto.wire.verbs import DecodeError


class Engine:
    """A node holding the first copy of t1 (succeeded) and of t2 (scheduled)."""

    def __init__(self, ids: bool = True) -> None:
        self.stats = Stats()
        self.ids = ids
        self.dispatcher = Dispatcher()

    def queue_counts(self, primary_only: bool = False) -> dict[str, dict[str, int]]:
        return {"q": {"succeeded": 1, "scheduled": 1}}

    def copy_states(self, limit: int) -> dict[str, dict[str, list[str]]] | None:
        return {"q": {"succeeded": ["t1"], "scheduled": ["t2"]}} if self.ids else None


class Dispatcher:
    def __init__(self, targets: list[dict[str, Any]] | None = None) -> None:
        self.states = targets or []

    def targets(self) -> list[dict[str, Any]]:
        return self.states


class Requests:
    def __init__(self, answers: dict[str, Any]):
        self.answers = answers

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        return self.answers


class Peers:
    def others(self) -> list[str]:
        return ["b", "c"]

    def replay(self, task_id: str) -> None:
        pass


def counts(answers: dict[str, Any], ids: bool = True) -> dict[str, dict[str, int]]:
    q = Queries("a", Engine(ids), Requests(answers), Peers(),  # type: ignore[arg-type]
                timeout=1.0, offset=1.0, clock=lambda: 1000.0)
    return q.queue_counts()


def peer(first: dict[str, int], ids: dict[str, Any] | None) -> dict[str, Any]:
    """A peer's answer to "counts": its first copies, its copies, and maybe their ids."""
    q: dict[str, Any] = dict(first)
    q.update({COPIES_PREFIX + s: len(v) for s, v in (ids or {}).items()})
    q.update({IDS_PREFIX + s: v for s, v in (ids or {}).items()})
    return {"q": q, IDS_FLAG: ids is not None}


# b: a restored first copy of t1 (succeeded) and the second copy of t2, which it ran;
# c: the second copy of t1 and the first copy of t3 (failed)
B = ({"succeeded": 1, "running": 0}, {"succeeded": ["t1"], "running": ["t2"]})
C = ({"failed": 1}, {"succeeded": ["t1"], "failed": ["t3"]})


def test_every_task_is_counted_once_at_its_most_advanced_copy() -> None:
    got = counts({"b": peer(*B), "c": peer(*C)})["q"]
    assert {s: got.get(s, 0) for s in ("scheduled", "running", "succeeded", "failed")} == \
        {"scheduled": 0, "running": 1, "succeeded": 1, "failed": 1}, got
    assert got[COPIES_PREFIX + "succeeded"] == 3  # t1 three times: a, b (restored), c
    assert got["cancelled"] == 0


def test_without_every_node_s_ids_the_first_copies_add_up() -> None:
    # t1's first copy on a and its restored twin on b: counted twice, as before
    for answers, ids in (({"b": peer(B[0], None), "c": peer(*C)}, True),
                         ({"b": peer(*B), "c": peer(*C)}, False)):
        got = counts(answers, ids)["q"]
        assert (got["succeeded"], got["scheduled"], got["failed"]) == (2, 1, 1), got


def test_a_peer_s_ill_typed_ids_are_not_believed() -> None:
    for bad in ([7], "t1", [{"id": "t1"}], ["x" * 600]):
        b = peer(B[0], {"succeeded": bad})
        got = counts({"b": b, "c": peer(*C)})["q"]
        assert got["succeeded"] == 2, (bad, got)  # the sums: no id list was taken
    got = counts({"b": "junk", "c": peer(*C)})["q"]  # a peer's answer that is no dict
    assert (got["succeeded"], got["scheduled"], got["failed"]) == (1, 1, 1), got


class TaskEngine:
    """A node holding one task's copy, and a page of one scheduled task."""

    def __init__(self, task) -> None:
        self.task = task

    def get(self, task_id: str):
        return self.task if task_id == self.task.id else None

    def browse(self, flt, after, limit):
        return browse.local_page([(self.task.fire_at, self.task)], None, flt, limit)


def queries(engine: Any, answers: dict[str, Any]) -> Queries:
    return Queries("a", engine, Requests(answers), Peers(),  # type: ignore[arg-type]
                   timeout=1.0, offset=1.0, clock=lambda: 1000.0)


def test_a_task_view_shows_its_request_redacted_even_from_a_peer() -> None:
    t = Task(id="t1", queue="q", url="http://w/x", params={"a": "1"}, fire_at=5.0,
             headers={"Authorization": "Bearer mine", "X-Trace": "1"}, replicas=("a", "b"))
    got = queries(TaskEngine(t), {})
    view = got.get_task("t1")
    assert view["params"] == {"a": "1"} and view["headers"]["Authorization"] == redact.REDACTED
    assert view["headers"]["X-Trace"] == "1"
    # our copy is gone; a peer (an older one, or a forged answer) sends its secrets bare
    peer_view = dict(t.evolve(replica=1).summary(), headers={"Cookie": "sid=9"}, params={})
    view = queries(TaskEngine(t.evolve(id="other")), {"b": peer_view}).get_task("t1")
    assert view["headers"] == {"Cookie": redact.REDACTED}
    assert "Bearer mine" not in ujson.dumps(got.serve("get", {"id": "t1"}))


def test_the_cluster_s_page_merges_the_peers_and_names_who_answered() -> None:
    t = Task(id="t1", queue="q", url="http://w/x", fire_at=5.0)
    theirs = browse.page_payload(browse.Page([((3.0, "t0"), Task(
        id="t0", queue="q", url="http://w/y", fire_at=3.0).summary())], None))
    got = queries(TaskEngine(t), {"b": theirs, "c": "junk"}).browse(
        browse.Filter(State.SCHEDULED), None, 10)
    assert [s["id"] for s in got["tasks"]] == ["t0", "t1"]
    assert got["next_cursor"] is None and got["nodes"] == ["a", "b"]
    assert queries(TaskEngine(t), {}).serve("browse", {
        "filter": {"state": "scheduled"}, "after": None, "limit": 5})["items"][0][0] == [5.0, "t1"]
    for bad in ({"filter": {"state": "x"}, "limit": 5}, {"filter": {"state": "scheduled"},
                                                          "after": [1], "limit": 5}):
        try:
            queries(TaskEngine(t), {}).serve("browse", bad)
        except DecodeError:
            continue
        raise AssertionError(f"{bad} was served")


def test_rates_add_up_over_the_cluster_or_are_one_node_s() -> None:
    eng = Engine()
    eng.stats.count("q", "delivered", 999.5)  # the second before the queries' clock (1000)
    theirs = dict(eng.stats.rates.series(1000.0, 60, 1), delivered=[2] * 60)
    got = queries(eng, {"b": theirs, "c": {"junk": 1}}).rates(60, 1, None)
    assert got["delivered"][-1] == 3 and sum(got["delivered"]) == 121
    assert got["nodes"] == ["a", "b"] and got["seconds"] == 60
    assert queries(eng, {"b": theirs}).rates(60, 1, "a")["delivered"][-1] == 1
    one = queries(eng, {"b": theirs}).rates(60, 1, "b")
    assert one["nodes"] == ["b"] and sum(one["delivered"]) == 120
    assert queries(eng, {}).rates(60, 1, "b") is None  # b did not answer
    assert queries(eng, {"z": theirs}).rates(60, 1, "z") is None  # not a member
    assert queries(eng, {}).serve("rates", {"seconds": 60, "step": 1})["delivered"][-1] == 1


class WaitingEngine(TaskEngine):
    """A node whose copy of the task is not the one that holds the accepted attempt."""

    def complete(self, grant, report):
        raise Conflict("this attempt is over")


def test_a_report_no_node_can_take_is_503_unless_a_copy_knows_the_attempt_is_over() -> None:
    grant = completion.Grant("t1", 0, 1, 0.0)
    report = completion.parse_report({"state": "succeeded"})
    waiting = Task(id="t1", queue="q", url="http://w/x", fire_at=5.0, replicas=("b", "a"),
                   replica=1)  # a sibling's copy, held by the claim: it knows no attempt
    with pytest.raises(Unavailable):  # b, the holder, is down: report again, not 409
        queries(WaitingEngine(waiting), {}).complete(grant, report)
    with pytest.raises(Conflict):  # the holder answers: over
        queries(WaitingEngine(waiting), {"b": {"conflict": "over"}}).complete(grant, report)
    for over in (waiting.evolve(attempts=1), waiting.evolve(state=State.SUCCEEDED),
                 waiting.evolve(reruns=1)):  # it heard of the attempt's end, or a new run
        with pytest.raises(Conflict):
            queries(WaitingEngine(over), {}).complete(grant, report)
    with pytest.raises(Unavailable):  # we hold no copy; c's waits, b (the holder) is down
        queries(WaitingEngine(waiting.evolve(id="other")), {"c": {"waiting": True}}).complete(
            grant, report)
    assert queries(WaitingEngine(waiting), {}).serve_held(
        "complete", {"id": "t1", "run": 0, "attempt": 1, "state": "succeeded"}) == {"waiting": True}
    assert queries(WaitingEngine(waiting.evolve(attempts=1)), {}).serve_held(
        "complete", {"id": "t1", "run": 0, "attempt": 1, "state": "succeeded"}) == \
        {"conflict": "this attempt is over"}
    assert not attempt_over(None, 0, 1) and not attempt_over(waiting, 0, 1)
    assert not attempt_over(waiting.evolve(reruns=1), 2, 1)


class PullEngine:
    """A node with no due pull copies; its long-poll wait moves a fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def lease(self, queue: str, n: int, lease_s: float) -> Any:
        return type("Taken", (), {"leased": [], "asking": 0})()

    def pull_wait(self, queue: str, timeout: float) -> None:
        self.now += max(0.0, timeout)


class CountingRequests(Requests):
    def __init__(self) -> None:
        super().__init__({})
        self.asked = 0

    def ask_all(self, members: list[str], op: str, args: dict, timeout: float) -> dict:
        self.asked += 1
        return {}


@pytest.mark.timeout(10)
def test_a_lease_long_poll_is_timed_by_the_nodes_monotonic_clock() -> None:
    # the simulator runs nodes on virtual time: a poll timed by the process's clock
    # outlasted the whole drain there (its pullers stuck, due tasks never leased)
    engine, wire = PullEngine(), CountingRequests()
    q = Queries("a", engine, wire, Peers(), timeout=1.0, offset=1.0,  # type: ignore[arg-type]
                clock=lambda: 1000.0, monotonic=lambda: engine.now)
    assert q.lease("q", 1, 3.0, wait_s=5.0) == []
    assert 5.0 <= engine.now < 6.0, engine.now
    assert 8 <= wire.asked <= 12, wire.asked  # each peer at once, then once per PEER_POLL


def test_a_peer_s_ids_may_be_as_long_as_any_wire_name() -> None:
    longest = "x" * checks.MAX_NAME
    for ids, believed in (([longest], True), ([longest + "x"], False)):
        b = peer(B[0], {"succeeded": ["t1", *ids], "running": ["t2"]})
        got = counts({"b": b, "c": peer(*C)})["q"]
        # believed: t1 once, the long one once, t2 at its running copy; else the sums of
        # the first copies (no running one)
        assert got["succeeded"] == 2 and got["running"] == (1 if believed else 0), (ids, got)
