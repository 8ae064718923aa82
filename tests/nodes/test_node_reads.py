"""Reads served in-process (the WSGI app, the node, the engine) over an in-memory
journal and a stub cluster: reading a queue creates no queue state. (The dashboard's
"last heard" column is tested in a browser: tests/nodes/test_dashboard_browser.py.)"""

from __future__ import annotations

import io
from typing import Any

import pytest
import ujson

from miyamoto.config import settings as config_mod
from miyamoto.node import Node
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)


class StubCluster:
    """The slice of ``Cluster`` the read routes use, answered from this node alone."""

    def __init__(self, node: Node, members: list[dict[str, Any]]):
        self.node = node
        self.members = members
        self.queries = self  # the node asks the cluster's queries role

    def queue_counts(self) -> dict[str, dict[str, int]]:
        return self.node.engine.queue_counts(primary_only=True)

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]:
        return [t.summary() for t in self.node.engine.list(queue, state, limit)]

    def blocked(self) -> dict[str, list[dict[str, str]]]:
        return {}  # no ordering key is held by a failed task in these reads

    def info(self) -> dict[str, Any]:
        return {"node": self.node.node_id, "leader": self.node.node_id, "term": 4,
                "members": self.members}


@pytest.fixture
def node():
    cfg = config_mod.load(env={}, flags={"data_dir": ":memory:", "node": "a"})
    n = Node(cfg)
    n.journal.open()
    n.cluster = StubCluster(n, [
        {"id": "a", "http": "127.0.0.1:1", "cluster": "tcp://127.0.0.1:2", "last_heard": 0.0},
        {"id": "b", "http": "127.0.0.1:3", "cluster": "tcp://127.0.0.1:4", "last_heard": 2.5},
        {"id": "c", "http": "127.0.0.1:5", "cluster": "tcp://127.0.0.1:6", "last_heard": None},
        {"id": "d", "http": "127.0.0.1:7", "cluster": "tcp://127.0.0.1:8", "last_heard": 754.2},
    ])
    yield n
    n.journal.close()


def get(node: Node, path: str, query: str = "") -> tuple[str, bytes]:
    """GET ``path`` through the node's WSGI app; (status line, body)."""
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list) -> None:
        seen["status"] = status

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
               "wsgi.input": io.BytesIO(b"")}
    body = b"".join(node.api(environ, start_response))
    return seen["status"], body


# ================================================================ reads create no queue state


def test_engine_queue_config_of_an_unknown_queue_creates_nothing(node):
    q = node.engine.queue_config("made-up")
    assert q.name == "made-up" and q.max_attempts == node.config.queue("default").max_attempts
    assert "made-up" not in node.engine.dispatcher.queues
    assert "made-up" not in node.engine.queue_counts()


def test_engine_queue_config_of_a_queue_in_use_is_its_states(node):
    node.engine.dispatcher.submit("busy", "some-task")  # a due task gives the queue state
    assert node.engine.queue_config("busy") is node.engine.dispatcher.queues["busy"].config


@pytest.mark.parametrize("path,query", [
    ("/queues/made-up", ""), ("/queues/made-up/tasks", "state=scheduled"),
    ("/queues/made-up/tasks", "state=failed"), ("/queues", ""), ("/", ""),
])
def test_reading_a_queue_through_the_api_creates_nothing(node, path, query):
    status, _ = get(node, path, query)
    assert status.startswith("404" if path == "/queues/made-up" else "200"), status
    assert "made-up" not in node.engine.dispatcher.queues
    _, body = get(node, "/queues")
    assert "made-up" not in {q["name"] for q in ujson.loads(body)["queues"]}


def test_an_unknown_queue_is_a_404_and_an_unused_one_answers_its_config(node):
    status, body = get(node, "/queues/made-up")
    assert status.startswith("404") and ujson.loads(body)["field"] == "queue"
    node.engine.queues.admit("unused", 0.0)  # made by an enqueue whose task has gone
    status, body = get(node, "/queues/unused")
    q = ujson.loads(body)
    assert status.startswith("200") and q["name"] == "unused" and q["paused"] is False
    assert q["config"]["max_attempts"] == node.config.queue("default").max_attempts
    assert sum(q["counts"].values()) == 0


def test_a_queue_with_tasks_is_listed(node):
    node.engine.add(Task(id="t1", queue="real", url="http://w.example/", eta=1e12,
                         fire_at=1e12, created=1.0))
    _, body = get(node, "/queues")
    queues = {q["name"]: q for q in ujson.loads(body)["queues"]}
    assert queues["real"]["counts"]["scheduled"] == 1
