"""The Python client (``from miyamoto import Client``) against a real node and a real sink.

Every method, every exception, and the 503 retry (named tasks only), the last against
a tiny local HTTP server in this process that answers a scripted list of statuses and
counts the calls.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from helpers import REPO, LocalServer
from miyamoto import (Client, Conflict, DuplicateTask, Forbidden, InvalidTask, MiyamotoError,
                      NotFound, Unauthorized, Unavailable)

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
TOKENS = f"admin:{ADMIN},read:{READ}"


@pytest.fixture
def client(node) -> Iterator[Client]:
    with Client(node.url, timeout=10) as c:
        yield c


# ---------------------------------------------------------------- a scripted 503 server
class Scripted(LocalServer):
    """Answers POSTs with the next status of ``script`` (the last repeats), counting them."""

    def __init__(self, *script: int, retry_after: str | None = None):
        self.script = list(script)
        self.calls = 0
        self.bodies: list[Any] = []
        this = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                this.bodies.append(json.loads(self.rfile.read(n) or b"null"))
                status = this.script[min(this.calls, len(this.script) - 1)]
                this.calls += 1
                body = (b'{"status":"scheduled","id":"abc"}' if status == 200 else
                        b'{"status":"error","error":"stored on 1 of 2 replicas, 2 needed"}')
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if retry_after and status == 503:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


@pytest.fixture
def scripted(request: pytest.FixtureRequest):
    made: list[Scripted] = []

    def make(*script: int, **kw: Any) -> Scripted:
        s = Scripted(*script, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# ---------------------------------------------------------------- tests
@pytest.mark.timeout(30)
def test_import_stays_light():
    code = ("import miyamoto, sys; assert 'gevent' not in sys.modules; "
            "assert 'requests' not in sys.modules; "
            "from miyamoto import Client; "
            "assert 'gevent' not in sys.modules and 'zmq' not in sys.modules, sorted(sys.modules)")
    cp = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=20)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.timeout(60)
def test_enqueue_get_tasks_cancel_and_errors(client, node, sink):
    answer = client.enqueue(f"{sink.url}/w", {"a": "1", "tag": ["x", "y"]},
                            headers={"X-Foo": "bar"}, max_attempts=3, timeout=5)
    assert answer["status"] == "scheduled"
    (req,) = sink.wait_for(count=1, path="/w")
    assert req.form == {"a": ["1"], "tag": ["x", "y"]}
    assert req.headers["X-Foo"] == "bar" and req.task_id == answer["id"]
    node.wait_task_state(answer["id"], "succeeded")
    got = client.get(answer["id"])
    assert got["state"] == "succeeded" and got["max_attempts"] == 3 and got["timeout"] == 5

    later = [client.enqueue(f"{sink.url}/later", countdown=60)["id"] for _ in range(3)]
    listed = [t["id"] for t in client.tasks("default", "scheduled", 10)]
    assert set(later) <= set(listed)
    assert [t["id"] for t in client.tasks(state="succeeded")] == [answer["id"]]
    assert client.cancel(later[0])["state"] == "cancelled"
    assert client.get(later[0])["state"] == "cancelled"
    with pytest.raises(Conflict):  # an ended task cannot be cancelled again
        client.cancel(answer["id"])

    first = client.enqueue(f"{sink.url}/n", name="once", countdown=60)
    with pytest.raises(DuplicateTask) as dup:
        client.enqueue(f"{sink.url}/n", name="once", countdown=60)
    assert dup.value.id == first["id"] and dup.value.status == 409

    with pytest.raises(InvalidTask) as bad:
        client.enqueue("ftp://example.com/")
    assert bad.value.field == "url" and bad.value.status == 400
    with pytest.raises(InvalidTask) as bad:
        client.enqueue(f"{sink.url}/w", json={"x": 1}, params={"a": 1})
    assert bad.value.field == "params"
    with pytest.raises(InvalidTask) as bad:
        client.enqueue_batch([{"url": f"{sink.url}/b"}, {"url": "nope"}], queue="default")
    assert bad.value.field == "tasks[1].url"
    with pytest.raises(NotFound):
        client.get("no-such-task")
    with pytest.raises(InvalidTask) as bad:
        client.tasks(state="bogus")
    assert bad.value.field == "state"

    results = client.enqueue_batch([{"url": f"{sink.url}/b", "params": {"i": i}}
                                    for i in range(5)] + [{"url": f"{sink.url}/b", "name": "once"}],
                                   queue="default")
    assert [r["status"] for r in results] == ["scheduled"] * 5 + ["duplicate"]
    assert results[-1]["id"] == first["id"]
    reqs = sink.wait_for(count=5, path="/b")
    assert sorted(r.form["i"][0] for r in reqs) == [str(i) for i in range(5)]

    info = client.cluster()
    assert info["leader"] == node.node_id and [m["id"] for m in info["members"]] == [node.node_id]
    assert "Traceback" not in node.log_text()


@pytest.mark.timeout(60)
def test_retry_pause_resume_purge(client, node, sink):
    sink.reply("/flaky", 500, 200)
    failed = client.enqueue(f"{sink.url}/flaky", max_attempts=1)["id"]
    node.wait_task_state(failed, "failed")
    assert [t["id"] for t in client.tasks(state="failed")] == [failed]
    assert client.retry(failed)["id"] == failed
    node.wait_task_state(failed, "succeeded")
    assert sink.count("/flaky") == 2

    client.enqueue(f"{sink.url}/later", queue="held", countdown=600)  # a pause makes no queue
    assert client.pause("held")["action"] == "pause"
    assert client.queue("held")["paused"] is True
    held = client.enqueue(f"{sink.url}/held", queue="held")["id"]
    # a task of another queue, enqueued after it, arrives; the paused one does not
    client.enqueue(f"{sink.url}/marker")
    sink.wait_for(count=1, path="/marker")
    assert sink.count("/held") == 0 and client.get(held)["state"] == "scheduled"
    assert client.resume("held")["action"] == "resume"
    sink.wait_for(count=1, path="/held")
    assert [q["paused"] for q in client.queues() if q["name"] == "held"] == [False]

    for _ in range(3):
        client.enqueue(f"{sink.url}/never", queue="purged", countdown=60)
    assert client.purge("purged")["purged"] == 3
    assert client.queue("purged")["counts"]["scheduled"] == 0


@pytest.mark.timeout(60)
def test_tokens_unauthorized_and_forbidden(node_factory, sink):
    n = node_factory("guarded", env={"MIYAMOTO_API_TOKENS": TOKENS})
    with Client(n.url, timeout=10) as anon, Client(n.url, token="wrong-token-0123456789") as bad, \
            Client(n.url, token=READ) as reader, Client(n.url, token=ADMIN) as admin:
        with pytest.raises(Unauthorized) as e:
            anon.cluster()
        assert e.value.status == 401 and "missing" in e.value.message
        with pytest.raises(Unauthorized):
            bad.enqueue(f"{sink.url}/t")
        with pytest.raises(Forbidden) as f:
            reader.enqueue(f"{sink.url}/t")
        assert f.value.status == 403 and "read" in f.value.message
        with pytest.raises(Forbidden):
            reader.pause("default")
        assert reader.cluster()["leader"] == n.node_id
        tid = admin.enqueue(f"{sink.url}/t")["id"]
        sink.wait_for(count=1, path="/t")
        assert reader.get(tid)["id"] == tid
        assert ADMIN not in repr(admin)
    assert ADMIN not in n.log_text() and READ not in n.log_text()


@pytest.mark.timeout(60)
def test_unavailable_from_a_node_that_stopped(node, sink):
    with Client(node.url, timeout=3) as c:
        c.enqueue(f"{sink.url}/one")
        node.stop()
        for call in (lambda: c.enqueue(f"{sink.url}/two"), c.cluster,
                     lambda: c.enqueue(f"{sink.url}/three", name="named")):
            with pytest.raises(Unavailable) as e:
                call()
            assert e.value.status is None and "cannot reach" in e.value.message
            assert isinstance(e.value, MiyamotoError)


@pytest.mark.timeout(30)
def test_503_is_retried_for_named_tasks_only(scripted):
    s = scripted(503, 503, 200)
    with Client(s.url, timeout=10) as c:
        assert c.enqueue("http://127.0.0.1:9/w", name="n1")["id"] == "abc"
    assert s.calls == 3 and all(b["name"] == "n1" for b in s.bodies)

    s = scripted(503, 200)
    with Client(s.url, timeout=10) as c, pytest.raises(Unavailable) as e:
        c.enqueue("http://127.0.0.1:9/w")
    assert s.calls == 1 and e.value.status == 503 and "replicas" in e.value.message

    s = scripted(503, 200)  # a batch is retried only when every task in it is named
    with Client(s.url, timeout=10) as c:
        c.enqueue_batch([{"url": "http://127.0.0.1:9/w", "name": "a"},
                         {"url": "http://127.0.0.1:9/w", "name": "b"}])
    assert s.calls == 2
    s = scripted(503, 200)
    with Client(s.url, timeout=10) as c, pytest.raises(Unavailable):
        c.enqueue_batch([{"url": "http://127.0.0.1:9/w", "name": "a"},
                         {"url": "http://127.0.0.1:9/w"}])
    assert s.calls == 1


@pytest.mark.timeout(30)
def test_503_retries_are_bounded_in_count_and_time(scripted):
    s = scripted(503)
    with Client(s.url, timeout=10, retries=4) as c, pytest.raises(Unavailable):
        c.enqueue("http://127.0.0.1:9/w", name="n")
    assert s.calls == 4

    s = scripted(503, retry_after="1")  # each wait is at least 1 s: the timeout comes first
    start = time.monotonic()
    with Client(s.url, timeout=1.5, retries=100) as c, pytest.raises(Unavailable):
        c.enqueue("http://127.0.0.1:9/w", name="n")
    took = time.monotonic() - start
    assert took < 1.6 and s.calls == 2, (took, s.calls)


@pytest.mark.timeout(60)
def test_a_client_of_three_nodes_fails_over_when_one_is_killed(cluster_factory, sink):
    nodes = cluster_factory(3)
    with Client([n.url for n in nodes], timeout=10) as c:
        c.enqueue(f"{sink.url}/before", name="before")
        nodes[0].kill()
        c._at = 0  # start at the dead node: a refused connection, for named and unnamed
        ids = [c.enqueue(f"{sink.url}/named", name=f"t{i}")["id"] for i in range(10)]
        c._at = 0
        ids.append(c.enqueue(f"{sink.url}/unnamed")["id"])
        assert c.base_url != nodes[0].url
        c._at = 0
        assert c.get(ids[0])["id"] == ids[0] and c.cluster()["leader"]
    sink.wait_for(count=10, path="/named", timeout=20)
    sink.wait_for(count=1, path="/unnamed", timeout=20)
