"""Cloud Tasks' v2 JSON, both ways: its Task and Queue resources, times, durations, and
Google's error shape. Pure: no node, no request; the routes are in ``http/cloudtasks.py``.

A task comes in as protobuf's JSON mapping of ``google.cloud.tasks.v2.Task``, as the
``google-cloud-tasks`` SDK's REST transport writes it: camelCase names, enums as integers
(it asks for ``enum-encoding=int``; their names are taken too), the body base64,
``scheduleTime`` a RFC 3339 timestamp, ``dispatchDeadline`` a duration such as "30s".
It becomes the fields of a native enqueue (``tasks/validate.build_task`` checks them), so
a Cloud Tasks task obeys every rule and limit of ours; a rejection names the Cloud Tasks
field (``task.httpRequest.url``), not ours.

A queue's ``rateLimits`` and ``retryConfig`` map onto our queue settings (``QueueConfig``,
written through ``definitions.queues`` as ``PUT /queues/<name>`` writes them):
maxDispatchesPerSecond is ``rate`` (the cluster's), maxConcurrentDispatches is
``max_concurrent`` (ours is per node), maxAttempts counts the first attempt as ours does.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime, timezone
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.task import METHODS

# google.cloud.tasks.v2.HttpMethod by number (POST=1 ... OPTIONS=7; OPTIONS and HEAD
# are not methods our deliveries send)
HTTP_METHODS = {1: "POST", 2: "GET", 3: "HEAD", 4: "PUT", 5: "DELETE", 6: "PATCH", 7: "OPTIONS"}
TASK_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,500}")  # Cloud Tasks' task ids
MIN_DEADLINE, MAX_DEADLINE = 15.0, 1800.0  # Cloud Tasks' dispatchDeadline range for HTTP targets
_DURATION_RE = re.compile(r"(-?\d{1,12}(?:\.\d{1,9})?)s")
_TASK_KEYS = frozenset({"name", "httpRequest", "appEngineHttpRequest", "scheduleTime",
                        "dispatchDeadline", "createTime", "dispatchCount", "responseCount",
                        "firstAttempt", "lastAttempt", "view"})
_REQUEST_KEYS = frozenset({"url", "httpMethod", "headers", "body", "oauthToken", "oidcToken"})
# Google's canonical codes by HTTP status (google.rpc.Code's HTTP mapping)
STATUS_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                404: "NOT_FOUND", 405: "UNIMPLEMENTED", 409: "ALREADY_EXISTS",
                411: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT",
                429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                503: "UNAVAILABLE"}
# our queue settings by their Cloud Tasks path (a patch's updateMask names these)
QUEUE_PATHS = {"rateLimits.maxDispatchesPerSecond": "rate",
               "rateLimits.maxConcurrentDispatches": "max_concurrent",
               "retryConfig.maxAttempts": "max_attempts",
               "retryConfig.maxRetryDuration": "max_retry_duration",
               "retryConfig.minBackoff": "min_backoff", "retryConfig.maxBackoff": "max_backoff",
               "retryConfig.maxDoublings": "max_doublings"}
_DURATIONS = frozenset({"max_retry_duration", "min_backoff", "max_backoff"})
_OUTPUT_ONLY = frozenset({"rateLimits.maxBurstSize", "state", "purgeTime", "name",
                          "stackdriverLoggingConfig"})  # taken and ignored, as Google does


def error(status: int, message: str, field: str | None = None,
          code: str | None = None) -> dict[str, Any]:
    """Google's JSON error: {"error": {"code", "message", "status"}}, and for a bad
    field a google.rpc.BadRequest detail naming it, as Google's APIs answer."""
    out: dict[str, Any] = {"code": status, "message": message,
                           "status": code or STATUS_CODES.get(status, "UNKNOWN")}
    if field is not None:
        out["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                           "fieldViolations": [{"field": field, "description": message}]}]
    return {"error": out}


# ---------------------------------------------------------------- times and durations

def timestamp(t: float) -> str:
    """A unix time as protobuf's JSON Timestamp (RFC 3339, UTC, microseconds)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(field: str, value: Any) -> float:
    if not isinstance(value, str):
        raise ValidationError(field, "must be a RFC 3339 timestamp such as "
                                     "2026-12-02T06:00:00Z")
    text = value.strip()
    m = re.fullmatch(r"(.*?\.\d{6})\d{1,3}(Z|[+-]\d\d:\d\d)?", text)  # nanoseconds: cut to us
    if m:
        text = m.group(1) + (m.group(2) or "")
    try:
        when = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise ValidationError(field, f"is not a RFC 3339 timestamp ({value!r}): give one "
                                     "such as 2026-12-02T06:00:00Z") from None
    if when.tzinfo is None:
        raise ValidationError(field, "has no time zone: end it with Z or an offset")
    return when.timestamp()


def duration(seconds: float) -> str:
    """Seconds as protobuf's JSON Duration ("30s", "0.05s")."""
    return f"{seconds:.0f}s" if float(seconds).is_integer() else \
        f"{seconds:.9f}".rstrip("0") + "s"


def parse_duration(field: str, value: Any) -> float:
    m = _DURATION_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValidationError(field, "must be a duration in seconds such as \"30s\" or "
                                     "\"0.5s\"")
    return float(m.group(1))


# ---------------------------------------------------------------- tasks

def task_fields(task: Any, queue: str, now: float) -> tuple[dict[str, Any], str | None]:
    """A Cloud Tasks Task (JSON) as the fields of a native enqueue, and its short
    name (None: the caller gave none, so our id becomes it)."""
    if not isinstance(task, dict):
        raise ValidationError("task", "must be a JSON object (a Task)")
    unknown = set(task) - _TASK_KEYS
    if unknown:
        raise ValidationError(f"task.{sorted(unknown)[0]}", "is not a field of a Task")
    if "appEngineHttpRequest" in task:
        raise ValidationError("task.appEngineHttpRequest", "is not served: App Engine "
                              "targets exist only on Google; give an httpRequest")
    req = task.get("httpRequest")
    if not isinstance(req, dict):
        raise ValidationError("task.httpRequest", "is required: an object with the url")
    fields = _request_fields(req)
    fields["queue"] = queue
    short = short_name(task.get("name"), queue) if task.get("name") else None
    if short is not None:
        fields["name"] = short
    if task.get("scheduleTime") is not None:  # a time past is now, as Cloud Tasks has it
        fields["eta"] = max(now, parse_timestamp("task.scheduleTime", task["scheduleTime"]))
    if task.get("dispatchDeadline") is not None:
        deadline = parse_duration("task.dispatchDeadline", task["dispatchDeadline"])
        if not MIN_DEADLINE <= deadline <= MAX_DEADLINE:
            raise ValidationError("task.dispatchDeadline", f"must be from {MIN_DEADLINE:g}s "
                                  f"to {MAX_DEADLINE:g}s (Cloud Tasks' range)")
        fields["timeout"] = deadline
    return fields, short


def _request_fields(req: dict[str, Any]) -> dict[str, Any]:
    unknown = set(req) - _REQUEST_KEYS
    if unknown:
        raise ValidationError(f"task.httpRequest.{sorted(unknown)[0]}",
                              "is not a field of an HttpRequest")
    if req.get("oauthToken"):
        raise ValidationError("task.httpRequest.oauthToken", "is not served: Miyamoto "
                              "mints no Google access tokens; give an oidcToken, an "
                              "Authorization header, or sign deliveries with signing_secret")
    fields: dict[str, Any] = {"url": req.get("url"), "method": http_method(req.get("httpMethod"))}
    if req.get("oidcToken") is not None:
        fields["oidc_audience"] = oidc_audience(req["oidcToken"], req.get("url"))
    headers = req.get("headers") or {}
    if not isinstance(headers, dict):
        raise ValidationError("task.httpRequest.headers", "must be an object of names to "
                                                          "values")
    headers = dict(headers)
    ctype = next((headers.pop(k) for k in list(headers) if k.lower() == "content-type"), None)
    if headers:
        fields["headers"] = headers
    if req.get("body"):
        fields["body"] = _body(req["body"])
        fields["content_type"] = ctype or "application/octet-stream"  # Cloud Tasks' default
    return fields


def oidc_audience(token: Any, url: Any) -> Any:
    """An OidcToken's audience, the task's URL when it names none (as Cloud Tasks has
    it). Its serviceAccountEmail is taken and not used: the token is signed by this
    node's ``oidc_signing_key`` under its ``oidc_issuer``, whose JWKS every node serves."""
    if not isinstance(token, dict):
        raise ValidationError("task.httpRequest.oidcToken", "must be an object "
                              "(serviceAccountEmail, audience)")
    unknown = set(token) - {"serviceAccountEmail", "audience"}
    if unknown:
        raise ValidationError(f"task.httpRequest.oidcToken.{sorted(unknown)[0]}",
                              "is not a field of an OidcToken")
    return token.get("audience") or url


def http_method(value: Any) -> str:
    """An HttpMethod as the SDK sends it (a number) or by its name; unset is POST."""
    if value is None or value == 0 or value == "HTTP_METHOD_UNSPECIFIED":
        return "POST"
    name = HTTP_METHODS.get(value) if isinstance(value, int) else value
    if not isinstance(name, str) or name.upper() not in METHODS:
        raise ValidationError("task.httpRequest.httpMethod", "must be one of "
                              f"{', '.join(METHODS)}")
    return name.upper()


def _body(value: Any) -> str:
    """The base64 body as the text we store: our tasks carry UTF-8 bodies."""
    if not isinstance(value, str):
        raise ValidationError("task.httpRequest.body", "must be base64 text")
    try:
        raw = base64.b64decode(value.replace("-", "+").replace("_", "/")
                               + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("task.httpRequest.body", "is not valid base64") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("task.httpRequest.body", "is not UTF-8 text once decoded: "
                              "Miyamoto carries text bodies (JSON, forms, text); send "
                              "binary data base64-encoded inside one") from None


def short_name(name: Any, queue: str) -> str:
    """T of projects/P/locations/L/queues/Q/tasks/T (Q must be the queue's)."""
    if not isinstance(name, str):
        raise ValidationError("task.name", "must be a string")
    parts = name.split("/")
    if len(parts) != 8 or parts[0::2] != ["projects", "locations", "queues", "tasks"]:
        raise ValidationError("task.name", "must be projects/P/locations/L/queues/Q/tasks/T")
    if parts[5] != queue:
        raise ValidationError("task.name", f"names queue {parts[5]!r}, not the parent's "
                                           f"{queue!r}")
    if not TASK_ID_RE.fullmatch(parts[7]):
        raise ValidationError("task.name", "must end in a task id of 1-500 characters of "
                                           "A-Z a-z 0-9 _ -")
    return parts[7]


# what our field names are as Cloud Tasks fields, for a rejection's message
_AS_CLOUD = {"url": "task.httpRequest.url", "method": "task.httpRequest.httpMethod",
             "body": "task.httpRequest.body", "content_type": "task.httpRequest.headers",
             "headers": "task.httpRequest.headers", "eta": "task.scheduleTime",
             "timeout": "task.dispatchDeadline", "name": "task.name", "queue": "parent",
             "oidc_audience": "task.httpRequest.oidcToken.audience"}


def cloud_field(field: str) -> str:
    """Our field (``headers.X-Foo``) as the Cloud Tasks path a rejection names."""
    head, dot, rest = field.partition(".")
    return _AS_CLOUD.get(head, field) + (dot + rest if head == "headers" else "")


def task_view(parent: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Our task record (``Task.summary``) as a Cloud Tasks Task, BASIC view."""
    name = summary.get("name")
    short = name if isinstance(name, str) and TASK_ID_RE.fullmatch(name) else summary["id"]
    out: dict[str, Any] = {
        "name": f"{parent}/tasks/{short}",
        "httpRequest": {"url": summary["url"], "httpMethod": summary["method"]},
        "scheduleTime": timestamp(summary.get("next_attempt") or summary["eta"]),
        "createTime": timestamp(summary["created"]),
        "dispatchDeadline": duration(summary.get("timeout") or 0) if summary.get("timeout")
        else None,
        "dispatchCount": summary.get("attempts", 0),
        "responseCount": summary.get("executions", 0), "view": "BASIC"}
    history = summary.get("history") or []  # newest first
    if history:
        out["firstAttempt"] = _attempt(history[-1])
        out["lastAttempt"] = _attempt(history[0])
    return {k: v for k, v in out.items() if v is not None}


def _attempt(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One attempt of our history as a Cloud Tasks Attempt; responseStatus is a
    google.rpc.Status (0 OK for a 2xx, else its code by the HTTP mapping)."""
    start = float(entry.get("start") or 0.0)
    out: dict[str, Any] = {"dispatchTime": timestamp(start)}
    status = entry.get("status")
    if status is not None:
        out["responseTime"] = timestamp(start + float(entry.get("duration") or 0.0))
        code = 0 if 200 <= status < 300 else _RPC_CODES.get(STATUS_CODES.get(status, ""), 2)
        out["responseStatus"] = {"code": code, "message": f"HTTP status {status}"}
    elif entry.get("error"):
        out["responseStatus"] = {"code": 14, "message": str(entry["error"])}
    return out


_RPC_CODES = {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "ALREADY_EXISTS": 6,
              "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "UNIMPLEMENTED": 12,
              "INTERNAL": 13, "UNAVAILABLE": 14, "UNAUTHENTICATED": 16}


# ---------------------------------------------------------------- queues

def queue_settings(queue: Any, mask: str | None = None) -> dict[str, Any]:
    """A Cloud Tasks Queue (JSON) as our queue settings: {setting: value} for each
    rate or retry field it gives (only those ``mask`` names, when given)."""
    if not isinstance(queue, dict):
        raise ValidationError("queue", "must be a JSON object (a Queue)")
    given: dict[str, Any] = {}
    for group in ("rateLimits", "retryConfig"):
        sub = queue.get(group) or {}
        if not isinstance(sub, dict):
            raise ValidationError(f"queue.{group}", "must be an object")
        given.update({f"{group}.{k}": v for k, v in sub.items()})
    for key in set(queue) - {"rateLimits", "retryConfig"}:
        if key not in _OUTPUT_ONLY and key != "httpTarget":
            raise ValidationError(f"queue.{key}", "is not a field of a Queue")
    if queue.get("httpTarget"):
        raise ValidationError("queue.httpTarget", "is not served: give each task its "
                                                  "httpRequest")
    paths = [p.strip() for p in mask.split(",") if p.strip()] if mask else list(given)
    out: dict[str, Any] = {}
    for path in paths:
        if path in _OUTPUT_ONLY or path in ("rateLimits", "retryConfig"):
            continue
        if path not in QUEUE_PATHS:
            raise ValidationError(f"queue.{path}", "is not a setting Miyamoto serves "
                                  f"(those are {', '.join(sorted(QUEUE_PATHS))})")
        if path in given:
            out[QUEUE_PATHS[path]] = _setting(path, given[path])
    return out


def _setting(path: str, value: Any) -> float | int:
    ours = QUEUE_PATHS[path]
    if ours in _DURATIONS:
        v = parse_duration(f"queue.{path}", value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        v = value
    else:
        raise ValidationError(f"queue.{path}", "must be a number")
    if ours == "max_attempts" and v == -1:
        raise ValidationError(f"queue.{path}", "of -1 (unlimited) is not served: give a "
                                               "count of 1 or more")
    if v < (1 if ours == "max_attempts" else 0):
        raise ValidationError(f"queue.{path}", "must not be negative" if ours != "max_attempts"
                              else "must be 1 or more")
    return int(v) if ours in ("max_concurrent", "max_attempts", "max_doublings") else float(v)


def queue_view(parent: str, view: Mapping[str, Any]) -> dict[str, Any]:
    """Our queue view (GET /queues/<name>) as a Cloud Tasks Queue."""
    c = view["config"]
    return {
        "name": f"{parent}/queues/{view['name']}",
        "rateLimits": {"maxDispatchesPerSecond": c["rate"], "maxBurstSize": c["burst"],
                       "maxConcurrentDispatches": c["max_concurrent"] or view.get("limit", 0)},
        "retryConfig": {"maxAttempts": c["max_attempts"],
                        "maxRetryDuration": duration(c["max_retry_duration"]),
                        "minBackoff": duration(c["min_backoff"]),
                        "maxBackoff": duration(c["max_backoff"]),
                        "maxDoublings": c["max_doublings"]},
        "state": "PAUSED" if view.get("paused") else "RUNNING"}

