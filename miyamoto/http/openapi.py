"""The OpenAPI 3.1 description served at /openapi.json (kept next to the routes in api.py).

Every route of ``Api.routes`` is described, each answer with a component schema, so that
``openapi-spec-validator`` accepts it and a schemathesis run (tests/nodes/test_openapi_node.py)
can check every answer against it; tests/unit/http/test_openapi.py holds each bound it
states to what the validators do. The task fields and their limits are those of
``miyamoto.tasks.validate`` and ``miyamoto.tasks.fields``, the schedules' and topics'
those of ``miyamoto.definitions``; the scopes are those of ``miyamoto.http.auth``.
One module for the whole document, so a route and its schemas are read in one place.
"""

from __future__ import annotations

from typing import Any

from miyamoto.definitions.queues import CHOICES as QUEUE_CHOICES
from miyamoto.engine import pull
from miyamoto.definitions.queues import FIELDS as QUEUE_FIELDS, SOURCES
from miyamoto.definitions.schedules import MAX_EVERY, NAME_CHARS
from miyamoto.definitions.topics import MAX_URLS
from miyamoto.tasks.fields import MAX_FLOW_KEY, MAX_FLOW_PARALLELISM, MAX_FLOW_RATE, \
                                  PRIORITY_DEFAULT, PRIORITY_MAX, PRIORITY_MIN
from miyamoto.tasks.checks import MAX_AUDIENCE
from miyamoto.tasks.labels import MAX_LABELS, MAX_VALUE as MAX_LABEL_VALUE
from miyamoto.tasks.options import LEASE_MAX, RETRY_DELAY_MAX, RETRY_DELAYS_MAX
from miyamoto.tasks.repeat import MODES as REPEAT_MODES
from miyamoto.tasks.task import METHODS, State
from miyamoto.tasks.validate import MAX_ATTEMPTS, MAX_TIMEOUT, Limits
from miyamoto.version import __version__

_QUEUE_PATTERN = "^[A-Za-z0-9_-]{1,100}$"
_ID_PATTERN = "^[A-Za-z0-9_.:-]{1,128}$"
_NAME_PATTERN = f"^[A-Za-z0-9_.-]{{1,{NAME_CHARS}}}$"  # a schedule's or a topic's name
_STATES = [s.value for s in State]
_D = Limits()


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


_SCALAR = {"type": ["string", "number", "boolean", "null"]}
_URL = {"type": "string", "format": "uri", "maxLength": _D.max_url,
        "description": "an http:// or https:// URL; refused if target_deny or the default "
                       "deny list (loopback-only rules aside) covers its host"}
# priority and the flow key: their limits are those of miyamoto.tasks.fields
_DISPATCH_FIELDS: dict[str, Any] = {
    "priority": {"type": ["integer", "null"], "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX,
                 "default": PRIORITY_DEFAULT, "description": "higher goes first among a "
                 "queue's waiting due tasks; a wait of 10 s counts as one level (aging)"},
    "flow_key": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_FLOW_KEY,
                 "description": "tasks sharing a key share flow_rate and flow_parallelism, "
                 "across queues and the cluster"},
    "flow_rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_FLOW_RATE,
                  "description": "tasks/s for the key (with flow_key; the last task seen sets it)"},
    "flow_parallelism": {"type": ["integer", "null"], "minimum": 1,
                         "maximum": MAX_FLOW_PARALLELISM,
                         "description": "deliveries in flight for the key (with flow_key)"},
}
_TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
_TASK_FIELDS: dict[str, Any] = {
    "url": _URL,
    "method": {"type": "string", "enum": list(METHODS), "default": "POST"},
    "params": {"type": ["object", "null"], "description": "form-encoded (the query string "
               "for GET/DELETE)", "additionalProperties": {
                   "anyOf": [_SCALAR, {"type": "array", "items": _SCALAR}]}},
    "body": {"type": "string", "description": "a raw body instead of params"},
    "content_type": {"type": "string", "minLength": 1,
                     "description": "the Content-Type of body or json"},
    "json": {"description": "a JSON body instead of params"},
    "headers": {"type": ["object", "null"], "description": "extra request headers; "
                "Host, Content-Length and other hop-by-hop ones are refused",
                "additionalProperties": {"type": ["string", "number"]}},
    "countdown": _nullable({"type": "number", "minimum": 0, "maximum": _D.max_delay,
                            "description": "seconds from now"}),
    "eta": _nullable({"type": "number", "minimum": 0, "description": "a unix time; wins "
                      "over countdown; at most max_delay ahead"}),
    "name": _nullable({"type": "string", "minLength": 1, "maxLength": _D.max_name,
                       "description": "de-duplication key (else the Idempotency-Key header)"}),
    "dedupe": {"enum": ["content", None], "description": "content: the name is content: + "
               "the SHA-256 of the method, URL, headers and body sent; not with name"},
    "queue": _nullable({"type": "string", "pattern": _QUEUE_PATTERN}),
    "max_attempts": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS}),
    "timeout": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT}),
    "callback": _nullable(dict(_URL, description="POSTed the outcome when the task succeeds")),
    "failure_callback": _nullable(dict(_URL, description="POSTed the outcome when it fails")),
    **_DISPATCH_FIELDS,
    "traceparent": _nullable({"type": "string", "pattern": _TRACEPARENT_PATTERN,
                              "description": "W3C Trace Context: kept with the task and sent "
                              "on every attempt (else the traceparent header)"}),
    "oidc_audience": _nullable({"type": "string", "minLength": 1, "maxLength": MAX_AUDIENCE,
                                "pattern": "^[!-~]+$",
                                "description": "each attempt carries Authorization: Bearer "
                                "<OIDC token> for this audience (the queue's oidc_audience "
                                "otherwise); needs oidc_signing_key"}),
    "expires_at": _nullable({"type": "number", "description": "a unix time after the eta: "
                             "no attempt starts after it, the task ends as expired (its "
                             "failure_callback told); wins over ttl"}),
    "ttl": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 2 * _D.max_delay,
                      "description": "seconds from now to expires_at"}),
    "retry_delays": _nullable({"type": "array", "minItems": 1, "maxItems": RETRY_DELAYS_MAX,
                               "items": {"type": "number", "minimum": 0,
                                         "maximum": RETRY_DELAY_MAX},
                               "description": "seconds before each retry instead of the "
                               "queue's backoff, the last repeating (a form: 1,10,60)"}),
    "async": _nullable({"type": "boolean", "description": "a long task: a 202 from the "
                        "worker keeps it running until the worker POSTs its "
                        "X-Task-Complete-Url or the lease runs out (lease 300 s unless "
                        "given); without it a 202 is a success"}),
    "lease": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": LEASE_MAX,
                        "description": "seconds a long task's 202 holds it running "
                        "(implies async; a heartbeat extends it)"}),
    "labels": _nullable({"type": "object", "maxProperties": MAX_LABELS,
                         "propertyNames": {"pattern": "^[a-z0-9_.-]{1,64}$"},
                         "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE},
                         "description": "a few key=value pairs to find the task by (GET "
                         "/tasks?label=k=v; a form: task.labels=k=v,k2=v2)"}),
}
# what a repeat of a held name does (tasks/repeat.py): POST /queue only, with a name
_REPEAT_FIELDS: dict[str, Any] = {
    "on_duplicate": ({"enum": [*REPEAT_MODES, None], "description": "a repeat of a "
                               "held name: reject (409, the default), keep (200 with the "
                               "held task) or replace (its params, body and eta, on every "
                               "copy, while it has not started)"}),
    "debounce": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": _D.max_delay,
                           "description": "seconds: each repeat moves the held task's eta "
                           "to at least now + debounce"}),
    "debounce_max": _nullable({"type": "number", "exclusiveMinimum": 0,
                               "maximum": _D.max_delay, "description": "seconds from the "
                               "first enqueue the eta never passes (10 debounces)"}),
}
_FORM_FIELDS = {f"task.{k}": {"type": "string"} for k in (
    "url", "method", "countdown", "eta", "name", "queue", "max_attempts", "timeout",
    "callback", "failure_callback", "dedupe", "topic", "traceparent", "oidc_audience",
    *_DISPATCH_FIELDS, "expires_at", "ttl", "retry_delays", "labels", "async", "lease",
    *_REPEAT_FIELDS)}

