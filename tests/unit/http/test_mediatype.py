"""Which body an enqueue carries (``miyamoto.http.mediatype``): the decision table, without
a node. The same answers from a real node: tests/nodes/test_content_types.py."""

from __future__ import annotations

import pytest

from miyamoto.http.mediatype import ACCEPTED, FORM, HINT, JSON, check_batch, enqueue_kind, \
    is_json_type, media_type
from miyamoto.tasks.validate import ValidationError

pytestmark = pytest.mark.timeout(10)

OBJ = b' {"url": "http://127.0.0.1:9/"}'


def test_media_type_is_bare_and_lower_case() -> None:
    assert media_type(" Application/JSON ; charset=utf-8") == "application/json"
    assert media_type("") == ""
    assert is_json_type("application/json") and is_json_type("application/cloudevents+json")
    assert not is_json_type("text/json+json") and not is_json_type("application/jsonx")
    assert not is_json_type("application/x-json-stream")


def test_enqueue_kind_rules() -> None:
    assert enqueue_kind("application/json", b"[1]") == JSON  # 400 later
    assert enqueue_kind("Application/JSON; charset=utf-8", b"") == JSON
    assert enqueue_kind("application/cloudevents+json", OBJ) == JSON
    assert enqueue_kind("", OBJ) == JSON
    assert enqueue_kind("", b"task.url=x") == FORM
    assert enqueue_kind("", b"") == FORM
    assert enqueue_kind("", b"[1, 2]") == FORM  # not an object: a form, as before
    assert enqueue_kind("", b"{not json") == FORM
    assert enqueue_kind("", b'{"a": "\xff"}') == FORM  # not UTF-8: not JSON
    assert enqueue_kind(FORM, b"a={b}") == FORM
    assert enqueue_kind(FORM + "; charset=utf-8", b"a=b") == FORM
    assert enqueue_kind(FORM, b"{not json") == FORM


@pytest.mark.parametrize("ctype,body,hint", [
    (FORM, OBJ, True), ("applicatoin/json", OBJ, True), ("multipart/form-data", OBJ, True),
    ("text/plain", b"x", False), ("text/plain", b"", False),
    ("multipart/form-data", b"a=b", False)])
def test_any_other_type_is_415_naming_what_to_send(ctype: str, body: bytes, hint: bool) -> None:
    with pytest.raises(ValidationError) as e:
        enqueue_kind(ctype, body)
    assert e.value.status == 415 and e.value.field == "Content-Type"
    assert repr(ctype) in e.value.message
    assert (HINT in e.value.message) == hint and (ACCEPTED in e.value.message) != hint


def test_a_batch_is_json() -> None:
    for ok in ("", "application/json", "application/json; charset=utf-8", "application/x+json"):
        check_batch(ok)
    for bad in (FORM, "text/plain", "applicatoin/json"):
        with pytest.raises(ValidationError) as e:
            check_batch(bad)
        assert e.value.status == 415 and e.value.field == "Content-Type"
        assert HINT in e.value.message
