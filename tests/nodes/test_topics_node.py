"""Fan-out topics on a real node: one task per URL, real deliveries (the parsing and
the expansion alone: tests/unit/definitions/test_topics.py)."""

from __future__ import annotations

import pytest

from helpers import NodeProcess, Sink

FORM = "application/x-www-form-urlencoded"


@pytest.mark.timeout(60)
def test_topic_of_three_urls_delivers_once_to_each(node: NodeProcess, sink: Sink) -> None:
    urls = [sink.url_for(f"/t{i}") for i in range(3)]
    r = node.request("PUT", "/topics/orders", json={"urls": urls})
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "orders", "urls": urls}
    assert node.get("/topics").json() == {"topics": [{"name": "orders", "urls": urls}]}
    assert node.get("/topics/orders").json()["urls"] == urls

    r = node.post("/queue", json={"topic": "orders", "params": {"n": "1"}, "name": "o1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "scheduled" and len(body["ids"]) == 3
    assert [t["url"] for t in body["tasks"]] == urls
    reqs = sink.wait_for(count=3, timeout=15)
    assert sorted(q.path for q in reqs) == ["/t0", "/t1", "/t2"]
    assert {q.headers["X-Task-Id"] for q in reqs} == set(body["ids"])
    assert all(q.form == {"n": ["1"]} for q in reqs)
    # the same name again: every URL's task is a duplicate
    again = node.post("/queue", json={"topic": "orders", "params": {"n": "1"}, "name": "o1"})
    assert again.status_code == 409 and again.json()["ids"] == body["ids"], again.text
    # the form API: task.topic instead of task.url
    r = node.post("/queue", data="task.topic=orders&x=2", headers={"Content-Type": FORM})
    assert r.status_code == 200 and len(r.json()["ids"]) == 3, r.text
    sink.wait_for(count=6, timeout=15)
    assert sink.count() == 6


@pytest.mark.timeout(30)
def test_topic_errors_name_the_field(node: NodeProcess, sink: Sink) -> None:
    r = node.post("/queue", json={"topic": "nope"})
    assert r.status_code == 404 and r.json()["field"] == "topic", r.text
    r = node.request("PUT", "/topics/t", json={"urls": [sink.url_for("/x")]})
    assert r.status_code == 200, r.text
    r = node.post("/queue", json={"topic": "t", "url": sink.url_for("/x")})
    assert r.status_code == 400 and r.json()["field"] == "topic", r.text
    r = node.post("/queue/default/batch", json=[{"topic": "t"}])
    assert r.status_code == 400 and r.json()["field"] == "tasks[0].topic", r.text
    r = node.request("PUT", "/topics/t", json={"urls": ["http://169.254.169.254/latest"]})
    assert r.status_code == 400 and r.json()["field"] == "urls[0]", r.text
    r = node.request("PUT", "/topics/t", json={"urls": [node.url + "/queue"]})
    assert r.status_code == 400 and r.json()["field"] == "urls[0]", r.text  # the node itself
    assert node.delete("/topics/t").status_code == 200
    assert node.get("/topics/t").status_code == 404
    assert node.delete("/topics/t").status_code == 404
    assert sink.count() == 0


@pytest.mark.timeout(60)
def test_client_and_cli_manage_topics(node: NodeProcess, sink: Sink) -> None:
    import json

    from helpers import run_cli
    from miyamoto import Client
    from miyamoto.client import InvalidTask, NotFound

    with Client(node.url) as c:
        assert c.put_topic("news", [sink.url_for("/n1")])["urls"] == [sink.url_for("/n1")]
        assert [t["name"] for t in c.topics()] == ["news"]
        out = c.publish("news", {"a": "1"})
        assert out["status"] == "scheduled" and len(out["ids"]) == 1
        with pytest.raises(InvalidTask) as e:
            c.put_topic("news", ["ftp://x/"])
        assert e.value.body["field"] == "urls[0]"
    env = {"MIYAMOTO_SERVER": node.url}
    r = run_cli("topic", "put", "cli", sink.url_for("/c1"), sink.url_for("/c2"), env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("topics", env=env)
    assert r.returncode == 0 and {t["name"] for t in json.loads(r.stdout)} == {"news", "cli"}
    r = run_cli("topic", "publish", "cli", "k=v", "--task-name", "once", env=env)
    assert r.returncode == 0 and len(json.loads(r.stdout)["ids"]) == 2, r.stderr
    ids = json.loads(r.stdout)["ids"]
    r = run_cli("topic", "publish", "cli", "k=v", "--task-name", "once", env=env)
    # was "the name is taken by task None": a fan-out's 409 names one task per URL
    assert r.returncode == 1 and r.stderr.strip() == \
        f"miyamoto: duplicate: the names are taken by tasks {ids[0]}, {ids[1]}", r.stderr
    sink.wait_for(count=3, timeout=15)
    assert sorted(q.path for q in sink.requests()) == ["/c1", "/c2", "/n1"]
    assert run_cli("topic", "delete", "cli", env=env).returncode == 0
    r = run_cli("topic", "show", "cli", env=env)
    assert r.returncode == 1 and "topic" in r.stderr, r.stderr
    with Client(node.url) as c, pytest.raises(NotFound):
        c.topic("cli")


@pytest.mark.timeout(60)
def test_scopes_reads_need_read_writes_need_admin(node_factory, sink: Sink) -> None:
    tokens = {"admin": "a" * 24, "enqueue": "e" * 24, "read": "r" * 24}
    node = node_factory("guarded", env={"MIYAMOTO_API_TOKENS": ",".join(
        f"{k}:{v}" for k, v in tokens.items())})

    def call(method: str, path: str, who: str | None, **kw):
        headers = {"Authorization": f"Bearer {tokens[who]}"} if who else {}
        return node.request(method, path, headers=headers, **kw).status_code

    body = {"urls": [sink.url_for("/s")]}
    assert call("PUT", "/topics/t", None, json=body) == 401
    assert call("PUT", "/topics/t", "read", json=body) == 403
    assert call("PUT", "/topics/t", "enqueue", json=body) == 403
    assert call("PUT", "/topics/t", "admin", json=body) == 200
    assert call("GET", "/topics", "read") == 200 and call("GET", "/schedules", "read") == 200
    sched = {"name": "s", "every": 60, "task": {"url": sink.url_for("/s")}}
    assert call("POST", "/schedules", "read", json=sched) == 403
    assert call("POST", "/schedules", "admin", json=sched) == 200
    assert call("POST", "/schedules/s/pause", "enqueue") == 403
    assert call("DELETE", "/topics/t", "read") == 403
    assert call("POST", "/queue", "enqueue", json={"topic": "t"}) == 200  # enqueue scope
