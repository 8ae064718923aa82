"""The HTTP API: one WSGI app that parses, routes and answers JSON.

It holds no state and no policy: every route calls the node (``service``, an
``ApiService``), and every failure becomes a 4xx/503 JSON body that names the problem. A handler that raises
anything unexpected is logged and answered 500 with no detail; the tests treat any
500 as a bug.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Iterable, Protocol
from urllib.parse import parse_qs

import ujson

from miyamoto.config.settings import Config
from miyamoto.definitions.queues import parse_put
from miyamoto.definitions.sync import DefSync
from miyamoto.delivery import completion
from miyamoto.delivery.identity import DISCOVERY_PATH, JWKS_PATH, WEBHOOK_KEY_PATH, Identity
from miyamoto.engine import browse, history
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.http import auth, dashboard, mediatype
from miyamoto.http.cloudtasks import PREFIX as CLOUDTASKS_PREFIX
from miyamoto.http.cloudtasks import CloudTasks
from miyamoto.http.definitions import DefsApi
from miyamoto.http.qstash import NotFound, QStashApi
from miyamoto.http.openapi import SPEC
from miyamoto.http.pull import PullApi
from miyamoto.metrics import CONTENT_TYPE_LATEST
from miyamoto.tasks import labels, options, repeat
from miyamoto.tasks.checks import number, traceparent
from miyamoto.tasks.task import ENDED, QUEUE_NAME_RE, State, Task
from miyamoto.tasks.validate import Limits, ValidationError, build_task, enqueue_fields, \
    json_fields, parse_batch

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 411: "Length Required",
            413: "Payload Too Large", 415: "Unsupported Media Type", 500: "Internal Server Error",
            503: "Service Unavailable"}
_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_PAGE = 1000  # the most items one listing answers (limit=)
RATE_POINTS = 360  # the most points GET /rates answers (an hour: one per 10 s)
QUEUES_PAGE = 1000  # GET /queues without limit: all of them at the default max_queues
_NO_QUEUE = ("names no queue: queues come from the config, a PUT /queues/<name> or an enqueue "
             "(while auto_create_queues is on)")
# what each route needs from a token (auth.py); any other GET needs read, anything else admin
_NEEDS = {"healthz": auth.OPEN, "readyz": auth.OPEN, "enqueue": auth.ENQUEUE,
          "enqueue_batch": auth.ENQUEUE, "get_task": auth.TASK,
          # a long task's worker reports with the token its delivery's URL carries
          "complete_task": auth.OPEN, "heartbeat_task": auth.OPEN,
          # a pull queue's worker leases with an enqueue token, answers with its lease's
          "lease_tasks": auth.ENQUEUE, "ack_task": auth.OPEN, "nack_task": auth.OPEN,
          "extend_task": auth.OPEN,
          # the dashboard's page and assets, and this API's description, hold no data
          "dashboard": auth.OPEN, "dashboard_asset": auth.OPEN, "openapi": auth.OPEN,
          # what targets verify deliveries with: public keys (delivery/identity.py)
          "oidc_discovery": auth.OPEN, "jwks": auth.OPEN, "webhook_public_key": auth.OPEN,
          # QStash's face (http/qstash.py): publishing is enqueueing, a message is a task
          "qstash_publish": auth.ENQUEUE, "qstash_enqueue": auth.ENQUEUE,
          "qstash_batch": auth.ENQUEUE, "qstash_message": auth.TASK}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers or []


Handler = Callable[..., tuple[int, Any]]
View = dict[str, Any]  # a JSON object the route answers as it is


class ApiService(Protocol):
    """What the routes ask of the node (``miyamoto.node.Node``). Each answers from the
    whole cluster; None where the task is not known anywhere."""

    @property
    def node_id(self) -> str: ...
    @property
    def config(self) -> Config: ...  # the schedules' defaults (http.definitions)
    @property
    def definitions(self) -> DefSync: ...  # schedules and topics (http.definitions)

    def enqueue(self, task: Task, again: repeat.Repeat = repeat.REJECT) -> View: ...
    def enqueue_many(self, tasks: list[Task]) -> list[View]: ...
    def get_task(self, task_id: str) -> View | None: ...
    def find_task(self, queue: str, name: str) -> View | None: ...
    def browse(self, flt: browse.Filter, after: browse.Key | None,
               limit: int) -> View: ...  # {"tasks", "next_cursor", "nodes"}
    def rates(self, seconds: int, step: int, node: str | None) -> View | None: ...
    def delete(self, task_id: str) -> View | None: ...
    def rerun(self, task_id: str) -> View | None: ...
    def resend(self, task_id: str) -> View | None: ...
    def complete(self, task_id: str, token: str, report: completion.Report) -> View | None: ...
    def heartbeat(self, task_id: str, token: str, lease: float | None) -> View | None: ...
    def resend_many(self, queue: str, f: dict[str, Any]) -> View: ...  # {count, more}
    def is_pull(self, queue: str) -> bool: ...  # its tasks need no url
    def lease(self, queue: str, max_tasks: int, lease_s: float,
              wait_s: float) -> list[View] | None: ...
    def ack(self, task_id: str, token: str) -> View | None: ...
    def nack(self, task_id: str, token: str, delay: float | None) -> View | None: ...
    def extend(self, task_id: str, token: str, lease_s: float | None) -> View | None: ...
    def queues(self, limit: int, cursor: str) -> View: ...  # {"queues", "next_cursor"}
    def queue(self, name: str) -> View | None: ...
    def put_queue(self, name: str, changes: dict[str, Any]) -> View: ...  # settings
    def reset_queue(self, name: str) -> View | None: ...  # None: the API set none
    def list_tasks(self, queue: str, state: State, limit: int) -> list[View]: ...
    def control(self, queue: str, action: str) -> View | None: ...
    def failed(self, queue: str, action: str) -> View: ...
    def cluster_info(self) -> View: ...
    def target_states(self) -> list[View]: ...
    def ready(self) -> tuple[bool, str]: ...  # (ready, why not)
    def clock_offset(self) -> float: ...  # the cluster's clock minus ours (absolute etas)
    def metrics_body(self) -> bytes: ...


class Api:
    def __init__(self, service: ApiService, limits: Limits, max_batch: int,
                 clock: Callable[[], float] = time.time, tokens: auth.Tokens | None = None,
                 identity: Identity | None = None):
        self.service = service
        self.identity = identity or Identity()
        self.tokens = tokens or auth.Tokens(())
        self.limits = limits
        self.max_batch = max_batch
        self.clock = clock
        q = r"(?P<queue>[^/]+)"
        t = r"(?P<task_id>[^/]+)"
        d, s, tp = DefsApi(self), r"(?P<sname>[^/]+)", r"(?P<tname>[^/]+)"
        self.defs = d
        self.cloudtasks = CloudTasks(service, self.tokens, limits, clock)
        self._native_routes: list[tuple[re.Pattern[str], dict[str, Handler]]] = [
            (re.compile(r"/queue/?"), {"POST": self.enqueue}),
            (re.compile(rf"/queue/{q}/batch"), {"POST": self.enqueue_batch}),
            (re.compile(rf"/queue/{q}"), {"POST": self.enqueue}),
            (re.compile(r"/tasks"), {"GET": self.find_task}),
            (re.compile(rf"/tasks/{t}"), {"GET": self.get_task, "DELETE": self.delete_task}),
            (re.compile(rf"/tasks/{t}/retry"), {"POST": self.retry_task}),
            (re.compile(rf"/tasks/{t}/complete"), {"POST": self.complete_task}),
            (re.compile(rf"/tasks/{t}/heartbeat"), {"POST": self.heartbeat_task}),
            (re.compile(rf"/tasks/{t}/resend"), {"POST": self.resend_task}),
            (re.compile(r"/queues/?"), {"GET": self.list_queues}),
            (re.compile(rf"/queues/{q}"), {"GET": self.get_queue, "PUT": self.put_queue,
                                           "DELETE": self.delete_queue}),
            (re.compile(rf"/queues/{q}/tasks"), {"GET": self.list_tasks}),
            (re.compile(rf"/queues/{q}/(?P<action>pause|resume|purge)"), {"POST": self.control}),
            (re.compile(rf"/queues/{q}/failed/(?P<action>retry|delete)"),
             {"POST": self.failed}),
            (re.compile(rf"/queues/{q}/resend"), {"POST": self.resend_many}),
            (re.compile(r"/schedules/?"), {"GET": d.list_schedules, "POST": d.post_schedule}),
            (re.compile(rf"/schedules/{s}"), {"GET": d.get_schedule,
                                              "DELETE": d.delete_schedule}),
            (re.compile(rf"/schedules/{s}/(?P<action>pause|resume)"),
             {"POST": d.schedule_control}),
            (re.compile(rf"/schedules/{s}/run"), {"POST": d.run_schedule}),
            (re.compile(r"/topics/?"), {"GET": d.list_topics}),
            (re.compile(rf"/topics/{tp}"), {"GET": d.get_topic, "PUT": d.put_topic,
                                            "DELETE": d.delete_topic}),
            (re.compile(r"/cluster/?"), {"GET": self.cluster}),
            (re.compile(r"/targets/?"), {"GET": self.targets}),  # scope read
            (re.compile(r"/rates/?"), {"GET": self.rates}),
            (re.compile(r"/healthz"), {"GET": self.healthz}),
            (re.compile(r"/readyz"), {"GET": self.readyz}),
            (re.compile(r"/metrics"), {"GET": self.metrics}),
            (re.compile(r"/openapi.json"), {"GET": self.openapi}),
            (re.compile(DISCOVERY_PATH), {"GET": self.oidc_discovery}),
            (re.compile(JWKS_PATH), {"GET": self.jwks}),
            (re.compile(WEBHOOK_KEY_PATH), {"GET": self.webhook_public_key}),
            (re.compile(r"/"), {"GET": self.dashboard}),
            (re.compile(r"/dashboard/(?P<asset>[^/]+)"), {"GET": self.dashboard_asset}),
        ]
        self._native_routes += PullApi(self, service).routes()  # lease, ack, nack, extend
        # QStash's face (http/qstash.py): a /v2/ path is tried against these alone
        self.qstash_routes = QStashApi(self).routes()
        self.routes = self._native_routes + self.qstash_routes  # every route, for the spec's tests

    # ------------------------------------------------------------ WSGI
    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if (environ.get("PATH_INFO") or "").startswith(CLOUDTASKS_PREFIX):
            return self.cloudtasks(environ, start_response)  # Google's API, Google's errors
        headers: list[tuple[str, str]] = []
        try:
            status, body = self._dispatch(environ)
        except auth.Denied as e:
            status, body = e.status, _error(e.message)
            if e.status == 401:
                headers.append(("WWW-Authenticate", 'Bearer realm="miyamoto"'))
        except HTTPError as e:
            status, body = e.status, _error(e.message, e.field)
            headers.extend(e.headers)
        except ValidationError as e:
            status, body = e.status, _error(e.message, e.field)
        except Duplicate as e:
            status, body = 409, {"status": "duplicate", "id": e.original_id}
        except Conflict as e:
            status, body = 409, _error(str(e))
        except Unavailable as e:
            status, body = 503, _error(str(e))
        except NotFound as e:
            status, body = 404, _error(str(e))
        except Exception:
            log.exception("api: %s %s failed", environ.get("REQUEST_METHOD"),
                          environ.get("PATH_INFO"))
            status, body = 500, _error("internal error")
        if status >= 400 and (environ.get("PATH_INFO") or "").startswith("/v2/"):
            body = _qstash_error(body)
        if isinstance(body, Raw):
            data, ctype = body.data, body.content_type
            headers.extend(body.headers)
        else:
            data = ujson.dumps(body, ensure_ascii=False, escape_forward_slashes=False).encode()
            ctype = "application/json"
        start_response(f"{status} {_REASONS.get(status, 'Error')}",
                       [("Content-Type", ctype), ("Content-Length", str(len(data))), *headers])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [data]

    def _dispatch(self, environ: dict) -> tuple[int, Any]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET").upper()
        routes = self.qstash_routes if path.startswith("/v2/") else self._native_routes
        for pattern, handlers in routes:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            handler = handlers.get(method) or (handlers.get("GET") if method == "HEAD" else None)
            if handler is None:
                # authenticate first: a route's methods are told only to who may use one
                self.tokens.check(environ.get("HTTP_AUTHORIZATION"), _weakest(handlers))
                raise HTTPError(405, f"{method} is not allowed on {path}",
                                headers=[("Allow", _allow(handlers))])
            self.tokens.check(environ.get("HTTP_AUTHORIZATION"), _need(handler, method))
            args = m.groupdict()
            if "queue" in args:
                _check_queue(args["queue"])
            if "task_id" in args and not _ID_RE.fullmatch(args["task_id"]):
                raise HTTPError(404, "names no known task", "id")
            return handler(environ, **args)
        raise HTTPError(404, f"no route for {path}")

    def body(self, environ: dict) -> bytes:
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ["wsgi.input"]
        if length:
            try:
                n = int(length)
            except ValueError:
                raise HTTPError(400, "bad Content-Length") from None
            if n < 0:
                raise HTTPError(400, "bad Content-Length")
            if n > self.limits.max_body:
                raise HTTPError(413, f"is larger than {self.limits.max_body} bytes", "body")
            data = _read(stream, n)
            if len(data) < n:
                raise HTTPError(400, f"ended after {len(data)} of {n} bytes", "body")
            return data
        data = _read(stream, self.limits.max_body + 1)
        if len(data) > self.limits.max_body:
            raise HTTPError(413, f"is larger than {self.limits.max_body} bytes", "body")
        return data

    # ------------------------------------------------------------ tasks
    def enqueue(self, environ: dict, queue: str | None = None) -> tuple[int, Any]:
        body = self.body(environ)
        kind = mediatype.enqueue_kind(environ.get("CONTENT_TYPE") or "", body)
        fields = enqueue_fields(kind, body, self.limits)
        key = _idempotency_key(environ)
        trace = environ.get("HTTP_TRACEPARENT")
        if trace is not None and "traceparent" not in fields:  # the field wins
            fields["traceparent"] = trace
        if key is not None and len(key) > self.limits.max_name:  # even when a name is given
            raise HTTPError(400, f"is longer than {self.limits.max_name} characters",
                            IDEMPOTENCY_KEY)
        if "topic" in fields:  # fan-out: one task per URL of the topic (miyamoto.definitions.topics)
            return self.defs.enqueue_topic(fields, queue, key)
        again = repeat.parse(fields, fields.get("name") is not None or key is not None
                             or fields.get("dedupe") == "content", self.limits.max_delay)
        for f in repeat.FIELDS:
            fields.pop(f, None)
        task = build_task(fields, path_queue=queue, idempotency_key=key, limits=self.limits,
                          now=self.clock(), offset=self.service.clock_offset(),
                          pull=self.service.is_pull)
        return 200, self.service.enqueue(task, again)

    def enqueue_batch(self, environ: dict, queue: str) -> tuple[int, Any]:
        mediatype.check_batch(environ.get("CONTENT_TYPE") or "")
        body = self.body(environ)
        tasks = parse_batch(body, path_queue=queue, limits=self.limits, now=self.clock(),
                            max_batch=self.max_batch, offset=self.service.clock_offset(),
                            pull=self.service.is_pull)
        trace = environ.get("HTTP_TRACEPARENT")
        if trace is not None:  # for the tasks that bring none of their own
            trace = traceparent("traceparent", trace)
            tasks = [t if t.traceparent else t.evolve(traceparent=trace) for t in tasks]
        results = self.service.enqueue_many(tasks)
        return 200, {"status": "ok", "tasks": results}

    def get_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        found = self.service.get_task(task_id)
        if found is None:
            raise HTTPError(404, "names no known task", "id")
        return 200, found

    def find_task(self, environ: dict) -> tuple[int, Any]:
        """GET /tasks?name=N&queue=Q: a task by its name (queue "default" if not given);
        without a name, a page of tasks (``browse_tasks``)."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if "name" not in query:
            return self.browse_tasks(query)
        name = (query.get("name") or [""])[0]
        if not 1 <= len(name) <= self.limits.max_name:
            raise HTTPError(400, f"must be 1-{self.limits.max_name} characters", "name")
        queue = (query.get("queue") or ["default"])[0]
        _check_queue(queue)
        found = self.service.find_task(queue, name)
        if found is None:
            raise HTTPError(404, "is held by no task of this queue (a name is kept for "
                                 "dedup_window)", "name")
        return 200, found

    def browse_tasks(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        """GET /tasks?state=&queue=&target=&name_prefix=&label=k=v&since=&until=&cursor=
        &limit=: a page of tasks
        in one state, over the cluster (``engine.browse``)."""
        state = _state(query)
        queue = (query.get("queue") or [None])[0] or None
        if queue is not None:
            _check_queue(queue)
        target, prefix = (_text(query, k, self.limits.max_url) for k in ("target",
                                                                         "name_prefix"))
        cursor = (query.get("cursor") or [None])[0]
        after = browse.decode_cursor(cursor) if cursor else None
        if cursor and after is None:
            raise HTTPError(400, "must be the next_cursor of a previous page", "cursor")
        limit = _limit(query, 50, browse.MAX_LIMIT)
        flt = browse.Filter(state, queue, target, prefix, _label(query),
                            *(_opt_number(query, k) for k in ("since", "until")))
        return 200, dict(self.service.browse(flt, after, limit), state=state.value)

    def delete_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        """Cancel a live task, delete a failed one (state "deleted"); 409 if it succeeded."""
        found = self.service.delete(task_id)
        if found is None:
            raise HTTPError(404, "names no known task", "id")
        return 200, found

    def retry_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        found = self.service.rerun(task_id)
        if found is None:
            raise HTTPError(404, "names no known task", "id")
        return 200, found

    def complete_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        """A long task's worker reports {"state": "succeeded"|"failed", "result": ...}
        at the URL its attempt carried (its token in the query)."""
        try:
            report = completion.parse_report(self._json_body(environ))
        except completion.ReportError as e:
            raise HTTPError(400, e.message, e.field) from None
        token = _completion_token(environ)
        return _found(self._granted(lambda: self.service.complete(task_id, token, report)))

    def heartbeat_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        """A long task's worker extends its lease: {"lease": seconds} or no body (the
        task's own lease, from now)."""
        body = self._json_body(environ, empty={})
        if not isinstance(body, dict) or set(body) - {"lease"}:
            raise HTTPError(400, "must be a JSON object with at most a lease", "body")
        lease = body.get("lease")
        if lease is not None and not options.check_lease(lease):
            raise HTTPError(400, f"must be a number of seconds in (0, {options.LEASE_MAX:g}]",
                            "lease")
        token = _completion_token(environ)
        return _found(self._granted(lambda: self.service.heartbeat(task_id, token, lease)))

    def _json_body(self, environ: dict, empty: Any = None) -> Any:
        data = self.body(environ)
        if not data.strip() and empty is not None:
            return empty
        try:
            return ujson.loads(data)
        except ValueError:
            raise HTTPError(400, "is not JSON", "body") from None

    @staticmethod
    def _granted(call: Callable[[], View | None]) -> View | None:
        try:
            return call()
        except completion.TokenError as e:
            raise HTTPError(403, str(e), "token") from None

    def resend_task(self, environ: dict, task_id: str) -> tuple[int, Any]:
        """A new run of an ended task (a succeeded one too) under the same id: 409 if it
        has not ended."""
        found = self.service.resend(task_id)
        if found is None:
            raise HTTPError(404, "names no known task", "id")
        return 200, found

    # ------------------------------------------------------------ queues
    def list_queues(self, environ: dict) -> tuple[int, Any]:
        """GET /queues?limit=&cursor=: a page of queues by name; ``next_cursor`` (null on
        the last page) is the next request's ``cursor``."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        limit = _limit(query, QUEUES_PAGE)
        cursor = (query.get("cursor") or [None])[0]
        if cursor is not None and not QUEUE_NAME_RE.fullmatch(cursor):
            raise HTTPError(400, "must be the next_cursor of a previous page", "cursor")
        return 200, self.service.queues(limit, cursor or "")

    def get_queue(self, environ: dict, queue: str) -> tuple[int, Any]:
        found = self.service.queue(queue)
        if found is None:
            raise HTTPError(404, _NO_QUEUE, "queue")
        return 200, found

    def put_queue(self, environ: dict, queue: str) -> tuple[int, Any]:
        """PUT /queues/<name>: set queue settings cluster-wide (``definitions.queues``)."""
        changes = parse_put(json_fields(self.body(environ)))
        return 200, self.service.put_queue(queue, changes)

    def delete_queue(self, environ: dict, queue: str) -> tuple[int, Any]:
        """DELETE /queues/<name>: drop the settings the API made (tasks stay)."""
        found = self.service.reset_queue(queue)
        if found is None:
            raise HTTPError(404, "has no settings made through the API (PUT /queues/<name>): "
                            "its settings are the config's", "queue")
        return 200, found

    def list_tasks(self, environ: dict, queue: str) -> tuple[int, Any]:
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        state = _state(query)
        limit = _limit(query, 100)
        return 200, {"queue": queue, "state": state.value,
                     "tasks": self.service.list_tasks(queue, state, limit)}

    def control(self, environ: dict, queue: str, action: str) -> tuple[int, Any]:
        found = self.service.control(queue, action)
        if found is None:  # a control creates no queue
            raise HTTPError(404, _NO_QUEUE, "queue")
        return 200, found

    def failed(self, environ: dict, queue: str, action: str) -> tuple[int, Any]:
        return 200, self.service.failed(queue, action)

    def resend_many(self, environ: dict, queue: str) -> tuple[int, Any]:
        """POST /queues/<q>/resend?state=&target=&since=&until=: the ended tasks picked."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        state = (query.get("state") or ["failed"])[0]
        if state not in ENDED:
            raise HTTPError(400, f"must be an ended state: {', '.join(ENDED)}", "state")
        f: dict[str, Any] = {"state": state}
        target = (query.get("target") or [None])[0]
        if target is not None:
            if not 0 < len(target) <= self.limits.max_url:
                raise HTTPError(400, f"must be 1-{self.limits.max_url} characters of a URL "
                                     "(its start)", "target")
            f["target"] = target
        for k in ("since", "until"):
            if query.get(k):
                f[k] = number(k, query[k][0])
        return 200, self.service.resend_many(queue, f)

    # ------------------------------------------------------------ operations
    def cluster(self, environ: dict) -> tuple[int, Any]:
        return 200, self.service.cluster_info()

    def targets(self, environ: dict) -> tuple[int, Any]:
        return 200, {"targets": self.service.target_states()}

    def rates(self, environ: dict) -> tuple[int, Any]:
        """GET /rates?seconds=&node=: tasks enqueued, delivered and failed over the last
        ``seconds`` (60 to 3,600; default 300) in at most RATE_POINTS points, summed
        over the cluster or of one node."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = (query.get("seconds") or ["300"])[0]
        if not given.isdigit() or not 60 <= int(given) <= history.SECONDS:
            raise HTTPError(400, f"must be a whole number of seconds from 60 to "
                                 f"{history.SECONDS}", "seconds")
        seconds = int(given)
        step = -(-seconds // RATE_POINTS)
        seconds -= seconds % step
        node = (query.get("node") or [None])[0] or None
        if node is not None and not _ID_RE.fullmatch(node):
            raise HTTPError(400, "must be a member's id", "node")
        found = self.service.rates(seconds, step, node)
        if found is None:
            raise HTTPError(404, "is not a member that answers", "node")
        return 200, found

    def healthz(self, environ: dict) -> tuple[int, Any]:
        return 200, {"status": "ok", "node": self.service.node_id}

    def readyz(self, environ: dict) -> tuple[int, Any]:
        ready, why = self.service.ready()
        return (200 if ready else 503), {"status": "ready" if ready else "not ready",
                                         "reason": why}

    def metrics(self, environ: dict) -> tuple[int, Any]:
        return 200, Raw(self.service.metrics_body(), CONTENT_TYPE_LATEST)

    def openapi(self, environ: dict) -> tuple[int, Any]:
        return 200, SPEC

    def oidc_discovery(self, environ: dict) -> tuple[int, Any]:
        return 200, _public(self._minter().discovery())

    def jwks(self, environ: dict) -> tuple[int, Any]:
        return 200, _public(self._minter().jwks())

    def _minter(self) -> Identity:
        """The identity that signs OIDC tokens; a 404 when this node signs none."""
        if not self.identity.mints:
            raise HTTPError(404, "this node signs no OIDC tokens (no oidc_signing_key)")
        return self.identity

    def webhook_public_key(self, environ: dict) -> tuple[int, Any]:
        doc = self.identity.webhook_public_key()
        if doc is None:
            raise HTTPError(404, "this node signs no v1a signatures (no ed25519_signing_key)")
        return 200, _public(doc)

    def dashboard(self, environ: dict) -> tuple[int, Any]:
        return self.dashboard_asset(environ, dashboard.PAGE)

    def dashboard_asset(self, environ: dict, asset: str) -> tuple[int, Any]:
        found = dashboard.asset(asset)
        if found is None:
            raise HTTPError(404, "no such dashboard file")
        data, ctype, headers = found
        return 200, Raw(data, ctype, headers)


def _public(doc: dict[str, Any]) -> "Raw":
    """A published key document, cacheable for a minute: a verifier that meets an unknown
    kid fetches again, and a retired key stays listed far longer than that."""
    data = ujson.dumps(doc, escape_forward_slashes=False).encode()
    return Raw(data, "application/json", [("Cache-Control", "public, max-age=60")])


class Raw:
    def __init__(self, data: bytes, content_type: str,
                 headers: Iterable[tuple[str, str]] = ()):
        self.data = data
        self.content_type = content_type
        self.headers = list(headers)


def _error(message: str, field: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "error", "error": message}
    if field is not None:
        out["error"] = f"{field} {message}"
        out["field"] = field
    return out


def _qstash_error(body: Any) -> dict[str, Any]:
    """An error of a /v2/ route in QStash's shape: ``{"error": "..."}`` alone."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return {"error": body["error"]}
    return {"error": "request failed"}


def _completion_token(environ: dict) -> str:
    tokens = parse_qs(environ.get("QUERY_STRING", "")).get("token")
    if not tokens or len(tokens) != 1:
        raise HTTPError(403, "is missing: use the URL the attempt carried", "token")
    return tokens[0]


def _found(view: View | None) -> tuple[int, Any]:
    if view is None:
        raise HTTPError(404, "names no known task", "id")
    return 200, view


def _need(handler: Handler, method: str) -> str:
    """What a token must allow to use ``handler``: its entry in _NEEDS, else read for a
    GET and admin for anything else."""
    return _NEEDS.get(handler.__name__) or (auth.READ if method in ("GET", "HEAD")
                                            else auth.ADMIN)


def _weakest(handlers: dict[str, Handler]) -> str:
    """The least a token must allow to be told a route's methods (a 405's Allow): that
    of the route's most open method, so an admin route answers 401/403 before 405."""
    needs = {_need(h, m) for m, h in handlers.items()}
    for need in (auth.OPEN, auth.TASK, auth.READ, auth.ENQUEUE):
        if need in needs:
            return need
    return auth.ADMIN


def _allow(handlers: dict[str, Handler]) -> str:
    """The Allow header of a 405 (RFC 9110 15.5.6): the route's methods, and HEAD
    wherever GET is served (answered by the GET handler without a body)."""
    methods = list(handlers) + (["HEAD"] if "GET" in handlers else [])
    return ", ".join(methods)


def _read(stream: Any, n: int) -> bytes:
    """Read the body; a short body, a broken chunk or a client that left is the client's
    fault (400; the server closes the connection), never a 500."""
    try:
        return stream.read(n)
    except (OSError, ValueError) as e:
        log.debug("api: body read failed: %r", e)
        raise HTTPError(400, "could not be read: it ended early or its chunked encoding "
                             "is broken", "body") from None


def _state(query: dict[str, list[str]]) -> State:
    """The ``state`` a task list asks for (scheduled when none): 400 naming it otherwise."""
    try:
        return State((query.get("state") or ["scheduled"])[0])
    except ValueError:
        raise HTTPError(400, f"must be one of {', '.join(s.value for s in State)}",
                        "state") from None


def _limit(query: dict[str, list[str]], default: int, most: int = MAX_PAGE) -> int:
    """A page's ``limit``: 1 to ``most``; given empty or not a number, a 400 naming it."""
    given = query.get("limit")
    if given is None:
        return default
    try:
        limit = int(given[0])
    except ValueError:
        raise HTTPError(400, f"must be an integer from 1 to {most}", "limit") from None
    if not 1 <= limit <= most:
        raise HTTPError(400, f"must be between 1 and {most}", "limit")
    return limit


def _text(query: dict[str, list[str]], key: str, most: int) -> str | None:
    """An optional filter's text: absent or empty is None; longer than ``most``, a 400."""
    value = (query.get(key) or [""])[0]
    if len(value) > most:
        raise HTTPError(400, f"must be at most {most} characters", key)
    return value or None


def _label(query: dict[str, list[str]]) -> tuple[str, str] | None:
    """GET /tasks?label=k=v: (key, value), or None; a 400 naming it if it is not one."""
    given = (query.get("label") or [""])[0]
    if not given:
        return None
    try:
        return labels.label_filter(given)
    except ValueError as e:
        raise HTTPError(400, str(e), "label") from None


def _opt_number(query: dict[str, list[str]], key: str) -> float | None:
    """An optional unix time of a filter (since, until); a 400 naming it if it is not one."""
    given = (query.get(key) or [""])[0]
    if not given:
        return None
    at = number(key, given)
    if not 0 <= at < 1e11:
        raise HTTPError(400, "must be a unix time in seconds", key)
    return at


def _idempotency_key(environ: dict) -> str | None:
    """The Idempotency-Key header: absent is None; empty, or text a header cannot carry,
    is refused naming the header (its value arrives as latin-1, the bytes as sent)."""
    key = environ.get("HTTP_IDEMPOTENCY_KEY")
    if key is None:
        return None
    if not key:
        raise HTTPError(400, "is empty: give a name of 1 or more characters, or no header",
                        IDEMPOTENCY_KEY)
    if not key.isascii():
        try:
            key.encode("latin-1").decode("utf-8")
        except UnicodeDecodeError:
            return key  # latin-1 text; build_task checks it as a name
        raise HTTPError(400, "holds UTF-8 (text beyond latin-1, such as an emoji), which an "
                             "HTTP header cannot carry: give such a name in the body's name "
                             "field", IDEMPOTENCY_KEY)
    return key


IDEMPOTENCY_KEY = "Idempotency-Key"


def _check_queue(name: str) -> None:
    if not QUEUE_NAME_RE.fullmatch(name):
        raise HTTPError(400, "must be 1-100 characters of A-Z a-z 0-9 _ -", "queue")
