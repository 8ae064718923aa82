"""Content types of an enqueue, against a real node and a real sink.

JSON and form bodies are accepted; a JSON object without any Content-Type is taken as
JSON; anything else, including a misspelt JSON type and a form type carrying a JSON
object (curl -d without -H), is answered 415 naming the accepted types, with the hint
to send ``Content-Type: application/json`` when the body is a JSON object. The
original README's example (typo included) ends in that hint. The decision table alone:
tests/unit/http/test_mediatype.py.
"""

from __future__ import annotations

import json

import pytest

from helpers import NodeProcess

FORM = "application/x-www-form-urlencoded"
HINT = "Content-Type: application/json"


def task(sink, path: str) -> dict:
    return {"url": sink.url_for(path), "params": {"k": "v"}}


def post(node: NodeProcess, body: bytes, ctype: str | None, path: str = "/queue"):
    headers = {} if ctype is None else {"Content-Type": ctype}
    return node.post(path, data=body, headers=headers)


def assert_415(r, *, hint: bool) -> dict:
    assert r.status_code == 415, r.text
    assert r.headers["Content-Type"] == "application/json"
    err = r.json()
    assert err["status"] == "error" and err["field"] == "Content-Type"
    assert "application/json" in err["error"]
    if hint:
        assert HINT in err["error"], err
    else:
        assert FORM in err["error"], err
    return err


@pytest.mark.timeout(60)
def test_json_and_form_are_delivered(node: NodeProcess, sink) -> None:
    """The two accepted types, with parameters and in any case, end in deliveries."""
    for i, ctype in enumerate(["application/json", "Application/JSON; charset=utf-8",
                               "application/merge-patch+json"]):
        r = post(node, json.dumps(task(sink, f"/j{i}")).encode(), ctype)
        assert r.status_code == 200, (ctype, r.text)
    r = post(node, f"task.url={sink.url_for('/f')}&k=v".encode(), FORM + "; charset=utf-8")
    assert r.status_code == 200, r.text
    for path in ("/j0", "/j1", "/j2", "/f"):
        (req,) = sink.wait_for(count=1, path=path)
        assert req.body == b"k=v"


@pytest.mark.timeout(60)
def test_json_object_without_a_type_is_json(node: NodeProcess, sink) -> None:
    """No Content-Type and a JSON object: nothing to contradict, it is read as JSON."""
    r = post(node, json.dumps(task(sink, "/untyped")).encode(), None)
    assert r.status_code == 200, r.text
    (req,) = sink.wait_for(count=1, path="/untyped")
    assert req.body == b"k=v"


@pytest.mark.timeout(60)
def test_readme_example_with_its_typo_gets_the_hint(node: NodeProcess, sink) -> None:
    """The original README: -H 'Content-Type: applicatoin/json' -d '{...}' (sic)."""
    r = post(node, json.dumps(task(sink, "/readme")).encode(), "applicatoin/json")
    err = assert_415(r, hint=True)
    assert "applicatoin/json" in err["error"]
    assert node.counts("default")["scheduled"] == 0


@pytest.mark.timeout(60)
def test_wrong_types_get_415(node: NodeProcess, sink) -> None:
    """A JSON object with a wrong type gets the hint (including curl -d '{...}' without
    -H, which sends the form type); any other body names the accepted types. Nothing
    is stored."""
    body = json.dumps(task(sink, "/wrong")).encode()
    for ctype in ("text/plain", "text/json", "application/jsn", FORM, "application/json5",
                  "multipart/form-data; boundary=x"):
        assert_415(post(node, body, ctype), hint=True)
    for ctype, other in [("text/plain", b"hello"), ("application/xml", b"<task/>"),
                         ("multipart/form-data; boundary=x", b"--x\r\n\r\n--x--\r\n"),
                         ("application/octet-stream", b"\x00\x01"),
                         ("text/plain", b"task.url=http://127.0.0.1:9/")]:
        assert_415(post(node, other, ctype), hint=False)
    assert node.counts("default")["scheduled"] == 0


@pytest.mark.timeout(60)
def test_genuine_forms_are_never_reinterpreted(node: NodeProcess, sink) -> None:
    """A form post stays a form: one whose value is JSON is delivered as that param,
    one without url is still 400 'url is required', with or without a type."""
    payload = json.dumps({"a": 1})
    r = node.post("/queue", data={"task.url": sink.url_for("/formjson"), "doc": payload})
    assert r.status_code == 200, r.text
    (req,) = sink.wait_for(count=1, path="/formjson")
    assert req.form["doc"] == [payload]
    for ctype in (FORM, None):
        r = post(node, b"a=1&b=2", ctype)
        assert r.status_code == 400 and r.json()["field"] == "url", r.text


@pytest.mark.timeout(60)
def test_batch_type(node: NodeProcess, sink) -> None:
    """A batch is JSON: JSON or no type is accepted, any other type 415 with the hint."""
    body = json.dumps([task(sink, "/b1")]).encode()
    for ctype in ("text/plain", FORM, "applicatoin/json"):
        assert_415(post(node, body, ctype, "/queue/default/batch"), hint=True)
    assert post(node, body, None, "/queue/default/batch").status_code == 200
    assert post(node, body, "application/json", "/queue/default/batch").status_code == 200
    sink.wait_for(count=2, path="/b1")
