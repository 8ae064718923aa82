"""Queue settings through the API on one real node in process
(``miyamoto.cluster.queuesettings``, ``Node.put_queue``): the API's values over the
INI's over the defaults, in effect at once; a pause on its edge only; POST pause and
resume kept in step with the settings; DELETE back to the config's; all of it read back
after a restart; a peer's value that does not fit left out. The real 3-node run:
tests/nodes/test_queue_settings_node.py."""

from __future__ import annotations

import io
import secrets
from pathlib import Path
from typing import Any, Iterator

import pytest
import ujson

from dispatchkit import wait_for
from miyamoto.config.settings import load
from miyamoto.definitions.messages import Entry
from miyamoto.node import Node

pytestmark = pytest.mark.timeout(60)

ADMIN, ENQ = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
INI = "[queue:default]\nmax_attempts = 7\n[queue:mail]\nrate = 3\n"


def _node(tmp_path: Path) -> Node:
    ini = tmp_path / "m.ini"
    ini.write_text(INI)
    cfg = load(str(ini), env={}, flags={
        "data_dir": str(tmp_path / "data"), "http": "127.0.0.1:0",
        "api_tokens": f"admin:{ADMIN},enqueue:{ENQ}", "shutdown_timeout": 1})
    node = Node(cfg)
    node.start()
    # a cluster of one leads its definitions a loop turn or two after it starts
    wait_for(lambda: node.definitions.machine.ready, 10)
    return node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = _node(tmp_path)
    yield n
    n.stop()


def call(node: Node, method: str, path: str, body: Any = None,
         token: str = ADMIN) -> tuple[int, Any]:
    data = b"" if body is None else ujson.dumps(body).encode()
    seen: dict[str, Any] = {}
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "",
               "wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data)),
               "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": f"Bearer {token}"}
    out = b"".join(node.api(environ, lambda s, h: seen.setdefault("status", int(s[:3]))))
    return seen["status"], ujson.loads(out)


def test_a_put_overrides_the_ini_at_once_and_says_where_each_value_comes_from(node) -> None:
    status, body = call(node, "PUT", "/queues/mail", {"burst": 9, "max_concurrent": 3})
    assert status == 200, body
    assert (body["config"]["rate"], body["config"]["burst"], body["limit"]) == (3.0, 9, 3)
    status, got = call(node, "GET", "/queues/mail")
    assert status == 200 and got["config"] == body["config"]
    assert {k: got["sources"][k] for k in ("rate", "burst", "max_attempts", "timeout")} == \
        {"rate": "config", "burst": "api", "max_attempts": "config", "timeout": "default"}
    q = node.engine.dispatcher.queue("mail")  # the delivery path reads these
    assert (q.bucket.burst, q.limit, node.engine.queue_config("mail").burst) == (9, 3, 9)
    status, body = call(node, "PUT", "/queues/mail", {"rate": 8, "burst": None})
    assert status == 200 and (body["config"]["rate"], body["config"]["burst"]) == (8.0, 100)
    assert body["sources"]["burst"] == "default" and body["config"]["max_concurrent"] == 3
    assert q.bucket.rate == 8.0 and q.bucket.burst == 100


def test_bad_settings_and_weak_tokens_are_refused(node) -> None:
    for body, field in [({"rate": -1}, "rate"), ({"nope": 1}, "nope"), ([1], "body"),
                        ({"max_backoff": 0.1}, "max_backoff")]:  # below min_backoff 0.5
        status, got = call(node, "PUT", "/queues/mail", body)
        assert (status, got.get("field")) == (400, field), got
    status, got = call(node, "PUT", "/queues/bad%name", {})
    assert (status, got["field"]) == (400, "queue")
    for method in ("PUT", "DELETE"):
        status, got = call(node, method, "/queues/mail", {}, token=ENQ)
        assert status == 403, got
    status, got = call(node, "DELETE", "/queues/mail")  # no settings made: nothing to drop
    assert status == 404 and "has no settings made through the API" in got["error"]
    assert node.definitions.machine.items("queue") == []


def test_a_put_makes_a_queue_and_a_delete_gives_the_configs_back(node) -> None:
    assert call(node, "POST", "/queues/made/pause")[0] == 404  # a control makes none
    status, body = call(node, "PUT", "/queues/made", {"paused": True, "timeout": 2})
    assert status == 200 and body["paused"] is True and body["sources"]["paused"] == "api"
    assert node.engine.dispatcher.summary("made")[1] is True
    assert [q["name"] for q in node.queues(100)["queues"]] == ["default", "made", "mail"]
    status, body = call(node, "DELETE", "/queues/made")
    assert status == 200 and body["paused"] is False and body["config"]["timeout"] == 30.0
    assert set(body["sources"].values()) <= {"config", "default"}
    assert node.engine.dispatcher.summary("made")[1] is False  # its pause went with it


def test_a_pause_follows_its_edge_and_post_pause_keeps_the_settings_in_step(node) -> None:
    call(node, "PUT", "/queues/mail", {"paused": True})
    assert node.engine.dispatcher.summary("mail")[1] is True
    assert call(node, "POST", "/queues/mail/resume")[0] == 200
    assert node.definitions.machine.get("queue", "mail") == {"paused": False}
    call(node, "PUT", "/queues/mail", {"rate": 2})  # another setting: no pause
    assert node.engine.dispatcher.summary("mail")[1] is False
    # a queue without API settings: POST pause is the node's, and GET says so
    assert call(node, "POST", "/queues/default/pause")[0] == 200
    assert node.definitions.machine.get("queue", "default") is None
    assert call(node, "GET", "/queues/default")[1]["sources"]["paused"] == "control"
    call(node, "PUT", "/queues/other", {"burst": 2})  # a change elsewhere undoes no pause
    assert node.engine.dispatcher.summary("default")[1] is True


def test_the_settings_survive_a_restart(tmp_path: Path) -> None:
    node = _node(tmp_path)
    try:
        call(node, "PUT", "/queues/kept", {"paused": True, "max_attempts": 2})
        call(node, "PUT", "/queues/mail", {"rate": 6})
    finally:
        node.stop()
    node = _node(tmp_path)
    try:
        assert node.engine.dispatcher.summary("kept")[1] is True
        assert node.engine.queue_config("kept").max_attempts == 2
        assert node.engine.queue_config("mail").rate == 6.0
        status, got = call(node, "GET", "/queues/kept")
        assert status == 200 and got["sources"]["max_attempts"] == "api"
    finally:
        node.stop()


def test_a_peers_setting_that_does_not_fit_is_left_out(node, caplog) -> None:
    m = node.definitions.machine
    m.entries[("queue", "evil")] = Entry("queue", "evil", m.dterm, 10 ** 6,
                                         {"rate": -5, "shell": "rm -rf"})
    m.entries[("queue", "fine")] = Entry("queue", "fine", m.dterm, 10 ** 6 + 1, {"burst": 4})
    node.cluster.queue_settings.apply(m.items("queue"))
    assert node.engine.api_settings("evil") is None and "evil" not in node.engine.queues
    assert node.engine.queue_config("fine").burst == 4
    assert "the settings of evil do not fit" in caplog.text
