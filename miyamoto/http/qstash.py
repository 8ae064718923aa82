"""QStash's v2 API as a second face of the same engine (``/v2/...``).

Each call is translated (``miyamoto.http.upstash``) onto what the native routes do: a
message is a task, a URL group is a topic, a schedule is a schedule, the DLQ is the
failed tasks, and a queue's ``parallelism`` is a flow key every task enqueued to it
shares (``qstash-queue:<name>``, the queue's setting a replicated definition of kind
``qstash_queue``), so it holds cluster-wide as flow keys do. Errors are answered in
QStash's shape, ``{"error": "..."}`` (``api.Api`` does that for every ``/v2/`` path),
and a duplicate is QStash's 202 with the first message's id and ``deduplicated``.
What is not covered is listed in the README ("QStash's v2 API").
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol

from miyamoto.definitions.schedules import MAX_SCHEDULES, check_name, parse_schedule, view
from miyamoto.definitions.sync import DefSync
from miyamoto.definitions.topics import MAX_TOPICS, expand, parse_topic
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.http import upstash
from miyamoto.http.definitions import Service
from miyamoto.tasks.checks import ValidationError, integer
from miyamoto.tasks.task import QUEUE_NAME_RE, State, Task, new_id
from miyamoto.tasks.validate import Limits, build_task, json_fields

QUEUE_KIND = "qstash_queue"
FLOW_PREFIX = "qstash-queue:"
DEFAULT_PARALLELISM = 1  # QStash's for a queue an enqueue creates
MAX_PARALLELISM = 1000
DLQ_PAGE = 100  # failed tasks listed per queue by GET /v2/dlq
Answer = tuple[int, Any]


class QService(Service, Protocol):
    """What these routes ask of the node beyond the definitions' routes."""

    def enqueue(self, task: Task) -> dict[str, Any]: ...
    def get_task(self, task_id: str) -> dict[str, Any] | None: ...
    def delete(self, task_id: str) -> dict[str, Any] | None: ...
    def queues(self, limit: int, cursor: str) -> dict[str, Any]: ...
    def queue(self, name: str) -> dict[str, Any] | None: ...
    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]: ...
    def control(self, queue: str, action: str) -> dict[str, Any] | None: ...
    def clock_offset(self) -> float: ...  # the cluster's clock minus ours


class Front(Protocol):
    """What these routes use of the HTTP front (``miyamoto.http.api.Api``)."""

    service: QService
    limits: Limits
    clock: Callable[[], float]
    max_batch: int

    def body(self, environ: dict) -> bytes: ...


class NotFound(Exception):
    """A 404 in QStash's words; ``api.Api`` answers it ``{"error": ...}``."""


