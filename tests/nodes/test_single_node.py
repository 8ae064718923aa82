"""One real node (``python -m miyamoto serve``) and a real HTTP sink, over real HTTP.

Ports come from the OS; every wait is a condition with a deadline. Where a test must
show that something did NOT happen, it waits for a later event that would have come
after it (a marker task due later in the same queue), or for the task to have ended
(an ended task cannot be delivered), rather than sleeping and hoping.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import threading
import time
import uuid
from typing import Any

import pytest
import requests

from conftest import write_node_config
from helpers import NodeProcess, Reply, metric, port_refuses, run_cli, wait_until
from miyamoto.version import __version__

FORM = "application/x-www-form-urlencoded"
UA = f"miyamoto/{__version__}"
TOL = 0.05  # clock slack when comparing the node's clock with the sink's (same host)


def post_form(node: NodeProcess, body: str | bytes, path: str = "/queue",
              headers: dict[str, str] | None = None) -> requests.Response:
    h = {"Content-Type": FORM}
    h.update(headers or {})
    return node.post(path, data=body, headers=h)


def _total_counts(node: NodeProcess) -> dict[str, int]:
    out: dict[str, int] = {}
    r = node.get("/queues")
    assert r.status_code == 200, r.text
    for q in r.json()["queues"]:
        for state, n in q["counts"].items():
            out[state] = out.get(state, 0) + n
    return out


def total_counts(node: NodeProcess) -> dict[str, int]:
    """Every queue's counts added up, per state, once two reads 50 ms apart agree.

    (A task that just ended is briefly missing from the counts until its journal
    group commits, see the report; this waits that out.)
    """
    prev: list[dict[str, int]] = [_total_counts(node)]

    def stable() -> dict[str, int] | None:
        time.sleep(0.05)
        now = _total_counts(node)
        same = now == prev[0]
        prev[0] = now
        return now if same else None

    return wait_until(stable, 5, interval=0, what="stable queue counts")


def wait_counts(node: NodeProcess, queue: str = "default", timeout: float = 10.0,
                **expected: int) -> dict[str, int]:
    """Wait until the queue's counts show ``expected`` (states not named: 0)."""
    want = {"scheduled": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0,
            "expired": 0}
    want.update(expected)
    seen: list[dict[str, int]] = []

    def match() -> dict[str, int] | None:
        c = node.counts(queue)
        seen.append(c)
        return c if c == want else None

    try:
        return wait_until(match, timeout, what=f"counts of {queue} to be {want}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen {seen[-1] if seen else None}") from None


def assert_error(r: requests.Response, status: int, field: str | None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    body = r.json()
    assert body["status"] == "error", body
    assert body["error"], body
    if field is not None:
        assert body.get("field") == field, body
    return body


# ================================================================ 1-3: what a worker receives


@pytest.mark.timeout(30)
def test_readme_form_example(node, sink):
    t0 = time.time()
    r = post_form(node, f"task.url={sink.url}/worker&task.countdown=2&foo=bar")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] == "scheduled"
    task_id = answer["id"]
    assert str(uuid.UUID(task_id)) == task_id
    assert answer["eta"] == pytest.approx(t0 + 2, abs=1.0)

    (req,) = sink.wait_for(count=1, path="/worker", timeout=10)
    assert req.method == "POST"
    assert req.body == b"foo=bar"
    assert req.headers["Content-Type"] == FORM
    assert req.headers["User-Agent"] == UA
    assert req.headers["X-Task-Id"] == task_id
    assert req.headers["X-Task-Queue"] == "default"
    assert req.headers["X-Task-Retry-Count"] == "0"
    assert req.headers["X-Task-Execution-Count"] == "0"
    assert float(req.headers["X-Task-Eta"]) == pytest.approx(answer["eta"], abs=1e-3)
    assert "X-Task-Name" not in req.headers and "X-Task-Previous-Response" not in req.headers
    # not before the countdown (a node that ignores countdown delivers at once)
    assert req.time >= t0 + 2 - TOL, f"delivered {req.time - t0:.3f}s after enqueue"
    assert req.time >= answer["eta"] - TOL
    assert req.time < t0 + 2 + 5, "delivered very late (fired on a replica offset?)"

    t = node.wait_task_state(task_id, "succeeded")
    assert t["attempts"] == 1 and t["executions"] == 1
    assert t["last_response"]["status"] == 200
    assert t["url"] == f"{sink.url}/worker" and t["queue"] == "default"
    assert sink.count() == 1


@pytest.mark.timeout(30)
def test_readme_json_example(node, sink):
    t0 = time.time()
    answer = node.enqueue(url=f"{sink.url}/worker", params={"foo": "bar", "n": 5, "ok": True},
                          countdown=1)
    assert answer["status"] == "scheduled" and answer["queue"] == "default"
    (req,) = sink.wait_for(count=1, path="/worker")
    assert req.method == "POST" and req.headers["Content-Type"] == FORM
    assert req.form == {"foo": ["bar"], "n": ["5"], "ok": ["true"]}
    assert req.headers["X-Task-Id"] == answer["id"]
    assert req.time >= t0 + 1 - TOL


