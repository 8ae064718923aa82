"""A task's own lifetime options on real nodes, a real sink: expiry while it waits behind
a paused queue (ended as expired, listed, counted, its failure_callback told), its own
retry delays, a schedule run now; and on three nodes, an expired task ends on every copy
and calls its failure_callback once. The decisions themselves: tests/unit/engine/
test_engine_expiry.py, tests/unit/delivery/test_retry.py, tests/unit/tasks/test_validate.py.
"""

from __future__ import annotations

from typing import Callable

import pytest

from helpers import NodeProcess, Sink, metric, wait_until


def _expires_behind_a_pause(node: NodeProcess, sink: Sink, queue: str) -> str:
    assert node.post(f"/queues/{queue}/pause").status_code == 200
    tid = node.enqueue(queue, url=sink.url_for("/late"), ttl=1.0,
                       failure_callback=sink.url_for("/dead"))["id"]
    return tid


@pytest.mark.timeout(60)
def test_expiry_retry_delays_and_a_schedule_run_on_one_node(node: NodeProcess,
                                                          sink: Sink) -> None:
    tid = _expires_behind_a_pause(node, sink, "ratelimited")
    got = node.wait_task_state(tid, "expired", timeout=10)
    assert got["attempts"] == 0 and got["expires_at"] is not None
    assert node.counts("ratelimited")["expired"] == 1
    listed = node.get("/queues/ratelimited/tasks?state=expired").json()["tasks"]
    assert [t["id"] for t in listed] == [tid]
    assert metric(node, "miyamoto_tasks_expired_total") == 1
    # its failure_callback is a task of the same queue, as a failed task's: it waits
    # for the resume too
    assert node.post("/queues/ratelimited/resume").status_code == 200
    (dead,) = sink.wait_for(count=1, path="/dead")
    assert dead.json()["state"] == "expired" and dead.json()["task"]["id"] == tid
    assert node.post("/queue", json={"url": sink.url_for("/x"), "countdown": 5, "ttl": 2}
                     ).json()["field"] == "ttl"  # it could never run: 400 naming it

    # its own retry delays, not the queue's backoff (0.05 s, doubling)
    sink.reply("/r", 500, 500, 200)
    rid = node.enqueue(url=sink.url_for("/r"), retry_delays=[0.4, 1.0])["id"]
    node.wait_task_state(rid, "succeeded", timeout=15)
    times = [r.time for r in sink.requests("/r")]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) == 2 and gaps[0] >= 0.35 and gaps[1] >= 0.95, gaps
    assert node.task(rid)["retry_delays"] == [0.4, 1.0]

    # resend: an ended task runs again under its id (a succeeded one too), a live one is 409
    assert node.post(f"/tasks/{rid}/resend").status_code == 200
    node.wait_task_state(rid, "succeeded")
    sink.wait_for(count=4, path="/r")
    live = node.enqueue(url=sink.url_for("/later"), countdown=60)["id"]
    assert node.post(f"/tasks/{live}/resend").status_code == 409
    # in bulk, by state and target: the expired task, now delivered
    r = node.post("/queues/ratelimited/resend", params={
        "state": "expired", "target": sink.url_for("/late")})
    assert r.status_code == 200 and (r.json()["count"], r.json()["more"]) == (1, False), r.text
    sink.wait_for(count=1, path="/late")
    assert node.post("/queues/ratelimited/resend", params={"state": "scheduled"}
                     ).json()["field"] == "state"

    # a schedule run now, paused or not; an Idempotency-Key makes a repeat 409
    r = node.post("/schedules", json={"name": "nightly", "cron": "@daily",
                                      "task": {"url": sink.url_for("/nightly")}})
    assert r.status_code == 200, r.text
    assert node.post("/schedules/nightly/pause").status_code == 200
    run = node.post("/schedules/nightly/run")
    assert run.status_code == 200 and run.json()["schedule"] == "nightly", run.text
    (req,) = sink.wait_for(count=1, path="/nightly")
    assert req.task_id == run.json()["id"]
    keyed = [node.post("/schedules/nightly/run", headers={"Idempotency-Key": "k1"})
             for _ in range(2)]
    assert [k.status_code for k in keyed] == [200, 409]
    assert keyed[1].json()["id"] == keyed[0].json()["id"]
    assert node.post("/schedules/none/run").status_code == 404


@pytest.mark.timeout(60)
def test_an_expired_task_ends_on_every_copy_and_tells_once(
        cluster_factory: Callable[..., list[NodeProcess]], sink: Sink) -> None:
    nodes = cluster_factory(3)
    tid = _expires_behind_a_pause(nodes[0], sink, "ratelimited")

    def every_copy_expired() -> bool:
        got = nodes[1].task(tid)
        copies = got["copies"]
        return got["state"] == "expired" and len(copies) == len(got["replicas"]) == 2 and \
            all(c["state"] == "expired" for c in copies)
    wait_until(every_copy_expired, 15, what=f"every copy of {tid} expired")
    assert nodes[0].post("/queues/ratelimited/resume").status_code == 200
    sink.wait_for(count=1, path="/dead")
    # copy 1 expires a replica_offset (1 s) after copy 0, whose news ended it first
    wait_until(lambda: sum(metric(n, "miyamoto_tasks_expired_total") for n in nodes) >= 1, 5)
    assert sum(metric(n, "miyamoto_tasks_expired_total") for n in nodes) == 1
    assert sink.count("/late") == 0 and sink.count("/dead") == 1
    # resent in bulk from any node: one task, delivered once
    r = nodes[2].post("/queues/ratelimited/resend", params={"state": "expired"})
    assert (r.json()["count"], r.json()["more"]) == (1, False), r.text
    sink.wait_for(count=1, path="/late")
    wait_until(lambda: nodes[0].task(tid)["state"] == "succeeded" and all(
        c["state"] == "succeeded" for c in nodes[0].task(tid)["copies"]), 10)
    assert sink.count("/late") == 1
