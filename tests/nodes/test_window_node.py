"""The memory window on a real node: tasks due beyond ``memory_window`` live only in the
journal (a real SQLite file), and every operation still works on them.

``memory_window`` is 2 s here, so a test sees tasks paged in. What is in memory is read
from /metrics (``miyamoto_tasks_in_memory``); ``miyamoto_tasks_live`` counts every live
copy, in memory or not.
"""

from __future__ import annotations

import time

import pytest

from helpers import metric, NodeProcess, wait_until

WINDOW = 2.0
OPTIONS = {"memory_window": WINDOW}
TOL = 0.05  # the node's clock against the sink's (same host)
LATE = 0.5  # how late a paged-in task may fire on a loaded box (a few ms when idle)
SLOW_RETRY = {"slowretry": {"min_backoff": 4, "max_backoff": 4, "max_doublings": 0}}


def in_memory(node: NodeProcess) -> int:
    return int(metric(node, "miyamoto_tasks_in_memory"))


def counts(node: NodeProcess, queue: str = "default") -> dict[str, int]:
    return {k: v for k, v in node.counts(queue).items() if v}


@pytest.mark.timeout(60)
def test_get_list_counts_dedupe_cancel_and_purge_beyond_the_window(node_factory, sink):
    node = node_factory(options=OPTIONS)
    ids = [node.enqueue(url=f"{sink.url}/far", countdown=3600 + i,
                        params={"i": str(i)})["id"] for i in range(4)]
    named = node.enqueue(url=f"{sink.url}/far", countdown=3700, name="far-name")["id"]
    ids.append(named)
    assert in_memory(node) == 0  # all in the journal only
    assert metric(node, "miyamoto_tasks_live") == 5
    for i, task_id in enumerate(ids[:4]):
        t = node.task(task_id)
        assert t["state"] == "scheduled" and abs(t["next_attempt"] - t["eta"]) < 1e-6
        assert t["eta"] - time.time() > 3590 + i
    listed = node.get("/queues/default/tasks?state=scheduled").json()["tasks"]
    assert [t["id"] for t in listed] == ids  # by fire time
    assert counts(node) == {"scheduled": 5}
    # the name is reserved, though its task is not in memory
    r = node.post("/queue", json={"url": f"{sink.url}/far", "countdown": 10, "name": "far-name"})
    assert r.status_code == 409 and r.json()["id"] == named, r.text
    r = node.delete(f"/tasks/{ids[0]}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert node.task(ids[0])["state"] == "cancelled"
    assert counts(node) == {"scheduled": 4, "cancelled": 1}
    r = node.delete(f"/tasks/{ids[0]}")  # again: still cancelled, not a 500 or a 404
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    r = node.post("/queues/default/purge")
    assert r.status_code == 200 and r.json()["purged"] == 4, r.text
    assert counts(node) == {"cancelled": 5}
    assert all(node.task(i)["state"] == "cancelled" for i in ids)
    assert in_memory(node) == 0 and metric(node, "miyamoto_tasks_live") == 0
    assert sink.count("/far") == 0


@pytest.mark.timeout(60)
def test_a_task_just_outside_the_window_is_paged_in_and_fires_on_time(node_factory, sink):
    node = node_factory(options=OPTIONS)
    t0 = time.time()
    outside = node.enqueue(url=f"{sink.url}/edge", countdown=WINDOW + 1.5)
    inside = node.enqueue(url=f"{sink.url}/edge", countdown=WINDOW - 1.0)
    seen = in_memory(node)
    if time.time() - t0 < 0.4:  # (a slow box may have paged ``outside`` in already)
        assert seen == 1, seen  # ``inside`` only
    reqs = sink.wait_for(count=2, path="/edge", timeout=15)
    at = {r.task_id: r.time for r in reqs}
    for t in (inside, outside):
        assert -TOL <= at[t["id"]] - t["eta"] < LATE, (t, at[t["id"]] - t["eta"])
    node.wait_task_state(outside["id"], "succeeded")
    assert sink.count("/edge") == 2  # once each
    assert counts(node) == {"succeeded": 2}


@pytest.mark.timeout(60)
def test_a_retry_beyond_the_window_leaves_memory_and_fires_on_time(node_factory, sink):
    node = node_factory(options=OPTIONS, queues=SLOW_RETRY)
    sink.reply("/retry", 500, 200)
    t = node.enqueue("slowretry", url=f"{sink.url}/retry")
    sink.wait_for(count=1, path="/retry", timeout=10)
    back = wait_until(lambda: (x := node.task(t["id"]))["state"] == "scheduled"
                      and x["attempts"] == 1 and x, 10, what="the retry to be scheduled")
    assert back["next_attempt"] - time.time() > WINDOW  # 4 s +- 10 %: beyond the window
    assert in_memory(node) == 0
    assert counts(node, "slowretry") == {"scheduled": 1}
    reqs = sink.wait_for(count=2, path="/retry", timeout=15)
    assert reqs[1].headers["X-Task-Retry-Count"] == "1"
    assert -TOL <= reqs[1].time - back["next_attempt"] < LATE
    node.wait_task_state(t["id"], "succeeded")
    assert sink.count("/retry") == 2


@pytest.mark.timeout(90)
def test_a_restart_loads_the_window_only_and_the_rest_fires_on_time_once(node_factory, sink):
    node = node_factory(options=OPTIONS)
    soon = [node.enqueue(url=f"{sink.url}/soon", countdown=7 + 0.2 * i)["id"] for i in range(5)]
    far = [node.enqueue(url=f"{sink.url}/later", countdown=3600)["id"] for _ in range(30)]
    named = node.enqueue(url=f"{sink.url}/later", countdown=3600, name="kept")["id"]
    etas = {i: node.task(i)["eta"] for i in soon}
    node.kill()  # kill -9: nothing is written on the way out
    node.restart().wait_ready()
    started = time.time()
    if started < min(etas.values()) - WINDOW - 0.5:  # (unless the restart took very long)
        assert in_memory(node) == 0  # neither the backlog nor what is due after the window
    assert metric(node, "miyamoto_tasks_live") == 36
    assert counts(node) == {"scheduled": 36}
    assert node.task(far[0])["state"] == "scheduled"
    r = node.post("/queue", json={"url": f"{sink.url}/later", "countdown": 5, "name": "kept"})
    assert r.status_code == 409 and r.json()["id"] == named, r.text
    reqs = sink.wait_for(count=5, path="/soon", timeout=20)
    print(f"\npaged in after the restart, ms late: "
          f"{sorted(round((r.time - etas[r.task_id]) * 1000, 1) for r in reqs)}")
    for r in reqs:
        assert -TOL <= r.time - etas[r.task_id] < LATE, (r.task_id, r.time - etas[r.task_id])
    for i in soon:
        node.wait_task_state(i, "succeeded")
    assert sorted(sink.by_task_id("/soon").values()) == [1] * 5  # once each
    assert counts(node) == {"scheduled": 31, "succeeded": 5}
    assert in_memory(node) == 0 and sink.count("/later") == 0