@pytest.mark.timeout(30)
def test_methods_body_kinds_and_headers(node, sink):
    u = sink.url
    cases: dict[str, dict[str, Any]] = {
        "/post": {"url": f"{u}/post", "params": {"a": "1", "b": ["x", "y"]}},
        "/put": {"url": f"{u}/put", "method": "PUT", "params": {"a": "2"}},
        "/patch": {"url": f"{u}/patch", "method": "patch", "params": {"a": "3"}},
        "/get": {"url": f"{u}/get?keep=1", "method": "GET", "params": {"q": "hello world"}},
        "/delete": {"url": f"{u}/delete", "method": "DELETE", "params": {"id": "7"}},
        "/json": {"url": f"{u}/json", "json": {"k": [1, 2], "s": "ü"}},
        "/raw": {"url": f"{u}/raw", "body": "<x>1</x>", "content_type": "application/xml"},
        "/headers": {"url": f"{u}/headers", "headers": {"X-Foo": "1", "Authorization": "Bearer t"}},
        "/named": {"url": f"{u}/named", "name": "invoice-42"},
    }
    ids = {path: node.enqueue(**fields)["id"] for path, fields in cases.items()}
    r = post_form(node, f"task.url={u}/form-header&task.method=PUT&task.header.X-Foo=bar&k=v")
    assert r.status_code == 200, r.text
    ids["/form-header"] = r.json()["id"]

    sink.wait_for(lambda reqs: {x.path for x in reqs} >= set(ids), timeout=10)
    got = {x.path: x for x in sink.requests()}
    for path, task_id in ids.items():
        assert got[path].headers["X-Task-Id"] == task_id, path
        assert got[path].headers["User-Agent"] == UA, path

    assert got["/post"].method == "POST" and got["/post"].form == {"a": ["1"], "b": ["x", "y"]}
    assert got["/put"].method == "PUT" and got["/put"].form == {"a": ["2"]}
    assert got["/put"].headers["Content-Type"] == FORM
    assert got["/patch"].method == "PATCH" and got["/patch"].form == {"a": ["3"]}
    g = got["/get"]
    assert g.method == "GET" and g.body == b""
    assert g.args == {"keep": ["1"], "q": ["hello world"]}
    d = got["/delete"]
    assert d.method == "DELETE" and d.args == {"id": ["7"]} and d.body == b""
    j = got["/json"]
    assert j.headers["Content-Type"] == "application/json" and j.json() == {"k": [1, 2], "s": "ü"}
    raw = got["/raw"]
    assert raw.body == b"<x>1</x>" and raw.headers["Content-Type"] == "application/xml"
    h = got["/headers"]
    assert h.headers["X-Foo"] == "1" and h.headers["Authorization"] == "Bearer t"
    n = got["/named"]
    assert n.headers["X-Task-Name"] == "invoice-42" and n.headers["Idempotency-Key"] == "invoice-42"
    f = got["/form-header"]
    assert f.method == "PUT" and f.headers["X-Foo"] == "bar" and f.form == {"k": ["v"]}
    for path in set(got) - {"/named"}:
        assert "X-Task-Name" not in got[path].headers, path


@pytest.mark.timeout(30)
def test_signed_deliveries_verify(node_factory, sink):
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    node = node_factory(options={"signing_secret": secret})
    answer = node.enqueue(url=f"{sink.url}/signed", params={"x": "1"})
    (req,) = sink.wait_for(count=1, path="/signed")
    assert req.headers["webhook-id"] == answer["id"]
    ts = req.headers["webhook-timestamp"]
    assert abs(int(ts) - req.time) < 10
    signed = f"{answer['id']}.{ts}.".encode() + req.body
    mac = base64.b64encode(hmac.new(b"k" * 32, signed, hashlib.sha256).digest()).decode()
    assert f"v1,{mac}" in req.headers["webhook-signature"].split(" ")


def _verifies(secret: str, msg_id: str, ts: str, body: bytes, signature: str) -> bool:
    """Standard Webhooks verification: base64 HMAC-SHA256 of "{id}.{timestamp}.{body}"
    with the key after whsec_, compared with each v1 entry of the header."""
    key = base64.b64decode(secret[len("whsec_"):])
    mac = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body,
                                    hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(f"v1,{mac}", s) for s in signature.split(" "))


@pytest.mark.timeout(30)
def test_two_signing_secrets_sign_each_delivery_twice(node_factory, sink):
    old = "whsec_" + base64.b64encode(b"o" * 24).decode()
    new = "whsec_" + base64.b64encode(b"n" * 64).decode()
    node = node_factory(options={"signing_secret": f"{old}, {new}"})
    answer = node.enqueue(url=f"{sink.url}/rotated", json={"x": 1})
    (req,) = sink.wait_for(count=1, path="/rotated")
    sig = req.headers["webhook-signature"]
    assert len(sig.split(" ")) == 2 and all(s.startswith("v1,") for s in sig.split(" ")), sig
    ts = req.headers["webhook-timestamp"]
    assert _verifies(old, answer["id"], ts, req.body, sig)
    assert _verifies(new, answer["id"], ts, req.body, sig)
    stranger = "whsec_" + base64.b64encode(b"s" * 32).decode()
    assert not _verifies(stranger, answer["id"], ts, req.body, sig)
    assert old[6:] not in node.log_text() and new[6:] not in node.log_text()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("secret", ["whsec_NOT-base64!!", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0",
                                    "whsec_", "whsec_" + base64.b64encode(b"k" * 32).decode()
                                    + " whsec_AAAA"])
def test_a_malformed_signing_secret_exits_2_naming_it(node_factory, secret):
    """Before, a bad secret started fine and then failed every delivery."""
    node = node_factory(options={"signing_secret": secret}, ready=False)
    assert node.wait_exit(15) == 2, node.log_text(30)
    log = node.log_text()
    assert "signing_secret" in log, log
    assert "Traceback" not in log, log
    assert "c2VjcmV0" not in log and "a2tr" not in log, log  # no secret is quoted


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


# ================================================================ 4-7: failures and retries# ================================================================ 4-7: failures and retries


