"""The OpenAPI description: valid 3.1, complete, and true.

* openapi-spec-validator accepts what a real node serves at /openapi.json;
* (that it names every route with every method, and is true at each edge of what it
  states: tests/unit/http/test_openapi.py);
* a bounded schemathesis run against a real node (no api tokens, so every route's body
  is reached rather than its 401) finds no 5xx and no answer outside its schema;
* a 405 carries ``Allow`` with the route's methods.

Tasks the run enqueues target only the sink on 127.0.0.1: every url-like field whose
scheme is http(s) is rewritten to it before the request is sent (anything else the node
refuses as not an http(s) URL, which is part of what is being checked).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from helpers import NodeProcess

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from openapi_spec_validator import validate  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance, negative_data_rejection, response_schema_conformance,
    status_code_conformance)


# examples per operation and mode: ~450 calls, ~10 s on an idle 2-core machine
MAX_EXAMPLES = {"positive": 20, "negative": 10}
_URL_FIELDS = ("url", "callback", "failure_callback")


@pytest.mark.timeout(30)
def test_served_spec_is_valid_openapi_31(node: NodeProcess) -> None:
    r = node.get("/openapi.json")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    spec = r.json()
    assert spec["openapi"].startswith("3.1")
    validate(spec)
    schemas = spec["components"]["schemas"]
    for name in ("TaskRequest", "TaskForm", "Error", "Duplicate", "Queue", "Queues",
                 "Cluster", "Task", "Enqueued"):
        assert name in schemas, name
    enqueue = spec["paths"]["/queue"]["post"]["requestBody"]["content"]
    assert set(enqueue) == {"application/json", "application/x-www-form-urlencoded"}


def _local(value: Any, target: str) -> Any:
    """An http(s) URL (by the same urlsplit the node uses) becomes the sink's."""
    if not isinstance(value, str):
        return value
    try:
        scheme = urlsplit(value).scheme
    except ValueError:
        return target
    return target if scheme in ("http", "https") else value


def _localize(body: Any, target: str) -> Any:
    if isinstance(body, list):
        return [_localize(x, target) for x in body]
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if isinstance(out.get("tasks"), list):
        out["tasks"] = _localize(out["tasks"], target)
    if isinstance(out.get("task"), dict):  # a schedule's task
        out["task"] = _localize(out["task"], target)
    if isinstance(out.get("urls"), list):  # a topic's URLs
        out["urls"] = [_local(u, target) for u in out["urls"]]
    for k in _URL_FIELDS:
        for key in (k, f"task.{k}"):
            if key in out:
                out[key] = _local(out[key], target)
    return out


def _fuzz(op: Any, mode: Any, node: NodeProcess, target: str, session: requests.Session,
          statuses: dict[str, list[int]]) -> None:
    """MAX_EXAMPLES[mode] cases of one operation, each answer checked."""
    checks = [not_a_server_error, response_schema_conformance, content_type_conformance]
    if mode == GenerationMode.POSITIVE:  # a negative case may be answered anything 4xx
        checks.append(status_code_conformance)
    else:  # but it must be refused: what the spec forbids, the server refuses
        checks.append(negative_data_rejection)

    @settings(max_examples=MAX_EXAMPLES[mode.value], deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if case.body is not None and not isinstance(case.body, (bytes, str)):
            case.body = _localize(case.body, target)
        response = case.call(base_url=node.url, session=session, timeout=10)
        statuses.setdefault(f"{mode.value} {op.label}", []).append(response.status_code)
        if mode == GenerationMode.NEGATIVE and response.status_code == 414:
            # refused too: several over-long query values (GET /tasks's filters) make a
            # request line the server's reader turns down, 414, which the check's list
            # of rejections leaves out
            assert response.json()["status"] == "error"
            return
        case.validate_response(response, checks=checks)

    try:
        run()
    except Unsatisfiable:  # nothing to make invalid: an operation without input
        assert mode == GenerationMode.NEGATIVE and not (op.body or op.path_parameters
                                                          or op.query or op.headers), op.label


@pytest.mark.timeout(200)
def test_schemathesis_finds_no_5xx_and_no_schema_violation(node: NodeProcess, sink) -> None:
    """Positive cases (valid per the spec) and negative ones (not): no 5xx, every answer
    in its schema, and a positive case only ever gets a documented status."""
    # from_dict, not from_url: from_url leaves out the operation at the schema's own
    # location, and /openapi.json is one of the routes to check
    schema = schemathesis.openapi.from_dict(node.get("/openapi.json").json())
    target = sink.url_for("/st")
    session = requests.Session()
    started = time.monotonic()
    statuses: dict[str, list[int]] = {}
    ops = [result.ok() for result in schema.get_all_operations()]
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(op, mode, node, target, session, statuses)
    elapsed = time.monotonic() - started
    print(f"schemathesis: {len(ops)} operations, {sum(map(len, statuses.values()))} calls "
          f"in {elapsed:.1f} s: " + ", ".join(f"{k} {sorted(set(v))}" for k, v in statuses.items()))
    described = sum(1 for item in schema.raw_schema["paths"].values() for method in item
                    if method in ("get", "put", "post", "delete", "patch"))
    assert len(ops) == described, [op.label for op in ops]  # schemathesis reached them all
    assert elapsed < 150, f"the run took {elapsed:.1f} s"
    # the run reached the routes' bodies, not only their refusals
    assert 200 in statuses["positive POST /queue"]
    assert 200 in statuses["positive POST /queue/{queue}/batch"]
    assert node.get("/healthz").status_code == 200


ALLOW = [
    ("GET", "/queue", "POST"), ("PUT", "/queue/x", "POST"), ("GET", "/queue/x/batch", "POST"),
    ("POST", "/tasks/abc", "GET, DELETE, HEAD"), ("GET", "/tasks/abc/retry", "POST"),
    ("DELETE", "/queues", "GET, HEAD"), ("POST", "/healthz", "GET, HEAD"),
    ("GET", "/queues/q/pause", "POST"), ("PATCH", "/openapi.json", "GET, HEAD"),
    ("POST", "/", "GET, HEAD")]


@pytest.mark.timeout(30)
def test_405_carries_allow(node: NodeProcess) -> None:
    for method, path, allow in ALLOW:
        r = node.request(method, path)
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers.get("Allow") == allow, (method, path)
        assert r.json()["status"] == "error"
