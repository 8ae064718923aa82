"""Cloud Tasks' v2 REST API as a second face of the node: ``/v2/projects/P/locations/L/
queues/Q[/tasks/T]`` and their ``:run``, ``:pause``, ``:resume``, ``:purge``, answered
from the same engine as the native routes (``http/api.py`` hands every path under
PREFIX here), so the ``google-cloud-tasks`` SDK's REST transport works against a node.

Q is our queue's name and T our task's name (its de-duplication key: a repeat is 409
ALREADY_EXISTS); a task created without a name is named by its id. P and L are taken
as given and echoed in every answer: a node is one project and one location. A task
that ended is gone, as in Cloud Tasks (NOT_FOUND; GET /tasks/<id> still shows it).
Every error is Google's JSON shape with its canonical code (``cloudtasksjson.error``);
tokens apply as on the native routes, by the same scopes. These routes are Google's API,
described by Google and proven by its SDK (tests/nodes/test_cloudtasks_sdk.py), so they
stay out of our OpenAPI document.
"""

from __future__ import annotations

import logging
import re
import time
from http import HTTPStatus
from typing import Any, Callable, Iterable, Protocol
from urllib.parse import parse_qs

import ujson

from miyamoto.definitions.queues import parse_put
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.http import auth
from miyamoto.http import cloudtasksjson as ctj
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.task import CLOUDTASKS, QUEUE_NAME_RE, State
from miyamoto.tasks.validate import Limits, build_task

log = logging.getLogger(__name__)

PREFIX = "/v2/projects/"
MAX_PAGE = 1000  # Cloud Tasks' largest pageSize
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_LIVE = (State.SCHEDULED, State.RUNNING)
_BY_SETTING = {ours: path for path, ours in ctj.QUEUE_PATHS.items()}
View = dict[str, Any]