@pytest.mark.timeout(30)
def test_retries_then_success(node, sink):
    sink.reply("/flaky", Reply(500, body="oops"), 500, 200)
    task_id = node.enqueue(url=f"{sink.url}/flaky", params={"a": "1"})["id"]
    reqs = sink.wait_for(count=3, path="/flaky")
    assert [r.headers["X-Task-Id"] for r in reqs] == [task_id] * 3
    assert [r.headers["X-Task-Retry-Count"] for r in reqs] == ["0", "1", "2"]
    assert [r.headers["X-Task-Execution-Count"] for r in reqs] == ["0", "1", "2"]
    assert "X-Task-Previous-Response" not in reqs[0].headers
    assert [r.headers["X-Task-Previous-Response"] for r in reqs[1:]] == ["500", "500"]
    assert all(r.body == b"a=1" for r in reqs)
    # backoff: 0.05 s then 0.1 s (+-10%); a retry may never come sooner
    assert reqs[1].time - reqs[0].time >= 0.05 * 0.9 - 0.005
    assert reqs[2].time - reqs[1].time >= 0.1 * 0.9 - 0.005
    t = node.wait_task_state(task_id, "succeeded")
    assert t["attempts"] == 3 and t["executions"] == 3
    assert t["last_response"]["status"] == 200
    assert sink.count("/flaky") == 3


@pytest.mark.timeout(30)
def test_retries_exhausted_then_manual_retry(node, sink):
    sink.reply("/down", Reply(503, headers={"X-Why": "maintenance"}, body="down for maintenance"))
    task_id = node.enqueue(url=f"{sink.url}/down", max_attempts=3)["id"]
    t = node.wait_task_state(task_id, "failed")
    assert t["attempts"] == 3 and t["executions"] == 3
    assert sink.count("/down") == 3  # ended: no fourth attempt can come
    wait_counts(node, failed=1)

    r = node.get("/queues/default/tasks", params={"state": "failed"})
    assert r.status_code == 200, r.text
    listed = {x["id"]: x for x in r.json()["tasks"]}
    assert task_id in listed
    last = listed[task_id]["last_response"]
    assert last["status"] == 503
    assert last["body"] == "down for maintenance"
    assert {k.lower(): v for k, v in last["headers"].items()}["x-why"] == "maintenance"
    assert listed[task_id]["state"] == "failed"
    assert node.get("/queues/default/tasks", params={"state": "bogus"}).status_code == 400

    sink.reply("/down", 200)
    r = node.post(f"/tasks/{task_id}/retry")
    assert r.status_code == 200, r.text
    req = sink.wait_for(count=4, path="/down")[3]
    assert req.headers["X-Task-Id"] == task_id
    assert req.headers["X-Task-Retry-Count"] == "0"  # a fresh set of attempts
    t = node.wait_task_state(task_id, "succeeded")
    assert t["last_response"]["status"] == 200
    wait_counts(node, succeeded=1)
    # a succeeded task cannot be retried
    assert node.post(f"/tasks/{task_id}/retry").status_code == 409
    assert node.post(f"/tasks/{uuid.uuid4()}/retry").status_code == 404


@pytest.mark.timeout(30)
def test_retry_after_is_honoured(node, sink):
    sink.reply("/busy", Reply(429, headers={"Retry-After": "1"}), 200)
    task_id = node.enqueue("patient", url=f"{sink.url}/busy")["id"]
    first, second = sink.wait_for(count=2, path="/busy")
    gap = second.time - first.time
    assert gap >= 1.0 - TOL, f"retried {gap:.3f}s after a Retry-After: 1 (backoff is 0.05 s)"
    assert second.headers["X-Task-Previous-Response"] == "429"
    assert node.wait_task_state(task_id, "succeeded")["attempts"] == 2


@pytest.mark.timeout(30)
def test_hanging_worker_times_out_and_is_retried(node, sink):
    sink.reply("/hang", Reply(200, delay=4))
    sink.reply("/hang-once", Reply(200, delay=4), 200)
    t0 = time.time()
    gave_up = node.enqueue(url=f"{sink.url}/hang", timeout=1, max_attempts=1)["id"]
    retried = node.enqueue(url=f"{sink.url}/hang-once", timeout=1)["id"]

    t = node.wait_task_state(gave_up, "failed", timeout=10)
    last = t["last_response"]
    assert last["status"] is None and last["error"], last
    assert t["attempts"] == 1 and t["executions"] == 0
    assert t["finished"] - t0 < 3.5, "the 1 s timeout was not enforced"

    first, second = sink.wait_for(count=2, path="/hang-once", timeout=10)
    assert second.headers["X-Task-Id"] == retried
    assert second.headers["X-Task-Retry-Count"] == "1"
    assert second.headers["X-Task-Execution-Count"] == "0"
    assert "X-Task-Previous-Response" not in second.headers  # no HTTP answer last time
    assert second.time - first.time < 3.5, "the retry waited for the hanging answer"
    t = node.wait_task_state(retried, "succeeded")
    assert t["attempts"] == 2 and t["executions"] == 1


@pytest.mark.timeout(30)
def test_connection_refused_is_a_failed_attempt(node):
    dead = f"http://127.0.0.1:{_closed_port()}/nobody"
    task_id = node.enqueue(url=dead, max_attempts=2)["id"]
    t = node.wait_task_state(task_id, "failed")
    assert t["attempts"] == 2 and t["last_response"]["error"]


def _closed_port() -> int:
    from helpers import free_port

    return free_port()


@pytest.mark.timeout(30)
def test_redirect_is_a_failed_attempt(node, sink):
    sink.reply("/moved", Reply(302, headers={"Location": f"{sink.url}/elsewhere"}))
    task_id = node.enqueue(url=f"{sink.url}/moved", max_attempts=1)["id"]
    t = node.wait_task_state(task_id, "failed")
    assert t["last_response"]["status"] == 302
    assert sink.count("/elsewhere") == 0


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


@pytest.mark.timeout(30)
def test_a_slow_success_is_not_retried(node, sink):
    """A 2xx that takes a while is one attempt (the success is not lost to the timeout
    accounting or a retry timer)."""
    sink.reply("/slow", Reply(202, delay=0.5))
    t = node.enqueue(url=f"{sink.url}/slow", timeout=3)
    got = node.wait_task_state(t["id"], "succeeded")
    assert got["attempts"] == 1 and sink.count("/slow") == 1


# ================================================================ 8-9: rate and concurrency