class QStashApi:
    def __init__(self, api: Front):
        self.api = api

    @property
    def _defs(self) -> DefSync:
        return self.api.service.definitions

    def _op(self, op: str, kind: str, name: str, value: dict | None = None,
            done: Any = None) -> Answer:
        """A definitions op (``DefSync.op``) answered as QStash does: ``done`` (else ``{}``)
        when it is made, else the op's own status and error."""
        status, body = self._defs.op(op, kind, name, value)
        return (200, {} if done is None else done) if status == 200 else (status, body)

    def routes(self) -> list[tuple[re.Pattern[str], dict[str, Callable[..., Answer]]]]:
        """The v2 routes, in the order they must be tried (a schedule's pause before a
        destination URL, which holds slashes)."""
        m, s = r"(?P<task_id>[^/]+)", r"(?P<sname>[^/]+)"
        q, t, dest = r"(?P<queue>[^/]+)", r"(?P<tname>[^/]+)", r"(?P<dest>.+)"
        return [(re.compile(p), h) for p, h in (
            (rf"/v2/publish/{dest}", {"POST": self.qstash_publish}),
            (rf"/v2/enqueue/{q}/{dest}", {"POST": self.qstash_enqueue}),
            (r"/v2/batch", {"POST": self.qstash_batch}),
            (r"/v2/messages", {"DELETE": self.qstash_cancel_many}),
            (rf"/v2/messages/{m}", {"GET": self.qstash_message, "DELETE": self.qstash_cancel}),
            (r"/v2/dlq", {"GET": self.qstash_dlq, "DELETE": self.qstash_dlq_delete_many}),
            (rf"/v2/dlq/{m}", {"GET": self.qstash_dlq_message, "DELETE": self.qstash_dlq_delete}),
            (r"/v2/schedules", {"GET": self.qstash_schedules}),
            (rf"/v2/schedules/{s}/(?P<action>pause|resume)", {"PATCH": self.qstash_schedule_control}),
            (rf"/v2/schedules/{s}", {"GET": self.qstash_schedule, "DELETE": self.qstash_schedule_delete,
                                     "POST": self.qstash_schedule_create}),
            (rf"/v2/schedules/{dest}", {"POST": self.qstash_schedule_create}),
            (r"/v2/topics", {"GET": self.qstash_topics}),
            (rf"/v2/topics/{t}", {"GET": self.qstash_topic, "DELETE": self.qstash_topic_delete}),
            (rf"/v2/topics/{t}/endpoints", {"POST": self.qstash_endpoints_add,
                                            "DELETE": self.qstash_endpoints_remove}),
            (r"/v2/queues", {"GET": self.qstash_queues, "POST": self.qstash_queue_upsert}),
            (rf"/v2/queues/{q}", {"GET": self.qstash_queue, "DELETE": self.qstash_queue_delete}),
            (rf"/v2/queues/{q}/(?P<action>pause|resume)", {"POST": self.qstash_queue_control}),
        )]

    # ------------------------------------------------------------ messages
    def qstash_publish(self, environ: dict, dest: str) -> Answer:
        return self._publish(environ, _destination(environ, dest, 3), None)

    def qstash_enqueue(self, environ: dict, queue: str, dest: str) -> Answer:
        return self._publish(environ, _destination(environ, dest, 4), queue)

    def _publish(self, environ: dict, dest: str, queue: str | None) -> Answer:
        fields = self._fields(dest, upstash.environ_headers(environ), self.api.body(environ),
                              queue)
        tasks = self._tasks(fields)
        if "topic" not in fields:
            return self._one(tasks[0])
        answers = [_answer(r, t.url) for t, r in zip(tasks, self.api.service.enqueue_many(tasks))]
        if all("error" in a for a in answers):
            raise Unavailable(answers[0]["error"])
        return (202 if all(a.get("deduplicated") for a in answers) else 201), answers

    def _fields(self, dest: str, headers: dict[str, str], body: bytes,
                queue: str | None) -> dict[str, Any]:
        fields = upstash.fields(dest, headers, body, queue=queue)
        if queue is not None and "flow_key" not in fields:
            fields["flow_key"] = FLOW_PREFIX + queue
            fields["flow_parallelism"] = self._parallelism(queue)
        return fields

    def _parallelism(self, queue: str) -> int:
        value = self._defs.machine.get(QUEUE_KIND, queue) or {}
        p = value.get("parallelism")
        return p if type(p) is int and p >= 1 else DEFAULT_PARALLELISM

    def _tasks(self, fields: dict[str, Any]) -> list[Task]:
        """The tasks of one message: one, or one per URL of the URL group it names.
        Upstash-Not-Before is an absolute time: on the cluster's clock (``offset``)."""
        now, offset = self.api.clock(), self.api.service.clock_offset()
        try:
            if "topic" not in fields:
                return [build_task(fields, path_queue=None, idempotency_key=None,
                                   limits=self.api.limits, now=now, offset=offset)]
            name = check_name(fields["topic"], "topic")
            urls = (self._defs.machine.get("topic", name) or {}).get("urls")
            if not isinstance(urls, list) or not urls:
                raise NotFound(f"destination names no URL group: {name}")
            return expand(fields, urls, path_queue=None, idempotency_key=None,
                          limits=self.api.limits, now=now, offset=offset)
        except ValidationError as e:
            raise upstash.renamed(e) from None

    def _one(self, task: Task) -> Answer:
        try:
            stored = self.api.service.enqueue(task)
        except Duplicate as e:
            return 202, {"messageId": e.original_id, "deduplicated": True}
        return 201, {"messageId": stored["id"]}

    def qstash_batch(self, environ: dict) -> Answer:
        """A JSON list of {destination, headers, body, queue}: all valid or none stored."""
        items = json_fields(self.api.body(environ))
        if not isinstance(items, list) or not items:
            raise ValidationError("body", "must be a JSON list of messages")
        if len(items) > self.api.max_batch:
            raise ValidationError("body", f"holds more than {self.api.max_batch} messages", 413)
        groups = [self._batch_item(i, item) for i, item in enumerate(items)]
        results = iter(self.api.service.enqueue_many([t for g, _ in groups for t in g]))
        out: list[Any] = []
        for tasks, to_group in groups:
            answers = [_answer(next(results), t.url) for t in tasks]
            out.append(answers if to_group else _strip_url(answers[0]))
        return 200, out

    def _batch_item(self, i: int, item: Any) -> tuple[list[Task], bool]:
        try:
            if not isinstance(item, dict) or not isinstance(item.get("destination"), str):
                raise ValidationError("destination", "must be given as a string")
            headers = item.get("headers") or {}
            if not isinstance(headers, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
                raise ValidationError("headers", "must be an object of header names to strings")
            body = item.get("body") or ""
            if not isinstance(body, str):
                raise ValidationError("body", "must be a string")
            queue = item.get("queue")
            if queue is not None and not isinstance(queue, str):
                raise ValidationError("queue", "must be a string")
            fields = self._fields(item["destination"], {k.lower(): v for k, v in headers.items()},
                                  body.encode(), queue)
            return self._tasks(fields), "topic" in fields
        except ValidationError as e:
            raise ValidationError(f"[{i}].{e.field}", e.message, e.status) from None

    def qstash_message(self, environ: dict, task_id: str) -> Answer:
        found = self.api.service.get_task(task_id)
        if found is None:
            raise NotFound(f"message {task_id} not found")
        return 200, upstash.message_view(found)

    def qstash_cancel(self, environ: dict, task_id: str) -> Answer:
        if self.api.service.delete(task_id) is None:
            raise NotFound(f"message {task_id} not found")
        return 202, {}

    def qstash_cancel_many(self, environ: dict) -> Answer:
        ids = _id_list(self._json_or_none(environ), "messageIds")
        return 200, {"cancelled": sum(self.api.service.delete(i) is not None for i in ids)}

    def _json_or_none(self, environ: dict) -> Any:
        body = self.api.body(environ)
        return json_fields(body) if body.strip() else None

    # ------------------------------------------------------------ DLQ
    def qstash_dlq(self, environ: dict) -> Answer:
        names = [q["name"] for q in self.api.service.queues(1000, "")["queues"]
                 if (q.get("counts") or {}).get("failed")]  # one cluster read per such queue
        failed = [upstash.dlq_view(v) for n in names
                  for v in self.api.service.list_tasks(n, State.FAILED, DLQ_PAGE)]
        return 200, {"messages": failed}

    def _failed(self, task_id: str) -> dict[str, Any]:
        found = self.api.service.get_task(task_id)
        if found is None or found.get("state") != State.FAILED.value:
            raise NotFound(f"dlq message {task_id} not found")
        return found

    def qstash_dlq_message(self, environ: dict, task_id: str) -> Answer:
        return 200, upstash.dlq_view(self._failed(task_id))

    def qstash_dlq_delete(self, environ: dict, task_id: str) -> Answer:
        self._failed(task_id)
        self.api.service.delete(task_id)
        return 200, {}

    def qstash_dlq_delete_many(self, environ: dict) -> Answer:
        deleted = 0
        for i in _id_list(self._json_or_none(environ), "dlqIds"):
            try:
                self._failed(i)
            except NotFound:  # not in the DLQ: not counted
                continue
            deleted += self.api.service.delete(i) is not None
        return 200, {"deleted": deleted}

    # ------------------------------------------------------------ schedules
    def qstash_schedule_create(self, environ: dict, dest: str | None = None,
                               sname: str | None = None) -> Answer:
        """POST /v2/schedules/<destination> with Upstash-Cron (and Upstash-Schedule-Id)."""
        dest = _destination(environ, dest or sname or "", 3)
        headers = upstash.environ_headers(environ)
        if not upstash.is_url(dest):
            raise ValidationError("destination", "must be an http(s) URL: a schedule of a "
                                                 "URL group is not supported")
        if "upstash-cron" not in headers:
            raise ValidationError("Upstash-Cron", "is required")
        cron, zone = upstash.cron_and_zone(headers["upstash-cron"])
        task = upstash.fields(dest, headers, self.api.body(environ),
                              queue=headers.get("upstash-queue-name"))
        for banned in ("name", "dedupe"):
            if banned in task:
                raise upstash.renamed(ValidationError(banned, "does not go with a schedule"))
        name = headers.get("upstash-schedule-id") or "scd_" + task_id_hex()
        now = self.api.clock()
        try:
            value = parse_schedule({"name": name, "cron": cron, "timezone": zone, "task": task},
                                   limits=self.api.limits, now=now,
                                   catch_up=self.api.service.config.schedule_catch_up)
        except ValidationError as e:
            raise _schedule_error(e) from None
        m = self._defs.machine
        if m.get("schedule", name) is None and len(m.items("schedule")) >= MAX_SCHEDULES:
            raise ValidationError("Upstash-Schedule-Id", f"would be schedule {MAX_SCHEDULES + 1}")
        return self._op("put", "schedule", name, value, done={"scheduleId": name})

    def qstash_schedules(self, environ: dict) -> Answer:
        m = self._defs.machine
        return 200, [self._schedule_out(n) for n, _ in m.items("schedule")]

    def _schedule_out(self, name: str) -> dict[str, Any]:
        m = self._defs.machine
        value = m.get("schedule", name)
        if value is None:
            raise NotFound(f"schedule {name} not found")
        cursor = m.get("cursor", name)
        shown = view(value, cursor if isinstance(cursor, dict) else None, self.api.clock())
        return upstash.schedule_view(shown, value.get("created", 0))

    def qstash_schedule(self, environ: dict, sname: str) -> Answer:
        return 200, self._schedule_out(sname)

    def qstash_schedule_delete(self, environ: dict, sname: str) -> Answer:
        return self._op("delete", "schedule", check_name(sname))

    def qstash_schedule_control(self, environ: dict, sname: str, action: str) -> Answer:
        return self._op(action, "schedule", check_name(sname))

    # ------------------------------------------------------------ URL groups
    def qstash_topics(self, environ: dict) -> Answer:
        return 200, [_group_view(n, v) for n, v in self._defs.machine.items("topic")]

    def qstash_topic(self, environ: dict, tname: str) -> Answer:
        value = self._defs.machine.get("topic", check_name(tname))
        if value is None:
            raise NotFound(f"url group {tname} not found")
        return 200, _group_view(tname, value)

    def qstash_topic_delete(self, environ: dict, tname: str) -> Answer:
        return self._op("delete", "topic", check_name(tname))

    def _endpoint_urls(self, environ: dict) -> list[str]:
        data = json_fields(self.api.body(environ))
        eps = data.get("endpoints") if isinstance(data, dict) else None
        if not isinstance(eps, list) or not all(isinstance(e, dict) for e in eps):
            raise ValidationError("endpoints", "must be a list of {url} objects")
        if any("url" not in e for e in eps):
            raise ValidationError("endpoints", "must each give a url: endpoint names are "
                                               "not supported")
        return [e["url"] for e in eps]

    def qstash_endpoints_add(self, environ: dict, tname: str) -> Answer:
        check_name(tname)
        old = (self._defs.machine.get("topic", tname) or {}).get("urls") or []
        urls = list(old) + [u for u in self._endpoint_urls(environ) if u not in old]
        if not old and len(self._defs.machine.items("topic")) >= MAX_TOPICS:
            raise ValidationError("name", f"would be URL group {MAX_TOPICS + 1}: too many")
        return self._op("put", "topic", tname, parse_topic({"urls": urls}, self.api.limits))

    def qstash_endpoints_remove(self, environ: dict, tname: str) -> Answer:
        value = self._defs.machine.get("topic", check_name(tname))
        if value is None:
            raise NotFound(f"url group {tname} not found")
        gone = set(self._endpoint_urls(environ))
        urls = [u for u in value.get("urls", []) if u not in gone]
        if urls:  # QStash deletes a group whose last endpoint is removed
            return self._op("put", "topic", tname, {"urls": urls})
        return self._op("delete", "topic", tname)

    # ------------------------------------------------------------ queues
    def qstash_queue_upsert(self, environ: dict) -> Answer:
        data = json_fields(self.api.body(environ))
        if not isinstance(data, dict):
            raise ValidationError("body", "must be a JSON object")
        name = data.get("queueName")
        if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
            raise ValidationError("queueName", "must be 1-100 characters of A-Z a-z 0-9 _ -")
        p = integer("parallelism", data.get("parallelism", DEFAULT_PARALLELISM), 1,
                    MAX_PARALLELISM)
        paused = data.get("paused", False)
        if not isinstance(paused, bool):
            raise ValidationError("paused", "must be true or false")
        now = int(self.api.clock() * 1000)
        old = self._defs.machine.get(QUEUE_KIND, name) or {}
        most = self.api.service.config.max_queues  # a bound on the settings kept, too
        if not old and len(self._defs.machine.items(QUEUE_KIND)) >= most:
            raise ValidationError("queueName", f"would be queue setting {most + 1}: "
                                               "max_queues is the most")
        value = {"parallelism": p, "paused": paused, "createdAt": old.get("createdAt", now),
                 "updatedAt": now}
        status, body = self._defs.op("put", QUEUE_KIND, name, value)
        if status != 200:
            return status, body
        native = self.api.service.queue(name)  # a control only where it changes something
        if native is not None and bool(native.get("paused")) != paused:
            self.api.service.control(name, "pause" if paused else "resume")
        return 200, {}

    def qstash_queues(self, environ: dict) -> Answer:
        names = {q["name"] for q in self.api.service.queues(1000, "")["queues"]}
        names.update(n for n, _ in self._defs.machine.items(QUEUE_KIND))
        return 200, [self._queue_out(n) for n in sorted(names)]

    def _queue_out(self, name: str) -> dict[str, Any]:
        value = self._defs.machine.get(QUEUE_KIND, name)
        native = self.api.service.queue(name)
        if value is None and native is None:
            raise NotFound(f"queue {name} not found")
        value = value or {}
        counts = (native or {}).get("counts", {})
        return {"name": name, "parallelism": self._parallelism(name),
                "createdAt": value.get("createdAt", 0), "updatedAt": value.get("updatedAt", 0),
                "lag": counts.get("scheduled", 0) + counts.get("running", 0),
                "paused": bool((native or {}).get("paused", value.get("paused", False)))}

    def qstash_queue(self, environ: dict, queue: str) -> Answer:
        return 200, self._queue_out(queue)

    def qstash_queue_delete(self, environ: dict, queue: str) -> Answer:
        """The queue's setting goes, and its waiting messages with it (as in QStash)."""
        self._queue_out(queue)
        if self._defs.machine.get(QUEUE_KIND, queue) is not None:
            status, body = self._defs.op("delete", QUEUE_KIND, queue)
            if status != 200:
                return status, body
        self.api.service.control(queue, "purge")
        return 200, {}

    def qstash_queue_control(self, environ: dict, queue: str, action: str) -> Answer:
        if self.api.service.control(queue, action) is None:
            raise NotFound(f"queue {queue} not found")
        value = self._defs.machine.get(QUEUE_KIND, queue)
        if value is not None:
            status, body = self._defs.op("put", QUEUE_KIND, queue,
                                         dict(value, paused=action == "pause"))
            if status != 200:
                return status, body
        return 200, {}


def task_id_hex() -> str:
    return new_id().replace("-", "")[:24]


def _destination(environ: dict, dest: str, parts: int) -> str:
    """The destination as the client sent it: from the raw request target when the
    server gives one (a URL's %2F and %20 stay as they are; PATH_INFO has them decoded),
    past the path's first ``parts`` slashes, with the query string, which is the
    destination's own."""
    raw = environ.get("RAW_URI")
    if isinstance(raw, str) and raw.count("/") >= parts:
        return raw.split("/", parts)[parts]
    query = environ.get("QUERY_STRING")
    return f"{dest}?{query}" if query else dest


def _answer(result: dict[str, Any], url: str) -> dict[str, Any]:
    """One enqueue_many result as QStash answers a message of a URL group."""
    if result.get("status") == "error":
        return {"error": result.get("error") or "not stored", "url": url}
    out: dict[str, Any] = {"messageId": result["id"], "url": url}
    if result.get("status") == "duplicate":
        out["deduplicated"] = True
    return out


def _strip_url(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "url"}


def _id_list(data: Any, key: str) -> list[str]:
    if data is None:
        raise ValidationError(key, "must be given: cancelling every message at once is "
                                   "not supported")
    ids = data.get(key) if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValidationError(key, "must be a list of ids")
    return ids


def _group_view(name: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "createdAt": 0, "updatedAt": 0,
            "endpoints": [{"url": u} for u in value.get("urls", [])]}


def _schedule_error(e: ValidationError) -> ValidationError:
    field = e.field
    if field.startswith("task."):
        return upstash.renamed(ValidationError(field[len("task."):], e.message, e.status))
    if field in ("cron", "timezone"):
        return ValidationError("Upstash-Cron", e.message, e.status)
    if field == "name":
        return ValidationError("Upstash-Schedule-Id", e.message, e.status)
    return e
