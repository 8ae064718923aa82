"""Single node: tests for behaviour that one small slip would break and that no other
test caught (issue 12). Each was shown to fail with the slip planted.

Real node processes and a real sink; every "nothing happened" check is paired with an
event that must happen in the same window (a later task delivered, a state reached).
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest

from helpers import metric, Reply, wait_until

MIB = 1024 * 1024  # the default max_body


# ================================================================ the timer


@pytest.mark.timeout(30)
def test_an_earlier_task_wakes_the_timer_waiting_for_a_later_one(node, sink):
    late = node.enqueue(url=f"{sink.url}/late", countdown=6)
    # the timer is now asleep until the late task is due; wait until it surely is
    wait_until(lambda: node.task(late["id"])["state"] == "scheduled", 5)
    time.sleep(0.2)  # not a check: lets the timer greenlet go to sleep on the late task
    t0 = time.time()
    early = node.enqueue(url=f"{sink.url}/early")
    (req,) = sink.wait_for(count=1, path="/early", timeout=4)
    assert req.task_id == early["id"]
    assert req.time - t0 < 2.0, req.time - t0
    assert sink.count("/late") == 0  # it did not come early either
    (req,) = sink.wait_for(count=1, path="/late", timeout=10)
    assert req.time >= late["eta"] - 0.05


# ================================================================ what success is


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_every_2xx_is_a_success(node, sink, status):
    sink.reply("/ok", status)
    t = node.enqueue(url=f"{sink.url}/ok", max_attempts=3)
    got = node.wait_task_state(t["id"], "succeeded")
    assert got["attempts"] == 1 and got["last_response"]["status"] == status, got
    assert sink.count("/ok") == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [300, 304])
def test_statuses_next_to_the_2xx_range_are_failures(node, sink, status):
    sink.reply("/not-ok", status)
    t = node.enqueue(url=f"{sink.url}/not-ok", max_attempts=2)
    got = node.wait_task_state(t["id"], "failed")
    assert got["attempts"] == 2, got
    assert sink.count("/not-ok") == 2


# ================================================================ max_retry_duration


@pytest.mark.timeout(30)
def test_max_retry_duration_ends_the_retries(node_factory, sink):
    limit = 1.2
    node = node_factory(queues={"brief": {"max_attempts": 1000, "min_backoff": 0.1,
                                          "max_backoff": 0.1, "max_retry_duration": limit}},
                        options={"breaker_failures": 0})  # retries, not the target's breaker
    sink.reply("/down", 500)
    t = node.enqueue("brief", url=f"{sink.url}/down")
    got = node.wait_task_state(t["id"], "failed", timeout=10)
    reqs = sink.requests("/down")
    assert got["attempts"] == len(reqs), (got, len(reqs))
    span = reqs[-1].time - reqs[0].time
    # it stopped once the limit was reached: not before, not long after
    assert limit - 0.15 <= span <= limit + 1.0, span
    assert 4 <= len(reqs) <= 20, len(reqs)
    # a queue without the limit keeps going past it (the positive control)
    sink.reply("/still", 500)
    other = node.enqueue(url=f"{sink.url}/still", max_attempts=1000)
    sink.wait_for(lambda rs: rs and rs[-1].time - rs[0].time > limit + 0.5, path="/still",
                  timeout=10)
    assert node.task(other["id"])["state"] in ("scheduled", "running")
    assert node.delete(f"/tasks/{other['id']}").status_code == 200


# ================================================================ purge


@pytest.mark.timeout(30)
def test_purge_of_a_paused_queue_cancels_its_due_backlog(node, sink):
    assert node.post("/queues/held/pause").status_code == 200
    ids = [node.enqueue("held", url=f"{sink.url}/backlog", params={"i": i})["id"]
           for i in range(5)]
    # due already, held by the pause
    wait_until(lambda: all((node.task(i)["next_attempt"] or 0) < time.time() - 0.3 for i in ids),
               5, what="the backlog to be overdue")
    assert node.counts("held")["scheduled"] == 5
    r = node.post("/queues/held/purge")
    assert r.status_code == 200 and r.json().get("purged") == 5, r.text
    for i in ids:
        assert node.task(i)["state"] == "cancelled"
    # resumed, the queue delivers a new task; a purged one still in the ready line would
    # have gone out first (the line is first in, first out)
    assert node.post("/queues/held/resume").status_code == 200
    marker = node.enqueue("held", url=f"{sink.url}/after")
    sink.wait_for(count=1, path="/after", timeout=10)
    node.wait_task_state(marker["id"], "succeeded")
    assert sink.count("/backlog") == 0
    assert node.counts("held")["cancelled"] == 5


# ================================================================ the body limit


def _json_body(size: int, url: str) -> bytes:
    """A JSON task of exactly ``size`` bytes."""
    base = {"url": url, "params": {"pad": ""}}
    pad = size - len(json.dumps(base).encode())
    assert pad > 0
    base["params"]["pad"] = "x" * pad
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


def _form_body(size: int, url: str) -> bytes:
    base = urlencode({"task.url": url, "pad": ""})
    body = (base + "x" * (size - len(base))).encode()
    assert len(body) == size
    return body


def _batch_body(size: int, url: str) -> bytes:
    base = [{"url": url, "params": {"pad": ""}}]
    pad = size - len(json.dumps(base).encode())
    base[0]["params"]["pad"] = "x" * pad
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


def _ids(answer: dict) -> list[str]:
    if "tasks" in answer:  # a batch
        assert all(t["status"] == "scheduled" for t in answer["tasks"]), answer
        return [t["id"] for t in answer["tasks"]]
    return [answer["id"]]


@pytest.mark.timeout(60)
def test_a_request_of_exactly_the_body_limit_is_taken(node, sink):
    url = f"{sink.url}/big"
    ids = []
    cases = [("/queue", "application/json", _json_body),
             ("/queue", "application/x-www-form-urlencoded", _form_body),
             ("/queue/default/batch", "application/json", _batch_body)]
    for path, ctype, make in cases:
        headers = {"Content-Type": ctype}
        r = node.post(path, data=make(MIB, url), headers=headers)
        assert r.status_code == 200, (path, ctype, r.status_code, r.text[:300])
        ids += _ids(r.json())
        # and one byte more is refused, naming the body
        r = node.post(path, data=make(MIB + 1, url), headers=headers)
        assert r.status_code == 413 and r.json()["field"] == "body", (path, r.status_code, r.text)
        # the same without a Content-Length (chunked)
        body = make(MIB, url)
        r = node.post(path, data=iter([body[:1000], body[1000:]]), headers=headers)
        assert r.status_code == 200, ("chunked", path, ctype, r.status_code, r.text[:300])
        ids += _ids(r.json())
        body = make(MIB + 1, url)
        r = node.post(path, data=iter([body[:1000], body[1000:]]), headers=headers)
        assert r.status_code == 413, ("chunked", path, r.status_code, r.text[:300])
    reqs = sink.wait_for(count=len(ids), path="/big", timeout=20)
    assert sorted(r.task_id for r in reqs) == sorted(ids)


# ================================================================ cancelled tasks, with a control


@pytest.mark.timeout(30)
def test_a_cancelled_due_task_is_not_delivered_and_a_sibling_task_is(node, sink):
    """Cancelled while its queue holds it (due, in the ready line): never delivered, and
    a task enqueued after it in the same queue is (the positive control)."""
    assert node.post("/queues/cq/pause").status_code == 200
    doomed = node.enqueue("cq", url=f"{sink.url}/cancelled")["id"]
    kept = node.enqueue("cq", url=f"{sink.url}/kept")["id"]
    wait_until(lambda: (node.task(doomed)["next_attempt"] or 0) < time.time() - 0.3, 5)
    cancelled_before = metric(node, "miyamoto_tasks_cancelled_total")
    assert node.delete(f"/tasks/{doomed}").status_code == 200
    assert metric(node, "miyamoto_tasks_cancelled_total") == cancelled_before + 1
    assert node.post("/queues/cq/resume").status_code == 200
    sink.wait_for(count=1, path="/kept", timeout=10)
    node.wait_task_state(kept, "succeeded")
    assert sink.count("/cancelled") == 0
    assert node.task(doomed)["state"] == "cancelled"


@pytest.mark.timeout(30)
def test_a_slow_success_is_not_retried(node, sink):
    """A 2xx that takes a while is one attempt (the success is not lost to the timeout
    accounting or a retry timer)."""
    sink.reply("/slow", Reply(202, delay=0.5))
    t = node.enqueue(url=f"{sink.url}/slow", timeout=3)
    got = node.wait_task_state(t["id"], "succeeded")
    assert got["attempts"] == 1 and sink.count("/slow") == 1