@pytest.mark.timeout(30)
def test_rate_limit_spaces_deliveries(node, sink):
    r = node.post("/queue/ratelimited/batch",
                  json=[{"url": f"{sink.url}/rated", "params": {"i": i}} for i in range(10)])
    assert r.status_code == 200, r.text
    reqs = sink.wait_for(count=10, path="/rated", timeout=15)
    span = reqs[-1].time - reqs[0].time
    # rate 5/s, burst 1: 9 intervals of 0.2 s after the first
    assert span >= 1.6, f"10 deliveries in {span:.3f}s at rate=5/s burst=1"
    assert len({x.headers["X-Task-Id"] for x in reqs}) == 10
    cfg = node.get("/queues/ratelimited").json()["config"]
    assert cfg["rate"] == 5 and cfg["burst"] == 1


@pytest.mark.timeout(30)
def test_max_concurrent_caps_requests_in_flight(node, sink):
    sink.reply("/slow", Reply(200, delay=0.5))
    r = node.post("/queue/narrow/batch", json=[{"url": f"{sink.url}/slow"} for _ in range(6)])
    assert r.status_code == 200, r.text
    sink.wait_for(count=6, path="/slow", timeout=15)
    sink.wait_idle()
    assert sink.max_inflight_by_path["/slow"] == 2, sink.max_inflight_by_path
    wait_counts(node, "narrow", succeeded=6)


# ================================================================ 10: queue control and cancel


@pytest.mark.timeout(30)
def test_pause_and_resume(node_factory, sink):
    node = node_factory(queues={"pq": {}})  # declared: a pause creates no queue
    r = node.post("/queues/pq/pause")
    assert r.status_code == 200, r.text
    assert node.get("/queues/pq").json()["paused"] is True
    ids = [node.enqueue("pq", url=f"{sink.url}/paused", params={"i": i})["id"] for i in range(3)]
    # they are due now; a paused queue holds them, while a task of another queue that
    # falls due after them is delivered (the positive control: they would have been too)
    marker = node.enqueue(url=f"{sink.url}/unpaused", countdown=0.5)["id"]
    sink.wait_for(count=1, path="/unpaused")
    node.wait_task_state(marker, "succeeded")
    assert all(node.task(i)["next_attempt"] < time.time() - 0.4 for i in ids)
    assert sink.count("/paused") == 0
    assert node.counts("pq")["scheduled"] == 3
    r = node.post("/queues/pq/resume")
    assert r.status_code == 200, r.text
    assert node.get("/queues/pq").json()["paused"] is False
    reqs = sink.wait_for(count=3, path="/paused")
    assert sorted(x.headers["X-Task-Id"] for x in reqs) == sorted(ids)


@pytest.mark.timeout(30)
def test_purge_cancels_scheduled_tasks(node, sink):
    ids = [node.enqueue("pg", url=f"{sink.url}/purged", countdown=1)["id"] for _ in range(3)]
    r = node.post("/queues/pg/purge")
    assert r.status_code == 200, r.text
    assert r.json().get("purged") == 3, r.json()
    for i in ids:
        assert node.task(i)["state"] == "cancelled"
    wait_counts(node, "pg", cancelled=3)
    # a marker due after them, in the same queue: once it arrived, they would have too
    marker = node.enqueue("pg", url=f"{sink.url}/marker", countdown=1.3)["id"]
    sink.wait_for(count=1, path="/marker")
    node.wait_task_state(marker, "succeeded")
    assert sink.count("/purged") == 0