def _queue_settings() -> dict[str, Any]:
    """PUT /queues/{queue}'s body: the fields and bounds of ``definitions.queues.FIELDS``."""
    props: dict[str, Any] = {}
    for name, (kind, lo, hi) in QUEUE_FIELDS.items():
        if kind is bool:
            props[name] = {"type": ["boolean", "null"]}
        elif kind is str:
            props[name] = {"type": ["string", "null"], "enum": [*QUEUE_CHOICES[name], None]}
        else:
            props[name] = {"type": ["integer" if kind is int else "number", "null"],
                           "minimum": lo, "maximum": hi}
    return {"type": "object", "additionalProperties": False, "properties": props,
            "description": "the settings to set; a field left out keeps what the API set "
                           "before, null drops it (back to the config's value)"}


# schedules and topics (miyamoto.http.definitions)
_DEFINITION_SCHEMAS: dict[str, Any] = {
    "ScheduleRequest": {
        "type": "object", "required": ["name", "task"], "additionalProperties": False,
        "description": "give cron or every, not both; cron_seconds_last only with cron",
        "oneOf": [{"required": ["cron"], "not": {"required": ["every"]}},
                  {"required": ["every"], "not": {"anyOf": [
                      {"required": ["cron"]}, {"required": ["cron_seconds_last"]}]}}],
        "properties": {
            "name": {"type": "string", "pattern": _NAME_PATTERN},
            "cron": {"type": "string", "description": "5 fields (minute hour day-of-month "
                     "month day-of-week) or an alias (@hourly, @daily, @weekly, @monthly, "
                     "@yearly); 6 fields (seconds last) only with cron_seconds_last"},
            "cron_seconds_last": {"type": "boolean", "default": False, "description":
                                  "cron has a sixth field, croniter's seconds, last"},
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
        "type": "object", "required": ["name", "timezone", "paused", "next", "next_at",
                                       "last_task_ids", "task"],
        "properties": {
            "name": {"type": "string"}, "cron": {"type": "string"},
            "cron_seconds_last": {"type": "boolean"},
            "every": {"type": "integer"}, "timezone": {"type": "string"},
            "catch_up": {"enum": ["last", "none"]}, "paused": {"type": "boolean"},
            "next": {"type": "array", "items": {"type": "number"},
                     "description": "the next fire times (unix), none while paused"},
            "next_at": {"type": "array", "items": {"type": "string", "format": "date-time"},
                        "description": "the same times, RFC 3339 in the schedule's timezone"},
            "error": {"type": "string", "description": "why a stored schedule cannot fire"},
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


# json and body are exclusive (tasks.validate): the schema says so, as the server does
_BOTH_BODIES = {"required": ["json", "body"]}


def _topic_task(task_fields: dict[str, Any]) -> dict[str, Any]:
    """An enqueue naming a topic instead of a url: one task per URL of the topic."""
    props = {k: v for k, v in task_fields.items() if k != "url"}
    props["topic"] = {"type": "string", "pattern": _NAME_PATTERN,
                      "description": "a topic (PUT /topics/{name}) instead of url"}
    return {"type": "object", "required": ["topic"], "properties": props,
            "additionalProperties": False, "not": _BOTH_BODIES,
            "description": "one task per URL of the topic; a name is suffixed per URL"}


# GET /tasks/<id> shows the request the task makes (miyamoto.tasks.redact)
_KINDS = ["enqueued", "delivered", "failed"]
_REQUEST_VIEW: dict[str, Any] = {
    "params": {"type": "object", "description": "the params sent to the target"},
    "headers": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "the extra headers sent to the target; the values of "
                "Authorization, Proxy-Authorization, Cookie and of every header whose name "
                "holds token, secret, key or signature are shown as \"[redacted]\""},
    "body": {"type": ["string", "null"], "description": "the raw body, its first 65,536 "
             "characters"},
    "body_chars": {"type": "integer", "minimum": 0, "description": "the raw body's length"},
    "content_type": {"type": ["string", "null"]},
}
_PAGE_PARAMS: list[dict[str, Any]] = [
    {"name": "state", "in": "query", "description": "without name: the state listed",
     "schema": {"enum": _STATES, "default": "scheduled"}},
    {"name": "target", "in": "query", "description": "without name: tasks whose URL "
     "starts with this (an origin, or more)", "schema": {"type": "string", "maxLength": 2083}},
    {"name": "name_prefix", "in": "query", "description": "without name: tasks whose name "
     "starts with this", "schema": {"type": "string", "maxLength": 2083}},
    {"name": "label", "in": "query", "description": "without name: tasks with this label, "
     "key=value", "schema": {"type": "string", "pattern": "^[a-z0-9_.-]{1,64}=.{0,256}$"}},
    {"name": "since", "in": "query", "description": "without name: tasks whose next "
     "attempt (ended: end) is at or after this unix time", "schema": {
         "type": "number", "minimum": 0, "exclusiveMaximum": 1e11}},
    {"name": "until", "in": "query", "description": "without name: ... and before this "
     "unix time", "schema": {"type": "number", "minimum": 0, "exclusiveMaximum": 1e11}},
    {"name": "cursor", "in": "query", "description": "without name: the next_cursor of the "
     "previous page", "schema": {"type": "string"}},
    {"name": "limit", "in": "query", "description": "without name: the most tasks a page "
     "holds", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
]

_REPORT = {"type": "object", "required": ["state"], "additionalProperties": False,
           "properties": {"state": {"enum": ["succeeded", "failed"]},
                          "result": {"description": "any JSON, at most 4096 bytes encoded; "
                                     "kept as the task's last response body"}}}
_HEARTBEAT = {"type": "object", "additionalProperties": False,
              "properties": {"lease": {"type": "number", "exclusiveMinimum": 0,
                                       "maximum": LEASE_MAX}}}
_TOKEN_FIELD = {"type": "string", "maxLength": 200,
                "description": "the token the lease carried (or ?token=)"}
_SECONDS = {"type": "number"}
_PULL_SCHEMAS: dict[str, Any] = {
    "LeaseRequest": {"type": "object", "additionalProperties": False, "properties": {
        "max_tasks": {"type": "integer", "minimum": 1, "maximum": pull.TASKS_MAX,
                      "default": 1},
        "lease_s": {**_SECONDS, "minimum": pull.LEASE_MIN, "maximum": pull.LEASE_MAX,
                    "default": 60},
        "wait_s": {**_SECONDS, "minimum": 0, "maximum": pull.WAIT_MAX, "default": 0,
                   "description": "long poll: wait up to this long for the first due task"}}},
    "Leases": {"type": "object", "required": ["queue", "tasks"], "properties": {
        "queue": {"type": "string"},
        "tasks": {"type": "array", "items": {"type": "object", "required": [
            "id", "token", "attempt", "lease_until", "params", "headers"], "properties": {
                "id": {"type": "string"}, "queue": {"type": "string"},
                "name": {"type": ["string", "null"]}, "token": {"type": "string"},
                "attempt": {"type": "integer", "minimum": 1},
                "lease_until": {"type": "number", "description": "unix time the lease ends"},
                "params": {"type": "object"}, "body": {"type": ["string", "null"]},
                "content_type": {"type": ["string", "null"]},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "labels": {"type": "object"}, "priority": {"type": "integer"},
                "eta": {"type": "number"}, "url": {"type": ["string", "null"]},
                "max_attempts": {"type": ["integer", "null"]},
                "node": {"type": ["string", "null"],
                         "description": "the node holding the lease"}}}}}},
    "Ack": {"type": "object", "additionalProperties": False,
            "properties": {"token": _TOKEN_FIELD}},
    "Nack": {"type": "object", "additionalProperties": False, "properties": {
        "token": _TOKEN_FIELD,
        "delay": {**_SECONDS, "minimum": 0, "maximum": pull.DELAY_MAX,
                  "description": "retry after this long (default: the task's backoff)"}}},
    "Extend": {"type": "object", "additionalProperties": False, "properties": {
        "token": _TOKEN_FIELD,
        "lease_s": {**_SECONDS, "minimum": pull.LEASE_MIN, "maximum": pull.LEASE_MAX,
                    "description": "seconds from now (default: the lease's own span)"}}},
}
_SCHEMAS: dict[str, Any] = {
    **_PULL_SCHEMAS,
    "Report": _REPORT, "Heartbeat": _HEARTBEAT,
    "TaskRequest": {"type": "object", "required": ["url"], "properties": _TASK_FIELDS,
                    "additionalProperties": False, "not": _BOTH_BODIES,
                    "description": "a task as JSON (Content-Type: application/json); a "
                                   "task of a queue in mode pull may leave url out"},
    # One schema per media type, each an object or a union of objects: a code generator
    # maps a schema of bare ``required`` alternatives to Any (and then fails on it)
    "EnqueueTaskRequest": {"type": "object", "required": ["url"],
                           "properties": {**_TASK_FIELDS, **_REPEAT_FIELDS},
                           "additionalProperties": False, "not": _BOTH_BODIES,
                           "description": "a task as JSON; on_duplicate and debounce "
                                          "need a name (or an Idempotency-Key)"},
    "EnqueueRequest": {"anyOf": [_ref("EnqueueTaskRequest"), _ref("TopicTaskRequest")],
                       "description": "a task for one url, or one per URL of a topic"},
    "TaskForm": {"type": "object", "properties": _FORM_FIELDS,
                 "additionalProperties": {"type": "string"},
                 "description": "a task as a form: task.url or task.topic is required; "
                                "task.X keys configure it (task.header.X adds a header), "
                                "every other key is a param"},
    "Batch": {"oneOf": [{"type": "array", "minItems": 1, "items": _ref("TaskRequest")},
                        {"type": "object", "required": ["tasks"], "additionalProperties": False,
                         "properties": {"tasks": {"type": "array", "minItems": 1,
                                                  "items": _ref("TaskRequest")}}}]},
    "Error": {"type": "object", "required": ["status", "error"], "properties": {
        "status": {"const": "error"}, "error": {"type": "string"},
        "field": {"type": "string", "description": "the culprit, when one field is"}}},
    "Duplicate": {"type": "object", "required": ["status", "id"], "properties": {
        "status": {"const": "duplicate"},
        "id": {"type": "string", "description": "the task first enqueued under this name"},
        "name": {"type": ["string", "null"]}}},
    "Enqueued": {"type": "object", "required": ["status", "id", "queue", "eta"], "properties": {
        "status": {"enum": ["scheduled", "kept", "replaced", "debounced"],
                   "description": "kept, replaced, debounced: a repeat of a held name "
                                  "(on_duplicate, debounce); id is the held task's"}, "id": {"type": "string"},
        "queue": {"type": "string"}, "eta": {"type": "number"},
        "name": {"type": ["string", "null"]},
        "replicas": {"type": "array", "items": {"type": "string"}}}},
    "ScheduleRun": {"type": "object", "required": ["schedule", "status", "id"], "properties": {
        "schedule": {"type": "string"}, "status": {"const": "scheduled"},
        "id": {"type": "string"}, "queue": {"type": "string"}, "eta": {"type": "number"},
        "name": {"type": ["string", "null"]},
        "replicas": {"type": "array", "items": {"type": "string"}}}},
    "BatchResult": {"type": "object", "required": ["status", "tasks"], "properties": {
        "status": {"const": "ok"}, "tasks": {"type": "array", "items": {"anyOf": [
            _ref("Enqueued"), _ref("Duplicate"),
            {"type": "object", "required": ["status", "error"],
             "properties": {"status": {"const": "error"}, "id": {"type": "string"},
                            "error": {"type": "string"}}}]}}}},
    "Task": {"type": "object", "required": ["id", "queue", "state", "url", "method"],
             "properties": {
                 "id": {"type": "string"}, "queue": {"type": "string"},
                 # "deleted": the answer to DELETE of a failed task
                 "state": {"enum": [*_STATES, "deleted"]}, "name": {"type": ["string", "null"]},
                 "url": {"type": "string"}, "method": {"enum": list(METHODS)},
                 "eta": {"type": "number"}, "created": {"type": "number"},
                 "next_attempt": {"type": ["number", "null"]},
                 "attempts": {"type": "integer"}, "executions": {"type": "integer"},
                 "max_attempts": {"type": ["integer", "null"]},
                 "timeout": {"type": ["number", "null"]},
                 "last_response": {"type": ["object", "null"]},
                 "finished": {"type": ["number", "null"]},
                 "replicas": {"type": "array", "items": {"type": "string"}},
                 "replica": {"type": "integer"}, "node": {"type": "string"},
                 "callback": {"type": ["string", "null"]},
                 "failure_callback": {"type": ["string", "null"]},
                 **_DISPATCH_FIELDS,
                 "expires_at": {"type": ["number", "null"]},
                 "retry_delays": {"type": ["array", "null"], "items": {"type": "number"}},
                 "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                 "lease": {"type": ["number", "null"]},
                 **_REQUEST_VIEW,
                 "history": {"type": "array", "maxItems": 20, "description": "the last "
                             "attempts, newest first", "items": {
                                 "type": "object", "properties": {
                                     "start": {"type": "number"}, "duration": {"type": "number"},
                                     "node": {"type": "string"},
                                     "status": {"type": ["integer", "null"]},
                                     "error": {"type": ["string", "null"]}}}},
                 "copies": {"type": "array", "items": {"type": "object", "properties": {
                     "node": {"type": "string"}, "replica": {"type": "integer"},
                     "state": {"enum": _STATES},
                     "next_attempt": {"type": ["number", "null"]}}}}}},
    "Queue": {"type": "object", "required": ["name", "paused", "config", "counts"],
              "properties": {
                  "name": {"type": "string"}, "paused": {"type": "boolean"},
                  "limit": {"type": ["number", "null"]},
                  "mode": {"enum": list(QUEUE_CHOICES["mode"]),
                           "description": "push: tasks are POSTed to their url; pull: "
                                          "workers lease them (POST /queues/{queue}/lease)"},
                  "leased": {"type": "integer", "minimum": 0,
                             "description": "a pull queue's tasks a worker holds a lease on"},
                  "config": {"type": "object", "additionalProperties": {
                      "type": ["number", "string", "null"]}},
                  "sources": {"type": "object", "description": "where each setting's "
                              "value comes from (GET /queues/{queue}, PUT, DELETE): api "
                              "(PUT), config (the INI), default (built in), control "
                              "(paused by POST pause or resume, against the settings)",
                              "additionalProperties": {"enum": list(SOURCES)}},
                  "counts": {"type": "object", "required": _STATES, "description": "tasks "
                             "by state, over the cluster, each counted once",
                             "properties": {s: {"type": "integer", "minimum": 0}
                                            for s in _STATES}},
                  "copies": {"type": "object", "description": "copies by state, over the "
                             "nodes that answered: a task has one per replica",
                             "properties": {s: {"type": "integer", "minimum": 0}
                                            for s in _STATES}},
                  "totals": {"type": "object", "description": "tasks enqueued, delivered and "
                             "failed (finally) since the nodes started, summed over the "
                             "cluster: the dashboard's rates", "properties": {
                                 k: {"type": "integer", "minimum": 0}
                                 for k in ("enqueued", "delivered", "failed")}},
                  "latency": {"type": "object", "description": "from a task's eta to its "
                              "delivery's answer, over the last window seconds, cluster-wide "
                              "(the upper edge of a bucket 19 % wide); null: no delivery",
                              "properties": {"p50": {"type": ["number", "null"]},
                                             "p99": {"type": ["number", "null"]},
                                             "count": {"type": "integer", "minimum": 0},
                                             "window": {"type": "integer"}}},
                  "breakers": {"type": "array", "description": "targets of the queue's "
                               "latest attempts whose circuit breaker is open (or half open) "
                               "on some node", "items": {"type": "object", "properties": {
                                   "origin": {"type": "string"},
                                   "nodes": {"type": "integer", "minimum": 1}}}}}},
    "QueueSettings": _queue_settings(),
    "Queues": {"type": "object", "required": ["queues"],
               "properties": {"queues": {"type": "array", "items": _ref("Queue")},
                              "next_cursor": {"type": ["string", "null"], "description":
                                              "the cursor of the next page; null: the last"}}},
    "TaskPage": {"type": "object", "required": ["state", "tasks", "next_cursor", "nodes"],
                 "description": "first copies in one state, live ones next to fire first, "
                 "ended ones latest first; each node reads at most 2,000 rows a page, so a "
                 "page may hold fewer than limit with more to come",
                 "properties": {
                     "state": {"enum": _STATES},
                     "tasks": {"type": "array", "items": {"type": "object"}},
                     "next_cursor": {"type": ["string", "null"], "description":
                                     "the cursor of the next page; null: the last"},
                     "nodes": {"type": "array", "items": {"type": "string"},
                               "description": "the nodes that answered"}}},
    "TaskList": {"type": "object", "required": ["queue", "state", "tasks"], "properties": {
        "queue": {"type": "string"}, "state": {"enum": _STATES},
        "tasks": {"type": "array", "items": {"type": "object"}}}},
    "Control": {"type": "object", "required": ["status", "queue", "action"], "properties": {
        "status": {"const": "ok"}, "queue": {"type": "string"},
        "action": {"enum": ["pause", "resume", "purge"]},
        "purged": {"type": "integer", "minimum": 0}}},
    "FailedBulk": {"type": "object", "required": ["status", "queue", "action", "count", "more"],
                   "properties": {"status": {"const": "ok"}, "queue": {"type": "string"},
                                  "action": {"enum": ["retry", "delete", "resend"]},
                                  "count": {"type": "integer", "minimum": 0},
                                  "more": {"type": "boolean"}}},
    "Cluster": {"type": "object", "required": ["node", "role", "leader", "term", "members"],
                "properties": {
                    "node": {"type": "string"},
                    "role": {"enum": ["joining", "follower", "candidate", "leader", "left"]},
                    "leader": {"type": ["string", "null"]}, "term": {"type": "integer"},
                    "version": {"type": "integer"},
                    "clock": {"type": "object", "description": "this node's clock against "
                              "the cluster's, on which absolute etas and schedule ticks "
                              "are judged", "properties": {
                                  "offset": {"type": "number", "description": "the "
                                             "cluster's clock minus ours, seconds"},
                                  "placed": {"type": "boolean", "description": "a majority "
                                             "of members has an estimate that agrees"},
                                  "skewed": {"type": "boolean", "description": "beyond "
                                             "max_clock_skew: this node does not lead"}}},
                    "members": {"type": "array", "items": {
                        "type": "object", "required": ["id", "http", "cluster", "leader"],
                        "properties": {
                            "id": {"type": "string"}, "http": {"type": "string"},
                            "cluster": {"type": ["string", "null"], "description": "null: "
                                        "a node without a cluster key binds no cluster port"},
                            "zone": {"type": ["string", "null"]},
                            "key": {"type": "string", "description": "the member's own "
                                    "CurveZMQ public key (Z85), the one it joined with; "
                                    "empty without keys"},
                            "leader": {"type": "boolean"},
                            "last_heard": {"type": ["number", "null"]},
                            "clock_offset": {"type": ["number", "null"]},
                            "clock_error": {"type": ["number", "null"]},
                            "clock_skewed": {"type": ["boolean", "null"]}}}},
                    "down": {"type": "array", "description": "members dropped from the "
                             "roster since this node started (the latest 32), until they "
                             "rejoin", "items": {
                                 "type": "object", "required": ["id", "http", "down_since"],
                                 "properties": {
                                     "id": {"type": "string"}, "http": {"type": "string"},
                                     "cluster": {"type": "string"},
                                     "zone": {"type": ["string", "null"]},
                                     "down_since": {"type": "number",
                                                    "description": "unix time it was dropped"},
                                     "last_heard_at": {"type": ["number", "null"]},
                                     "last_heard": {"type": ["number", "null"],
                                                    "description": "seconds ago; null: "
                                                    "this node never heard from it"}}}}}},
    "Rates": {"type": "object", "required": ["end", "step", "seconds", "nodes", *_KINDS],
              "description": "tasks per step seconds, oldest first; the last point ends "
              "at end (unix second)", "properties": {
                  "end": {"type": "integer"}, "step": {"type": "integer", "minimum": 1},
                  "seconds": {"type": "integer"},
                  "nodes": {"type": "array", "items": {"type": "string"},
                            "description": "the nodes whose counts are summed"},
                  **{k: {"type": "array", "items": {"type": "integer", "minimum": 0}}
                     for k in _KINDS}}},
    "Health": {"type": "object", "required": ["status", "node"],
               "properties": {"status": {"const": "ok"}, "node": {"type": "string"}}},
    "Ready": {"type": "object", "required": ["status", "reason"], "properties": {
        "status": {"enum": ["ready", "not ready"]}, "reason": {"type": "string"}}},
    "OpenAPI": {"type": "object", "required": ["openapi", "info", "paths"]},
    # what targets verify deliveries with (miyamoto.delivery.identity)
    "OpenIDConfiguration": {"type": "object", "required": ["issuer", "jwks_uri"], "properties": {
        "issuer": {"type": "string"}, "jwks_uri": {"type": "string"},
        "id_token_signing_alg_values_supported": {"type": "array", "items": {
            "enum": ["RS256", "ES256"]}}}},
    "JWKS": {"type": "object", "required": ["keys"], "properties": {"keys": {
        "type": "array", "items": {"type": "object", "required": ["kty", "kid", "alg", "use"],
                                   "properties": {"kty": {"enum": ["RSA", "EC"]},
                                                  "kid": {"type": "string"},
                                                  "alg": {"enum": ["RS256", "ES256"]},
                                                  "use": {"const": "sig"}}}}}},
    "WebhookPublicKey": {"type": "object", "required": ["scheme", "public_key", "pem"],
                         "properties": {"scheme": {"const": "v1a"},
                                        "algorithm": {"const": "ed25519"},
                                        "public_key": {"type": "string", "pattern": "^whpk_"},
                                        "pem": {"type": "string"}}},
    "Targets": {
        "type": "object", "required": ["targets"], "properties": {"targets": {
            "type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["origin", "state", "failures", "inflight", "retry_at"],
                "properties": {
                    "origin": {"type": "string", "description": "scheme://host:port"},
                    "state": {"enum": ["closed", "open", "half_open"]},
                    "failures": {"type": "integer", "minimum": 0,
                                 "description": "consecutive failed attempts"},
                    "inflight": {"type": "integer", "minimum": 0},
                    "retry_at": {"type": ["number", "null"],
                                 "description": "open: when the probe may go (unix time)"}}}}}},
    **_DEFINITION_SCHEMAS,
    "TopicTaskRequest": _topic_task(_TASK_FIELDS),
}


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(schema)}}


def _answer(description: str, schema: str = "Error") -> dict[str, Any]:
    return {"description": description, "content": _json(schema)}


_AUTH = {"401": _answer("no valid API token (when api_tokens is set)"),
         "403": _answer("the token's scope does not allow this route")}


def _op(summary: str, ok: str, *, body: dict | None = None, params: list | None = None,
        extra: dict | None = None, scope: str = "read") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "description": f"Needs the {scope} scope "
                          "(or admin) when api_tokens is set.",
                          "responses": {"200": _answer("OK", ok), "400": _answer("bad request"),
                                        "404": _answer("no such route or task"),
                                        **_AUTH, **(extra or {})}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if params:
        op["parameters"] = params
    return op


def _path(name: str, pattern: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True,
            "schema": {"type": "string", "pattern": pattern}}


_QUEUE = _path("queue", _QUEUE_PATTERN)
_ID = _path("id", _ID_PATTERN)
_IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False,
                "description": "the task's name when the body gives none",
                "schema": {"type": "string", "minLength": 1, "maxLength": _D.max_name}}
