"""Cloud Tasks' routes (``miyamoto.http.cloudtasks``) in process, through the API's WSGI
app, against a recording service: each route's call and answer, tokens by scope, and
every failure in Google's JSON error shape with its canonical code. The SDK against
real nodes: tests/nodes/test_cloudtasks_sdk.py."""

from __future__ import annotations

import io
from typing import Any

import pytest
import ujson

from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.http import auth
from miyamoto.http.api import Api
from miyamoto.http.cloudtasks import PREFIX
from miyamoto.http.openapi import SPEC
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.task import CLOUDTASKS, State, Task
from miyamoto.tasks.validate import Limits

pytestmark = pytest.mark.timeout(30)

NOW = 1_780_000_000.0
LOC = "/v2/projects/p/locations/l"
QP = f"{LOC}/queues/q"
ID = "7e998f34-bed7-44f4-80cd-49620b0ab562"
CONFIG = {"rate": 0.0, "burst": 100, "max_concurrent": 0, "max_attempts": 25,
          "min_backoff": 0.5, "max_backoff": 3600.0, "max_doublings": 16,
          "max_retry_duration": 0.0, "timeout": 30.0}


def record(state: str = "scheduled", name: str | None = "t1", queue: str = "q") -> dict:
    return {"id": ID, "queue": queue, "state": state, "name": name, "url": "http://h/w",
            "method": "POST", "eta": NOW, "next_attempt": NOW, "created": NOW, "timeout": None,
            "attempts": 0, "executions": 0, "history": []}


class Service:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.tasks = {ID: record()}
        self.known_queues = {"q"}
        self.raise_: Exception | None = None
        self.offset = 0.0  # the cluster's clock minus this node's

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        if self.raise_ is not None:
            raise self.raise_

    def clock_offset(self) -> float:
        return self.offset

    def enqueue(self, task: Task, again: object = None) -> dict:
        self._call("enqueue", task)
        return {"status": "scheduled", "id": task.id}

    def get_task(self, task_id: str) -> dict | None:
        self._call("get_task", task_id)
        return self.tasks.get(task_id)

    def find_task(self, queue: str, name: str) -> dict | None:
        self._call("find_task", queue, name)
        return next((t for t in self.tasks.values() if (t["queue"], t["name"]) == (queue, name)),
                    None)

    def delete(self, task_id: str) -> dict | None:
        self._call("delete", task_id)
        return self.tasks.get(task_id)

    def rerun(self, task_id: str) -> dict | None:
        self._call("rerun", task_id)
        return self.tasks.get(task_id)

    def queues(self, limit: int, cursor: str) -> dict:
        self._call("queues", limit, cursor)
        return {"queues": [self.queue("q")], "next_cursor": "q"}

    def queue(self, name: str) -> dict | None:
        if name not in self.known_queues:
            return None
        return {"name": name, "paused": False, "limit": 50, "config": dict(CONFIG)}

    def put_queue(self, name: str, changes: dict) -> dict:
        self._call("put_queue", name, changes)
        if changes.get("min_backoff", 0) > CONFIG["max_backoff"]:  # as queue_defs.check
            raise ValidationError("min_backoff", "is above max_backoff")
        self.known_queues.add(name)
        view = self.queue(name)
        view["config"].update(changes)  # type: ignore[index]
        return view  # type: ignore[return-value]

    def reset_queue(self, name: str) -> dict | None:
        self._call("reset_queue", name)
        return None

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict]:
        self._call("list_tasks", queue, state, limit)
        return [t for t in self.tasks.values() if t["state"] == state.value][:limit]

    def control(self, queue: str, action: str) -> dict | None:
        self._call("control", queue, action)
        return {"status": "ok"} if queue in self.known_queues else None


def app(tokens: tuple[tuple[str, str], ...] = ()) -> tuple[Api, Service]:
    service = Service()
    return Api(service, Limits(), 10, clock=lambda: NOW,  # type: ignore[arg-type]
               tokens=auth.Tokens(tokens)), service