@pytest.mark.timeout(30)
def test_cancel_a_task(node, sink):
    task_id = node.enqueue(url=f"{sink.url}/cancelled", countdown=1)["id"]
    r = node.delete(f"/tasks/{task_id}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and r.json()["id"] == task_id
    assert node.task(task_id)["state"] == "cancelled"
    r = node.delete(f"/tasks/{task_id}")  # idempotent
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert_error(node.delete(f"/tasks/{uuid.uuid4()}"), 404, "id")
    assert_error(node.get(f"/tasks/{uuid.uuid4()}"), 404, "id")

    marker = node.enqueue(url=f"{sink.url}/marker", countdown=1.3)["id"]
    sink.wait_for(count=1, path="/marker")
    node.wait_task_state(marker, "succeeded")
    assert sink.count("/cancelled") == 0
    assert node.task(task_id)["state"] == "cancelled"
    # an ended task cannot be cancelled
    r = node.delete(f"/tasks/{marker}")
    assert r.status_code == 409, r.text
    assert node.task(marker)["state"] == "succeeded"


@pytest.mark.timeout(30)
def test_purge_of_a_paused_queue_cancels_its_due_backlog(node_factory, sink):
    node = node_factory(queues={"held": {}})  # declared: a pause creates no queue
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


@pytest.mark.timeout(30)
def test_a_cancelled_due_task_is_not_delivered_and_a_sibling_task_is(node_factory, sink):
    """Cancelled while its queue holds it (due, in the ready line): never delivered, and
    a task enqueued after it in the same queue is (the positive control)."""
    node = node_factory(queues={"cq": {}})  # declared: a pause creates no queue
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


# ================================================================ 11: names


@pytest.mark.timeout(30)
def test_duplicate_names(node, sink):
    r1 = post_form(node, f"task.url={sink.url}/dup&task.name=order-1&task.countdown=1")
    assert r1.status_code == 200, r1.text
    first = r1.json()["id"]
    r2 = post_form(node, f"task.url={sink.url}/dup&task.name=order-1")
    assert r2.status_code == 409, r2.text
    assert r2.json() == {"status": "duplicate", "id": first} or (
        r2.json()["status"] == "duplicate" and r2.json()["id"] == first), r2.json()

    # the Idempotency-Key request header is the same thing
    r3 = node.post("/queue", json={"url": f"{sink.url}/dup2"}, headers={"Idempotency-Key": "k-9"})
    assert r3.status_code == 200, r3.text
    r4 = node.post("/queue", json={"url": f"{sink.url}/dup2"}, headers={"Idempotency-Key": "k-9"})
    assert r4.status_code == 409 and r4.json()["id"] == r3.json()["id"], r4.text
    r5 = node.post("/queue", json={"url": f"{sink.url}/dup2", "name": "k-9"})
    assert r5.status_code == 409 and r5.json()["id"] == r3.json()["id"], r5.text

    # names are per queue
    r6 = post_form(node, f"task.url={sink.url}/dup&task.name=order-1", path="/queue/other")
    assert r6.status_code == 200, r6.text

    # in a batch, a taken name is reported per item
    r7 = node.post("/queue/default/batch", json=[{"url": f"{sink.url}/b", "name": "order-1"},
                                                  {"url": f"{sink.url}/b", "name": "fresh"}])
    assert r7.status_code == 200, r7.text
    items = r7.json()["tasks"]
    assert items[0]["status"] == "duplicate" and items[0]["id"] == first
    assert items[1]["status"] == "scheduled"

    # the duplicate was never stored: one delivery of order-1 in the default queue
    node.wait_task_state(first, "succeeded")
    reqs = sink.requests("/dup")
    assert len([x for x in reqs if x.headers.get("X-Task-Name") == "order-1"
                and x.headers["X-Task-Queue"] == "default"]) == 1


# ================================================================ 12: callbacks


@pytest.mark.timeout(30)
def test_callbacks(node, sink):
    sink.reply("/bad", 500)
    ok = node.enqueue(url=f"{sink.url}/ok", callback=f"{sink.url}/cb-ok",
                      failure_callback=f"{sink.url}/cb-fail-wrong")["id"]
    bad = node.enqueue(url=f"{sink.url}/bad", max_attempts=1, callback=f"{sink.url}/cb-ok-wrong",
                       failure_callback=f"{sink.url}/cb-fail")["id"]
    (cb_ok,) = sink.wait_for(count=1, path="/cb-ok")
    (cb_fail,) = sink.wait_for(count=1, path="/cb-fail")
    for req, task_id, state, status in ((cb_ok, ok, "succeeded", 200), (cb_fail, bad, "failed", 500)):
        assert req.method == "POST"
        assert req.headers["Content-Type"].startswith("application/json")
        doc = req.json()
        assert doc["state"] == state
        assert doc["task"]["id"] == task_id
        assert doc["response"]["status"] == status
        assert req.headers.get("X-Task-Callback-For") == task_id
    # nothing else was spawned: ok + its callback + bad's callback succeeded, bad failed
    wait_counts(node, succeeded=3, failed=1)
    assert sink.count("/cb-ok-wrong") == 0 and sink.count("/cb-fail-wrong") == 0


# ================================================================ 13: batches


@pytest.mark.timeout(30)
def test_batch(node, sink):
    r = node.post("/queue/bq/batch", json=[{"url": f"{sink.url}/batch", "params": {"i": i}}
                                           for i in range(3)])
    assert r.status_code == 200, r.text
    items = r.json()["tasks"]
    assert [x["status"] for x in items] == ["scheduled"] * 3
    reqs = sink.wait_for(count=3, path="/batch")
    assert sorted(x.form["i"][0] for x in reqs) == ["0", "1", "2"]
    assert {x.headers["X-Task-Id"] for x in reqs} == {x["id"] for x in items}
    assert {x.headers["X-Task-Queue"] for x in reqs} == {"bq"}

    wait_counts(node, "bq", succeeded=3)
    before = total_counts(node)
    bad = [{"url": f"{sink.url}/never"}, {"url": "ftp://x/"}, {"url": f"{sink.url}/never"}]
    assert_error(node.post("/queue/bq2/batch", json=bad), 400, "tasks[1].url")
    assert_error(node.post("/queue/bq2/batch", json={"tasks": [{"url": f"{sink.url}/never"},
                                                               {"url": sink.url, "countdown": -1}]}),
                 400, "tasks[1].countdown")
    assert total_counts(node) == before
    assert node.get("/queues/bq2").status_code == 404  # a refused batch made no queue
    marker = node.enqueue("bq2", url=f"{sink.url}/marker")["id"]
    node.wait_task_state(marker, "succeeded")
    assert sink.count("/never") == 0


# ================================================================ 14-15: crashes and stops


@pytest.mark.timeout(60)
def test_kill_9_loses_nothing_and_duplicates_nothing(node_factory, sink):
    """Four clients enqueue concurrently; the node is killed (-9) the moment the 200th
    200 arrives, with requests still in flight. Every acknowledged task is delivered
    exactly once after the restart; unacknowledged ones at most once."""
    node = node_factory(queues={"frozen": {}})  # declared: a pause creates no queue
    named = node.enqueue(url=f"{sink.url}/later", name="kept-name", countdown=3600)["id"]
    assert node.post("/queues/frozen/pause").status_code == 200
    eta = time.time() + 5  # the same eta for all: none may be due before the kill
    acked: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()

    def client(k: int) -> None:
        with requests.Session() as s:
            i = 0
            while not stop.is_set():
                try:
                    r = s.post(node.url + "/queue", timeout=10,
                               json={"url": f"{sink.url}/durable", "params": {"c": k, "i": i},
                                     "eta": eta})
                except requests.RequestException:
                    return  # the node is gone
                i += 1
                if r.status_code == 200:
                    with lock:
                        acked.append(r.json()["id"])
                        if len(acked) >= 200:
                            enough.set()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    assert enough.wait(20), "could not enqueue 200 tasks"
    node.kill()  # kill -9 right after the 200th acknowledgement
    stop.set()
    for t in threads:
        t.join(15)
    assert time.time() < eta, "enqueueing took too long for this test's premise"
    assert sink.count("/durable") == 0
    with lock:
        acked_ids = set(acked)
    assert len(acked_ids) >= 200

    node.start().wait_ready()
    reqs = sink.wait_for(lambda rs: acked_ids <= {r.task_id for r in rs}, path="/durable",
                         timeout=30)
    # once nothing is live but the named task, no more deliveries can come
    wait_until(lambda: (lambda c: c["running"] == 0 and c["scheduled"] == 1)(node.counts()),
               timeout=15, what="all durable tasks to end")
    per_id = sink.by_task_id("/durable")
    assert acked_ids <= set(per_id), f"lost: {sorted(acked_ids - set(per_id))[:5]}"
    assert all(n == 1 for n in per_id.values()), {k: n for k, n in per_id.items() if n > 1}
    assert len(set(per_id) - acked_ids) <= 4  # at most the requests in flight at the kill
    assert min(x.time for x in sink.requests("/durable")) >= eta - TOL
    # what else the journal kept: a reserved name and a paused queue
    assert node.task(named)["state"] == "scheduled"
    r = node.post("/queue", json={"url": f"{sink.url}/later", "name": "kept-name"})
    assert r.status_code == 409 and r.json()["id"] == named, r.text
    assert node.get("/queues/frozen").json()["paused"] is True
    assert len(reqs) >= 200


@pytest.mark.timeout(60)
def test_sigterm_drains_in_flight_deliveries(node, sink):
    sink.reply("/slow", Reply(200, delay=1.0))
    ids = [node.enqueue(url=f"{sink.url}/slow", params={"i": i})["id"] for i in range(4)]
    sink.wait_for(count=4, path="/slow")  # all four in flight
    node.signal(signal.SIGTERM)

    # while it drains, it refuses new tasks with a 503 (or, once gone, connections)
    outcome = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            r = node.post("/queue", json={"url": f"{sink.url}/late", "countdown": 3600}, timeout=5)
        except requests.ConnectionError:
            outcome = "refused"
            break
        if r.status_code == 503:
            outcome = "503"
            assert r.json()["status"] == "error"
            break
        assert r.status_code == 200, r.text  # the signal may not have been handled yet
        time.sleep(0.01)
    assert outcome == "503", "no 503 while draining (the drain window is ~1 s)"

    assert node.wait_exit(15) == 0
    assert port_refuses(node.http_port)
    done = sink.requests("/slow")
    assert len(done) == 4 and all(x.done is not None for x in done)

    node.start().wait_ready()
    for i in ids:
        assert node.task(i)["state"] == "succeeded", node.task(i)
    marker = node.enqueue(url=f"{sink.url}/marker")["id"]
    sink.wait_for(count=1, path="/marker")
    node.wait_task_state(marker, "succeeded")
    assert sink.by_task_id("/slow") == {i: 1 for i in ids}, "a succeeded task was delivered again"


# ================================================================ 16: bad input


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory, request):
    """One node for the table of bad inputs (each case checks that nothing was stored)."""
    from helpers import ProcessRegistry

    base = tmp_path_factory.mktemp("shared")
    reg = ProcessRegistry()
    request.addfinalizer(reg.kill_all)
    proc = NodeProcess(base, "shared", config=write_node_config(base / "shared.ini"), registry=reg)
    proc.start()
    try:
        proc.wait_ready()
    except AssertionError:
        reg.kill_all()
        raise
    return proc


