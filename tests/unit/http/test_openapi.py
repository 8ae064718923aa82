"""The OpenAPI description (``miyamoto.http.openapi``) in process: valid 3.1, naming every
route with every method, and true to the server at each edge. Every bound, default and
required field it states is checked against what the validators and routes do: a value
at a documented bound must be taken by both, a value past it refused by both, and an
answer of the routes must fit its schema. Against a real node (served document,
schemathesis): tests/nodes/test_openapi_node.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
import ujson
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from miyamoto.definitions import topics
from miyamoto.definitions.queues import parse_put
from miyamoto.definitions.schedules import parse_schedule
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.engine import browse
from miyamoto.http.api import Api, HTTPError, _opt_number
from miyamoto.http.openapi import SPEC
from miyamoto.tasks import repeat
from miyamoto.tasks.options import check_lease
from miyamoto.tasks.task import HISTORY_MAX, Task, add_attempt
from miyamoto.tasks.validate import Limits, ValidationError, build_task, parse_batch
from test_api import Service, call

pytestmark = pytest.mark.timeout(30)

URL = "http://127.0.0.1:9/w"
NOW = 1_700_000_000.0
SCHEMAS = SPEC["components"]["schemas"]


def schema(name: str) -> Draft202012Validator:
    return Draft202012Validator({"components": SPEC["components"],
                                 "$ref": f"#/components/schemas/{name}"})


def server_takes(fields: dict[str, Any]) -> bool:
    try:
        build_task(fields, path_queue=None, idempotency_key=None, limits=Limits(), now=NOW)
    except ValidationError:
        return False
    return True


def test_the_document_is_valid_openapi_31() -> None:
    validate(SPEC)
    assert SPEC["openapi"].startswith("3.1")


def _template(pattern: re.Pattern[str]) -> str:
    """``/queues/(?P<queue>[^/]+)/tasks`` -> ``/queues/{queue}/tasks`` (optional / dropped)."""
    out = re.sub(r"\(\?P<task_id>[^)]*\)", "{id}", pattern.pattern)
    out = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", out)
    return out.rstrip("?").rstrip("/") or "/"


# QStash's face (miyamoto/http/qstash.py) is left out of our spec on purpose: it is
# QStash's API, described by QStash's docs and proven with QStash's own SDK
# (tests/nodes/test_qstash_node.py), and its destinations are URLs with slashes in the
# path (/v2/publish/https://...), which an OpenAPI path template cannot express.
QSTASH_PREFIX = "/v2/"


def test_every_route_and_method_is_described() -> None:
    api = Api(service=None, limits=Limits(), max_batch=10)  # type: ignore[arg-type]
    seen = set()
    for pattern, handlers in api.routes:
        path = _template(pattern)
        if path.startswith(QSTASH_PREFIX):
            continue
        if "{action}" in path:  # the alternatives the route's pattern names
            names = re.search(r"\(\?P<action>([^)]*)\)", pattern.pattern).group(1)
            paths = [path.replace("{action}", a) for a in names.split("|")]
        else:
            paths = [path]
        for p in paths:
            assert p in SPEC["paths"], p
            assert {m.lower() for m in handlers} == set(SPEC["paths"][p]), p
            seen.add(p)
    assert seen == set(SPEC["paths"])


def test_the_routes_that_read_a_body_and_only_those_say_so() -> None:
    with_body = {(p, m) for p, ops in SPEC["paths"].items() for m, op in ops.items()
                 if "requestBody" in op}
    assert with_body == {("/queue", "post"), ("/queue/{queue}", "post"),
                         ("/queue/{queue}/batch", "post"), ("/schedules", "post"),
                         ("/topics/{tname}", "put"), ("/queues/{queue}", "put"),
                         ("/tasks/{id}/complete", "post"), ("/tasks/{id}/heartbeat", "post"),
                         ("/queues/{queue}/lease", "post"), ("/tasks/{id}/ack", "post"),
                         ("/tasks/{id}/nack", "post"), ("/tasks/{id}/extend", "post")}
    for p, m in with_body:
        if m != "post" or not p.endswith("/heartbeat"):
            assert SPEC["paths"][p][m]["requestBody"]["required"] is True
    for p, ops in SPEC["paths"].items():
        for m, op in ops.items():
            names = {x["name"] for x in op.get("parameters", []) if x["in"] == "path"}
            assert names == set(re.findall(r"{(\w+)}", p)), (p, m)
            assert all(x["required"] for x in op.get("parameters", []) if x["in"] == "path")


# ---------------------------------------------------------------- requests, at the edges

# what else a field needs to be taken (a rate goes with a key, a type with a body)
_WITH = {"flow_rate": {"flow_key": "k"}, "flow_parallelism": {"flow_key": "k"},
         "content_type": {"body": "x"}}


def _edges(name: str, prop: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(value, inside the documented bounds) at each bound ``prop`` states."""
    integer = "integer" in (prop.get("type") if isinstance(prop.get("type"), list)
                            else [prop.get("type")])
    step = 1 if integer else 0.5
    out: list[tuple[Any, bool]] = []
    if "minimum" in prop:
        out += [(prop["minimum"], True), (prop["minimum"] - step, False)]
    if "maximum" in prop:
        out += [(prop["maximum"], True), (prop["maximum"] + step, False)]
    if "exclusiveMinimum" in prop:
        out += [(prop["exclusiveMinimum"], False), (prop["exclusiveMinimum"] + 0.5, True)]
    fill = "http://a/" if name in ("url", "callback", "failure_callback") else ""
    if "minLength" in prop:
        n = prop["minLength"]
        out += [(fill + "k" * (n - len(fill)), True)]
        if n - len(fill) > 0:
            out += [(fill + "k" * (n - len(fill) - 1), False)]
    if "maxLength" in prop:
        n = prop["maxLength"]
        out += [(fill + "k" * (n - len(fill)), True), (fill + "k" * (n - len(fill) + 1), False)]
    return out


