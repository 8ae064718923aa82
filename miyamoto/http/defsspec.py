"""The OpenAPI pieces of schedules and topics (``miyamoto.http.definitions``), which
``miyamoto.http.openapi`` adds to its document: kept apart so that module stays small."""

from __future__ import annotations

from typing import Any, Callable

from miyamoto.definitions.schedules import MAX_EVERY, NAME_CHARS
from miyamoto.definitions.topics import MAX_URLS

NAME_PATTERN = f"^[A-Za-z0-9_.-]{{1,{NAME_CHARS}}}$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "ScheduleRequest": {
        "type": "object", "required": ["name", "task"], "additionalProperties": False,
        "description": "give cron or every, not both",
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "cron": {"type": "string", "description": "5 fields (or 6, seconds last)"},
            "every": {"type": "integer", "minimum": 1, "maximum": MAX_EVERY,
                      "description": "seconds; ticks at unix times that are multiples"},
            "timezone": {"type": "string", "default": "UTC",
                         "description": "an IANA zone for cron, e.g. Europe/Paris"},
            "catch_up": {"enum": ["last", "none"], "description": "ticks missed while no "
                         "leader existed: the newest fires once, or none do (default: the "
                         "schedule_catch_up option)"},
            "paused": {"type": "boolean", "default": False},
            "task": {"type": "object", "description": "enqueue fields (as POST /queue "
                     "takes, without name and eta), checked when the schedule is posted"}}},
    "Schedule": {
        "type": "object", "required": ["name", "timezone", "paused", "next", "last_task_ids",
                                       "task"],
        "properties": {
            "name": {"type": "string"}, "cron": {"type": "string"},
            "every": {"type": "integer"}, "timezone": {"type": "string"},
            "catch_up": {"enum": ["last", "none"]}, "paused": {"type": "boolean"},
            "next": {"type": "array", "items": {"type": "number"},
                     "description": "the next fire times (unix), none while paused"},
            "last_tick": {"type": ["number", "null"]},
            "last_task_ids": {"type": "array", "items": {"type": "string"}},
            "task": {"type": "object"}}},
    "Schedules": {"type": "object", "required": ["schedules"], "properties": {
        "schedules": {"type": "array", "items": _ref("Schedule")}}},
    "TopicRequest": {"type": "object", "required": ["urls"], "additionalProperties": False,
                     "properties": {"urls": {"type": "array", "minItems": 1,
                                             "maxItems": MAX_URLS, "uniqueItems": True,
                                             "items": {"type": "string", "format": "uri"}}}},
    "Topic": {"type": "object", "required": ["name", "urls"], "properties": {
        "name": {"type": "string"}, "urls": {"type": "array", "items": {"type": "string"}}}},
    "Topics": {"type": "object", "required": ["topics"], "properties": {
        "topics": {"type": "array", "items": _ref("Topic")}}},
    "Deleted": {"type": "object", "required": ["status", "name"], "properties": {
        "status": {"const": "deleted"}, "name": {"type": "string"}}},
    "FanOut": {"type": "object", "required": ["status", "ids", "tasks"], "properties": {
        "status": {"enum": ["scheduled", "duplicate", "error"]}, "topic": {"type": "string"},
        "ids": {"type": "array", "items": {"type": "string"}},
        "tasks": {"type": "array", "items": {"type": "object", "required": ["url", "id"],
                                             "properties": {"url": {"type": "string"},
                                                            "id": {"type": "string"},
                                                            "status": {"type": "string"}}}}}},
}


def topic_task(task_fields: dict[str, Any]) -> dict[str, Any]:
    """An enqueue naming a topic instead of a url: one task per URL of the topic."""
    props = {k: v for k, v in task_fields.items() if k != "url"}
    props["topic"] = {"type": "string", "pattern": NAME_PATTERN,
                      "description": "a topic (PUT /topics/{name}) instead of url"}
    return {"type": "object", "required": ["topic"], "properties": props,
            "additionalProperties": False,
            "description": "one task per URL of the topic; a name is suffixed per URL"}


def paths(op: Callable[..., dict], path: Callable[..., dict],
          answer: Callable[..., dict]) -> dict[str, Any]:
    """The routes, built with openapi.py's own helpers (``_op``, ``_path``, ``_answer``)."""
    s, t = path("sname", NAME_PATTERN), path("tname", NAME_PATTERN)
    write = {"503": answer("no leader holds the definitions yet, or a majority did not "
                           "confirm in time"),
             "409": answer("the cluster holds as many definitions as it may")}

    def body(name: str) -> dict[str, Any]:
        return {"application/json": {"schema": _ref(name)}}

    return {
        "/schedules": {
            "get": op("Every schedule, with its next fire times", "Schedules"),
            "post": op("Create or replace a schedule, cluster-wide", "Schedule",
                       body=body("ScheduleRequest"), extra=write, scope="admin")},
        "/schedules/{sname}": {
            "get": op("One schedule, with its next fire times and last task ids", "Schedule",
                      params=[s]),
            "delete": op("Delete a schedule", "Deleted", params=[s], extra=write,
                         scope="admin")},
        "/schedules/{sname}/pause": {"post": op("Pause a schedule", "Schedule", params=[s],
                                                extra=write, scope="admin")},
        "/schedules/{sname}/resume": {"post": op("Resume a schedule", "Schedule", params=[s],
                                                 extra=write, scope="admin")},
        "/topics": {"get": op("Every topic", "Topics")},
        "/topics/{tname}": {
            "get": op("One topic", "Topic", params=[t]),
            "put": op("Create or replace a topic (each URL checked like a task's url)",
                      "Topic", params=[t], body=body("TopicRequest"), extra=write,
                      scope="admin"),
            "delete": op("Delete a topic", "Deleted", params=[t], extra=write,
                         scope="admin")},
    }