_TRACEPARENT = {"name": "traceparent", "in": "header", "required": False,
                "description": "W3C Trace Context of the producer: kept with the task (the "
                "traceparent field wins) and sent to the target on every attempt",
                "schema": {"type": "string", "pattern": _TRACEPARENT_PATTERN}}
_RESEND_FILTER = [
    {"name": "state", "in": "query", "description": "the ended state to resend",
     "schema": {"enum": [s for s in _STATES if s not in ("scheduled", "running")],
                "default": "failed"}},
    {"name": "target", "in": "query", "description": "only tasks whose url starts with this",
     "schema": {"type": "string", "minLength": 1, "maxLength": _D.max_url}},
    {"name": "since", "in": "query", "description": "only tasks that ended at or after "
     "this unix time", "schema": {"type": "number"}},
    {"name": "until", "in": "query", "description": "only tasks that ended before this "
     "unix time", "schema": {"type": "number"}}]
_TASK_BODY = {"application/json": {"schema": _ref("EnqueueRequest")},
              "application/x-www-form-urlencoded": {"schema": _ref("TaskForm")}}
_ENQ_EXTRA = {"409": _answer("a task of this name exists", "Duplicate"),
              "413": _answer("the body or a field is too large"),
              "415": _answer("neither JSON nor a form; names the accepted types"),
              "503": _answer("stopping, or too few replicas answered")}
