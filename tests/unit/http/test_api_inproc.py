"""The HTTP API's WSGI app in process (``miyamoto.http.api`` and the schedule and topic
routes of ``miyamoto.http.definitions``): routing, the body's framing, each route's
checks and answers, and every failure turned into a JSON answer naming the culprit,
against a recording service and a one-member definitions set in memory.

The same routes against real nodes: tests/nodes/test_single_node.py, test_schedules_node.py,
test_topics_node.py, test_api_tokens.py."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import ujson

from miyamoto.definitions import schedules, topics
from miyamoto.definitions.sync import DefSync
from miyamoto.delivery import completion
from miyamoto.engine.browse import Filter
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.http import auth
from miyamoto.http.api import QUEUES_PAGE, Api
from miyamoto.http.openapi import SPEC
from miyamoto.metrics import CONTENT_TYPE_LATEST
from miyamoto.tasks.task import State, Task
from miyamoto.tasks.validate import Limits, ValidationError

pytestmark = pytest.mark.timeout(30)

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
URL = "http://127.0.0.1:9/w"
NOW = 1000.0


class Service:
    """What the routes ask of the node: records each call, answers what a test set."""

    node_id = "n1"

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.tasks: dict[str, dict] = {"t-1": {"id": "t-1", "state": "scheduled"}}
        self.raise_: Exception | None = None
        self.results: list[dict] | None = None
        self.is_ready = (True, "")
        self.offset = 0.0  # the cluster's clock minus ours
        self.config = SimpleNamespace(schedule_catch_up="last")
        self.definitions = DefSync("n1", ":memory:", lambda *a, **k: True, "tcp://x:1",
                                   monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
        self.definitions.tick("n1", 1, ("n1",))

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if self.raise_ is not None:
            raise self.raise_

    def enqueue(self, task: Task, again: object = None) -> dict:
        self._record("enqueue", task)
        return {"status": "scheduled", "id": task.id}

    def enqueue_many(self, tasks: list[Task]) -> list[dict]:
        self._record("enqueue_many", tasks)
        if self.results is not None:
            return self.results
        return [{"status": "scheduled", "id": t.id} for t in tasks]

    def get_task(self, task_id: str) -> dict | None:
        self._record("get_task", task_id)
        return self.tasks.get(task_id)

    def find_task(self, queue: str, name: str) -> dict | None:
        self._record("find_task", queue, name)
        return {"id": "t-1"} if name == "known" else None

    def browse(self, flt: Any, after: Any, limit: int) -> dict:
        self._record("browse", flt, after, limit)
        return {"tasks": [{"id": "t-1"}], "next_cursor": None, "nodes": ["n1"]}

    def rates(self, seconds: int, step: int, node: str | None) -> dict | None:
        self._record("rates", seconds, step, node)
        return None if node == "gone" else {"step": step}

    def delete(self, task_id: str) -> dict | None:
        self._record("delete", task_id)
        return None if task_id not in self.tasks else dict(self.tasks[task_id], state="deleted")

    def rerun(self, task_id: str) -> dict | None:
        self._record("rerun", task_id)
        return None if task_id not in self.tasks else dict(self.tasks[task_id], reruns=1)

    def queues(self, limit: int, cursor: str) -> dict:
        self._record("queues", limit, cursor)
        return {"queues": [{"name": "default"}], "next_cursor": None}

    def queue(self, name: str) -> dict | None:
        self._record("queue", name)
        return None if name == "nosuch" else {"name": name}

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict]:
        self._record("list_tasks", queue, state, limit)
        return [{"id": "t-1"}]

    def control(self, queue: str, action: str) -> dict:
        self._record("control", queue, action)
        return {"queue": queue, "action": action}

    def failed(self, queue: str, action: str) -> dict:
        self._record("failed", queue, action)
        return {"count": 0, "more": False, "action": action}

    def cluster_info(self) -> dict:
        self._record("cluster_info")
        return {"leader": "n1"}

    def target_states(self) -> list[dict]:
        self._record("target_states")
        return [{"origin": "http://127.0.0.1:9"}]

    def ready(self) -> tuple[bool, str]:
        return self.is_ready

    def is_pull(self, queue: str) -> bool:
        return False

    def clock_offset(self) -> float:
        return self.offset

    def metrics_body(self) -> bytes:
        return b"# metrics\n"


class Answer:
    def __init__(self, status_line: str, headers: list, body: bytes):
        self.status_line = status_line
        self.status = int(status_line.split()[0])
        self.headers = dict(headers)
        self.header_list = headers
        self.body = body

    def json(self) -> Any:
        return ujson.loads(self.body)


def call(app: Api, method: str, path: str, body: bytes | None = None, *,
         ctype: str | None = None, query: str = "", length: str | None = None,
         headers: dict[str, str] | None = None, stream: Any = None,
         raw_uri: str | None = None) -> Answer:
    seen: dict[str, Any] = {}

    def start_response(status: str, hs: list) -> None:
        seen["status"], seen["headers"] = status, hs

    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path,
                               "QUERY_STRING": query,
                               "wsgi.input": stream or io.BytesIO(body or b"")}
    if body is not None and length is None:
        environ["CONTENT_LENGTH"] = str(len(body))
    if length is not None:
        environ["CONTENT_LENGTH"] = length
    if ctype is not None:
        environ["CONTENT_TYPE"] = ctype
    if raw_uri is not None:  # the request target as sent, as http/server.py gives it
        environ["RAW_URI"] = raw_uri
    for k, v in (headers or {}).items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    out = b"".join(app(environ, start_response))
    return Answer(seen["status"], seen["headers"], out)


def post_json(app: Api, path: str, doc: Any, **kw: Any) -> Answer:
    return call(app, "POST", path, ujson.dumps(doc).encode(), ctype=JSON, **kw)


@pytest.fixture
def svc() -> Service:
    return Service()


@pytest.fixture
def app(svc: Service) -> Api:
    return Api(svc, Limits(max_body=1000), max_batch=3, clock=lambda: NOW)


def error_of(a: Answer, status: int, field: str | None = None) -> str:
    assert a.status == status, (a.status, a.body)
    assert a.headers["Content-Type"] == JSON
    doc = a.json()
    assert doc["status"] == "error"
    if field is not None:
        assert doc["field"] == field and doc["error"].startswith(f"{field} "), doc
    else:
        assert "field" not in doc, doc
    return doc["error"]


# ================================================================ WSGI and routing

def test_an_answer_is_json_with_its_length_and_reason(app: Api) -> None:
    a = call(app, "GET", "/healthz")
    assert a.status_line == "200 OK" and a.json() == {"status": "ok", "node": "n1"}
    assert a.headers["Content-Type"] == JSON and a.headers["Content-Length"] == str(len(a.body))
    assert call(app, "GET", "/nope").status_line == "404 Not Found"
    assert call(app, "GET", "/").status == 200


def test_a_route_without_the_method_is_405_naming_the_allowed_ones(app: Api) -> None:
    a = call(app, "DELETE", "/queues")
    error_of(a, 405)
    assert a.status_line == "405 Method Not Allowed"
    assert a.headers["Allow"] == "GET, HEAD"
    assert call(app, "GET", "/queue").headers["Allow"] == "POST"
    assert call(app, "POST", "/tasks/t-1").headers["Allow"] == "GET, DELETE, HEAD"
    assert "DELETE is not allowed on /queues" in a.json()["error"]


def test_no_route_is_404(app: Api, svc: Service) -> None:
    for path in ("/nope", "/queues/a/b/c", "/tasks/t-1/x"):
        assert "no route for" in error_of(call(app, "GET", path), 404)
    a = call(app, "GET", "/queues/a", headers={})
    assert a.status == 200
    environ = {"REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO(b"")}  # no PATH_INFO: "/"
    status: list[str] = []
    app(environ, lambda s, h: status.append(s))
    assert status == ["200 OK"]


def test_task_ids_and_queue_names_are_checked_before_the_node_is_asked(app: Api,
                                                                       svc: Service) -> None:
    for bad in ("a%20b", "a b", "x" * 129, "a,b"):
        error_of(call(app, "GET", f"/tasks/{bad}"), 404, "id")
    assert call(app, "GET", "/tasks/" + "x" * 128).status == 404  # well formed, unknown
    assert [c[0] for c in svc.calls] == ["get_task"]
    for bad in ("a.b", "a b", "q" * 101):
        error_of(call(app, "GET", f"/queues/{bad}"), 400, "queue")
    assert call(app, "GET", "/queues/" + "q" * 100).status == 200


def test_an_unexpected_error_is_a_500_without_detail(app: Api, svc: Service,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    svc.raise_ = RuntimeError("secret detail")
    a = call(app, "GET", "/queues")
    assert error_of(a, 500) == "internal error" and b"secret" not in a.body
    assert a.status_line == "500 Internal Server Error"
    assert "api: GET /queues failed" in caplog.text


# ================================================================ tokens

def test_a_body_within_the_limit_is_read_whole(app: Api, svc: Service) -> None:
    doc = {"url": URL, "params": {"k": "v" * 900}}
    raw = ujson.dumps(doc).encode()
    assert len(raw) <= 1000
    assert call(app, "POST", "/queue", raw, ctype=JSON).status == 200
    # no Content-Length (chunked): read up to the limit
    assert call(app, "POST", "/queue", raw, ctype=JSON, length="").status == 200
    assert svc.calls[-1][1].params == {"k": "v" * 900}
    exact = b"task.url=" + URL.encode() + b"&k=" + b"v" * (1000 - 9 - len(URL) - 3)
    assert len(exact) == 1000
    assert call(app, "POST", "/queue", exact, ctype=FORM).status == 200
    assert call(app, "POST", "/queue", exact, ctype=FORM, length="").status == 200


def test_a_body_over_the_limit_is_413(app: Api, svc: Service) -> None:
    big = b"task.url=" + URL.encode() + b"&k=" + b"v" * 1000
    a = call(app, "POST", "/queue", big, ctype=FORM)
    assert "is larger than 1000 bytes" in error_of(a, 413, "body")
    assert a.status_line == "413 Payload Too Large"
    error_of(call(app, "POST", "/queue", big, ctype=FORM, length=""), 413, "body")
    over = b"x" * 1001
    error_of(call(app, "POST", "/queue", over, ctype=FORM), 413, "body")
    error_of(call(app, "POST", "/queue", over, ctype=FORM, length=""), 413, "body")
    assert svc.calls == []


def test_a_bad_or_short_content_length_is_400(app: Api, svc: Service) -> None:
    body = ujson.dumps({"url": URL}).encode()
    for length in ("abc", "-1", "1.5"):
        assert error_of(call(app, "POST", "/queue", body, ctype=JSON, length=length),
                        400) == "bad Content-Length"
    a = call(app, "POST", "/queue", body, ctype=JSON, length=str(len(body) + 5))
    assert error_of(a, 400, "body") == f"body ended after {len(body)} of {len(body) + 5} bytes"
    a = call(app, "POST", "/queue", body, ctype=JSON, length="0")
    assert a.status == 400  # an empty JSON body
    assert svc.calls == []


def test_a_body_that_cannot_be_read_is_400(app: Api, svc: Service) -> None:
    class Broken:
        def read(self, n: int) -> bytes:
            raise OSError("the client left")
    for length in ("10", None):
        a = call(app, "POST", "/queue", None, ctype=JSON, length=length, stream=Broken())
        assert "could not be read" in error_of(a, 400, "body")


# ================================================================ tasks

def test_enqueue_json_and_form_with_the_path_queue_and_idempotency_key(app: Api,
                                                                        svc: Service) -> None:
    a = post_json(app, "/queue", {"url": URL, "params": {"k": "v"}})
    task = svc.calls[-1][1]
    assert a.status == 200 and a.json() == {"status": "scheduled", "id": task.id}
    assert (task.queue, task.url, task.params, task.created) == ("default", URL, {"k": "v"}, NOW)
    post_json(app, "/queue/", {"url": URL})
    assert svc.calls[-1][1].queue == "default"
    post_json(app, "/queue/mail", {"url": URL}, headers={"Idempotency-Key": "k-1"})
    task = svc.calls[-1][1]
    assert (task.queue, task.name) == ("mail", "k-1")
    # a key longer than a name may be is refused, even beside a name in the body
    error_of(post_json(app, "/queue/mail", {"url": URL, "name": "n"},
                       headers={"Idempotency-Key": "k" * 501}), 400, "Idempotency-Key")
    a = call(app, "POST", "/queue/mail", f"task.url={URL}&x=1".encode(), ctype=FORM)
    assert a.status == 200 and svc.calls[-1][1].params == {"x": "1"}
    a = call(app, "POST", "/queue", f"task.url={URL}".encode())  # no type: a form
    assert a.status == 200
    error_of(call(app, "POST", "/queue", b"{}", ctype="text/plain"), 415, "Content-Type")
    error_of(post_json(app, "/queue", {"params": {}}), 400, "url")


def test_a_batch_is_json_within_max_batch(app: Api, svc: Service) -> None:
    a = post_json(app, "/queue/mail/batch", [{"url": URL}, {"url": URL, "name": "n"}])
    assert a.status == 200 and a.json()["status"] == "ok"
    tasks = svc.calls[-1][1]
    assert [t.queue for t in tasks] == ["mail", "mail"] and tasks[1].name == "n"
    assert [r["id"] for r in a.json()["tasks"]] == [t.id for t in tasks]
    assert post_json(app, "/queue/mail/batch", [{"url": URL}] * 3).status == 200
    assert "more than 3 tasks" in error_of(
        post_json(app, "/queue/mail/batch", [{"url": URL}] * 4), 413, "body")
    one = ujson.dumps([{"url": URL}]).encode()
    a = call(app, "POST", "/queue/mail/batch", one, ctype=FORM)
    error_of(a, 415, "Content-Type")
    assert a.status_line == "415 Unsupported Media Type"
    assert call(app, "POST", "/queue/mail/batch", one).status == 200  # no type: JSON


def test_task_routes_answer_what_the_node_says_or_404(app: Api, svc: Service) -> None:
    assert call(app, "GET", "/tasks/t-1").json() == {"id": "t-1", "state": "scheduled"}
    for method, path, key, value in (("DELETE", "/tasks/t-1", "state", "deleted"),
                                     ("POST", "/tasks/t-1/retry", "reruns", 1)):
        a = call(app, method, path)
        assert a.status == 200 and a.json()[key] == value, path
    for method, path in (("GET", "/tasks/t-9"), ("DELETE", "/tasks/t-9"),
                         ("POST", "/tasks/t-9/retry")):
        assert error_of(call(app, method, path), 404, "id") == "id names no known task"
    assert svc.calls[:3] == [("get_task", "t-1"), ("delete", "t-1"), ("rerun", "t-1")]


def test_find_a_task_by_its_name(app: Api, svc: Service) -> None:
    assert call(app, "GET", "/tasks", query="name=known&queue=mail").json() == {"id": "t-1"}
    assert call(app, "GET", "/tasks", query="name=known").status == 200
    assert svc.calls == [("find_task", "mail", "known"), ("find_task", "default", "known")]
    assert "dedup_window" in error_of(call(app, "GET", "/tasks", query="name=x"), 404, "name")
    assert call(app, "GET", "/tasks", query="name=" + "x" * 500).status == 404
    for query, field in [("name=", "name"), ("name=" + "x" * 501, "name"),
                         ("name=a&queue=b%2Fad", "queue"), ("name=a&queue=", "queue")]:
        error_of(call(app, "GET", "/tasks", query=query), 400, field)


def test_browse_tasks_by_state_and_filters_a_page_at_a_time(app: Api, svc: Service) -> None:
    a = call(app, "GET", "/tasks")
    assert a.status == 200
    assert a.json() == {"state": "scheduled", "tasks": [{"id": "t-1"}], "next_cursor": None,
                        "nodes": ["n1"]}
    assert svc.calls[-1] == ("browse", Filter(State.SCHEDULED), None, 50)
    call(app, "GET", "/tasks", query="state=failed&queue=mail&target=http%3A%2F%2Fw"
         "&name_prefix=inv-&cursor=12.5~t-9&limit=500")
    assert svc.calls[-1] == ("browse", Filter(State.FAILED, "mail", "http://w", "inv-"),
                             (12.5, "t-9"), 500)
    call(app, "GET", "/tasks", query="queue=&target=&name_prefix=&cursor=")  # empty: no filter
    assert svc.calls[-1] == ("browse", Filter(State.SCHEDULED), None, 50)
    for query, field in [("state=lost", "state"), ("queue=a%2Fb", "queue"),
                         ("cursor=12", "cursor"), ("cursor=x~t", "cursor"), ("limit=501", "limit"),
                         ("limit=0", "limit"), ("target=" + "x" * 2084, "target"),
                         ("name_prefix=" + "x" * 2084, "name_prefix")]:
        error_of(call(app, "GET", "/tasks", query=query), 400, field)


def test_rates_over_five_minutes_or_an_hour_in_a_few_hundred_points(app: Api,
                                                                     svc: Service) -> None:
    assert call(app, "GET", "/rates").json() == {"step": 1}
    assert svc.calls[-1] == ("rates", 300, 1, None)
    call(app, "GET", "/rates", query="seconds=3600&node=n2")
    assert svc.calls[-1] == ("rates", 3600, 10, "n2")
    call(app, "GET", "/rates", query="seconds=1000")  # whole steps of 3 s
    assert svc.calls[-1] == ("rates", 999, 3, None)
    for query, field in [("seconds=59", "seconds"), ("seconds=3601", "seconds"),
                         ("seconds=1e3", "seconds"), ("seconds=", "seconds"),
                         ("node=a%2Fb", "node")]:
        error_of(call(app, "GET", "/rates", query=query), 400, field)
    error_of(call(app, "GET", "/rates", query="node=gone"), 404, "node")


def test_list_a_queues_tasks_by_state_and_limit(app: Api, svc: Service) -> None:
    a = call(app, "GET", "/queues/mail/tasks")
    assert a.json() == {"queue": "mail", "state": "scheduled", "tasks": [{"id": "t-1"}]}
    assert svc.calls[-1] == ("list_tasks", "mail", State.SCHEDULED, 100)
    a = call(app, "GET", "/queues/mail/tasks", query="state=failed&limit=1")
    assert a.json()["state"] == "failed" and svc.calls[-1] == ("list_tasks", "mail",
                                                                State.FAILED, 1)
    call(app, "GET", "/queues/mail/tasks", query="limit=1000")
    assert svc.calls[-1][3] == 1000
    assert "scheduled, running" in error_of(
        call(app, "GET", "/queues/mail/tasks", query="state=lost"), 400, "state")
    error_of(call(app, "GET", "/queues/mail/tasks", query="limit=x"), 400, "limit")
    for limit in ("0", "1001", "-5"):
        assert "between 1 and 1000" in error_of(
            call(app, "GET", "/queues/mail/tasks", query=f"limit={limit}"), 400, "limit")


def test_readyz_says_why_not(app: Api, svc: Service) -> None:
    assert call(app, "GET", "/readyz").json() == {"status": "ready", "reason": ""}
    svc.is_ready = (False, "no leader")
    a = call(app, "GET", "/readyz")
    assert a.status == 503 and a.json() == {"status": "not ready", "reason": "no leader"}


# ================================================================ schedules and topics

SCHEDULE = {"name": "s", "every": 10, "task": {"url": URL}}


def test_schedules_put_list_get_pause_resume_delete(app: Api, svc: Service) -> None:
    a = post_json(app, "/schedules", SCHEDULE)
    assert a.status == 200, a.body
    shown = a.json()
    assert shown["name"] == "s" and shown["every"] == 10 and shown["catch_up"] == "last"
    assert shown["next"] == [1010.0, 1020.0, 1030.0, 1040.0, 1050.0]
    assert call(app, "GET", "/schedules").json() == {"schedules": [shown]}
    assert call(app, "GET", "/schedules/").json() == {"schedules": [shown]}
    assert call(app, "GET", "/schedules/s").json() == shown
    svc.definitions.write([("cursor", "s", {"tick": 990.0, "ids": ["t-7"]})])
    assert call(app, "GET", "/schedules/s").json()["last_task_ids"] == ["t-7"]
    paused = call(app, "POST", "/schedules/s/pause").json()
    assert paused["paused"] is True and paused["next"] == [] and paused["last_tick"] == 990.0
    assert call(app, "POST", "/schedules/s/resume").json()["paused"] is False
    assert call(app, "DELETE", "/schedules/s").json() == {"status": "deleted", "name": "s"}
    assert error_of(call(app, "GET", "/schedules/s"), 404, "name") == \
        "name names no known schedule"
    error_of(call(app, "DELETE", "/schedules/s"), 404, "name")
    error_of(call(app, "POST", "/schedules/s/pause"), 404, "name")
    error_of(call(app, "GET", "/schedules/a.b c"), 400, "name")


def test_a_schedule_is_200_to_get_and_run_and_an_unknown_one_404(app: Api,
                                                                 svc: Service) -> None:
    post_json(app, "/schedules", SCHEDULE)
    got = call(app, "GET", "/schedules/s")
    assert got.status_line == "200 OK" and got.json()["name"] == "s"
    ran = call(app, "POST", "/schedules/s/run")
    assert ran.status_line == "200 OK" and ran.json()["schedule"] == "s"
    assert [t.url for t in svc.calls[-1][1]] == [URL]
    asked = len(svc.calls)
    assert error_of(call(app, "POST", "/schedules/nope/run"), 404, "name") == \
        "name names no known schedule"
    svc.definitions.write([("schedule", "odd", {"every": 10})])  # stored without a task
    error_of(call(app, "POST", "/schedules/odd/run"), 404, "name")
    assert len(svc.calls) == asked  # nothing enqueued


def test_a_traceparent_header_reaches_the_task_unless_the_body_names_one(app: Api,
                                                                        svc: Service) -> None:
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    field = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    post_json(app, "/queue", {"url": URL}, headers={"traceparent": header})
    assert svc.calls[-1][1].traceparent == header
    post_json(app, "/queue", {"url": URL, "traceparent": field}, headers={"traceparent": header})
    assert svc.calls[-1][1].traceparent == field
    post_json(app, "/queue", {"url": URL})
    assert not svc.calls[-1][1].traceparent


def test_a_schedule_takes_the_clusters_catch_up_default(app: Api, svc: Service) -> None:
    svc.config.schedule_catch_up = "none"
    assert post_json(app, "/schedules", SCHEDULE).json()["catch_up"] == "none"


def test_a_bad_schedule_names_the_field(app: Api) -> None:
    error_of(post_json(app, "/schedules", dict(SCHEDULE, every=0)), 400, "every")
    error_of(post_json(app, "/schedules", dict(SCHEDULE, task={"url": "ftp://x"})), 400,
             "task.url")


def test_a_stored_schedule_that_does_not_fit_is_left_out_not_a_500(app: Api,
                                                                    svc: Service) -> None:
    post_json(app, "/schedules", SCHEDULE)
    svc.definitions.write([("schedule", "bad", {"name": "bad", "every": 10})])
    assert [v["name"] for v in call(app, "GET", "/schedules").json()["schedules"]] == ["s"]
    error_of(call(app, "GET", "/schedules/bad"), 404, "name")
    svc.definitions.write([("cursor", "s", {"tick": "x"})])  # not a dict's worth: ignored
    svc.definitions.write([("cursor", "s", ["x"])])
    assert call(app, "GET", "/schedules/s").json()["last_tick"] is None


def test_the_schedule_count_is_bounded_but_a_replace_always_goes(app: Api, svc: Service,
                                                                 monkeypatch) -> None:
    from miyamoto.http import definitions as routes
    monkeypatch.setattr(routes, "MAX_SCHEDULES", 2)
    for name in ("a", "b"):
        assert post_json(app, "/schedules", dict(SCHEDULE, name=name)).status == 200
    assert "would be schedule 3" in error_of(
        post_json(app, "/schedules", dict(SCHEDULE, name="c")), 400, "name")
    assert post_json(app, "/schedules", dict(SCHEDULE, name="a", every=20)).status == 200


def test_topics_put_list_get_delete(app: Api) -> None:
    urls = [URL, URL + "2"]
    a = call(app, "PUT", "/topics/t", ujson.dumps({"urls": urls}).encode(), ctype=JSON)
    assert a.status == 200 and a.json() == {"name": "t", "urls": urls}
    assert call(app, "GET", "/topics").json() == {"topics": [{"name": "t", "urls": urls}]}
    assert call(app, "GET", "/topics/").status == 200
    assert call(app, "GET", "/topics/t").json() == {"name": "t", "urls": urls}
    assert call(app, "DELETE", "/topics/t").json() == {"status": "deleted", "name": "t"}
    assert error_of(call(app, "GET", "/topics/t"), 404, "name") == "name names no known topic"
    error_of(call(app, "DELETE", "/topics/t"), 404, "name")
    error_of(call(app, "PUT", "/topics/a b", b'{"urls": []}', ctype=JSON), 400, "name")
    error_of(call(app, "PUT", "/topics/t", b'{"urls": []}', ctype=JSON), 400, "urls")


def test_the_topic_count_is_bounded_but_a_replace_always_goes(app: Api, monkeypatch) -> None:
    from miyamoto.http import definitions as routes
    monkeypatch.setattr(routes, "MAX_TOPICS", 1)
    body = ujson.dumps({"urls": [URL]}).encode()
    assert call(app, "PUT", "/topics/a", body, ctype=JSON).status == 200
    assert "would be topic 2" in error_of(call(app, "PUT", "/topics/b", body, ctype=JSON),
                                          400, "name")
    assert call(app, "PUT", "/topics/a", body, ctype=JSON).status == 200


def put_topic(app: Api, urls: list[str]) -> None:
    assert call(app, "PUT", "/topics/t", ujson.dumps({"urls": urls}).encode(),
                ctype=JSON).status == 200


def test_an_enqueue_naming_a_topic_fans_out(app: Api, svc: Service) -> None:
    urls = [URL, URL + "2"]
    put_topic(app, urls)
    a = post_json(app, "/queue/mail", {"topic": "t", "params": {"k": "v"}},
                  headers={"Idempotency-Key": "k-1"})
    tasks = svc.calls[-1][1]
    assert a.status == 200 and [t.url for t in tasks] == urls
    assert {t.queue for t in tasks} == {"mail"}
    assert [t.name for t in tasks] == [f"k-1:{topics.url_suffix(u)}" for u in urls]
    assert a.json() == {"status": "scheduled", "topic": "t", "ids": [t.id for t in tasks],
                        "tasks": [{"url": t.url, "id": t.id, "status": "scheduled"}
                                  for t in tasks]}
    form = call(app, "POST", "/queue", b"task.topic=t&x=2", ctype=FORM)
    assert form.status == 200 and len(form.json()["ids"]) == 2


def test_a_fan_out_answer_sums_up_its_tasks(app: Api, svc: Service) -> None:
    put_topic(app, [URL, URL + "2"])
    svc.results = [{"status": "duplicate", "id": "a"}, {"status": "duplicate", "id": "b"}]
    a = post_json(app, "/queue", {"topic": "t", "name": "n"})
    assert a.status == 409 and a.json()["status"] == "duplicate" and a.json()["ids"] == ["a", "b"]
    svc.results = [{"status": "duplicate", "id": "a"}, {"status": "scheduled", "id": "b"}]
    a = post_json(app, "/queue", {"topic": "t", "name": "n"})
    assert a.status == 200 and a.json()["status"] == "scheduled"
    svc.results = [{"status": "error", "id": "a", "error": "too few replicas"},
                   {"status": "scheduled", "id": "b"}]
    a = post_json(app, "/queue", {"topic": "t", "name": "n"})
    doc = a.json()
    assert a.status == 503 and doc["status"] == "error" and "see tasks" in doc["error"]
    assert doc["tasks"][0]["error"] == "too few replicas" and "error" not in doc["tasks"][1]


def test_a_fan_out_to_an_unknown_or_bad_topic_is_404(app: Api, svc: Service) -> None:
    error_of(post_json(app, "/queue", {"topic": "nope"}), 404, "topic")
    svc.definitions.write([("topic", "odd", {"urls": [URL, 5]})])
    error_of(post_json(app, "/queue", {"topic": "odd"}), 404, "topic")
    svc.definitions.write([("topic", "odd", {"urls": URL})])
    error_of(post_json(app, "/queue", {"topic": "odd"}), 404, "topic")
    error_of(post_json(app, "/queue", {"topic": "a/b"}), 400, "topic")
    assert not [c for c in svc.calls if c[0] == "enqueue_many"]


def test_definition_writes_without_a_ready_leader_are_503(svc: Service) -> None:
    svc.definitions = DefSync("n1", ":memory:", lambda *a, **k: True, "tcp://x:1",
                              monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
    app = Api(svc, Limits(), max_batch=3, clock=lambda: NOW)
    a = post_json(app, "/schedules", SCHEDULE)
    assert a.status == 503 and "no leader" in a.json()["error"]
    assert call(app, "GET", "/schedules").json() == {"schedules": []}


def test_schedule_views_use_the_clock(svc: Service) -> None:
    now = [NOW]
    app = Api(svc, Limits(), max_batch=3, clock=lambda: now[0])
    post_json(app, "/schedules", SCHEDULE)
    now[0] = 2005.0
    assert call(app, "GET", "/schedules/s").json()["next"][0] == 2010.0
    assert call(app, "POST", "/schedules/s/pause").json()["paused"] is True
    assert call(app, "POST", "/schedules/s/resume").json()["next"][0] == 2010.0
    assert schedules.upcoming({"every": 10}, 2005.0, 1) == [2010.0]


def test_an_absolute_eta_is_taken_on_the_clusters_clock(app: Api, svc: Service) -> None:
    """The node's clock reads 1000 and the cluster's 970 (this node runs 30 s ahead): an
    eta of 973 fires at 1003 here, whether enqueued alone or in a batch; a countdown
    of 3 at 1003 as well."""
    svc.offset = -30.0
    assert post_json(app, "/queue", {"url": URL, "eta": 973.0}).status == 200
    assert post_json(app, "/queue", {"url": URL, "countdown": 3}).status == 200
    assert post_json(app, "/queue/default/batch", [{"url": URL, "eta": 973.0}]).status == 200
    tasks = [c[1] for c in svc.calls if c[0] == "enqueue"]
    tasks += [t for c in svc.calls if c[0] == "enqueue_many" for t in c[1]]
    assert [t.fire_at for t in tasks] == [NOW + 3] * 3


def test_head_is_get_without_the_body(app: Api) -> None:
    get, head = call(app, "GET", "/queues"), call(app, "HEAD", "/queues")
    assert head.status == 200 and head.body == b""
    assert head.headers["Content-Length"] == get.headers["Content-Length"] != "0"
    assert call(app, "head", "/queues").status == 200  # a method is case-blind


def test_the_service_errors_become_answers(app: Api, svc: Service) -> None:
    svc.raise_ = Duplicate("orig-1")
    a = call(app, "GET", "/queues")
    assert a.status_line == "409 Conflict" and a.json() == {"status": "duplicate",
                                                            "id": "orig-1"}
    svc.raise_ = Conflict("the task succeeded")
    assert error_of(call(app, "GET", "/queues"), 409) == "the task succeeded"
    svc.raise_ = Unavailable("too few replicas")
    a = call(app, "GET", "/queues")
    assert error_of(a, 503) == "too few replicas"
    assert a.status_line == "503 Service Unavailable"
    svc.raise_ = ValidationError("flow_key", "is odd", 422)
    a = call(app, "GET", "/queues")
    assert error_of(a, 422, "flow_key") == "flow_key is odd"
    assert a.status_line == "422 Error"


def test_tokens_guard_each_route_by_its_scope(svc: Service) -> None:
    admin, enq, read = "a" * 24, "e" * 24, "r" * 24
    app = Api(svc, Limits(), max_batch=3, clock=lambda: NOW,
              tokens=auth.Tokens([("admin", admin), ("enqueue", enq), ("read", read)]))

    def status(method: str, path: str, token: str | None, body: bytes | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return call(app, method, path, body, ctype=JSON if body else None,
                    headers=headers).status
    a = call(app, "GET", "/queues")
    assert error_of(a, 401).startswith("Authorization: Bearer token is missing")
    assert a.headers["WWW-Authenticate"] == 'Bearer realm="miyamoto"'
    a = call(app, "GET", "/queues", headers={"Authorization": "Bearer " + "x" * 24})
    assert a.status == 401 and "not a valid API token" in a.json()["error"]
    assert status("GET", "/healthz", None) == 200 and status("GET", "/readyz", None) == 200
    assert status("GET", "/", None) == 200
    task = ujson.dumps({"url": URL}).encode()
    assert status("POST", "/queue", enq, task) == 200
    assert status("POST", "/queue/default/batch", enq, b"[" + task + b"]") == 200
    assert status("GET", "/tasks/t-1", enq) == 200 and status("GET", "/tasks/t-1", read) == 200
    assert status("POST", "/queue", read, task) == 403
    a = call(app, "GET", "/queues", headers={"Authorization": f"Bearer {enq}"})
    assert error_of(a, 403).endswith("(it needs read or admin)")
    assert "WWW-Authenticate" not in a.headers
    assert status("HEAD", "/queues", read) == 200 and status("GET", "/metrics", read) == 200
    assert status("POST", "/queues/default/pause", read) == 403
    assert status("POST", "/queues/default/pause", enq) == 403
    assert status("POST", "/queues/default/pause", admin) == 200
    assert status("DELETE", "/tasks/t-1", enq) == 403
    assert status("DELETE", "/tasks/t-1", admin) == 200


def test_queue_and_operation_routes(app: Api, svc: Service) -> None:
    assert call(app, "GET", "/queues").json() == {"queues": [{"name": "default"}],
                                                  "next_cursor": None}
    assert svc.calls[-1] == ("queues", QUEUES_PAGE, "")
    assert call(app, "GET", "/queues", query="limit=2&cursor=mail").status == 200
    assert svc.calls[-1] == ("queues", 2, "mail")  # a page goes on after its cursor
    assert call(app, "GET", "/queues", query="cursor=a%20b").status == 400
    assert call(app, "GET", "/queues/").status == 200
    assert call(app, "GET", "/queues/mail").json() == {"name": "mail"}
    assert call(app, "GET", "/queues/nosuch").status == 404  # a queue nothing made
    for action in ("pause", "resume", "purge"):
        assert call(app, "POST", f"/queues/mail/{action}").json() == {"queue": "mail",
                                                                      "action": action}
    for action in ("retry", "delete"):
        assert call(app, "POST", f"/queues/mail/failed/{action}").json()["action"] == action
    assert call(app, "POST", "/queues/mail/stop").status == 404
    assert call(app, "GET", "/cluster").json() == {"leader": "n1"}
    assert call(app, "GET", "/targets").json() == {"targets": [{"origin": "http://127.0.0.1:9"}]}
    a = call(app, "GET", "/metrics")
    assert a.body == b"# metrics\n" and a.headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert call(app, "GET", "/openapi.json").json() == ujson.loads(ujson.dumps(SPEC))


# ================================================================ long tasks' completion URL

class LongTasks(Service):
    """A service whose completion and heartbeat check the token as the node does."""

    def complete(self, task_id: str, token: str, report: Any) -> dict | None:
        self._record("complete", task_id, token, report)
        if token != "good":
            raise completion.TokenError("is not valid for this task")
        return self.tasks.get(task_id)

    def heartbeat(self, task_id: str, token: str, lease: float | None) -> dict | None:
        self._record("heartbeat", task_id, token, lease)
        return self.tasks.get(task_id)


def test_a_report_at_the_completion_url_needs_no_api_token_but_its_own() -> None:
    s = LongTasks()
    app = Api(s, Limits(max_body=10000), max_batch=3, clock=lambda: NOW,
              tokens=auth.Tokens([("admin", "a" * 24)]))
    a = post_json(app, "/tasks/t-1/complete", {"state": "succeeded", "result": [1]},
                  query="token=good")
    assert a.status == 200 and s.calls[-1] == ("complete", "t-1", "good",
                                               completion.Report("succeeded", [1]))
    error_of(post_json(app, "/tasks/t-1/complete", {"state": "failed"}, query="token=bad"),
             403, "token")
    error_of(post_json(app, "/tasks/t-1/complete", {"state": "failed"}), 403, "token")
    error_of(post_json(app, "/tasks/t-1/complete", {"state": "done"}, query="token=good"),
             400, "state")
    error_of(post_json(app, "/tasks/t-1/complete", {"state": "failed", "result": "r" * 5000},
                       query="token=good"), 400, "result")
    error_of(call(app, "POST", "/tasks/t-1/complete", b"{", query="token=good"), 400, "body")
    error_of(post_json(app, "/tasks/t-9/complete", {"state": "failed"}, query="token=good"),
             404, "id")
    s.raise_ = Conflict("this attempt is over")
    assert post_json(app, "/tasks/t-1/complete", {"state": "failed"},
                     query="token=good").status == 409


def test_a_heartbeat_takes_a_bounded_lease_or_none(app: Api) -> None:
    s = LongTasks()
    app = Api(s, Limits(max_body=1000), max_batch=3, clock=lambda: NOW)
    assert call(app, "POST", "/tasks/t-1/heartbeat", b"", query="token=good").status == 200
    assert s.calls[-1] == ("heartbeat", "t-1", "good", None)
    assert post_json(app, "/tasks/t-1/heartbeat", {"lease": 60},
                     query="token=good").status == 200
    assert s.calls[-1][-1] == 60
    error_of(post_json(app, "/tasks/t-1/heartbeat", {"lease": 0}, query="token=good"),
             400, "lease")
    error_of(post_json(app, "/tasks/t-1/heartbeat", {"lease": 10 ** 7}, query="token=good"),
             400, "lease")
    error_of(post_json(app, "/tasks/t-1/heartbeat", {"x": 1}, query="token=good"), 400, "body")


class QueueService(Service):
    """The recording service with the queue-settings and bulk-resend reads a node makes."""

    def put_queue(self, name: str, changes: dict) -> dict:
        self._record("put_queue", name, changes)
        return {"name": name, "settings": changes}

    def reset_queue(self, name: str) -> dict | None:
        self._record("reset_queue", name)
        return {"name": name} if name == "mail" else None

    def resend_many(self, queue: str, f: dict) -> dict:
        self._record("resend_many", queue, f)
        return {"count": 2, "more": False}


def test_queue_settings_are_put_and_reset_through_the_api() -> None:
    svc = QueueService()
    app = Api(svc, Limits(max_body=1000), max_batch=3, clock=lambda: NOW)
    a = call(app, "PUT", "/queues/mail", b'{"rate": 5}', ctype=JSON)
    assert a.status_line == "200 OK" and a.json() == {"name": "mail", "settings": {"rate": 5.0}}
    assert svc.calls[-1] == ("put_queue", "mail", {"rate": 5.0})
    error_of(call(app, "PUT", "/queues/mail", b'{"speed": 5}', ctype=JSON), 400, "speed")
    a = call(app, "DELETE", "/queues/mail")
    assert a.status_line == "200 OK" and a.json() == {"name": "mail"}
    assert "has no settings made through the API" in error_of(
        call(app, "DELETE", "/queues/other"), 404, "queue")


def test_a_bulk_resend_takes_its_filters_from_the_query() -> None:
    svc = QueueService()
    app = Api(svc, Limits(max_body=1000), max_batch=3, clock=lambda: NOW)
    a = call(app, "POST", "/queues/mail/resend")
    assert a.status_line == "200 OK" and a.json() == {"count": 2, "more": False}
    assert svc.calls[-1] == ("resend_many", "mail", {"state": "failed"})
    call(app, "POST", "/queues/mail/resend",
         query="state=expired&target=http%3A%2F%2Fw%2F&since=5&until=9")
    assert svc.calls[-1] == ("resend_many", "mail", {"state": "expired", "target": "http://w/",
                                                     "since": 5.0, "until": 9.0})
    error_of(call(app, "POST", "/queues/mail/resend", query="state=scheduled"), 400, "state")
    error_of(call(app, "POST", "/queues/mail/resend", query="target="), 400, "target")


def test_a_schedule_run_with_an_idempotency_key_is_named_by_it(app: Api, svc: Service) -> None:
    post_json(app, "/schedules", SCHEDULE)
    call(app, "POST", "/schedules/s/run", headers={"Idempotency-Key": "k-1"})
    assert [t.name for t in svc.calls[-1][1]] == ["schedule:s:run:k-1"]
    call(app, "POST", "/schedules/s/run")
    assert [t.name for t in svc.calls[-1][1]] == [None]


def test_a_topic_is_200_to_get(app: Api) -> None:
    call(app, "PUT", "/topics/t", b'{"urls": ["http://127.0.0.1:9/w"]}', ctype=JSON)
    got = call(app, "GET", "/topics/t")
    assert got.status_line == "200 OK" and got.json()["name"] == "t"