def _bounded(schema_name: str) -> list[tuple[str, Any, bool]]:
    props = SCHEMAS[schema_name]["properties"]
    cases = []
    for name, prop in props.items():
        for s in [prop, *prop.get("anyOf", [])]:
            cases += [(name, v, inside) for v, inside in _edges(name, s)]
    return cases


@pytest.mark.parametrize("field,value,inside", [
    c for c in _bounded("EnqueueTaskRequest") if c[0] in ("debounce", "debounce_max")])
def test_a_repeat_field_at_a_documented_bound(field: str, value: Any, inside: bool) -> None:
    doc = {"url": URL, "name": "n", **({"debounce": 0.5} if field == "debounce_max" else {}),
           field: value}
    assert schema("EnqueueTaskRequest").is_valid(doc) is inside, doc
    try:
        repeat.parse(doc, named=True, max_delay=Limits().max_delay)
    except ValidationError:
        assert not inside, doc
    else:
        assert inside, doc


@pytest.mark.parametrize("field,value,inside", _bounded("TaskRequest"))
def test_a_task_field_at_a_documented_bound(field: str, value: Any, inside: bool) -> None:
    doc = {"url": URL, **_WITH.get(field, {}), field: value}
    assert schema("TaskRequest").is_valid(doc) is inside, doc
    assert server_takes(doc) is inside, doc


def test_what_a_task_request_must_hold_and_must_not() -> None:
    for doc, ok in [({"url": URL}, True), ({}, False), ({"url": URL, "nope": 1}, False),
                    ({"url": URL, "method": "PATCH"}, True), ({"url": URL, "method": "BREW"},
                                                                False)]:
        assert schema("TaskRequest").is_valid(doc) is ok and server_takes(doc) is ok, doc


def test_a_topic_task_takes_every_task_field_but_url() -> None:
    def expands(doc: dict) -> bool:
        try:
            topics.expand(doc, [URL], path_queue=None, idempotency_key=None, limits=Limits(),
                          now=NOW)
        except ValidationError:
            return False
        return True
    for doc, ok in [({"topic": "t", "priority": 1, "name": "n", "countdown": 5}, True),
                    ({"topic": "t", "url": URL}, False), ({"topic": "t", "nope": 1}, False)]:
        assert schema("TopicTaskRequest").is_valid(doc) is ok and expands(doc) is ok, doc


