"""What a task view shows of a task's request (``miyamoto.tasks.redact``): secrets
among the headers hidden by name, the body cut, a peer's view checked."""

from __future__ import annotations

import pytest

from miyamoto.tasks import redact
from miyamoto.tasks.task import Task

pytestmark = pytest.mark.timeout(30)


def test_secret_headers_are_redacted_by_name_and_the_rest_shown() -> None:
    headers = {"Authorization": "Bearer s3cret", "proxy-authorization": "Basic x",
               "Cookie": "sid=1", "X-Api-Key": "k", "X-Hub-Signature-256": "sha256=ab",
               "X-Auth-Token": "t", "Client-Secret": "c", "X-Trace": "visible",
               "Content-Language": "en"}
    t = Task(id="t1", queue="q", url="http://w/x", params={"a": "1"}, headers=headers,
             body="hello", content_type="text/plain")
    view = redact.request_view(t)
    assert view["headers"] == {**{k: redact.REDACTED for k in headers},
                               "X-Trace": "visible", "Content-Language": "en"}
    assert view["params"] == {"a": "1"}
    assert (view["body"], view["body_chars"], view["content_type"]) == ("hello", 5, "text/plain")
    assert "s3cret" not in repr(view)


def test_a_long_body_is_cut_and_its_length_told() -> None:
    t = Task(id="t1", queue="q", url="http://w/x", body="x" * (redact.BODY_CHARS + 10))
    view = redact.request_view(t)
    assert len(view["body"]) == redact.BODY_CHARS and view["body_chars"] == redact.BODY_CHARS + 10
    assert redact.shown(view) == view  # a view shown again is unchanged
    # 64 Ki characters are shown whole, one more is cut (a view fits one peer's REPLY)
    whole = Task(id="t2", queue="q", url="http://w/x", body="y" * 65536)
    assert redact.request_view(whole)["body"] == whole.body
    cut = redact.request_view(whole.evolve(body="y" * 65537))
    assert (len(cut["body"]), cut["body_chars"]) == (65536, 65537)


def test_a_peer_s_view_is_checked_and_redacted_again() -> None:
    got = redact.shown({"params": "x", "headers": {"Authorization": "b", "X": 1},
                        "body": 5, "content_type": []})
    assert got == {"params": {}, "headers": {}, "content_type": None, "body": None,
                   "body_chars": 0}
    got = redact.shown({"headers": {"Authorization": "Bearer leak"}, "body": "ab",
                        "body_chars": 1})
    assert got["headers"] == {"Authorization": redact.REDACTED} and got["body_chars"] == 2
    assert redact.shown(None)["headers"] == {}