_CONFLICT = {"409": _answer("the task's state does not allow it")}


def _enqueue(summary: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    op = _op(summary, "Enqueued", body=_TASK_BODY, params=params, extra=_ENQ_EXTRA,
             scope="enqueue")
    for status, schema in (("200", "Enqueued"), ("409", "Duplicate"), ("503", "Error")):
        # with topic instead of url: one task per URL (miyamoto.http.definitions.enqueue_topic)
        op["responses"][status]["content"]["application/json"]["schema"] = {
            "anyOf": [_ref(schema), _ref("FanOut")]}
    return op


def _find_tasks() -> dict[str, Any]:
    """GET /tasks: with name, the task holding it; without, a page of tasks."""
    op = _op("With name: the task holding it (while the dedup window keeps it); without: "
             "a page of tasks in a state, filtered by queue, target and name prefix",
             "Task", params=[{"name": "name", "in": "query", "schema": {
                 "type": "string", "minLength": 1, "maxLength": _D.max_name}},
                 {"name": "queue", "in": "query", "description": "with name: its queue "
                  "(default: default); without: only this queue's tasks", "schema": {
                      "type": "string", "pattern": _QUEUE_PATTERN}}, *_PAGE_PARAMS])
    op["responses"]["200"]["content"]["application/json"]["schema"] = {
        "anyOf": [_ref("Task"), _ref("TaskPage")]}
    return op


def _control(summary: str) -> dict[str, Any]:
    return {"post": _op(summary, "Control", params=[_QUEUE], scope="admin")}


def _definition_paths() -> dict[str, Any]:
    """The routes of schedules and topics (miyamoto.http.definitions)."""
    s, t = _path("sname", _NAME_PATTERN), _path("tname", _NAME_PATTERN)
    write = {"503": _answer("no leader holds the definitions yet, or a majority did not "
                            "confirm in time"),
             "409": _answer("the cluster holds as many definitions as it may")}
    return {
        "/schedules": {
            "get": _op("Every schedule, with its next fire times", "Schedules"),
            "post": _op("Create or replace a schedule, cluster-wide", "Schedule",
                        body=_json("ScheduleRequest"), scope="admin", extra={
                            **write, "413": _answer("the schedule is larger than one "
                                                    "definition may be (512 KiB as JSON)")})},
        "/schedules/{sname}": {
            "get": _op("One schedule, with its next fire times and last task ids", "Schedule",
                       params=[s]),
            "delete": _op("Delete a schedule", "Deleted", params=[s], extra=write,
                          scope="admin")},
        "/schedules/{sname}/pause": {"post": _op("Pause a schedule", "Schedule", params=[s],
                                                 extra=write, scope="admin")},
        "/schedules/{sname}/resume": {"post": _op("Resume a schedule", "Schedule", params=[s],
                                                  extra=write, scope="admin")},
        "/schedules/{sname}/run": {"post": _op(
            "Enqueue the schedule's task once, now (paused or not; the next tick stays as "
            "planned). With an Idempotency-Key a repeat is 409", "ScheduleRun",
            params=[s, _IDEMPOTENCY], scope="admin", extra={
                "409": _answer("a run with this Idempotency-Key exists", "Duplicate"),
                "503": _answer("the task could not be stored", "Error")})},
        "/topics": {"get": _op("Every topic", "Topics")},
        "/topics/{tname}": {
            "get": _op("One topic", "Topic", params=[t]),
            "put": _op("Create or replace a topic (each URL checked like a task's url)",
                       "Topic", params=[t], body=_json("TopicRequest"), extra=write,
                       scope="admin"),
            "delete": _op("Delete a topic", "Deleted", params=[t], extra=write,
                          scope="admin")},
    }


def _queue_paths() -> dict[str, Any]:
    """GET, PUT and DELETE of one queue (PUT and DELETE: ``miyamoto.definitions.queues``)."""
    write = {"503": _answer("no leader holds the definitions yet, or a majority did not "
                            "confirm in time"),
             "409": _answer("the cluster holds as many definitions as it may")}
    return {
        "get": _op("One queue, each setting with its source", "Queue", params=[_QUEUE]),
        "put": _op("Set a queue's settings on every node (the fields given; null: back to "
                   "the config's); makes the queue", "Queue", params=[_QUEUE],
                   body=_json("QueueSettings"), extra=write, scope="admin"),
        "delete": _op("Drop the settings the API made for a queue (back to the config's; "
                      "its tasks stay)", "Queue", params=[_QUEUE], extra=write,
                      scope="admin")}


_OPEN = {"security": [], "description": "Open: needs no token."}
_TOKEN = {"name": "token", "in": "query", "required": True,
          "description": "the completion token of the attempt (from X-Task-Complete-Url)",
          "schema": {"type": "string", "maxLength": 200}}
_COMPLETION = {"403": _answer("the token is missing, forged, for another task or expired"),
               "409": _answer("the attempt is over: reported, its lease ran out, or the "
                              "task ended"),
               "503": _answer("the node holding the attempt did not answer (down or cut "
                              "off): report again in a moment")}

_LEASE_ANSWERS = {"403": _answer("the token is missing, forged, for another task or expired"),
                  "409": _answer("the lease is over: answered, run out, or the task ended")}
_LEASE_OPEN = "Open: the lease's token (one attempt's, signed) is the credential."

_PATHS: dict[str, Any] = {
    "/queue": {"post": _enqueue("Enqueue a task", [_IDEMPOTENCY, _TRACEPARENT])},
    "/queue/{queue}": {"post": _enqueue("Enqueue a task in a queue",
                                        [_QUEUE, _IDEMPOTENCY, _TRACEPARENT])},
    "/queue/{queue}/batch": {"post": _op(
        "Enqueue a JSON list of tasks, all valid or none stored", "BatchResult",
        params=[_QUEUE, _TRACEPARENT], extra=_ENQ_EXTRA, scope="enqueue",
        body={"application/json": {"schema": _ref("Batch")}})},
    "/tasks": {"get": _find_tasks()},
    "/tasks/{id}": {"get": _op("One task, with its copies", "Task", params=[_ID],
                               scope="read or enqueue"),
                    "delete": _op("Cancel a task on every replica (delete a failed one)",
                                  "Task", params=[_ID],
                                  extra=_CONFLICT, scope="admin")},
    "/tasks/{id}/retry": {"post": _op("Run a task again", "Task", params=[_ID],
                                      extra={**_CONFLICT, "503": _answer("stopping")},
                                      scope="admin")},
    "/tasks/{id}/complete": {"post": {**_op(
        "A long task's worker reports its outcome at the X-Task-Complete-Url its attempt "
        "carried (the task ends, or is retried on failed)", "Task", params=[_ID, _TOKEN],
        body=_json("Report"), extra=_COMPLETION), **_OPEN,
        "description": "Open: the URL's token (one attempt's, signed) is the credential."}},
    "/tasks/{id}/heartbeat": {"post": {**_op(
        "A long task's worker extends its lease from now (its own lease unless given); "
        "the siblings keep waiting", "Task", params=[_ID, _TOKEN],
        extra=_COMPLETION), **_OPEN, "requestBody": {
            "required": False, "content": _json("Heartbeat")},
        "description": "Open: the URL's token (one attempt's, signed) is the credential."}},
    "/tasks/{id}/ack": {"post": {**_op(
        "A pull queue's worker: the leased task succeeded", "Task", params=[_ID],
        body=_json("Ack"), extra=_LEASE_ANSWERS), **_OPEN, "description": _LEASE_OPEN}},
    "/tasks/{id}/nack": {"post": {**_op(
        "A pull queue's worker: the leased task failed this attempt; it is retried after "
        "delay (else its backoff) while attempts last", "Task", params=[_ID],
        body=_json("Nack"), extra=_LEASE_ANSWERS), **_OPEN, "description": _LEASE_OPEN}},
    "/tasks/{id}/extend": {"post": {**_op(
        "A pull queue's worker: the lease runs lease_s more from now (the siblings keep "
        "waiting)", "Task", params=[_ID], body=_json("Extend"), extra=_LEASE_ANSWERS),
        **_OPEN, "description": _LEASE_OPEN}},
    "/queues/{queue}/lease": {"post": _op(
        "Lease up to max_tasks due tasks of a pull queue for lease_s each, waiting up to "
        "wait_s for the first (from this node's copies, then the other nodes')", "Leases",
        params=[_QUEUE], body=_json("LeaseRequest"), scope="enqueue", extra={
            "409": _answer("the queue is in mode push"),
            "503": _answer("stopping")})},
    "/tasks/{id}/resend": {"post": _op(
        "Resend an ended task (a succeeded one too): a new run under the same id (reruns "
        "+ 1, attempts from 0, no expiry), its history kept", "Task", params=[_ID],
        extra={**_CONFLICT, "503": _answer("stopping")}, scope="admin")},
    "/queues/{queue}/resend": {"post": _op(
        "Resend the queue's ended tasks in one state, to a target, ended in a time range, "
        "cluster-wide (each node looks through its last 10,000 of that state a call: more)",
        "FailedBulk", params=[_QUEUE, *_RESEND_FILTER], scope="admin")},
    "/queues": {"get": _op("Queues with config and counts, a page at a time by name",
                           "Queues", params=[
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                     "maximum": 1000, "default": 1000}},
        {"name": "cursor", "in": "query", "description": "next_cursor of the previous page",
         "schema": {"type": "string", "pattern": _QUEUE_PATTERN}}])},
    "/queues/{queue}": _queue_paths(),
    "/queues/{queue}/tasks": {"get": _op("Tasks of a queue by state", "TaskList", params=[
        _QUEUE,
        {"name": "state", "in": "query", "schema": {"enum": _STATES, "default": "scheduled"}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                     "maximum": 1000, "default": 100}}])},
    "/queues/{queue}/pause": _control("Pause a queue, cluster-wide"),
    "/queues/{queue}/resume": _control("Resume a queue, cluster-wide"),
    "/queues/{queue}/purge": _control("Cancel every scheduled task of a queue"),
    "/queues/{queue}/failed/retry": {"post": _op(
        "Run every failed task of a queue again, cluster-wide (up to 10,000 a call: more)",
        "FailedBulk", params=[_QUEUE], scope="admin")},
    "/queues/{queue}/failed/delete": {"post": _op(
        "Delete every failed task of a queue, cluster-wide (up to 10,000 a call: more)",
        "FailedBulk", params=[_QUEUE], scope="admin")},
    **_definition_paths(),
    "/cluster": {"get": _op("Roster, leader, term, members' health", "Cluster")},
    "/targets": {"get": _op("Target origins attempted recently by this node: circuit "
                            "breaker state, consecutive failures, deliveries in flight", "Targets")},
    "/rates": {"get": _op("Tasks enqueued, delivered and failed per second (or per few "
                          "seconds) over the last minutes or hour, from every node's ring of "
                          "per-second counts", "Rates", params=[
        {"name": "seconds", "in": "query", "schema": {"type": "integer", "minimum": 60,
                                                       "maximum": 3600, "default": 300}},
        {"name": "node", "in": "query", "description": "one member's counts (default: the "
         "cluster's sum)", "schema": {"type": "string", "pattern": _ID_PATTERN}}])},
    "/healthz": {"get": {**_op("Liveness", "Health"), **_OPEN}},
    "/readyz": {"get": {**_op("Readiness", "Ready", extra={"503": _answer("not ready",
                                                                          "Ready")}), **_OPEN}},
    "/metrics": {"get": {"summary": "Prometheus metrics", "description": "Needs read.",
                         "responses": {"200": {"description": "Prometheus text exposition",
                                               "content": {"text/plain": {
                                                   "schema": {"type": "string"}}}}, **_AUTH}}},
    "/openapi.json": {"get": {**_op("This description", "OpenAPI"), **_OPEN}},
    "/.well-known/openid-configuration": {"get": {**_op(
        "The OIDC issuer's metadata (404 without oidc_signing_key)", "OpenIDConfiguration"),
        **_OPEN}},
    "/.well-known/jwks.json": {"get": {**_op(
        "The public keys of the OIDC tokens sent to targets: the current one and the retired "
        "ones still listed (404 without oidc_signing_key)", "JWKS"), **_OPEN}},
    "/.well-known/webhook-public-key": {"get": {**_op(
        "The Ed25519 public key of the v1a webhook signatures (404 without "
        "ed25519_signing_key)", "WebhookPublicKey"), **_OPEN}},
    "/": {"get": {"summary": "The dashboard page (its script reads the API with a token)",
                  **_OPEN, "responses": {"200": {"description": "HTML", "content": {
                      "text/html": {"schema": {"type": "string"}}}}}}},
    "/dashboard/{asset}": {"get": {
        "summary": "The dashboard's script and style", **_OPEN,
        "parameters": [{"name": "asset", "in": "path", "required": True,
                        "schema": {"enum": ["dashboard.html", "dashboard.js", "dashboard.css"]}}],
        "responses": {"200": {"description": "the file", "content": {
            "text/javascript": {"schema": {"type": "string"}},
            "text/css": {"schema": {"type": "string"}},
            "text/html": {"schema": {"type": "string"}}}},
            "404": _answer("not a dashboard file")}}},
}

