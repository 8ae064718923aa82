"""Turn an enqueue request (form or JSON) into a validated ``Task``.

Form keys that start with ``task.`` configure the task (``task.header.X`` adds a
header); every other key is a param. JSON bodies name the same fields directly.
Every rejection is a ``ValidationError`` naming the field, which the API answers
with a 4xx; nothing is stored for a rejected request.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

import ujson

from miyamoto.tasks import dedupe
from miyamoto.tasks import fields as dispatchfields
from miyamoto.tasks import labels, options, repeat
from miyamoto.tasks.checks import ValidationError, audience, integer, number, traceparent
from miyamoto.tasks.formdata import form_pairs
from miyamoto.tasks.task import METHODS, QUEUE_NAME_RE, Task, new_id

_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE_RE = re.compile(r"[\t\x20-\x7e\x80-\xff]{0,8192}")
_FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-connection",
})
_NAME_RE = re.compile(r"[^\x00-\x1f\x7f]+")
_JSON_FIELDS = frozenset({
    "url", "method", "params", "body", "content_type", "json", "headers", "countdown", "eta",
    "name", "queue", "max_attempts", "timeout", "callback", "failure_callback",
    "dedupe", "traceparent", "oidc_audience",
    *dispatchfields.FIELDS,  # priority, flow_key, flow_rate, flow_parallelism
    *options.FIELDS,  # expires_at, ttl, retry_delays
    "labels",
    "topic",  # instead of url: one task per URL of the topic (miyamoto.definitions.topics)
})
# a form's task.X options: params, the body and the headers come as form fields instead;
# the repeat fields too (POST /queue takes them out before build_task)
_FORM_OPTIONS = (_JSON_FIELDS | set(repeat.FIELDS)) - {"params", "json", "headers", "body",
                                                       "content_type"}
MAX_TIMEOUT = 1800.0  # Cloud Tasks' longest dispatch deadline for HTTP targets
MAX_ATTEMPTS = 10000
MAX_FORM_FIELDS = 10000


@dataclass(frozen=True)
class Limits:
    max_body: int = 1024 * 1024
    max_url: int = 2083
    max_delay: float = 30 * 86400.0
    max_name: int = 500
    # (host, port) -> the target rule that refuses it, or None (TargetGuard.check_literal)
    targets: Callable[[str, int], str | None] | None = None
    oidc: bool = True  # whether this node signs OIDC tokens (an oidc_audience is refused if not)


def _audience(value: Any, limits: Limits) -> str:
    if not limits.oidc:
        raise ValidationError("oidc_audience", "this node signs no OIDC tokens: its config "
                              "needs oidc_issuer and oidc_signing_key")
    return audience("oidc_audience", value)


def check_url(field: str, value: Any, limits: Limits) -> str:
    """``value`` as the URI to send to, or the ValidationError naming ``field``. A task's
    target repeats: a URL checked once is remembered (its host and port, not the
    verdict of the target rules, which is asked each time: it changes with the
    cluster's endpoints). Parsing one was ~6 us of a ~70 us ``build_task``."""
    parsed = _URLS.get((value, limits.max_url)) if isinstance(value, str) else None
    if parsed is None:
        parsed = _parse_url(field, value, limits)
    value, host, port = parsed
    if limits.targets is not None:
        rule = limits.targets(host, port)
        if rule:
            raise ValidationError(field, f"targets a denied address: {rule}")
    return value


_URLS: dict[tuple[str, int], tuple[str, str, int]] = {}  # (url, max_url) -> its parse
_MAX_URLS, _MAX_URL_KEPT = 1024, 512  # URLs kept, the longest kept: <= ~0.7 MB


def _parse_url(field: str, value: Any, limits: Limits) -> tuple[str, str, int]:
    """(URI, host, port) of a URL every check but the target rules passed."""
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty string")
    if len(value) > limits.max_url:
        raise ValidationError(field, f"is longer than {limits.max_url} characters")
    if any(c in value for c in "\r\n\t ") or not value.isprintable():
        raise ValidationError(field, "must not contain whitespace or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
        if not value.isascii():  # an IRI: send it as the URI it stands for
            value = _to_uri(parts)
            if len(value) > limits.max_url:
                raise ValidationError(field, f"is longer than {limits.max_url} characters "
                                             "once percent-encoded")
            parts = urlsplit(value)
    except (ValueError, UnicodeError) as e:
        raise ValidationError(field, f"is not a valid URL ({e})") from e
    if parts.scheme not in ("http", "https"):
        raise ValidationError(field, "must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValidationError(field, "has no host")
    if port == 0:
        raise ValidationError(field, "has port 0")
    if parts.username or parts.password:
        raise ValidationError(field, "must not carry credentials; use headers")
    parsed = (value, parts.hostname, port or (443 if parts.scheme == "https" else 80))
    if len(value) <= _MAX_URL_KEPT:
        if len(_URLS) >= _MAX_URLS:
            _URLS.clear()
        _URLS[(value, limits.max_url)] = parsed
    return parsed


def _to_uri(parts: SplitResult) -> str:
    """IDNA for the host, UTF-8 percent-encoding for the rest (RFC 3987 section 3.1)."""
    host = (parts.hostname or "").encode("idna").decode("ascii")
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    safe = "/:@!$&'()*+,;=%~-._"
    return urlunsplit((parts.scheme, netloc, quote(parts.path, safe=safe),
                       quote(parts.query, safe=safe + "?"), quote(parts.fragment, safe=safe + "?")))


def _param_value(field: str, v: Any) -> str | list[str]:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)) and (not isinstance(v, float) or math.isfinite(v)):
        return str(v)
    if v is None:
        return ""
    if isinstance(v, list):
        out = []
        for x in v:
            if isinstance(x, (list, dict)):
                raise ValidationError(field, "lists must hold strings, numbers or booleans")
            out.append(_param_value(field, x))
        return out  # type: ignore[return-value]
    raise ValidationError(field, "must be a string, number, boolean or a list of those")


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


MAX_DEPTH = 64  # nesting of JSON values in json/params


def _check_text(field: str, value: Any) -> None:
    """Reject strings with no UTF-8 form (lone surrogates spelled as JSON \\u escapes):
    they could be neither journaled nor delivered. Reject NaN and +-Infinity too: ujson
    parses them (and 1e999 as inf) but writes them back as bare NaN/Inf, which is not
    JSON, so a ``json`` body holding one would reach the worker unparseable. Walks
    iteratively, and rejects nesting deeper than MAX_DEPTH, so no input can exhaust
    the stack."""
    stack: list[tuple[str, Any, int]] = [(field, value, 0)]
    while stack:
        where, v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValidationError(field, f"is nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, str):
            if not _is_text(v):
                raise ValidationError(where, "is not valid Unicode text (a lone surrogate)")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValidationError(where, "must be a finite number (NaN and Infinity are not JSON)")
        elif isinstance(v, dict):
            for k, x in v.items():
                if not _is_text(k):
                    raise ValidationError(where, "has a key that is not valid Unicode text")
                stack.append((f"{where}.{k}", x, depth + 1))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                stack.append((f"{where}[{i}]", x, depth + 1))


def _plain_strings(d: dict) -> bool:
    """Whether every key and value of ``d`` is an ASCII string (params, headers: then
    ``_check_text`` has nothing to find, and is not walked)."""
    for k, v in d.items():
        if type(k) is not str or type(v) is not str or not k.isascii() or not v.isascii():
            return False
    return True


def _headers(field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValidationError(field, "must be an object of header names to strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _HEADER_NAME_RE.fullmatch(k):
            raise ValidationError(f"{field}.{k}", "is not a valid header name")
        if k.lower() in _FORBIDDEN_HEADERS:
            raise ValidationError(f"{field}.{k}", "is set by Miyamoto and cannot be overridden")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str):
            raise ValidationError(f"{field}.{k}", "must be a string or a number")
        if not v.isascii():  # the real reason first: an emoji is not a control character
            try:
                v.encode("latin-1")
            except UnicodeEncodeError:
                raise ValidationError(f"{field}.{k}", "must be latin-1 text: an HTTP header "
                                      "cannot carry characters beyond it (an emoji, say)") from None
        if not _HEADER_VALUE_RE.fullmatch(v):
            raise ValidationError(f"{field}.{k}", "must be a string without control characters")
        out[k] = v
    return out


def build_task(fields: Mapping[str, Any], *, path_queue: str | None, idempotency_key: str | None,
               limits: Limits, now: float, offset: float = 0.0,
               pull: Callable[[str], bool] | None = None) -> Task:
    """Validate the JSON-shaped ``fields`` into a new scheduled Task.

    ``now`` is this node's clock, on which the task's times are kept; ``offset`` is the
    cluster's clock minus it: a client's absolute ``eta`` is a moment on the cluster's
    clock (``miyamoto.cluster.clocks``), so its copy fires at ``eta - offset`` here.
    One check per concern, in a fixed order, so that a request with several faults
    is always answered with the same field. ``pull`` tells a pull queue (its mode), whose
    tasks are leased by workers, never POSTed: they need no url (one given is kept, shown,
    and not used)."""
    pulled = pull is not None and "url" not in fields and pull(_queue(fields, path_queue))
    _check_field_names(fields, needs_url=not pulled)
    url = check_url("url", fields["url"], limits) if "url" in fields else ""
    if fields.keys() <= _PLAIN:
        return _plain_task(fields, url, path_queue, idempotency_key, limits, now)
    method = _method(fields)
    params = _params(fields)
    body, content_type = _body(fields, method, params, limits)
    headers = _headers("headers", fields.get("headers") or {})
    eta = _eta(fields, limits, now, offset)
    name = _name(fields, idempotency_key, limits)
    try:
        dedupe_mode = dedupe.mode(fields, named=name is not None)
    except dedupe.DedupeError as e:
        raise ValidationError("dedupe", str(e)) from None
    queue = _queue(fields, path_queue)
    max_attempts, timeout = _attempt_limits(fields)
    callback = _optional_url(fields, "callback", limits)
    failure_callback = _optional_url(fields, "failure_callback", limits)
    priority_and_flow = dispatchfields.parse(fields)
    lifetime = options.parse(fields, eta, now, limits.max_delay)
    trace = fields.get("traceparent")
    aud = fields.get("oidc_audience")
    return dedupe.apply(Task(
        id=new_id(), queue=queue, url=url, method=method, params=params, body=body,
        content_type=content_type, headers=headers, name=name, eta=eta,
        max_attempts=max_attempts, timeout=timeout, callback=callback,
        failure_callback=failure_callback, created=now, fire_at=eta, **priority_and_flow,
        **lifetime, labels=labels.parse(fields),
        traceparent=None if trace is None else traceparent("traceparent", trace),
        oidc_audience=None if aud is None else _audience(aud, limits),
    ), dedupe_mode)


_PLAIN = frozenset({"url", "params", "headers", "queue"})  # a task with only these is plain


def _plain_task(fields: Mapping[str, Any], url: str, path_queue: str | None,
                idempotency_key: str | None, limits: Limits, now: float) -> Task:
    """``build_task`` of a task that gives none of the optional fields (most do not):
    the same checks in the same order, each optional field at the value its parser
    gives when it is absent, without asking each parser (they were ~15 % of it)."""
    params = _params(fields)
    headers = _headers("headers", fields.get("headers") or {})
    name = _name(fields, idempotency_key, limits)
    return _PLAIN_TASK.evolve(  # (evolve copies slots: ~30 % quicker than Task's __init__)
        id=new_id(), queue=_queue(fields, path_queue), url=url, params=params,
        headers=headers, name=name, eta=now, created=now, fire_at=now, labels={})


# every field at its default (each one _plain_task does not set is immutable)
_PLAIN_TASK = Task(id="", queue="default", url="")


def _check_field_names(fields: Mapping[str, Any], needs_url: bool = True) -> None:
    """Every key and value is storable text, every key a known field, url is given
    (unless the task's queue is a pull queue)."""
    for k, v in fields.items():
        if type(k) is not str or not k.isascii():  # (an ASCII string is text: O(1))
            _check_text(k if _is_text(k) else "body", k)
        if type(v) is str:
            if not v.isascii() and not _is_text(v):
                raise ValidationError(k, "is not valid Unicode text (a lone surrogate)")
        elif type(v) is not dict or not _plain_strings(v):
            _check_text(k, v)
    unknown = set(fields) - _JSON_FIELDS
    if unknown:
        raise ValidationError(sorted(unknown)[0], "unknown field")
    if "topic" in fields:  # a topic is expanded before (miyamoto.definitions.topics), one task at a time
        raise ValidationError("topic", "cannot be given with url" if "url" in fields
                              else "is accepted by POST /queue only, one task at a time")
    if "url" not in fields and needs_url:
        raise ValidationError("url", "is required (but in a pull queue)")


def _method(fields: Mapping[str, Any]) -> str:
    method = fields.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValidationError("method", f"must be one of {', '.join(METHODS)}")
    return method.upper()


def _params(fields: Mapping[str, Any]) -> dict[str, str | list[str]]:
    params_in = fields.get("params", {})
    if params_in is None:
        params_in = {}
    if not isinstance(params_in, dict):
        raise ValidationError("params", "must be an object")
    return {str(k): v if type(v) is str else _param_value(f"params.{k}", v)
            for k, v in params_in.items()}


def _body(fields: Mapping[str, Any], method: str, params: dict,
          limits: Limits) -> tuple[str | None, str | None]:
    """The raw body and its content type (json or body, optional content_type), which
    replace params and which a GET or DELETE cannot carry."""
    body: str | None = None
    content_type: str | None = None
    if "json" in fields and "body" in fields:
        raise ValidationError("json", "give either json or body, not both")
    if "json" in fields:
        body = ujson.dumps(fields["json"], ensure_ascii=False)
        content_type = "application/json"
    elif "body" in fields:
        if not isinstance(fields["body"], str):
            raise ValidationError("body", "must be a string")
        body = fields["body"]
        content_type = "text/plain; charset=utf-8"
    if "content_type" in fields:
        ct = fields["content_type"]
        if body is None:
            raise ValidationError("content_type", "goes with body or json")
        if not isinstance(ct, str) or not ct or not _HEADER_VALUE_RE.fullmatch(ct):
            raise ValidationError("content_type", "must be a media type string")
        content_type = ct
    if body is not None and params:
        raise ValidationError("params", "give either params or a body, not both")
    if body is not None and method in ("GET", "DELETE"):
        raise ValidationError("body", f"a {method} request carries no body; use params")
    if body is not None and len(body.encode("utf-8")) > limits.max_body:
        raise ValidationError("body", f"is larger than {limits.max_body} bytes", 413)
    return body, content_type


def _eta(fields: Mapping[str, Any], limits: Limits, now: float, offset: float) -> float:
    """When the task is due, on our clock: eta (a unix time on the cluster's clock) wins
    over countdown (seconds from now)."""
    if fields.get("eta") is not None:
        eta = number("eta", fields["eta"])
        if eta > now + offset + limits.max_delay:
            raise ValidationError("eta", f"is more than {limits.max_delay:g} s in the future")
        if eta < 0:
            raise ValidationError("eta", "must be a unix time")
        return eta - offset
    if fields.get("countdown") is not None:
        countdown = number("countdown", fields["countdown"])
        if countdown < 0:
            raise ValidationError("countdown", "must not be negative")
        if countdown > limits.max_delay:
            raise ValidationError("countdown", f"must be at most {limits.max_delay:g} seconds")
        return now + countdown
    return now


def _name(fields: Mapping[str, Any], idempotency_key: str | None, limits: Limits) -> str | None:
    """The de-duplication name: the field, else the Idempotency-Key header."""
    name = fields.get("name")
    if name is None and idempotency_key:
        name = idempotency_key
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ValidationError("name", "must be a non-empty string")
    if len(name) > limits.max_name:
        raise ValidationError("name", f"is longer than {limits.max_name} characters")
    if not _NAME_RE.fullmatch(name):
        raise ValidationError("name", "must not contain control characters")
    return name


def _queue(fields: Mapping[str, Any], path_queue: str | None) -> str:
    """The queue from the field or the path (they must agree), else the default one."""
    queue = fields.get("queue")
    if queue is not None and path_queue is not None and queue != path_queue:
        raise ValidationError("queue", "differs from the queue in the path")
    queue = queue if queue is not None else (path_queue or "default")
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        raise ValidationError("queue", "must be 1-100 characters of A-Z a-z 0-9 _ -")
    return queue


def _attempt_limits(fields: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """The task's own max_attempts and dispatch deadline; None keeps the queue's."""
    max_attempts = None
    if fields.get("max_attempts") is not None:
        max_attempts = integer("max_attempts", fields["max_attempts"], 1, MAX_ATTEMPTS)
    timeout = None
    if fields.get("timeout") is not None:
        timeout = number("timeout", fields["timeout"])
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ValidationError("timeout", f"must be in (0, {MAX_TIMEOUT:g}] seconds")
    return max_attempts, timeout


def _optional_url(fields: Mapping[str, Any], field: str, limits: Limits) -> str | None:
    value = fields.get(field)
    return None if value is None else check_url(field, value, limits)


def form_fields(body: bytes) -> dict[str, Any]:
    """Map a form body onto the JSON field names (``task.X`` -> X, rest -> params)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("body", "form data must be UTF-8") from None
    fields: dict[str, Any] = {}
    params: dict[str, Any] = {}
    headers: dict[str, str] = {}
    try:
        pairs = form_pairs(text, MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise ValidationError("body", "form data must be UTF-8") from None
    except ValueError:
        raise ValidationError("body", f"has more than {MAX_FORM_FIELDS} fields") from None
    for key, value in pairs:
        if key.startswith("task.header."):
            headers[key[len("task.header."):]] = value
        elif key.startswith("task."):
            name = key[len("task."):]
            if name not in _FORM_OPTIONS:
                raise ValidationError(key, "unknown task option")
            fields[name] = value
        elif key in params:
            prev = params[key]
            params[key] = (prev if isinstance(prev, list) else [prev]) + [value]
        else:
            params[key] = value
    fields["params"] = params
    if headers:
        fields["headers"] = headers
    return fields


def json_fields(body: bytes) -> Any:
    try:
        return ujson.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValidationError("body", f"is not valid JSON: {_where(body, e)}") from None


def _where(body: bytes, error: Exception) -> str:
    """What is wrong and where, by the standard library's parser: ujson's message has no
    position ("Unexpected character in found when decoding object value"). Only on this
    error path, so the fast parser still reads every good body."""
    try:
        json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 at byte {e.start + 1}"
    except json.JSONDecodeError as e:
        return f"{e.msg} at line {e.lineno} column {e.colno}"
    except ValueError as e:  # e.g. a number the standard library refuses to convert
        return str(e)
    except RecursionError:
        return "nested too deep"
    return str(error)  # the standard library takes it, ujson does not (a huge number)


def parse_enqueue(content_type: str, body: bytes, *, path_queue: str | None,
                  idempotency_key: str | None, limits: Limits, now: float,
                  offset: float = 0.0) -> Task:
    """One task from a form or JSON body (``offset``: see ``build_task``)."""
    return build_task(enqueue_fields(content_type, body, limits), path_queue=path_queue,
                      idempotency_key=idempotency_key, limits=limits, now=now, offset=offset)


def enqueue_fields(content_type: str, body: bytes, limits: Limits) -> dict[str, Any]:
    """A form or JSON enqueue body as JSON-shaped fields, not yet checked."""
    if len(body) > limits.max_body:
        raise ValidationError("body", f"is larger than {limits.max_body} bytes", 413)
    if content_type.split(";")[0].strip().lower() == "application/json":
        fields = json_fields(body)
        if not isinstance(fields, dict):
            raise ValidationError("body", "must be a JSON object")
        return fields
    return form_fields(body)


def parse_batch(body: bytes, *, path_queue: str | None, limits: Limits, now: float,
                max_batch: int, offset: float = 0.0,
                pull: Callable[[str], bool] | None = None) -> list[Task]:
    """A JSON list of task objects (or {"tasks": [...]}); all valid or none stored
    (``offset``: see ``build_task``)."""
    if len(body) > limits.max_body:
        raise ValidationError("body", f"is larger than {limits.max_body} bytes", 413)
    data = json_fields(body)
    if isinstance(data, dict) and "tasks" in data and len(data) == 1:
        data = data["tasks"]
    if not isinstance(data, list):
        raise ValidationError("body", "must be a JSON list of tasks")
    if not data:
        raise ValidationError("body", "holds no tasks")
    if len(data) > max_batch:
        raise ValidationError("body", f"holds more than {max_batch} tasks", 413)
    tasks = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValidationError(f"tasks[{i}]", "must be a JSON object")
        try:
            tasks.append(build_task(item, path_queue=path_queue, idempotency_key=None,
                                    limits=limits, now=now, offset=offset, pull=pull))
        except ValidationError as e:
            raise ValidationError(f"tasks[{i}].{e.field}", e.message, e.status) from None
    return tasks
