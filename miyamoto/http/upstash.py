"""QStash's v2 request headers as our task fields, and our views as QStash's JSON.

Pure: no I/O, no clock read (``now`` is passed in). ``fields`` turns a publish (its
destination, its ``Upstash-*`` headers, its body) into the JSON-shaped enqueue fields
``tasks.validate.build_task`` checks, so a QStash message is an ordinary task (one
engine, two faces); ``renamed`` turns a ``ValidationError`` about a native field back
into one that names the header the client sent. The ``*_view`` functions answer in the
shapes the ``qstash`` SDK parses (``messageId``, ``createdAt`` in milliseconds, ...).

The mapping, and why
    ``Upstash-Retries: n`` is ``max_attempts = n + 1`` (QStash counts retries after the
    first attempt); absent, QStash's default of 3 retries, not the queue's limit, since
    a QStash client expects QStash's settings. ``Upstash-Delay`` (``10s``, ``1h30m``)
    is ``countdown``, ``Upstash-Not-Before`` (unix seconds) is ``eta`` and wins, as in
    QStash. ``Upstash-Deduplication-Id`` is the task's ``name``; content-based
    de-duplication is ``dedupe: "content"``. ``Upstash-Forward-X: v`` is the header
    ``X: v``. ``Upstash-Flow-Control-Key`` / ``-Value`` (``parallelism=2, rate=10,
    period=1m``) are ``flow_key``, ``flow_parallelism`` and ``flow_rate`` (rate /
    period). What we cannot honour (``Upstash-Retry-Delay`` expressions, callback
    headers) is refused naming the header, never dropped in silence; what only shapes
    QStash's own logs (``Upstash-Label``, ``Upstash-Redact-Fields``) is ignored.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError

DEFAULT_RETRIES = 3  # QStash's when Upstash-Retries is absent
MAX_RETRIES = 100
FORWARD = "upstash-forward-"
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_REFUSED = {
    "upstash-retry-delay": "is not supported: retries back off as the queue's backoff "
                           "settings say (min_backoff, max_backoff)",
    "upstash-callback-": "is not supported: a callback gets the outcome without extra headers",
    "upstash-failure-callback-": "is not supported: a failure callback gets the outcome "
                                 "without extra headers",
}
# the native field a build_task error names -> the header or part of a publish that set it
_SOURCES = {"url": "destination", "topic": "destination", "method": "Upstash-Method",
            "body": "body", "content_type": "Content-Type", "countdown": "Upstash-Delay",
            "eta": "Upstash-Not-Before", "max_attempts": "Upstash-Retries",
            "timeout": "Upstash-Timeout", "callback": "Upstash-Callback",
            "failure_callback": "Upstash-Failure-Callback",
            "name": "Upstash-Deduplication-Id", "dedupe": "Upstash-Content-Based-Deduplication",
            "flow_key": "Upstash-Flow-Control-Key", "flow_rate": "Upstash-Flow-Control-Value",
            "flow_parallelism": "Upstash-Flow-Control-Value", "queue": "queue"}


def environ_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """A WSGI request's headers by lower-case name (``Upstash-Forward-X-Id`` is
    ``upstash-forward-x-id``); Content-Type as ``content-type``."""
    out = {k[5:].lower().replace("_", "-"): v for k, v in environ.items()
           if k.startswith("HTTP_") and isinstance(v, str)}
    if environ.get("CONTENT_TYPE"):
        out["content-type"] = environ["CONTENT_TYPE"]
    return out


def is_url(destination: str) -> bool:
    return destination.startswith(("http://", "https://"))


def duration(header: str, value: str) -> float:
    """``10s``, ``500ms``, ``3m``, ``1h30m``, ``2d``; a bare number is seconds."""
    text = value.strip()
    try:
        return _finite(float(text))
    except ValueError:
        pass
    parts = _DURATION_RE.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValidationError(header, "must be a duration such as 10s, 3m, 1h30m or 2d")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _finite(x: float) -> float:
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("not finite")
    return x


def fields(destination: str, headers: Mapping[str, str], body: bytes, *,
           queue: str | None = None) -> dict[str, Any]:
    """The enqueue fields of one QStash message (``headers`` by lower-case name)."""
    _refuse(headers)
    if "://" in destination and not is_url(destination):
        raise ValidationError("destination", "must be an http:// or https:// URL, or the "
                                             "name of a URL group")
    out: dict[str, Any] = {"url" if is_url(destination) else "topic": destination}
    method = headers.get("upstash-method", "POST").strip().upper()
    if method != "POST":
        out["method"] = method
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError("body", f"must be UTF-8 text (byte {e.start + 1} is not): "
                                      "Miyamoto stores a body as text") from None
    if text or method not in ("GET", "DELETE", "HEAD"):
        out["body"] = text
        if headers.get("content-type"):
            out["content_type"] = headers["content-type"]
    forwarded = {_header_name(k[len(FORWARD):]): v for k, v in headers.items()
                 if k.startswith(FORWARD) and len(k) > len(FORWARD)}
    if forwarded:
        out["headers"] = forwarded
    out.update(_timing(headers))
    out["max_attempts"] = _retries(headers) + 1
    for header, field in (("upstash-callback", "callback"),
                          ("upstash-failure-callback", "failure_callback"),
                          ("upstash-deduplication-id", "name")):
        if headers.get(header):
            out[field] = headers[header]
    if _flag(headers, "upstash-content-based-deduplication"):
        out["dedupe"] = "content"
    out.update(_flow(headers))
    if queue is not None:
        out["queue"] = queue
    return out


def _refuse(headers: Mapping[str, str]) -> None:
    for name in headers:
        for prefix, why in _REFUSED.items():
            if name.startswith(prefix):
                raise ValidationError(_header_name(name), why)


def _header_name(lower: str) -> str:
    return "-".join(p.capitalize() for p in lower.split("-"))


def _timing(headers: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "upstash-not-before" in headers:
        try:
            out["eta"] = int(headers["upstash-not-before"].strip())
        except ValueError:
            raise ValidationError("Upstash-Not-Before", "must be a unix time in seconds") from None
    elif "upstash-delay" in headers:
        out["countdown"] = duration("Upstash-Delay", headers["upstash-delay"])
    if "upstash-timeout" in headers:
        out["timeout"] = duration("Upstash-Timeout", headers["upstash-timeout"])
    return out


def _retries(headers: Mapping[str, str]) -> int:
    given = headers.get("upstash-retries")
    if given is None:
        return DEFAULT_RETRIES
    try:
        n = int(given.strip())
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_RETRIES:
        raise ValidationError("Upstash-Retries", f"must be an integer from 0 to {MAX_RETRIES}")
    return n


def _flag(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name, "false").strip().lower()
    if value not in ("true", "false"):
        raise ValidationError(_header_name(name), "must be true or false")
    return value == "true"


def _flow(headers: Mapping[str, str]) -> dict[str, Any]:
    """``Upstash-Flow-Control-Key`` and ``-Value: parallelism=2, rate=10, period=1m``."""
    key = headers.get("upstash-flow-control-key")
    if key is None:
        if "upstash-flow-control-value" in headers:
            raise ValidationError("Upstash-Flow-Control-Value", "goes with Upstash-Flow-Control-Key")
        return {}
    out: dict[str, Any] = {"flow_key": key}
    settings: dict[str, str] = {}
    for part in headers.get("upstash-flow-control-value", "").split(","):
        if part.strip():
            k, eq, v = part.partition("=")
            if not eq or k.strip() not in ("parallelism", "rate", "period"):
                raise ValidationError("Upstash-Flow-Control-Value",
                                      "must be parallelism=N, rate=N, period=DURATION")
            settings[k.strip()] = v.strip()
    if "parallelism" in settings:
        out["flow_parallelism"] = settings["parallelism"]
    if "rate" in settings:
        period = duration("Upstash-Flow-Control-Value", settings.get("period", "1s"))
        if period <= 0:
            raise ValidationError("Upstash-Flow-Control-Value", "period must be above 0")
        try:
            out["flow_rate"] = float(settings["rate"]) / period
        except ValueError:
            raise ValidationError("Upstash-Flow-Control-Value", "rate must be a number") from None
    return out


def renamed(e: ValidationError) -> ValidationError:
    """``e`` naming what the client sent: ``max_attempts`` is ``Upstash-Retries``,
    ``headers.X`` is ``Upstash-Forward-X``, and so on."""
    if e.field.startswith("headers."):
        return ValidationError(f"Upstash-Forward-{e.field[len('headers.'):]}", e.message,
                               e.status)
    source = _SOURCES.get(e.field)
    return e if source is None else ValidationError(source, e.message, e.status)


# ------------------------------------------------------------ answers
def _ms(t: float | None) -> int:
    return int((t or 0) * 1000)


def _state(view: Mapping[str, Any]) -> str:
    state = view.get("state")
    if state == "scheduled":
        return "RETRY" if view.get("attempts") else "CREATED"
    return {"running": "ACTIVE", "succeeded": "DELIVERED", "failed": "FAILED",
            "cancelled": "CANCELLED", "deleted": "CANCELLED",
            "expired": "FAILED"}.get(str(state), "CREATED")


def message_view(view: Mapping[str, Any]) -> dict[str, Any]:
    """GET /v2/messages/<id>: a task's view (``Task.summary``) as QStash's message."""
    max_attempts = view.get("max_attempts")
    out: dict[str, Any] = {
        "messageId": view["id"], "url": view.get("url", ""),
        "method": view.get("method", "POST"),
        "maxRetries": (max_attempts - 1) if max_attempts else DEFAULT_RETRIES,
        "notBefore": _ms(view.get("eta")), "createdAt": _ms(view.get("created")),
        "state": _state(view), "retried": view.get("attempts", 0),
        "queueName": view.get("queue")}
    for ours, theirs in (("callback", "callback"), ("failure_callback", "failureCallback")):
        if view.get(ours):
            out[theirs] = view[ours]
    return out


def dlq_view(view: Mapping[str, Any]) -> dict[str, Any]:
    """A failed task as a DLQ message: its id is its dlqId; its last answer is kept."""
    last = view.get("last_response") or {}
    out = message_view(view)
    out.update(dlqId=view["id"], responseStatus=last.get("status") or 0,
               responseHeader={k: [v] for k, v in (last.get("headers") or {}).items()},
               responseBody=last.get("body") or "")
    return out


def schedule_view(view: Mapping[str, Any], created: float) -> dict[str, Any]:
    """A schedule's view (``definitions.schedules.view``) as QStash's schedule."""
    task = view.get("task") or {}
    cron = view.get("cron") or f"@every {view.get('every')}s"
    if view.get("timezone", "UTC") != "UTC":
        cron = f"CRON_TZ={view['timezone']} {cron}"
    max_attempts = task.get("max_attempts")
    out: dict[str, Any] = {
        "scheduleId": view["name"], "destination": task.get("url", ""), "cron": cron,
        "createdAt": _ms(created), "method": task.get("method", "POST"),
        "retries": (max_attempts - 1) if max_attempts else DEFAULT_RETRIES,
        "isPaused": bool(view.get("paused")),
        "header": {k: [v] for k, v in (task.get("headers") or {}).items()}}
    if task.get("body") is not None:
        out["body"] = task["body"]
    if view.get("next"):
        out["nextScheduleTime"] = _ms(view["next"][0])
    if view.get("last_tick") is not None:
        out["lastScheduleTime"] = _ms(view["last_tick"])
    for ours, theirs in (("callback", "callback"), ("failure_callback", "failureCallback"),
                         ("queue", "queueName"), ("timeout", "timeout"),
                         ("countdown", "delay")):
        if task.get(ours) is not None:
            out[theirs] = task[ours]
    return out


def cron_and_zone(header: str) -> tuple[str, str]:
    """``Upstash-Cron``: a cron, optionally after ``CRON_TZ=<zone> `` as QStash takes it."""
    text = header.strip()
    if text.startswith("CRON_TZ="):
        zone, _, cron = text[len("CRON_TZ="):].partition(" ")
        return cron.strip(), zone
    return text, "UTC"