def test_a_batch_holds_at_least_one_task_in_either_shape() -> None:
    def takes(doc: Any) -> bool:
        try:
            parse_batch(ujson.dumps(doc).encode(), path_queue=None, limits=Limits(), now=NOW,
                        max_batch=10)
        except ValidationError:
            return False
        return True
    for doc, ok in [([{"url": URL}], True), ([], False), ({"tasks": [{"url": URL}]}, True),
                    ({"tasks": []}, False), ({"tasks": [{"url": URL}], "x": 1}, False)]:
        assert schema("Batch").is_valid(doc) is ok and takes(doc) is ok, doc


def _schedule_takes(doc: dict) -> bool:
    try:
        parse_schedule(doc, limits=Limits(), now=NOW, catch_up="last")
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("field,value,inside", _bounded("ScheduleRequest"))
def test_a_schedule_field_at_a_documented_bound(field: str, value: Any, inside: bool) -> None:
    doc = {"name": "s", "every": 5, "task": {"url": URL}, field: value}
    assert schema("ScheduleRequest").is_valid(doc) is inside
    assert _schedule_takes(doc) is inside


def test_a_schedule_request_and_its_defaults() -> None:
    base = {"name": "s", "every": 5, "task": {"url": URL}}
    for doc, ok in [(base, True), ({**base, "x": 1}, False), ({"every": 5, "task": {}}, False),
                    ({**base, "catch_up": "all"}, False)]:
        assert schema("ScheduleRequest").is_valid(doc) is ok and _schedule_takes(doc) is ok
    value = parse_schedule(base, limits=Limits(), now=NOW, catch_up="last")
    props = SCHEMAS["ScheduleRequest"]["properties"]
    assert (props["paused"]["default"], props["timezone"]["default"]) == (
        value["paused"], value["timezone"])


def test_a_topic_request_at_its_bounds() -> None:
    most = [f"http://a/{i}" for i in range(topics.MAX_URLS)]

    def takes(doc: dict) -> bool:
        try:
            topics.parse_topic(doc, Limits())
        except ValidationError:
            return False
        return True
    for doc, ok in [({"urls": most[:1]}, True), ({"urls": most}, True), ({"urls": []}, False),
                    ({"urls": most + ["http://a/x"]}, False), ({"urls": [URL, URL]}, False),
                    ({"urls": [URL], "x": 1}, False), ({}, False)]:
        assert schema("TopicRequest").is_valid(doc) is ok and takes(doc) is ok, doc


def test_the_task_fields_documented_defaults_are_the_servers() -> None:
    t = build_task({"url": URL}, path_queue=None, idempotency_key=None, limits=Limits(), now=NOW)
    props = SCHEMAS["TaskRequest"]["properties"]
    assert (props["method"]["default"], props["priority"]["default"]) == (t.method, t.priority)


# ---------------------------------------------------------------- parameters

def _param(path: str, name: str) -> dict[str, Any]:
    (op,) = SPEC["paths"][path].values()
    return next(p for p in op["parameters"] if p["name"] == name)


def test_the_idempotency_key_is_optional_and_bounded_as_a_name() -> None:
    key = _param("/queue", "Idempotency-Key")
    assert key["required"] is False
    for value, ok in [("k" * key["schema"]["minLength"], True),
                      ("k" * key["schema"]["maxLength"], True),
                      ("k" * (key["schema"]["maxLength"] + 1), False)]:
        try:
            build_task({"url": URL}, path_queue=None, idempotency_key=value, limits=Limits(),
                       now=NOW)
            took = True
        except ValidationError:
            took = False
        assert took is ok


# ---------------------------------------------------------------- answers fit

def test_a_tasks_answer_fits_with_a_full_history() -> None:
    history: tuple = ()
    for i in range(HISTORY_MAX + 3):
        history = add_attempt(history, {"start": float(i), "duration": 0.1, "node": "a",
                                        "status": 500, "error": None})
    t = Task(id="t", queue="q", url=URL, history=history)
    answer = t.summary()
    assert schema("Task").is_valid(answer)
    answer["history"] = answer["history"] + answer["history"][:1]  # one more than kept
    assert not schema("Task").is_valid(answer)


