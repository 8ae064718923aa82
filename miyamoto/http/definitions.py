"""The HTTP routes of schedules and topics (``/schedules``, ``/topics``), and the
fan-out of an enqueue that names a topic.

Reads answer from this node's copy of the definitions (every member holds them all);
writes go through ``DefSync.op``, which forwards them to the leader, so any node takes
them and the answer comes once a majority has them on disk. The routes of one kind of
resource, as ``api.py`` holds the tasks' and queues': it hands them in through ``Front``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from miyamoto.config.settings import Config
from miyamoto.definitions.sync import DefSync

from miyamoto.definitions.schedules import MAX_SCHEDULES, check_name, parse_schedule, view
from miyamoto.definitions.topics import MAX_TOPICS, expand, parse_topic, topic_name
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, build_task, json_fields

log = logging.getLogger(__name__)


def _safe_view(name: str, value: dict, cursor: Any, now: float) -> dict[str, Any] | None:
    """A schedule's view, or None (logged) if its stored value does not fit: values come
    from peers, and a bad one must not turn a read into a 500."""
    try:
        return view(value, cursor if isinstance(cursor, dict) else None, now)
    except (KeyError, TypeError, ValueError) as e:
        log.warning("schedules: %s has a bad definition: %r", name, e)
        return None


class Service(Protocol):
    """What these routes ask of the node."""

    @property
    def config(self) -> Config: ...  # the schedules' defaults
    @property
    def definitions(self) -> DefSync: ...
    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]: ...  # a topic's fan-out


class Front(Protocol):
    """What these routes use of the HTTP front (``miyamoto.http.api.Api``)."""

    service: Service
    limits: Limits
    clock: Callable[[], float]

    def body(self, environ: dict) -> bytes: ...


class DefsApi:
    def __init__(self, api: Front):
        self.api = api

    @property
    def _defs(self) -> DefSync:
        return self.api.service.definitions

    def _json(self, environ: dict) -> Any:
        return json_fields(self.api.body(environ))

    def _answer(self, status: int, body: dict, shape: Any) -> tuple[int, Any]:
        return (status, shape(body["value"])) if status == 200 else (status, body)

    # ------------------------------------------------------------ schedules
    def list_schedules(self, environ: dict) -> tuple[int, Any]:
        m, now = self._defs.machine, self.api.clock()
        views = [_safe_view(n, v, m.get("cursor", n), now) for n, v in m.items("schedule")]
        return 200, {"schedules": [v for v in views if v is not None]}

    def post_schedule(self, environ: dict) -> tuple[int, Any]:
        cfg = self.api.service.config
        value = parse_schedule(self._json(environ), limits=self.api.limits,
                               now=self.api.clock(), catch_up=cfg.schedule_catch_up)
        m = self._defs.machine
        if m.get("schedule", value["name"]) is None and len(m.items("schedule")) >= MAX_SCHEDULES:
            raise ValidationError("name", f"would be schedule {MAX_SCHEDULES + 1}: too many")
        status, body = self._defs.op("put", "schedule", value["name"], value)
        return self._answer(status, body, lambda v: view(v, None, self.api.clock()))

    def get_schedule(self, environ: dict, sname: str) -> tuple[int, Any]:
        m = self._defs.machine
        value = m.get("schedule", check_name(sname))
        shown = None if value is None else _safe_view(sname, value, m.get("cursor", sname),
                                                      self.api.clock())
        if shown is None:
            return 404, _err("names no known schedule", "name")
        return 200, shown

    def delete_schedule(self, environ: dict, sname: str) -> tuple[int, Any]:
        status, body = self._defs.op("delete", "schedule", check_name(sname))
        return self._answer(status, body, lambda v: {"status": "deleted", "name": sname})

    def schedule_control(self, environ: dict, sname: str, action: str) -> tuple[int, Any]:
        status, body = self._defs.op(action, "schedule", check_name(sname))
        cursor = self._defs.machine.get("cursor", sname)
        return self._answer(status, body, lambda v: view(v, cursor, self.api.clock()))

    def run_schedule(self, environ: dict, sname: str) -> tuple[int, Any]:
        """POST /schedules/<name>/run: enqueue the schedule's task once, now, as a tick
        would, paused or not. Not a tick: the cursor does not move, so the next tick
        comes as planned, and it needs no leader (any node enqueues; the definitions are
        on every member). Unnamed, so each run is a task of its own, unless the request
        has an Idempotency-Key: then a repeat within the dedup window is 409."""
        value = self._defs.machine.get("schedule", check_name(sname))
        if value is None or not isinstance(value.get("task"), dict):
            return 404, _err("names no known schedule", "name")
        fields = {k: v for k, v in value["task"].items() if k not in ("name", "dedupe")}
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if key:
            fields["name"] = f"schedule:{sname}:run:{key}"
        task = build_task(fields, path_queue=None, idempotency_key=None,
                          limits=self.api.limits, now=self.api.clock())
        (r,) = self.api.service.enqueue_many([task])
        status = {"scheduled": 200, "duplicate": 409}.get(r["status"], 503)
        return status, {"schedule": sname, **r}

    # ------------------------------------------------------------ topics
    def list_topics(self, environ: dict) -> tuple[int, Any]:
        return 200, {"topics": [dict(v, name=n) for n, v in self._defs.machine.items("topic")]}

    def get_topic(self, environ: dict, tname: str) -> tuple[int, Any]:
        value = self._defs.machine.get("topic", check_name(tname))
        if value is None:
            return 404, _err("names no known topic", "name")
        return 200, dict(value, name=tname)

    def put_topic(self, environ: dict, tname: str) -> tuple[int, Any]:
        check_name(tname)
        value = parse_topic(self._json(environ), self.api.limits)
        m = self._defs.machine
        if m.get("topic", tname) is None and len(m.items("topic")) >= MAX_TOPICS:
            raise ValidationError("name", f"would be topic {MAX_TOPICS + 1}: too many")
        status, body = self._defs.op("put", "topic", tname, value)
        return self._answer(status, body, lambda v: dict(v, name=tname))

    def delete_topic(self, environ: dict, tname: str) -> tuple[int, Any]:
        status, body = self._defs.op("delete", "topic", check_name(tname))
        return self._answer(status, body, lambda v: {"status": "deleted", "name": tname})

    def enqueue_topic(self, fields: dict, queue: str | None,
                      idempotency_key: str | None) -> tuple[int, Any]:
        """One task per URL of the topic; 404 naming ``topic`` if there is none."""
        name = topic_name(fields)
        value = self._defs.machine.get("topic", name)
        urls = None if value is None else value.get("urls")
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            return 404, _err("names no known topic", "topic")
        tasks = expand(fields, urls, path_queue=queue,
                       idempotency_key=idempotency_key, limits=self.api.limits,
                       now=self.api.clock(), offset=self.api.service.clock_offset())
        results = self.api.service.enqueue_many(tasks)
        out = [{"url": t.url, "id": r["id"], "status": r["status"],
                **({"error": r["error"]} if "error" in r else {})}
               for t, r in zip(tasks, results)]
        statuses = {r["status"] for r in results}
        status = 503 if "error" in statuses else 409 if statuses == {"duplicate"} else 200
        overall = {200: "scheduled", 409: "duplicate", 503: "error"}[status]
        body: dict[str, Any] = {"status": overall, "topic": name,
                                "ids": [r["id"] for r in out], "tasks": out}
        if status == 503:
            body["error"] = "some of the topic's tasks were not stored: see tasks"
        return status, body


def _err(message: str, field: str) -> dict[str, Any]:
    return {"status": "error", "error": f"{field} {message}", "field": field}