URL = "http://127.0.0.1:9/w"
J = {"Content-Type": "application/json"}

BAD_INPUTS = [
    # id, path, body (bytes, or an object sent as JSON), headers, status, field
    ("malformed-json", "/queue", b'{"url": ', J, 400, "body"),
    ("empty-json", "/queue", b"", J, 400, "body"),
    ("json-array", "/queue", [{"url": URL}], None, 400, "body"),
    ("json-string", "/queue", "http://x/", None, 400, "body"),
    ("countdown-abc", "/queue", {"url": URL, "countdown": "abc"}, None, 400, "countdown"),
    ("max-attempts-true", "/queue", {"url": URL, "max_attempts": True}, None, 400, "max_attempts"),
    ("params-list", "/queue", {"url": URL, "params": ["a", "b"]}, None, 400, "params"),
    ("headers-non-string", "/queue", {"url": URL, "headers": {"X-A": {"b": 1}}}, None, 400, "headers.X-A"),
    ("headers-list", "/queue", {"url": URL, "headers": ["X-A: 1"]}, None, 400, "headers"),
    ("missing-url", "/queue", {"params": {"a": 1}}, None, 400, "url"),
    ("missing-url-form", "/queue", b"foo=bar", {"Content-Type": FORM}, 400, "url"),
    ("ftp-url", "/queue", {"url": "ftp://example.com/x"}, None, 400, "url"),
    ("javascript-url", "/queue", {"url": "javascript:alert(1)"}, None, 400, "url"),
    ("url-too-long", "/queue", {"url": "http://a.example/" + "x" * 2067}, None, 400, "url"),
    ("negative-countdown", "/queue", {"url": URL, "countdown": -1}, None, 400, "countdown"),
    ("countdown-31-days", "/queue", {"url": URL, "countdown": 31 * 86400}, None, 400, "countdown"),
    ("eta-far-future", "/queue", {"url": URL, "eta": time.time() + 365 * 86400}, None, 400, "eta"),
    ("unknown-method", "/queue", {"url": URL, "method": "TRACE"}, None, 400, "method"),
    ("unknown-json-field", "/queue", {"url": URL, "colour": "red"}, None, 400, "colour"),
    ("unknown-form-key", "/queue", f"task.url={URL}&task.colour=red".encode(),
     {"Content-Type": FORM}, 400, "task.colour"),
    ("forbidden-header-json", "/queue", {"url": URL, "headers": {"Host": "evil"}}, None, 400, "headers.Host"),
    ("forbidden-header-form", "/queue", f"task.url={URL}&task.header.Host=evil".encode(),
     {"Content-Type": FORM}, 400, "headers.Host"),
    ("bad-queue-in-path", "/queue/bad.name", {"url": URL}, None, 400, "queue"),
    ("bad-queue-in-batch-path", "/queue/bad.name/batch", [{"url": URL}], None, 400, "queue"),
    ("queue-path-mismatch", "/queue/a", {"url": URL, "queue": "b"}, None, 400, "queue"),
    ("invalid-utf8-form", "/queue", b"task.url=http://127.0.0.1:9/w&foo=\xff\xfe",
     {"Content-Type": FORM}, 400, "body"),
    ("invalid-utf8-json", "/queue", b'{"url": "http://127.0.0.1:9/\xff"}', J, 400, "body"),
    ("lone-surrogate", "/queue", b'{"url": "http://127.0.0.1:9/w", "params": {"k": "\\ud800"}}',
     J, 400, "params.k"),
    ("lone-surrogate-body", "/queue", b'{"url": "http://127.0.0.1:9/w", "body": "\\udc00"}',
     J, 400, "body"),
    ("name-too-long", "/queue", {"url": URL, "name": "n" * 501}, None, 400, "name"),
    ("idempotency-key-too-long", "/queue", {"url": URL}, {"Idempotency-Key": "k" * 501}, 400,
     "Idempotency-Key"),
    ("timeout-zero", "/queue", {"url": URL, "timeout": 0}, None, 400, "timeout"),
    ("callback-ftp", "/queue", {"url": URL, "callback": "ftp://x/"}, None, 400, "callback"),
    ("json-and-body", "/queue", {"url": URL, "json": {}, "body": "x"}, None, 400, "json"),
    ("get-with-body", "/queue", {"url": URL, "method": "GET", "body": "x"}, None, 400, "body"),
    ("too-many-form-fields", "/queue",
     ("&".join(f"k{i}=1" for i in range(10001)) + f"&task.url={URL}").encode(),
     {"Content-Type": FORM}, 400, "body"),
    # ujson parses NaN, Infinity and 1e999 (= inf) but would deliver them as bare NaN/Inf,
    # which is not JSON
    ("json-nan", "/queue", b'{"url": "http://127.0.0.1:9/w", "json": NaN}', J, 400, "json"),
    ("json-infinity", "/queue", b'{"url": "http://127.0.0.1:9/w", "json": {"a": [Infinity]}}',
     J, 400, "json.a[0]"),
    ("json-minus-infinity", "/queue", b'{"url": "http://127.0.0.1:9/w", "json": {"b": -Infinity}}',
     J, 400, "json.b"),
    ("json-overflow", "/queue", b'{"url": "http://127.0.0.1:9/w", "json": [1e999]}', J, 400,
     "json[0]"),
    ("batch-json-nan", "/queue/q/batch", b'[{"url": "http://127.0.0.1:9/w", "json": NaN}]', J,
     400, "tasks[0].json"),
    ("form-json-nan", "/queue", f"task.url={URL}&task.json=NaN".encode(), {"Content-Type": FORM},
     400, "task.json"),
    ("batch-not-a-list", "/queue/q/batch", {"url": URL}, None, 400, "body"),
    ("batch-empty", "/queue/q/batch", [], None, 400, "body"),
    ("batch-bad-item", "/queue/q/batch", [{"url": URL}, 5], None, 400, "tasks[1]"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_a_4xx_naming_the_field(shared_node, case):
    _, path, body, headers, status, field = case
    before = total_counts(shared_node)
    if isinstance(body, bytes):
        r = shared_node.post(path, data=body, headers=headers or {})
    else:
        r = shared_node.post(path, data=json.dumps(body), headers={**J, **(headers or {})})
    assert_error(r, status, field)
    assert total_counts(shared_node) == before, "a rejected request stored something"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ctype", ["application/json", FORM])
def test_body_over_1_mib_is_413(shared_node, ctype):
    before = total_counts(shared_node)
    big = b"x" * (1024 * 1024 + 1)
    try:
        r = shared_node.post("/queue", data=big, headers={"Content-Type": ctype})
    except requests.ConnectionError as e:  # the server may answer before reading it all
        pytest.fail(f"the node dropped the connection instead of answering 413: {e}")
    assert_error(r, 413, "body")
    assert total_counts(shared_node) == before
    # a JSON task whose own body is just under the limit is fine
    ok = shared_node.post("/queue", json={"url": URL, "body": "y" * (1024 * 1024 - 200),
                                          "countdown": 3600})
    assert ok.status_code == 200, ok.text[:300]
    assert shared_node.delete(f"/tasks/{ok.json()['id']}").status_code == 200


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method,path,status", [
    ("GET", "/nope", 404), ("POST", "/nope", 404), ("GET", "/queue/a/b/c", 404),
    ("GET", "/tasks/", 404), ("GET", "/tasks/a/b", 404), ("GET", "/tasks/bad%20id", 404),
    ("GET", "/queue", 405), ("PUT", "/queue", 405), ("DELETE", "/queue/x", 405),
    ("GET", "/queue/x/batch", 405), ("DELETE", "/queues", 405), ("POST", "/tasks/abc", 405),
    ("GET", "/tasks/abc/retry", 405), ("POST", "/healthz", 405), ("GET", "/queues/q/pause", 405),
    ("PATCH", "/queues/q", 405), ("PATCH", "/tasks/abc", 405),
    ("DELETE", "/queues/q", 404), ("GET", "/queues/bad.name", 400),
    ("GET", "/queues/q/tasks?state=bogus", 400), ("GET", "/queues/q/tasks?limit=0", 400),
    ("GET", "/queues/q/tasks?limit=abc", 400),
])
def test_unknown_routes_and_wrong_methods(shared_node, method, path, status):
    r = shared_node.request(method, path)
    assert r.status_code == status, (r.status_code, r.text)
    assert r.json()["status"] == "error"


