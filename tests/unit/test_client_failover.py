"""The client's failover and retry policy: which calls move to the next node on which
errors, against real local HTTP servers in this process that answer a scripted status
(or close the connection unanswered) and count the calls, and ports nothing listens on.
"""

from __future__ import annotations

import http.server
import json
import socket
import time
from typing import Any, Callable, Iterator

import pytest

from helpers import LocalServer
from miyamoto.client import Client, Unavailable, retry_policy

CLOSE = 0  # a "status": read the request, then close the connection without an answer
W = "http://127.0.0.1:9/w"


class Node(LocalServer):
    """A stand-in node: answers every request with ``status`` and counts them."""

    def __init__(self, status: int):
        self.status = status
        self.calls: list[tuple[str, str, Any]] = []
        this = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                this.calls.append((self.command, self.path, json.loads(self.rfile.read(n) or b"null")))
                if this.status == CLOSE:
                    self.close_connection = True
                    return
                body = (b'{"status":"scheduled","id":"abc"}' if this.status == 200 else
                        b'{"status":"error","error":"this node is not (yet) a member"}')
                self.send_response(this.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = _answer

        super().__init__(Handler)


def closed_port() -> str:
    """The URL of a port nothing listens on (the OS gave it, then it was closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def nodes() -> Iterator[Callable[[int], Node]]:
    made: list[Node] = []

    def make(status: int) -> Node:
        made.append(Node(status))
        return made[-1]

    yield make
    for n in made:
        n.close()


def test_the_policy_retries_what_never_arrived_always_and_the_rest_for_safe_calls():
    arrived, refused = Unavailable("503"), Unavailable("refused")
    refused.reached = False
    assert retry_policy(True, arrived) and retry_policy(True, refused)
    assert retry_policy(False, refused) and not retry_policy(False, arrived)


@pytest.mark.timeout(20)
def test_a_refused_connection_moves_every_call_to_the_next_node(nodes):
    ok = nodes(200)
    with Client([closed_port(), ok.url], timeout=5) as c:
        assert c.enqueue(W)["id"] == "abc"  # unnamed: safe here, nothing reached a node
        assert c.base_url == ok.url  # and it stays there
        c.pause("default")
        c.cluster()
    assert [call[:2] for call in ok.calls] == [("POST", "/queue"),
                                                ("POST", "/queues/default/pause"),
                                                ("GET", "/cluster")]


@pytest.mark.timeout(20)
def test_a_503_moves_safe_calls_only(nodes):
    busy, ok = nodes(503), nodes(200)
    with Client([busy.url, ok.url], timeout=5) as c:
        assert c.enqueue(W, name="n1")["id"] == "abc"
        c._at = 0
        assert c.enqueue(W, dedupe="content")["id"] == "abc"
        for call in (c.cluster, lambda: c.get("t1"), lambda: c.pause("q"), lambda: c.cancel("t1"),
                     lambda: c.purge("q"), lambda: c.retry("t1"), lambda: c.unschedule("s")):
            c._at = 0
            call()
        c._at = 0
        with pytest.raises(Unavailable) as e:  # unnamed: the 503 came after it was sent
            c.enqueue(W)
        assert e.value.status == 503 and "not (yet) a member" in e.value.message
        assert c.base_url == ok.url  # the next call starts at the node that answered
        c._at = 0
        with pytest.raises(Unavailable):  # a batch with one unnamed task is unnamed
            c.enqueue_batch([{"url": W, "name": "a"}, {"url": W}])
    assert len(busy.calls) == 11 and len(ok.calls) == 9


@pytest.mark.timeout(20)
def test_a_connection_closed_after_the_request_is_not_retried_for_an_unnamed_task(nodes):
    dropper, ok = nodes(CLOSE), nodes(200)
    with Client([dropper.url, ok.url], timeout=5) as c:
        with pytest.raises(Unavailable) as e:
            c.enqueue(W)
        assert e.value.reached and e.value.status is None
        assert not ok.calls
        c._at = 0
        assert c.enqueue(W, name="n")["id"] == "abc"
    assert len(dropper.calls) == 2 and len(ok.calls) == 1


@pytest.mark.timeout(20)
def test_attempts_are_bounded_and_only_a_revisit_waits(nodes):
    a, b = nodes(503), nodes(503)
    with Client([a.url, b.url], timeout=10, retries=5) as c, pytest.raises(Unavailable):
        c.get("t")
    assert len(a.calls) == 3 and len(b.calls) == 2
    start = time.monotonic()
    with Client([closed_port(), closed_port(), closed_port()], timeout=1.0) as c, \
            pytest.raises(Unavailable) as e:
        c.enqueue(W)
    assert not e.value.reached and "cannot reach" in e.value.message
    assert time.monotonic() - start < 1.3  # within the call's timeout, waits included


@pytest.mark.timeout(20)
def test_one_url_a_list_or_a_comma_string(nodes):
    ok = nodes(200)
    assert repr(Client(ok.url + "/")) == f"Client({ok.url!r})"
    c = Client(f"{closed_port()}, {ok.url}")
    assert len(c.urls) == 2 and c.cluster()["id"] == "abc"
    with pytest.raises(ValueError):
        Client([])