def test_answers_of_a_quiet_node_fit_with_their_zeros() -> None:
    states = ("scheduled", "running", "succeeded", "failed", "cancelled", "expired")
    queue = {"name": "default", "paused": False, "config": {"rate": None},
             "counts": {s: 0 for s in states},
             "totals": {"enqueued": 0, "delivered": 0, "failed": 0}}
    assert schema("Queue").is_valid(queue)
    assert not schema("Queue").is_valid({**queue, "counts": {**queue["counts"], "failed": -1}})
    assert schema("Control").is_valid({"status": "ok", "queue": "q", "action": "purge",
                                       "purged": 0})
    assert schema("FailedBulk").is_valid({"status": "ok", "queue": "q", "action": "retry",
                                          "count": 0, "more": False})


def test_a_targets_answer_fits_and_holds_nothing_else() -> None:
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name), 8, clock=lambda: NOW,
                   breaker_failures=1)
    d.outcome("http://a:80", 200)
    d.outcome("http://b:80", 503)  # open
    answer = {"targets": d.targets()}
    assert [t["state"] for t in answer["targets"]] == ["closed", "open"]
    assert schema("Targets").is_valid(answer)
    extra = {"targets": [{**answer["targets"][0], "url": "http://a/x"}]}
    assert not schema("Targets").is_valid(extra)  # a client may rely on these keys alone


def _queue_settings_take(doc: Any) -> bool:
    try:
        parse_put(doc)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("field,value,inside", _bounded("QueueSettings"))
def test_a_queue_setting_at_a_documented_bound(field: str, value: Any, inside: bool) -> None:
    doc = {field: value}
    assert schema("QueueSettings").is_valid(doc) is inside, doc
    assert _queue_settings_take(doc) is inside, doc


def test_queue_settings_take_nulls_and_refuse_strangers() -> None:
    for doc, ok in [({}, True), ({"rate": None, "paused": None}, True), ({"paused": 1}, False),
                    ({"rate": "5"}, False), ({"burst": 2.5}, False), ({"nope": 1}, False),
                    ([], False), ({"paused": True, "timeout": 5}, True)]:
        assert schema("QueueSettings").is_valid(doc) is ok, doc
        assert _queue_settings_take(doc) is ok, doc


def test_the_browse_limit_and_a_heartbeat_body_are_documented_as_the_server_takes_them(
        ) -> None:
    limit = _param("/tasks", "limit")["schema"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, browse.MAX_LIMIT, 50)
    beat = schema("Heartbeat")
    for body, taken in (({}, True), ({"lease": 0.5}, True), ({"lease": 7 * 86400}, True),
                        ({"lease": 0}, False), ({"lease": 7 * 86400 + 1}, False),
                        ({"lease": 1, "x": 1}, False)):
        # the server: at most a lease (api.heartbeat_task), in bounds (options.check_lease)
        server = set(body) <= {"lease"} and ("lease" not in body or check_lease(body["lease"]))
        assert beat.is_valid(body) is taken is server, body


@pytest.mark.parametrize("key", ["since", "until"])
def test_a_browse_time_bound_is_documented_as_the_server_takes_it(key: str) -> None:
    check = Draft202012Validator(_param("/tasks", key)["schema"])
    for at, taken in ((0, True), (0.5, True), (NOW, True), (1e11 - 1, True), (-1, False),
                      (-0.5, False), (1e11, False)):
        try:
            server = _opt_number({key: [repr(float(at))]}, key) == at
        except HTTPError:
            server = False
        assert check.is_valid(at) is taken is server, (key, at)


def test_a_workers_ack_and_nack_bodies_name_only_their_fields() -> None:
    # http/pull.py refuses any other field (400 naming it): so does the document
    ack, nack = schema("Ack"), schema("Nack")
    assert ack.is_valid({}) and ack.is_valid({"token": "t"})
    assert not ack.is_valid({"token": "t", "delay": 5}) and not ack.is_valid({"x": 1})
    for body, taken in (({}, True), ({"token": "t", "delay": 0}, True),
                        ({"delay": 30 * 86400}, True), ({"delay": 30 * 86400 + 1}, False),
                        ({"delay": -1}, False), ({"token": "t", "lease_s": 5}, False)):
        assert nack.is_valid(body) is taken, body