class CloudError(Exception):
    """An answer in Google's error shape: HTTP status, message, the field, the code."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field, self.code = status, message, field, code


class Service(Protocol):
    """What this face asks of the node (``miyamoto.node.Node``), as the native routes do."""

    def enqueue(self, task: Any) -> View: ...
    def get_task(self, task_id: str) -> View | None: ...
    def find_task(self, queue: str, name: str) -> View | None: ...
    def delete(self, task_id: str) -> View | None: ...
    def rerun(self, task_id: str) -> View | None: ...
    def queues(self, limit: int, cursor: str) -> View: ...
    def queue(self, name: str) -> View | None: ...
    def put_queue(self, name: str, changes: dict[str, Any]) -> View: ...
    def reset_queue(self, name: str) -> View | None: ...
    def list_tasks(self, queue: str, state: State, limit: int) -> list[View]: ...
    def control(self, queue: str, action: str) -> View | None: ...
    def clock_offset(self) -> float: ...  # the cluster's clock minus ours (absolute times)


class CloudTasks:
    def __init__(self, service: Service, tokens: auth.Tokens, limits: Limits,
                 clock: Callable[[], float] = time.time):
        self.service, self.tokens, self.limits, self.clock = service, tokens, limits, clock
        loc = r"/v2/projects/(?P<project>[^/:]+)/locations/(?P<location>[^/:]+)"
        q, t = rf"{loc}/queues/(?P<queue>[^/:]+)", r"/tasks/(?P<task>[^/:]+)"
        self.routes: list[tuple[re.Pattern[str], dict[str, tuple[Callable[..., Any], str]]]] = [
            (re.compile(rf"{loc}/queues"), {"GET": (self.list_queues, auth.READ),
                                            "POST": (self.create_queue, auth.ADMIN)}),
            (re.compile(q), {"GET": (self.get_queue, auth.READ),
                             "PATCH": (self.patch_queue, auth.ADMIN),
                             "DELETE": (self.delete_queue, auth.ADMIN)}),
            (re.compile(rf"{q}:(?P<action>pause|resume|purge)"),
             {"POST": (self.control, auth.ADMIN)}),
            (re.compile(rf"{q}/tasks"), {"GET": (self.list_tasks, auth.READ),
                                         "POST": (self.create_task, auth.ENQUEUE)}),
            (re.compile(q + t), {"GET": (self.get_task, auth.TASK),
                                 "DELETE": (self.delete_task, auth.ADMIN)}),
            (re.compile(rf"{q}{t}:run"), {"POST": (self.run_task, auth.ADMIN)}),
        ]

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        """The WSGI answer: a JSON body, an error in Google's shape, never a traceback."""
        status, body = self.dispatch(environ)
        data = ujson.dumps(body, ensure_ascii=False, escape_forward_slashes=False).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        if status == 401:
            headers.append(("WWW-Authenticate", 'Bearer realm="miyamoto"'))
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [data]

    def dispatch(self, environ: dict) -> tuple[int, Any]:
        """The answer to a request under PREFIX: (status, JSON body), never an exception."""
        try:
            return self._route(environ)
        except auth.Denied as e:
            return e.status, ctj.error(e.status, e.message)
        except CloudError as e:
            return e.status, ctj.error(e.status, e.message, e.field, e.code)
        except ValidationError as e:
            field = ctj.cloud_field(e.field)
            return e.status, ctj.error(e.status, f"{field} {e.message}", field)
        except Duplicate as e:
            return 409, ctj.error(409, f"a task of this name exists already (id {e.original_id})"
                                       "; a name stays taken for dedup_window after it ends")
        except Conflict as e:
            return 400, ctj.error(400, str(e), code="FAILED_PRECONDITION")
        except Unavailable as e:
            return 503, ctj.error(503, str(e))
        except Exception:
            log.exception("cloudtasks: %s %s failed", environ.get("REQUEST_METHOD"),
                          environ.get("PATH_INFO"))
            return 500, ctj.error(500, "internal error")

    def _route(self, environ: dict) -> tuple[int, Any]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET").upper()
        for pattern, handlers in self.routes:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            handler, need = handlers.get(method) or (None, auth.ADMIN)
            self.tokens.check(environ.get("HTTP_AUTHORIZATION"), need)
            if handler is None:
                raise CloudError(405, f"{method} is not a method of {path} (it takes "
                                      f"{', '.join(handlers)})")
            args = m.groupdict()
            if "queue" in args and not QUEUE_NAME_RE.fullmatch(args["queue"]):
                raise CloudError(400, "the queue id must be 1-100 characters of A-Z a-z "
                                      "0-9 _ -", "name")
            return handler(environ, **args)
        raise CloudError(404, f"no Cloud Tasks method at {path}")

    def _json(self, environ: dict) -> Any:
        """The request's JSON object; without a Content-Length (chunked) read to the cap."""
        length = environ.get("CONTENT_LENGTH") or ""
        most = self.limits.max_body
        if length and (not length.isdigit() or int(length) > most):
            raise CloudError(413 if length.isdigit() else 400, f"the body is larger than "
                             f"{most} bytes" if length.isdigit() else "bad Content-Length")
        try:
            data = environ["wsgi.input"].read(int(length) if length else most + 1)
        except (OSError, ValueError):  # a broken chunk, a client that left: theirs
            raise CloudError(400, "the body could not be read: it ended early or its "
                                  "chunked encoding is broken") from None
        if len(data) > most:
            raise CloudError(413, f"the body is larger than {most} bytes")
        try:
            body = ujson.loads(data) if data.strip() else {}
        except (ValueError, UnicodeDecodeError):
            raise CloudError(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise CloudError(400, "the body must be a JSON object")
        return body

    # ------------------------------------------------------------ tasks
    def create_task(self, environ: dict, project: str, location: str,
                    queue: str) -> tuple[int, Any]:
        body = self._json(environ)
        if set(body) - {"task", "responseView"}:
            raise CloudError(400, "the body must be a CreateTaskRequest: {\"task\": {...}}",
                             "task")
        now, offset = self.clock(), self.service.clock_offset()
        # scheduleTime is absolute: judged on the cluster's clock, as every face's eta is
        fields, _ = ctj.task_fields(body.get("task"), queue, now + offset)
        task = build_task(fields, path_queue=queue, idempotency_key=None, limits=self.limits,
                          now=now, offset=offset).evolve(face=CLOUDTASKS)
        self.service.enqueue(task)
        return 200, ctj.task_view(_parent(project, location, queue), task.summary())

    def get_task(self, environ: dict, project: str, location: str, queue: str,
                 task: str) -> tuple[int, Any]:
        return 200, ctj.task_view(_parent(project, location, queue), self._live(queue, task))

    def list_tasks(self, environ: dict, project: str, location: str,
                   queue: str) -> tuple[int, Any]:
        limit = _page_size(environ)
        found: list[View] = []
        for state in _LIVE:
            found += self.service.list_tasks(queue, state, limit - len(found))
            if len(found) >= limit:
                break
        parent = _parent(project, location, queue)
        return 200, {"tasks": [ctj.task_view(parent, t) for t in found]}

    def delete_task(self, environ: dict, project: str, location: str, queue: str,
                    task: str) -> tuple[int, Any]:
        found = self._live(queue, task)
        try:
            self.service.delete(found["id"])
        except Conflict:  # it ended meanwhile
            raise _gone(task) from None
        return 200, {}

    def run_task(self, environ: dict, project: str, location: str, queue: str,
                 task: str) -> tuple[int, Any]:
        """Dispatch a scheduled task now (not past a paused queue, unlike Cloud Tasks)."""
        found = self.service.rerun(self._live(queue, task)["id"])
        if found is None or "conflict" in found:
            raise CloudError(400, f"task {task} cannot run now: "
                             f"{(found or {}).get('conflict', 'it ended')}",
                             code="FAILED_PRECONDITION")
        return 200, ctj.task_view(_parent(project, location, queue), found)

    def _live(self, queue: str, task: str) -> View:
        """The task T of queue Q, by name or (a task made without one) by id; NOT_FOUND
        if it is unknown or ended."""
        found = None
        if _UUID_RE.fullmatch(task):
            found = self.service.get_task(task)
            if found is not None and found.get("queue") != queue:
                found = None
        if found is None and ctj.TASK_ID_RE.fullmatch(task):
            found = self.service.find_task(queue, task)
        if found is None:
            raise CloudError(404, f"task {task} is not in queue {queue}", "name")
        if found.get("state") not in (State.SCHEDULED.value, State.RUNNING.value):
            raise _gone(task, found)
        return found

    # ------------------------------------------------------------ queues
    def list_queues(self, environ: dict, project: str, location: str) -> tuple[int, Any]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        cursor = (query.get("pageToken") or [""])[0]
        if cursor and not QUEUE_NAME_RE.fullmatch(cursor):
            raise CloudError(400, "pageToken must be the nextPageToken of a previous page",
                             "pageToken")
        page = self.service.queues(_page_size(environ), cursor)
        out: dict[str, Any] = {"queues": [ctj.queue_view(_loc(project, location), v)
                                          for v in page["queues"]]}
        if page.get("next_cursor"):
            out["nextPageToken"] = page["next_cursor"]
        return 200, out

    def get_queue(self, environ: dict, project: str, location: str,
                  queue: str) -> tuple[int, Any]:
        return 200, ctj.queue_view(_loc(project, location), self._queue(queue))

    def create_queue(self, environ: dict, project: str, location: str) -> tuple[int, Any]:
        """CreateQueue: its rate and retry settings become the queue's API settings,
        on every node (``PUT /queues/<name>``'s)."""
        body = self._json(environ)
        name = _queue_id(body, project, location)
        changes = ctj.queue_settings(body)
        if self.service.queue(name) is not None:
            raise CloudError(409, f"queue {name} exists already")
        return 200, ctj.queue_view(_loc(project, location), self._put(name, changes))

    def patch_queue(self, environ: dict, project: str, location: str,
                    queue: str) -> tuple[int, Any]:
        """UpdateQueue: the fields given (those of ``updateMask``, when given) set; the
        queue is created if it does not exist, as Cloud Tasks does."""
        body = self._json(environ)
        if body.get("name") is not None and _queue_id(body, project, location) != queue:
            raise CloudError(400, "queue.name differs from the queue in the path", "queue.name")
        mask = (parse_qs(environ.get("QUERY_STRING", "")).get("updateMask") or [None])[0]
        changes = ctj.queue_settings(body, mask)
        return 200, ctj.queue_view(_loc(project, location), self._put(queue, changes))

    def _put(self, queue: str, changes: dict[str, Any]) -> View:
        """The settings written cluster-wide, checked as a PUT /queues/<name>'s are; a
        refused one named as the Queue's field."""
        try:
            return self.service.put_queue(queue, parse_put(changes))
        except ValidationError as e:
            path = _BY_SETTING.get(e.field)
            if path is None:
                raise
            raise CloudError(e.status, f"queue.{path} {e.message}", f"queue.{path}") from None

    def delete_queue(self, environ: dict, project: str, location: str,
                     queue: str) -> tuple[int, Any]:
        """DeleteQueue: its tasks are purged and the settings made through the API
        dropped; the name stays known (a declared queue is the config's; another one
        expires when idle)."""
        if self.service.control(queue, "purge") is None:
            raise _no_queue(queue)
        self.service.reset_queue(queue)
        return 200, {}

    def control(self, environ: dict, project: str, location: str, queue: str,
                action: str) -> tuple[int, Any]:
        if self.service.control(queue, action) is None:
            raise _no_queue(queue)
        return 200, ctj.queue_view(_loc(project, location), self._queue(queue))

    def _queue(self, queue: str) -> View:
        found = self.service.queue(queue)
        if found is None:
            raise _no_queue(queue)
        return found


def _loc(project: str, location: str) -> str:
    return f"projects/{project}/locations/{location}"


def _parent(project: str, location: str, queue: str) -> str:
    return f"{_loc(project, location)}/queues/{queue}"


def _no_queue(queue: str) -> CloudError:
    return CloudError(404, f"queue {queue} does not exist", "name")


def _gone(task: str, found: View | None = None) -> CloudError:
    ended = f"it {found['state']} (GET /tasks/{found['id']} shows it)" if found else "it ended"
    return CloudError(404, f"task {task} does not exist: {ended}", "name")


def _queue_id(body: Any, project: str, location: str) -> str:
    """Q of a Queue's name projects/P/locations/L/queues/Q (P and L the path's)."""
    name = body.get("name") if isinstance(body, dict) else None
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 6 or parts[0::2] != ["projects", "locations", "queues"]:
        raise CloudError(400, "queue.name must be projects/P/locations/L/queues/Q",
                         "queue.name")
    if parts[1] != project or parts[3] != location:
        raise CloudError(400, "queue.name's project and location differ from the path's",
                         "queue.name")
    if not QUEUE_NAME_RE.fullmatch(parts[5]):
        raise CloudError(400, "the queue id must be 1-100 characters of A-Z a-z 0-9 _ -",
                         "queue.name")
    return parts[5]


def _page_size(environ: dict) -> int:
    given = (parse_qs(environ.get("QUERY_STRING", "")).get("pageSize") or ["0"])[0]
    if not given.isdigit() or int(given) > MAX_PAGE:
        raise CloudError(400, f"pageSize must be an integer from 0 to {MAX_PAGE}", "pageSize")
    return int(given) or MAX_PAGE