# (path, method) -> (operationId, tag): the names a code generator gives its functions
# and the groups it files them in; tests/unit/http/test_openapi.py holds every operation
# to one, each id used once.
_TAGS = {"tasks": "enqueue, read, cancel and rerun tasks",
         "queues": "queues: counts, lists and control, cluster-wide",
         "schedules": "cron and interval schedules, cluster-wide",
         "topics": "named lists of URLs a task fans out to",
         "cluster": "the roster and this node's view of its targets",
         "operations": "health, readiness, metrics, this description",
         "dashboard": "the web console"}
_OPERATIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("/queue", "post"): ("enqueue", "tasks"),
    ("/queue/{queue}", "post"): ("enqueueInQueue", "tasks"),
    ("/queue/{queue}/batch", "post"): ("enqueueBatch", "tasks"),
    ("/tasks", "get"): ("findTasks", "tasks"),
    ("/tasks/{id}", "get"): ("getTask", "tasks"),
    ("/tasks/{id}", "delete"): ("cancelTask", "tasks"),
    ("/tasks/{id}/retry", "post"): ("retryTask", "tasks"),
    ("/tasks/{id}/resend", "post"): ("resendTask", "tasks"),
    ("/tasks/{id}/complete", "post"): ("completeTask", "tasks"),
    ("/tasks/{id}/heartbeat", "post"): ("heartbeatTask", "tasks"),
    ("/tasks/{id}/ack", "post"): ("ackTask", "tasks"),
    ("/tasks/{id}/nack", "post"): ("nackTask", "tasks"),
    ("/tasks/{id}/extend", "post"): ("extendTask", "tasks"),
    ("/queues/{queue}/lease", "post"): ("leaseTasks", "queues"),
    ("/queues/{queue}/resend", "post"): ("resendTasks", "queues"),
    ("/queues", "get"): ("listQueues", "queues"),
    ("/queues/{queue}", "get"): ("getQueue", "queues"),
    ("/queues/{queue}", "put"): ("putQueue", "queues"),
    ("/queues/{queue}", "delete"): ("resetQueue", "queues"),
    ("/queues/{queue}/tasks", "get"): ("listQueueTasks", "queues"),
    ("/queues/{queue}/pause", "post"): ("pauseQueue", "queues"),
    ("/queues/{queue}/resume", "post"): ("resumeQueue", "queues"),
    ("/queues/{queue}/purge", "post"): ("purgeQueue", "queues"),
    ("/queues/{queue}/failed/retry", "post"): ("retryFailedTasks", "queues"),
    ("/queues/{queue}/failed/delete", "post"): ("deleteFailedTasks", "queues"),
    ("/schedules", "get"): ("listSchedules", "schedules"),
    ("/schedules", "post"): ("putSchedule", "schedules"),
    ("/schedules/{sname}", "get"): ("getSchedule", "schedules"),
    ("/schedules/{sname}", "delete"): ("deleteSchedule", "schedules"),
    ("/schedules/{sname}/pause", "post"): ("pauseSchedule", "schedules"),
    ("/schedules/{sname}/resume", "post"): ("resumeSchedule", "schedules"),
    ("/schedules/{sname}/run", "post"): ("runSchedule", "schedules"),
    ("/topics", "get"): ("listTopics", "topics"),
    ("/topics/{tname}", "get"): ("getTopic", "topics"),
    ("/topics/{tname}", "put"): ("putTopic", "topics"),
    ("/topics/{tname}", "delete"): ("deleteTopic", "topics"),
    ("/cluster", "get"): ("getCluster", "cluster"),
    ("/targets", "get"): ("listTargets", "cluster"),
    ("/rates", "get"): ("getRates", "operations"),
    ("/healthz", "get"): ("getHealth", "operations"),
    ("/readyz", "get"): ("getReadiness", "operations"),
    ("/metrics", "get"): ("getMetrics", "operations"),
    ("/openapi.json", "get"): ("getOpenApi", "operations"),
    ("/.well-known/openid-configuration", "get"): ("getOpenIdConfiguration", "operations"),
    ("/.well-known/jwks.json", "get"): ("getJwks", "operations"),
    ("/.well-known/webhook-public-key", "get"): ("getWebhookPublicKey", "operations"),
    ("/", "get"): ("getDashboard", "dashboard"),
    ("/dashboard/{asset}", "get"): ("getDashboardAsset", "dashboard"),
}


def _named(paths: dict[str, Any]) -> dict[str, Any]:
    """``paths`` with each operation's operationId and tag (those _OPERATIONS gives)."""
    out: dict[str, Any] = {}
    for path, ops in paths.items():
        out[path] = {}
        for method, op in ops.items():
            name = _OPERATIONS.get((path, method))
            out[path][method] = op if name is None else \
                {"operationId": name[0], "tags": [name[1]], **op}
    return out


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Miyamoto", "version": __version__,
             "description": "A clustered webhook task queue. Every error is a JSON body "
                            "naming the problem; a 405 carries Allow."},
    "components": {
        "schemas": _SCHEMAS,
        # api_tokens = SCOPE:TOKEN,...: admin, enqueue, read (miyamoto.http.auth); open when unset
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                       "description": "scopes admin, enqueue, read"}}},
    "security": [{"bearer": []}, {}],
    "tags": [{"name": k, "description": v} for k, v in _TAGS.items()],
    "paths": _named(_PATHS),
}
