"""miyamoto.tasks.dedupe: content names, pure (no processes): same request, same name; any
difference in what the target gets, a different name; and the hashed request is the one
delivery.build_request actually sends."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
import ujson

from miyamoto.tasks import dedupe
from miyamoto.delivery.attempt import build_request
from miyamoto.tasks.validate import Limits, ValidationError, build_task, parse_batch, parse_enqueue

NOW = 1_700_000_000.0
URL = "http://worker.example:9099/hook"
BASE = {"url": URL, "params": {"a": "1", "b": ["x", "y"]}, "dedupe": "content"}


def name_of(fields: dict, key: str | None = None) -> str | None:
    return build_task(fields, path_queue=None, idempotency_key=key, limits=Limits(),
                      now=NOW).name


def rejects(fields: dict, key: str | None = None) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        name_of(fields, key)
    assert info.value.field == "dedupe" and info.value.status == 400, info.value
    return info.value


@pytest.mark.timeout(10)
def test_same_content_same_name_and_its_shape():
    one, two = name_of(BASE), name_of(dict(BASE))
    assert one == two and one.startswith("content:") and len(one) == len("content:") + 64
    assert int(one[len("content:"):], 16) >= 0  # hex
    assert name_of({k: v for k, v in BASE.items() if k != "dedupe"}) is None
    # what is not part of the request does not count: when, which node, the id
    assert name_of(dict(BASE, countdown=30)) == one
    assert name_of(dict(BASE, max_attempts=3, timeout=5)) == one


@pytest.mark.timeout(10)
@pytest.mark.parametrize("change", [
    {"url": URL + "x"}, {"url": "https://worker.example:9099/hook"},
    {"method": "PUT"}, {"params": {"a": "2", "b": ["x", "y"]}},
    {"params": {"a": "1", "b": ["y", "x"]}}, {"params": {"a": "1"}},
    {"headers": {"X-Sig": "1"}}, {"params": None, "json": {"a": "1"}},
    {"params": None, "body": "a=1&b=x&b=y"},  # the same bytes, but sent as text/plain
])
def test_any_difference_in_the_request_is_another_name(change):
    assert name_of(dict(BASE, **change)) != name_of(BASE), change


@pytest.mark.timeout(10)
def test_header_names_ignore_case_and_order_values_do_not():
    h1 = dict(BASE, headers={"X-Alpha": "1", "x-beta": "2"})
    h2 = dict(BASE, headers={"x-beta": "2", "X-ALPHA": "1"})
    assert name_of(h1) == name_of(h2)
    assert name_of(dict(BASE, headers={"X-Alpha": "1", "x-beta": "3"})) != name_of(h1)
    assert name_of(dict(BASE, headers={"X-Alpha": "1"})) != name_of(h1)
    # a Content-Type header the task sets is replaced by Miyamoto's (build_request): the
    # target gets the same request, so it is the same task
    assert name_of(dict(BASE, headers={"Content-Type": "text/plain"})) == name_of(BASE)


@pytest.mark.timeout(10)
def test_body_kinds_json_raw_and_content_type():
    js = {"url": URL, "json": {"k": [1, 2]}, "dedupe": "content"}
    raw = {"url": URL, "body": '{"k":[1,2]}', "content_type": "application/json",
           "dedupe": "content"}
    assert name_of(js) == name_of(raw)  # the same bytes and type reach the target
    assert name_of(dict(raw, content_type="application/xml")) != name_of(raw)
    assert name_of(dict(raw, body='{"k":[1,3]}')) != name_of(raw)
    as_form = {"url": URL, "body": "a=1&b=x&b=y", "dedupe": "content",
               "content_type": "application/x-www-form-urlencoded"}
    assert name_of(as_form) == name_of(BASE)  # byte for byte the request params make
    get = {"url": URL, "method": "GET", "params": {"q": "1"}, "dedupe": "content"}
    assert name_of(get) == name_of({"url": URL + "?q=1", "method": "GET", "dedupe": "content"})
    assert name_of(get) != name_of(dict(get, params={"q": "2"}))


@pytest.mark.timeout(10)
def test_form_and_json_requests_agree():
    body = urlencode([("task.url", URL), ("task.dedupe", "content"), ("a", "1"),
                      ("b", "x"), ("b", "y")]).encode()
    form_task = parse_enqueue("application/x-www-form-urlencoded", body, path_queue=None,
                              idempotency_key=None, limits=Limits(), now=NOW)
    json_task = parse_enqueue("application/json", ujson.dumps(BASE).encode(), path_queue=None,
                              idempotency_key=None, limits=Limits(), now=NOW)
    assert form_task.name == json_task.name == name_of(BASE)


@pytest.mark.timeout(10)
def test_bad_values_and_name_together_are_400_naming_dedupe():
    for bad in ("Content", "body", "", 1, True, ["content"]):
        assert "content" in rejects(dict(BASE, dedupe=bad)).message
    assert "name" in rejects(dict(BASE, name="mine")).message
    rejects(BASE, key="an-idempotency-key")
    assert name_of(dict(BASE, dedupe=None)) is None
    with pytest.raises(ValidationError) as info:
        parse_batch(ujson.dumps([BASE, dict(BASE, dedupe="yes")]).encode(), path_queue=None,
                    limits=Limits(), now=NOW, max_batch=10)
    assert info.value.field == "tasks[1].dedupe"
    ok = parse_batch(ujson.dumps([BASE, dict(BASE, params={"a": "2"})]).encode(),
                     path_queue=None, limits=Limits(), now=NOW, max_batch=10)
    assert ok[0].name == name_of(BASE) and ok[1].name != ok[0].name


@pytest.mark.timeout(10)
@pytest.mark.parametrize("fields", [
    BASE, dict(BASE, method="PATCH", headers={"X-A": "1", "content-type": "x/y"}),
    {"url": URL + "?z=0", "method": "DELETE", "params": {"q": ["1", "2"]}},
    {"url": URL, "method": "GET"}, {"url": URL, "json": {"é": "ü"}},
    {"url": URL, "body": "raw", "headers": {"Accept": "*/*"}},
])
def test_the_hashed_request_is_what_delivery_sends(fields):
    task = build_task(dict(fields, dedupe="content"), path_queue=None, idempotency_key=None,
                      limits=Limits(), now=NOW)
    method, url, headers, body = dedupe.request_parts(task)
    sent = build_request(task, NOW)
    assert (method, url, body) == (sent[0], sent[1], sent[3])
    miyamotos = {"user-agent", "idempotency-key"}
    expected = sorted((k.lower(), v) for k, v in sent[2].items()
                      if not k.lower().startswith("x-task-") and k.lower() not in miyamotos)
    assert headers == expected


@pytest.mark.timeout(10)
def test_parts_that_run_together_the_same_way_are_still_two_requests():
    """Each part is hashed with its length: a header value "bc" with an empty body and
    "b" with the body "c" are two requests, never one name."""
    one = {"url": URL, "headers": {"X-A": "bc"}, "body": "", "content_type": "t/p",
           "dedupe": "content"}
    two = {"url": URL, "headers": {"X-A": "b"}, "body": "c", "content_type": "t/p",
           "dedupe": "content"}
    assert name_of(one) != name_of(two)


@pytest.mark.timeout(10)
def test_a_content_name_is_the_same_on_every_version():
    """Nodes of two versions share one cluster during an upgrade: a name one reserved must
    be the name the other computes for the same request, so the hash is pinned."""
    assert name_of(BASE) == ("content:"
                             "95f002b598c8ace23f98bebfcda9d31c49b0d068793586d11246f50dc076af76")
