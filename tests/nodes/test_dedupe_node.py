"""Content-based de-duplication against a real node and a real sink: a second task that
would send the same request is answered 409 with the first one's id and never delivered;
a task that differs in anything the target gets is a new task. JSON, form and batch."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from helpers import NodeProcess, Sink

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.timeout(60)
def test_json_twice_is_409_with_the_first_id(node: NodeProcess, sink: Sink) -> None:
    task = {"url": sink.url_for("/j"), "params": {"order": "42"},
            "headers": {"X-Shop": "a"}, "dedupe": "content"}
    first = node.post("/queue", json=task)
    assert first.status_code == 200, first.text
    first_id, name = first.json()["id"], first.json()["name"]
    assert name.startswith("content:")
    again = node.post("/queue", json=dict(task, headers={"x-shop": "a"}))  # case only
    assert again.status_code == 409, again.text
    assert again.json()["status"] == "duplicate" and again.json()["id"] == first_id
    other = node.post("/queue", json=dict(task, params={"order": "43"}))
    assert other.status_code == 200, other.text
    assert other.json()["id"] != first_id and other.json()["name"] != name
    reqs = sink.wait_for(count=2, path="/j")
    assert sorted(r.form["order"][0] for r in reqs) == ["42", "43"]
    assert {r.task_id for r in reqs} == {first_id, other.json()["id"]}
    assert reqs[0].headers["X-Task-Name"].startswith("content:")
    # delivered, the name still holds for the window
    node.wait_task_state(first_id, "succeeded")
    late = node.post("/queue", json=task)
    assert late.status_code == 409 and late.json()["id"] == first_id, late.text
    bad = node.post("/queue", json=dict(task, dedupe="body"))
    assert bad.status_code == 400 and bad.json()["field"] == "dedupe", bad.text
    both = node.post("/queue", json=dict(task, name="mine"))
    assert both.status_code == 400 and both.json()["field"] == "dedupe", both.text
    sink.wait_idle()
    assert sink.count("/j") == 2


@pytest.mark.timeout(60)
def test_form_twice_is_409_and_matches_json(node: NodeProcess, sink: Sink) -> None:
    url = sink.url_for("/f")
    body = urlencode([("task.url", url), ("task.dedupe", "content"), ("task.countdown", "30"),
                      ("a", "1"), ("b", "x"), ("b", "y")])
    first = node.post("/queue", data=body, headers=FORM)
    assert first.status_code == 200, first.text
    first_id = first.json()["id"]
    again = node.post("/queue", data=body, headers=FORM)
    assert again.status_code == 409 and again.json()["id"] == first_id, again.text
    # the same request written as JSON is the same task
    same = node.post("/queue", json={"url": url, "params": {"a": 1, "b": ["x", "y"]},
                                     "dedupe": "content"})
    assert same.status_code == 409 and same.json()["id"] == first_id, same.text
    differs = node.post("/queue", data=body.replace("a=1", "a=2"), headers=FORM)
    assert differs.status_code == 200 and differs.json()["id"] != first_id, differs.text
    bad = node.post("/queue", data=body.replace("dedupe=content", "dedupe=yes"), headers=FORM)
    assert bad.status_code == 400 and bad.json()["field"] == "dedupe", bad.text
    assert node.counts()["scheduled"] == 2


@pytest.mark.timeout(60)
def test_batch_answers_duplicates_by_content(node: NodeProcess, sink: Sink) -> None:
    url = sink.url_for("/b")
    first = node.enqueue(url=url, json={"n": 1}, dedupe="content")
    r = node.post("/queue/default/batch", json=[
        {"url": url, "json": {"n": 1}, "dedupe": "content"},
        {"url": url, "json": {"n": 2}, "dedupe": "content"}])
    assert r.status_code == 200, r.text
    dup, new = r.json()["tasks"]
    assert dup["status"] == "duplicate" and dup["id"] == first["id"], dup
    assert new["status"] == "scheduled" and new["id"] != first["id"], new
    reqs = sink.wait_for(count=2, path="/b")
    assert sorted(r.json()["n"] for r in reqs) == [1, 2]


@pytest.mark.timeout(30)
def test_client_retries_a_content_named_task_on_503() -> None:
    """The server names it, so sending it again stores it once: retried like a named one."""
    from miyamoto import Client
    from test_client_node import Scripted  # the scripted 503 server of the client's tests

    s = Scripted(503, 503, 200)
    try:
        with Client(s.url, timeout=10) as c:
            assert c.enqueue("http://127.0.0.1:9/w", {"a": "1"}, dedupe="content")["id"] == "abc"
        assert s.calls == 3 and all(b["dedupe"] == "content" for b in s.bodies)
    finally:
        s.close()
    s = Scripted(503, 200)  # a batch of content-named and named tasks
    try:
        with Client(s.url, timeout=10) as c:
            c.enqueue_batch([{"url": "http://127.0.0.1:9/w", "dedupe": "content"},
                             {"url": "http://127.0.0.1:9/w", "name": "b"}])
        assert s.calls == 2
    finally:
        s.close()
