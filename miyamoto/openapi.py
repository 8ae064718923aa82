"""The OpenAPI description served at /openapi.json (kept next to the routes in api.py)."""

from __future__ import annotations

from typing import Any

from miyamoto.version import __version__

_TASK_FIELDS: dict[str, Any] = {
    "url": {"type": "string", "format": "uri", "description": "http(s) target"},
    "method": {"type": "string", "enum": ["POST", "PUT", "PATCH", "GET", "DELETE"]},
    "params": {"type": "object", "description": "form-encoded (query string for GET/DELETE)"},
    "body": {"type": "string", "description": "raw body instead of params"},
    "content_type": {"type": "string"},
    "json": {"description": "a JSON body instead of params"},
    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
    "countdown": {"type": "number", "minimum": 0},
    "eta": {"type": "number", "description": "unix time; wins over countdown"},
    "name": {"type": "string", "maxLength": 500, "description": "de-duplication key"},
    "queue": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,100}$"},
    "max_attempts": {"type": "integer", "minimum": 1},
    "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 1800},
    "callback": {"type": "string", "format": "uri"},
    "failure_callback": {"type": "string", "format": "uri"},
}

_JSON = {"application/json": {"schema": {"type": "object"}}}
_ERR = {"description": "error naming the field", "content": _JSON}
_AUTH = {"401": {"description": "no valid API token (when api_tokens is set)", "content": _JSON},
         "403": {"description": "the token's scope does not allow this route", "content": _JSON}}


def _op(summary: str, *, body: dict | None = None, params: list | None = None,
        extra: dict | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "responses": {"200": {"description": "OK", "content": _JSON},
                                        "400": _ERR, "404": _ERR, **_AUTH, **(extra or {})}}
    if body is not None:
        op["requestBody"] = {"content": body}
    if params:
        op["parameters"] = params
    return op


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_TASK_BODY = {
    "application/json": {"schema": {"type": "object", "required": ["url"],
                                    "properties": _TASK_FIELDS, "additionalProperties": False}},
    "application/x-www-form-urlencoded": {"schema": {"type": "object", "description":
                                                     "task.X keys configure the task; other keys are params"}},
}
_ENQ_EXTRA = {"409": {"description": "duplicate name", "content": _JSON},
              "413": _ERR, "503": {"description": "stopping or too few replicas"}}

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Miyamoto", "version": __version__,
             "description": "A clustered webhook task queue."},
    # bearer tokens with scopes admin, enqueue, read (api_tokens); open when none are set
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}, {}],
    "paths": {
        "/queue": {"post": _op("Enqueue a task", body=_TASK_BODY, extra=_ENQ_EXTRA)},
        "/queue/{queue}": {"post": _op("Enqueue a task in a queue", body=_TASK_BODY,
                                       params=[_path("queue")], extra=_ENQ_EXTRA)},
        "/queue/{queue}/batch": {"post": _op(
            "Enqueue a JSON list of tasks", params=[_path("queue")], extra=_ENQ_EXTRA,
            body={"application/json": {"schema": {"type": "array", "items": {
                "type": "object", "properties": _TASK_FIELDS}}}})},
        "/tasks/{id}": {"get": _op("One task", params=[_path("id")]),
                        "delete": _op("Cancel a task on every replica", params=[_path("id")],
                                      extra={"409": _ERR})},
        "/tasks/{id}/retry": {"post": _op("Run a task again", params=[_path("id")],
                                          extra={"409": _ERR})},
        "/queues": {"get": _op("Queues with config and counts")},
        "/queues/{queue}": {"get": _op("One queue", params=[_path("queue")])},
        "/queues/{queue}/tasks": {"get": _op("Tasks of a queue by state", params=[
            _path("queue"),
            {"name": "state", "in": "query", "schema": {"type": "string", "enum": [
                "scheduled", "running", "succeeded", "failed", "cancelled"]}},
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                         "maximum": 1000}}])},
        "/queues/{queue}/pause": {"post": _op("Pause a queue, cluster-wide", params=[_path("queue")])},
        "/queues/{queue}/resume": {"post": _op("Resume a queue", params=[_path("queue")])},
        "/queues/{queue}/purge": {"post": _op("Cancel every scheduled task of a queue",
                                              params=[_path("queue")])},
        "/cluster": {"get": _op("Roster, leader, term, members' health")},
        "/healthz": {"get": dict(_op("Liveness"), security=[])},
        "/readyz": {"get": dict(_op("Readiness", extra={"503": {"description": "not ready"}}),
                                security=[])},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "Prometheus text exposition "
                                                           "format (prometheus_client)"}}}},
    },
}
