"""Failed tasks: DELETE of a dead letter, bulk retry/delete of a queue's failed list, and
the attempts history of GET /tasks/<id>, against real nodes and a real sink.

Exactly-once of the bulk retry is shown by waiting until every copy of every task has
succeeded (an ended copy cannot deliver again) and then counting the sink's requests.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers import NodeProcess, Sink, free_port, wait_until

FAST = {"fast": {"min_backoff": 0.01, "max_backoff": 0.02, "max_doublings": 1, "timeout": 5}}


def failing_tasks(node: NodeProcess, sink: Sink, path: str, n: int) -> list[str]:
    """``n`` tasks with one attempt each to ``path`` (the sink answers 500 there)."""
    sink.reply(path, 500)
    return [node.enqueue(url=sink.url_for(path), max_attempts=1)["id"] for _ in range(n)]


def all_copies(node: NodeProcess, task_id: str, state: str) -> dict[str, Any] | None:
    """The task as ``node`` sees it once every copy of it is in ``state``."""
    got = node.task(task_id)
    copies = got["copies"]
    ok = got["state"] == state and len(copies) == len(got["replicas"]) and \
        all(c["state"] == state for c in copies)
    return got if ok else None


def wait_all(nodes: list[NodeProcess], ids: list[str], state: str, timeout: float = 15) -> None:
    for i, task_id in enumerate(ids):
        wait_until(lambda: all_copies(nodes[i % len(nodes)], task_id, state), timeout,
                   what=f"every copy of {task_id} {state}")


def gone_everywhere(nodes: list[NodeProcess], task_id: str) -> bool:
    return all(n.get(f"/tasks/{task_id}").status_code == 404 for n in nodes)


@pytest.mark.timeout(40)
def test_delete_failed_task_and_history(node: NodeProcess, sink: Sink) -> None:
    sink.reply("/h", 500, 500, 200)
    tid = node.enqueue(url=sink.url_for("/h"), max_attempts=5)["id"]
    got = node.wait_task_state(tid, "succeeded")
    history = got["history"]
    assert [a["status"] for a in history] == [200, 500, 500], history  # newest first
    starts = [a["start"] for a in history]
    assert starts == sorted(starts, reverse=True) and len(set(starts)) == 3
    assert all(a["node"] == node.node_id and a["duration"] >= 0 and a["error"] is None
               for a in history), history
    # a succeeded task is the proof of its delivery: DELETE keeps refusing it
    assert node.delete(f"/tasks/{tid}").status_code == 409

    (dead,) = failing_tasks(node, sink, "/dead", 1)
    node.wait_task_state(dead, "failed")
    r = node.delete(f"/tasks/{dead}")
    assert r.status_code == 200 and r.json()["state"] == "deleted" and r.json()["id"] == dead
    assert node.get(f"/tasks/{dead}").status_code == 404
    assert node.delete(f"/tasks/{dead}").status_code == 404
    assert node.get("/queues/default/tasks?state=failed").json()["tasks"] == []

    # no response at all: the attempt records the error (cut short), no status
    refused = node.enqueue(url=f"http://127.0.0.1:{free_port()}/x", max_attempts=1)["id"]
    (attempt,) = node.wait_task_state(refused, "failed")["history"]
    assert attempt["status"] is None and 0 < len(attempt["error"]) <= 200, attempt


@pytest.mark.timeout(40)
def test_history_is_bounded(node_factory: Callable[..., NodeProcess], sink: Sink) -> None:
    # 25 failures in a row to one target: no circuit breaker (it would hold them 30 s)
    node = node_factory(queues=FAST, options={"breaker_failures": 0})
    sink.reply("/always", 500)
    tid = node.enqueue("fast", url=sink.url_for("/always"), max_attempts=25)["id"]
    got = node.wait_task_state(tid, "failed", timeout=20)
    assert got["attempts"] == 25 and sink.count("/always") == 25
    history = got["history"]
    assert len(history) == 20 and all(a["status"] == 500 for a in history)
    starts = [a["start"] for a in history]
    assert starts == sorted(starts, reverse=True)
    times = sorted(r.time for r in sink.requests("/always"))
    assert times[4] < starts[-1] < times[5] + 0.001  # the oldest kept is the 6th attempt


@pytest.mark.timeout(40)
def test_bulk_retry_and_delete_single_node(node: NodeProcess, sink: Sink) -> None:
    ids = failing_tasks(node, sink, "/bulk", 5)
    for t in ids:
        node.wait_task_state(t, "failed")
    sink.reply("/bulk", 200)
    r = node.post("/queues/default/failed/retry")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    assert r.json()["count"] == 5 and r.json()["more"] is False, r.json()
    for t in ids:
        assert len(node.wait_task_state(t, "succeeded")["history"]) == 2
    assert sink.count("/bulk") == 10
    assert node.post("/queues/default/failed/retry").json()["count"] == 0

    more = failing_tasks(node, sink, "/bulk2", 3)
    for t in more:
        node.wait_task_state(t, "failed")
    r = node.post("/queues/default/failed/delete")
    assert r.status_code == 200 and r.json()["count"] == 3, r.text
    assert all(node.get(f"/tasks/{t}").status_code == 404 for t in more)
    assert all(node.task(t)["state"] == "succeeded" for t in ids)  # the others stay
    assert node.get("/queues/default/failed/retry").status_code == 405
    assert node.post("/queues/bad%20name/failed/delete").status_code == 400


@pytest.mark.timeout(60)
def test_failed_tasks_in_a_cluster(cluster_factory: Callable[..., list[NodeProcess]],
                                   sink: Sink) -> None:
    nodes = cluster_factory(3)
    a, b, c = nodes
    ids = failing_tasks(a, sink, "/c", 4)
    wait_all(nodes, ids, "failed")
    assert sink.count("/c") == 4  # one attempt each, by one copy

    # DELETE on another node than the one enqueued to: gone from every copy
    r = b.delete(f"/tasks/{ids[0]}")
    assert r.status_code == 200 and r.json()["state"] == "deleted", r.text
    assert gone_everywhere(nodes, ids[0])

    sink.reply("/c", 200)
    r = c.post("/queues/default/failed/retry")
    assert r.status_code == 200 and r.json()["count"] == 3 and r.json()["more"] is False, r.text
    wait_all(nodes, ids[1:], "succeeded")
    per_id = {t: sum(1 for q in sink.requests("/c") if q.task_id == t) for t in ids}
    assert per_id == {ids[0]: 1, ids[1]: 2, ids[2]: 2, ids[3]: 2}, per_id

    doomed = failing_tasks(b, sink, "/c2", 2)
    wait_all(nodes, doomed, "failed")
    r = a.post("/queues/default/failed/delete")
    assert r.status_code == 200 and r.json()["count"] == 2, r.text
    assert all(gone_everywhere(nodes, t) for t in doomed)

    # the history of a task retried across the cluster: every node shows all 3 attempts
    sink.reply("/hist", 500, 500, 200)
    tid = a.enqueue(url=sink.url_for("/hist"), max_attempts=5)["id"]
    wait_all(nodes, [tid], "succeeded")
    for n in nodes:
        history = n.task(tid)["history"]
        assert [h["status"] for h in history] == [200, 500, 500], (n.node_id, history)
        # each node's own copy knows all three (RETRY/DONE carry the attempt): a node's
        # list shows its own copy's record first
        listed = n.get("/queues/default/tasks?state=succeeded&limit=1000").json()["tasks"]
        (own,) = [t for t in listed if t["id"] == tid]
        assert [h["status"] for h in own["history"]] == [200, 500, 500], (n.node_id, own)


@pytest.mark.timeout(30)
def test_bulk_routes_need_admin(node_factory: Callable[..., NodeProcess]) -> None:
    import secrets

    admin, enq, read = (secrets.token_urlsafe(24) for _ in range(3))
    n = node_factory(env={"MIYAMOTO_API_TOKENS": f"admin:{admin},enqueue:{enq},read:{read}"})
    for action in ("retry", "delete"):
        path = f"/queues/default/failed/{action}"
        assert n.post(path).status_code == 401
        for token in (enq, read):
            assert n.post(path, headers={"Authorization": f"Bearer {token}"}).status_code == 403
        r = n.post(path, headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200 and r.json()["count"] == 0, r.text