@pytest.mark.timeout(30)
def test_the_node_still_works_after_the_bad_inputs(shared_node, sink):
    r = shared_node.post("/queue", json={"url": f"{sink.url}/after"})
    assert r.status_code == 200, r.text
    sink.wait_for(count=1, path="/after")
    assert "Traceback" not in shared_node.log_text(), shared_node.log_text(80)


# ================================================================ 17: operations and the CLI


@pytest.mark.timeout(30)
def test_operations_endpoints(node):
    r = node.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["node"] == node.node_id
    r = node.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"

    qs = node.get("/queues").json()["queues"]
    names = {q["name"] for q in qs}
    assert {"default", "ratelimited", "narrow"} <= names
    q = node.get("/queues/narrow").json()
    assert q["name"] == "narrow" and q["paused"] is False
    assert q["config"]["max_concurrent"] == 2
    assert q["config"]["min_backoff"] == 0.05  # inherited from [queue:default]
    assert set(q["counts"]) == {"scheduled", "running", "succeeded", "failed", "cancelled",
                                "expired"}
    # a read makes no queue: it comes from the config or an enqueue
    assert_error(node.get("/queues/made-up"), 404, "queue")

    node.enqueue(url=URL, countdown=3600)
    assert node.counts()["scheduled"] == 1

    r = node.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert "miyamoto_tasks_stored_total 1" in r.text
    assert f'version="{__version__}"' in r.text

    r = node.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert spec.get("openapi", "").startswith("3") and "/queue" in spec["paths"]
    assert "/tasks/{id}" in spec["paths"] or any(p.startswith("/tasks/") for p in spec["paths"])

    r = node.get("/")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    # the dashboard's page is static: its script reads the API (its tests: test_dashboard*.py)
    assert "<html" in r.text.lower() and "/dashboard/dashboard.js" in r.text

    r = node.get("/cluster")
    assert r.status_code == 200
    info = r.json()
    assert info["leader"] == node.node_id
    assert [m["id"] for m in info["members"]] == [node.node_id]