def call(api: Api, path: str, method: str = "GET", body: Any = None, query: str = "",
         token: str | None = None) -> tuple[int, Any]:
    data = b"" if body is None else (body if isinstance(body, bytes) else ujson.dumps(body).encode())
    env = {"PATH_INFO": path, "REQUEST_METHOD": method, "QUERY_STRING": query,
           "CONTENT_LENGTH": str(len(data)), "wsgi.input": io.BytesIO(data)}
    if token:
        env["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    got: list[Any] = []
    out = b"".join(api(env, lambda status, headers: got.append((status, dict(headers)))))
    (status, headers), = got
    assert headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == str(len(out))
    assert ("WWW-Authenticate" in headers) == status.startswith("401 ")
    return int(status.split()[0]), ujson.loads(out)


def task_body(**task: Any) -> dict:
    return {"task": {"httpRequest": {"url": "http://127.0.0.1:9/w"}, **task},
            "responseView": 1}


def test_a_task_is_created_as_a_native_one_marked_for_the_face() -> None:
    api, service = app()
    status, out = call(api, f"{QP}/tasks", "POST",
                       task_body(name="projects/p/locations/l/queues/q/tasks/t2"))
    assert status == 200, out
    (_, task), = [c for c in service.calls if c[0] == "enqueue"]
    assert (task.face, task.name, task.queue) == (CLOUDTASKS, "t2", "q")
    assert out["name"] == "projects/p/locations/l/queues/q/tasks/t2" and out["view"] == "BASIC"
    status, out = call(api, f"{QP}/tasks", "POST", task_body())
    assert out["name"].endswith("/tasks/" + service.calls[-1][1].id)  # its id names it


def test_a_schedule_time_is_judged_on_the_clusters_clock() -> None:
    """scheduleTime is absolute: on a node 30 s behind the cluster, a task due 60 s on by
    the cluster's clock fires 60 s on here, not 90 s."""
    from miyamoto.http.cloudtasksjson import timestamp

    api, service = app()
    service.offset = 30.0
    body = task_body()
    body["task"]["scheduleTime"] = timestamp(NOW + 30.0 + 60.0)
    status, out = call(api, f"{QP}/tasks", "POST", body)
    assert status == 200, out
    (_, task), = [c for c in service.calls if c[0] == "enqueue"]
    assert task.fire_at == pytest.approx(NOW + 60.0, abs=1e-3)


@pytest.mark.parametrize("raise_, status, code", [
    (Duplicate(ID), 409, "ALREADY_EXISTS"), (Conflict("busy"), 400, "FAILED_PRECONDITION"),
    (RuntimeError("boom"), 500, "INTERNAL")])
def test_the_services_refusals_take_googles_codes(raise_, status, code) -> None:
    api, service = app()
    service.raise_ = raise_
    got, out = call(api, f"{QP}/tasks", "POST", task_body())
    assert (got, out["error"]["code"], out["error"]["status"]) == (status, status, code)
    assert "boom" not in out["error"]["message"]


@pytest.mark.parametrize("body, field", [
    (task_body(httpRequest={"url": "ftp://h/w"}), "task.httpRequest.url"),
    (task_body(httpRequest={"url": "http://h/w", "headers": {"Host": "x"}}),
     "task.httpRequest.headers.Host"),
    ({"task": {}, "other": 1}, "task"),
])
def test_a_bad_task_is_invalid_argument_naming_the_field(body, field) -> None:
    api, service = app()
    status, out = call(api, f"{QP}/tasks", "POST", body)
    assert status == 400 and out["error"]["status"] == "INVALID_ARGUMENT"
    assert out["error"]["details"][0]["fieldViolations"][0]["field"] == field
    assert not [c for c in service.calls if c[0] == "enqueue"]


def test_a_body_that_is_no_json_object_is_refused() -> None:
    api, _ = app()
    for body in (b"{nope", b"[1]"):
        status, out = call(api, f"{QP}/tasks", "POST", body)
        assert status == 400 and out["error"]["status"] == "INVALID_ARGUMENT", out


class Broken(io.BytesIO):
    def read(self, n: int = -1) -> bytes:
        raise ValueError("bad chunk")


def test_a_body_is_read_without_a_length_to_the_cap_and_a_broken_one_is_the_clients() -> None:
    api, service = app()
    data = ujson.dumps(task_body()).encode()
    env = {"PATH_INFO": f"{QP}/tasks", "REQUEST_METHOD": "POST", "wsgi.input": io.BytesIO(data)}
    assert api.cloudtasks.dispatch(env)[0] == 200  # chunked: no CONTENT_LENGTH
    big = {"PATH_INFO": f"{QP}/tasks", "REQUEST_METHOD": "POST",
           "wsgi.input": io.BytesIO(b" " * (Limits().max_body + 1))}
    assert api.cloudtasks.dispatch(big)[0] == 413
    status, out = api.cloudtasks.dispatch(dict(env, CONTENT_LENGTH="9", **{
        "wsgi.input": Broken()}))
    assert status == 400 and "could not be read" in out["error"]["message"]
    assert api.cloudtasks.dispatch(dict(env, CONTENT_LENGTH="99999999999"))[0] == 413


def test_the_face_stays_out_of_our_openapi_document() -> None:
    """Google describes this API and its SDK proves it; /openapi.json is ours alone."""
    assert not [p for p in SPEC["paths"] if p.startswith(PREFIX)]


def test_a_task_is_found_by_name_or_by_id_and_an_ended_one_is_gone() -> None:
    api, service = app()
    assert call(api, f"{QP}/tasks/t1")[1]["name"].endswith("/tasks/t1")
    assert call(api, f"{QP}/tasks/{ID}")[0] == 200
    assert ("get_task", ID) in service.calls
    assert call(api, f"{LOC}/queues/other/tasks/{ID}")[0] == 404  # another queue's
    service.tasks[ID]["state"] = "succeeded"
    status, out = call(api, f"{QP}/tasks/t1")
    assert status == 404 and out["error"]["status"] == "NOT_FOUND"
    assert f"GET /tasks/{ID}" in out["error"]["message"]
    assert call(api, f"{QP}/tasks/t1", "DELETE")[0] == 404
    assert not [c for c in service.calls if c[0] == "delete"]


def test_delete_run_and_list() -> None:
    api, service = app()
    assert call(api, f"{QP}/tasks/t1", "DELETE") == (200, {})
    assert ("delete", ID) in service.calls
    assert call(api, f"{QP}/tasks/t1:run", "POST", {})[0] == 200
    assert ("rerun", ID) in service.calls
    status, out = call(api, f"{QP}/tasks", query="pageSize=5&responseView=1")
    assert status == 200 and [t["name"] for t in out["tasks"]] == [
        "projects/p/locations/l/queues/q/tasks/t1"]
    assert ("list_tasks", "q", State.SCHEDULED, 5) in service.calls
    assert call(api, f"{QP}/tasks", query="pageSize=5000")[0] == 400


def test_queues_list_get_control_and_delete() -> None:
    api, service = app()
    status, out = call(api, f"{LOC}/queues", query="pageSize=2")
    assert status == 200 and out["nextPageToken"] == "q"
    assert out["queues"][0]["name"] == "projects/p/locations/l/queues/q"
    assert call(api, QP)[1]["state"] == "RUNNING"
    assert call(api, f"{QP}:pause", "POST", {})[0] == 200
    assert ("control", "q", "pause") in service.calls
    assert call(api, QP, "DELETE") == (200, {})
    assert service.calls[-2:] == [("control", "q", "purge"), ("reset_queue", "q")]
    status, out = call(api, f"{LOC}/queues/nope:resume", "POST", {})
    assert status == 404 and out["error"]["status"] == "NOT_FOUND"
    assert call(api, f"{LOC}/queues/bad.name")[0] == 400


def test_a_queue_is_created_once_with_its_settings_and_patched_by_its_mask() -> None:
    api, service = app()
    made = {"name": "projects/p/locations/l/queues/new", "retryConfig": {"maxAttempts": 3}}
    status, out = call(api, f"{LOC}/queues", "POST", made)
    assert status == 200 and out["retryConfig"]["maxAttempts"] == 3
    assert ("put_queue", "new", {"max_attempts": 3}) in service.calls
    status, out = call(api, f"{LOC}/queues", "POST", made)
    assert status == 409 and out["error"]["status"] == "ALREADY_EXISTS"
    other = {"name": "projects/other/locations/l/queues/x"}
    assert call(api, f"{LOC}/queues", "POST", other)[0] == 400
    status, out = call(api, QP, "PATCH", {"name": "projects/p/locations/l/queues/q",
                                          "retryConfig": {"maxAttempts": 7, "maxDoublings": 3}},
                       query="updateMask=retryConfig.maxAttempts")
    assert status == 200 and out["retryConfig"]["maxAttempts"] == 7
    assert service.calls[-1] == ("put_queue", "q", {"max_attempts": 7})  # the mask's only
    status, out = call(api, QP, "PATCH", {"retryConfig": {"maxAttempts": 10001}})
    assert status == 400 and out["error"]["details"][0]["fieldViolations"][0]["field"] == \
        "queue.retryConfig.maxAttempts"
    assert out["error"]["message"] == "queue.retryConfig.maxAttempts must be between 1 and 10000"
    assert not [c for c in service.calls if c[0] == "put_queue" and c[2].get("max_attempts")
                == 10001]  # checked before it is written
    status, out = call(api, QP, "PATCH", {"retryConfig": {"minBackoff": "7200s"}})
    assert status == 400 and out["error"]["message"] == \
        "queue.retryConfig.minBackoff is above max_backoff"  # the node's check, renamed


def test_tokens_apply_by_scope_in_googles_shape() -> None:
    api, service = app((("admin", "A"), ("read", "R"), ("enqueue", "E")))
    status, out = call(api, QP)
    assert status == 401 and out["error"]["status"] == "UNAUTHENTICATED"
    assert call(api, QP, token="R")[0] == 200
    status, out = call(api, f"{QP}/tasks", "POST", task_body(), token="R")
    assert status == 403 and out["error"]["status"] == "PERMISSION_DENIED"
    assert call(api, f"{QP}/tasks", "POST", task_body(), token="E")[0] == 200
    assert call(api, f"{QP}:pause", "POST", {}, token="E")[0] == 403
    assert call(api, f"{QP}:pause", "POST", {}, token="A")[0] == 200


def test_unknown_paths_and_methods_answer_in_googles_shape() -> None:
    api, _ = app()
    status, out = call(api, f"{LOC}/queues/q/nothing")
    assert status == 404 and out["error"]["status"] == "NOT_FOUND"
    status, out = call(api, f"{QP}/tasks/t1", "PUT")
    assert status == 405 and out["error"]["status"] == "UNIMPLEMENTED"


def test_the_body_cap_is_max_body_and_a_bad_length_is_refused() -> None:
    api, _ = app()
    most = Limits().max_body
    env = {"PATH_INFO": f"{QP}/tasks", "REQUEST_METHOD": "POST"}
    status, out = api.cloudtasks.dispatch(dict(env, CONTENT_LENGTH=str(most), **{
        "wsgi.input": io.BytesIO(b" " * most)}))
    assert status == 400 and out["error"]["details"][0]["fieldViolations"][0]["field"] == "task"
    assert api.cloudtasks.dispatch(dict(env, CONTENT_LENGTH=str(most + 1), **{
        "wsgi.input": io.BytesIO(b" " * (most + 1))}))[0] == 413
    assert api.cloudtasks.dispatch(dict(env, **{"wsgi.input": io.BytesIO(b" " * most)}))[0] \
        == 400  # chunked, at the cap: read, and found empty
    status, out = api.cloudtasks.dispatch(dict(env, CONTENT_LENGTH="x1", **{
        "wsgi.input": io.BytesIO(b"{}")}))
    assert status == 400 and "Content-Length" in out["error"]["message"]
    assert call(api, f"{LOC}/queues", "POST", b"[1]")[0] == 400  # no object


def test_unavailable_is_503_and_a_run_or_delete_that_cannot_be_is_told() -> None:
    api, service = app()
    service.raise_ = Unavailable("too few replicas")
    status, out = call(api, f"{QP}/tasks", "POST", task_body())
    assert (status, out["error"]["status"]) == (503, "UNAVAILABLE")
    service.raise_ = None
    service.rerun = lambda task_id: {"conflict": "task is running"}  # type: ignore[method-assign]
    status, out = call(api, f"{QP}/tasks/t1:run", "POST", {})
    assert (status, out["error"]["status"]) == (400, "FAILED_PRECONDITION")
    assert "task is running" in out["error"]["message"]
    service.rerun = lambda task_id: None  # type: ignore[method-assign]
    assert call(api, f"{QP}/tasks/t1:run", "POST", {})[0] == 400

    def ended(task_id: str) -> dict:
        raise Conflict("task already succeeded")

    service.delete = ended  # type: ignore[method-assign]
    status, out = call(api, f"{QP}/tasks/t1", "DELETE")
    assert (status, out["error"]["status"]) == (404, "NOT_FOUND")


def test_a_listing_stops_at_its_page_size_across_states() -> None:
    api, service = app()
    service.tasks["r"] = dict(record(state="running", name="t9"), id="r")
    status, out = call(api, f"{QP}/tasks", query="pageSize=1")
    assert len(out["tasks"]) == 1
    assert [c for c in service.calls if c[0] == "list_tasks"] == [
        ("list_tasks", "q", State.SCHEDULED, 1)]
    status, out = call(api, f"{QP}/tasks", query="pageSize=2")
    assert [t["name"].rsplit("/", 1)[1] for t in out["tasks"]] == ["t1", "t9"]
    assert ("list_tasks", "q", State.RUNNING, 1) in service.calls
    assert call(api, f"{QP}/tasks", query="pageSize=1000")[0] == 200
    assert call(api, f"{QP}/tasks", query="pageSize=1001")[0] == 400
    assert call(api, f"{LOC}/queues", query="pageToken=not%20a%20queue")[0] == 400


def test_queue_names_and_settings_on_create_and_patch() -> None:
    api, service = app()
    for bad in ("projects/p/locations/l/queue/x", "projects/p/locations/l/queues/a.b",
                "projects/p/locations/x/queues/x"):
        status, out = call(api, f"{LOC}/queues", "POST", {"name": bad})
        assert status == 400 and out["error"]["details"][0]["fieldViolations"][0]["field"] == \
            "queue.name", bad
    assert call(api, QP, "PATCH", {"name": "projects/p/locations/l/queues/other"})[0] == 400
    assert call(api, f"{LOC}/queues/later", "PATCH", {})[0] == 200  # UpdateQueue creates
    assert ("put_queue", "later", {}) in service.calls
    for path, method in ((f"{LOC}/queues/nope", "GET"), (f"{LOC}/queues/nope", "DELETE")):
        status, out = call(api, path, method)
        assert (status, out["error"]["status"]) == (404, "NOT_FOUND"), path
