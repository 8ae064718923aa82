"""The HTTP routes of pull queues: a worker leases due tasks, then acks, nacks or
extends each with the token its lease carried.

``POST /queues/<name>/lease`` {max_tasks, lease_s, wait_s} answers {"tasks": [...]}
(each with its id, params or body, headers, attempt, token and lease_until); the token
is a long task's completion token (``delivery/completion.py``: signed under the
cluster's completion key, for one attempt), so any node checks it without a lookup and
carries the answer to the node holding the lease. ``POST /tasks/<id>/ack`` {token},
``/nack`` {token, delay}, ``/extend`` {token, lease_s}; the token may also come as
``?token=``. A bad token is 403, a lease already over 409, a push queue's lease 409.
The routes of one kind of resource, as ``api.py`` holds the tasks' and queues'.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol
from urllib.parse import parse_qs

import ujson

from miyamoto.delivery import completion
from miyamoto.engine import pull
from miyamoto.tasks.checks import ValidationError

LEASE_DEFAULT = 60.0  # s: a lease's span when the request names none
Reply = tuple[int, Any]


class Service(Protocol):
    """What these routes ask of the node (``miyamoto.node.Node``)."""

    def lease(self, queue: str, max_tasks: int, lease_s: float,
              wait_s: float) -> list[dict[str, Any]] | None: ...
    def ack(self, task_id: str, token: str) -> dict[str, Any] | None: ...
    def nack(self, task_id: str, token: str, delay: float | None) -> dict[str, Any] | None: ...
    def extend(self, task_id: str, token: str,
               lease_s: float | None) -> dict[str, Any] | None: ...


class Front(Protocol):
    """What these routes use of the HTTP front (``miyamoto.http.api.Api``)."""

    def body(self, environ: dict) -> bytes: ...


class PullApi:
    def __init__(self, api: Front, service: Service):
        self.api = api
        self.service = service

    def routes(self) -> list[tuple[re.Pattern[str], dict[str, Callable[..., Reply]]]]:
        q, t = r"(?P<queue>[^/]+)", r"(?P<task_id>[^/]+)"
        return [(re.compile(rf"/queues/{q}/lease"), {"POST": self.lease_tasks}),
                (re.compile(rf"/tasks/{t}/ack"), {"POST": self.ack_task}),
                (re.compile(rf"/tasks/{t}/nack"), {"POST": self.nack_task}),
                (re.compile(rf"/tasks/{t}/extend"), {"POST": self.extend_task})]

    def lease_tasks(self, environ: dict, queue: str) -> Reply:
        body = self._body(environ, {"max_tasks", "lease_s", "wait_s"})
        n = _number(body, "max_tasks", 1, 1, pull.TASKS_MAX, whole=True)
        lease_s = _number(body, "lease_s", LEASE_DEFAULT, pull.LEASE_MIN, pull.LEASE_MAX)
        wait_s = _number(body, "wait_s", 0.0, 0.0, pull.WAIT_MAX)
        tasks = self.service.lease(queue, int(n), lease_s, wait_s)
        if tasks is None:
            raise ValidationError("queue", "names no queue of this node (a queue comes from "
                                  "the config, a PUT /queues/<name> or an enqueue)", 404)
        for t in tasks:
            t.pop("lease_left", None)
        return 200, {"queue": queue, "tasks": tasks}

    def ack_task(self, environ: dict, task_id: str) -> Reply:
        body = self._body(environ, {"token"})
        token = _token(environ, body)
        return _found(_granted(lambda: self.service.ack(task_id, token)))

    def nack_task(self, environ: dict, task_id: str) -> Reply:
        body = self._body(environ, {"token", "delay"})
        token = _token(environ, body)
        delay = body.get("delay")
        if delay is not None:
            delay = _number(body, "delay", 0.0, 0.0, pull.DELAY_MAX)
        return _found(_granted(lambda: self.service.nack(task_id, token, delay)))

    def extend_task(self, environ: dict, task_id: str) -> Reply:
        body = self._body(environ, {"token", "lease_s"})
        token = _token(environ, body)
        lease_s = body.get("lease_s")
        if lease_s is not None:
            lease_s = _number(body, "lease_s", 0.0, pull.LEASE_MIN, pull.LEASE_MAX)
        return _found(_granted(lambda: self.service.extend(task_id, token, lease_s)))

    def _body(self, environ: dict, fields: set[str]) -> dict[str, Any]:
        data = self.api.body(environ)
        if not data.strip():
            return {}
        try:
            body = ujson.loads(data)
        except ValueError:
            raise ValidationError("body", "is not JSON") from None
        if not isinstance(body, dict):
            raise ValidationError("body", "must be a JSON object of " + ", ".join(sorted(fields)))
        unknown = sorted(set(body) - fields)
        if unknown:
            raise ValidationError(unknown[0], "is not a field here: give "
                                  + ", ".join(sorted(fields)))
        return body


def _number(body: dict, name: str, default: float, lo: float, hi: float,
            whole: bool = False) -> float:
    v = body.get(name, default)
    if not pull.within(v, lo, hi) or (whole and float(v) != int(v)):
        kind = "an integer" if whole else "a number of seconds"
        raise ValidationError(name, f"must be {kind} from {lo:g} to {hi:g}")
    return float(v)


def _token(environ: dict, body: dict[str, Any]) -> str:
    token = body.get("token")
    if token is None:
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token") or []
        token = given[0] if len(given) == 1 else None
    if not isinstance(token, str) or not token:
        raise ValidationError("token", "is missing: give the token the lease carried", 403)
    return token


def _granted(call: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    try:
        return call()
    except completion.TokenError as e:
        raise ValidationError("token", str(e), 403) from None


def _found(view: dict[str, Any] | None) -> Reply:
    if view is None:
        raise ValidationError("id", "names no known task", 404)
    return 200, view