@pytest.mark.timeout(60)
def test_cli_enqueue_status_task(node, sink):
    res = run_cli("enqueue", f"{sink.url}/cli", "foo=bar", "x=1", "--countdown", "0.5",
                  "--server", node.url)
    assert res.returncode == 0, res.stderr + res.stdout
    out = json.loads(res.stdout)
    assert out["status"] == "scheduled"
    (req,) = sink.wait_for(count=1, path="/cli")
    assert req.form == {"foo": ["bar"], "x": ["1"]}
    assert req.headers["X-Task-Id"] == out["id"]
    node.wait_task_state(out["id"], "succeeded")

    res = run_cli("task", out["id"], "--server", node.url)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "succeeded"

    res = run_cli("status", "--json", "--server", node.url)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    default = [q for q in status["queues"] if q["name"] == "default"][0]
    assert default["counts"]["succeeded"] == 1
    assert status["cluster"]["leader"] == node.node_id

    res = run_cli("task", str(uuid.uuid4()), "--server", node.url)
    assert res.returncode == 1
    res = run_cli("enqueue", "ftp://x/", "--server", node.url)
    assert res.returncode == 1 and "url" in res.stderr
    res = run_cli("enqueue", f"{sink.url}/cli", "novalue", "--server", node.url)
    assert res.returncode == 2
    res = run_cli("status", "--server", f"http://127.0.0.1:{_closed_port()}")
    assert res.returncode == 1 and "cannot reach" in res.stderr
    res = run_cli("enqueue", f"{sink.url}/cli", env={"MIYAMOTO_SERVER": node.url})
    assert res.returncode == 0, res.stderr
    res = run_cli("--version")
    assert res.returncode == 0 and __version__ in res.stdout


# ================================================================ 18: configurations


@pytest.mark.timeout(30)
def test_memory_data_dir(node_factory, sink, tmp_path):
    node = node_factory(data_dir=":memory:")
    answer = node.enqueue(url=f"{sink.url}/mem", params={"a": "b"})
    sink.wait_for(count=1, path="/mem")
    assert node.wait_task_state(answer["id"], "succeeded")["attempts"] == 1
    sink.reply("/mem-fail", 500)
    failed = node.enqueue(url=f"{sink.url}/mem-fail", max_attempts=2)["id"]
    node.wait_task_state(failed, "failed")
    wait_counts(node, succeeded=1, failed=1)
    assert not (tmp_path / ":memory:").exists()
    assert node.stop() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,env,culprit", [
    (["--replication", "0"], {}, "replication"),
    (["--replica-offset", "-1"], {}, "replica_offset"),
    ([], {"MIYAMOTO_HTTP": "nonsense"}, "http"),
    ([], {"MIYAMOTO_CLUSTER": "udp://x:1"}, "cluster"),
    (["--log-level", "loud"], {}, "log_level"),
    # the option, the form it takes and where the value came from; not int()'s words
    (["--replication", "two"], {},
     "bad option replication: must be a whole number >= 1, not 'two' (from --replication)"),
    ([], {"MIYAMOTO_REPLICATON": "3"}, "did you mean MIYAMOTO_REPLICATION?"),
])
def test_bad_config_exits_2_naming_the_option(tmp_path, args, env, culprit):
    res = run_cli("serve", "--data-dir", str(tmp_path / "d"), *args, env=env, timeout=20,
                  cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert culprit in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.timeout(60)
def test_bad_ini_exits_2(tmp_path):
    ini = tmp_path / "bad.ini"
    ini.write_text("[queue:default]\nmin_backoff = soon\n")
    res = run_cli("serve", "--config", str(ini), "--data-dir", str(tmp_path / "d"), timeout=20,
                  cwd=tmp_path)
    assert res.returncode == 2 and "queue:default.min_backoff" in res.stderr, res.stderr


@pytest.mark.timeout(30)
def test_http_port_taken_fails_cleanly(node, proc_registry, tmp_path):
    other = NodeProcess(tmp_path, "clash", http_port=node.http_port,
                        config=write_node_config(tmp_path / "clash.ini"), registry=proc_registry)
    other.start()
    assert other.wait_exit(20) != 0
    assert node.get("/healthz").status_code == 200
