"""Content-based de-duplication: ``dedupe: "content"`` names a task after what it sends.

QStash's "content based deduplication": two tasks that would make the same request of
the same target are the same task, so the second one within the de-duplication window
gets the usual 409 duplicate answer with the first one's id. Here that is done by
setting the task's ``name`` from a hash of the request, so everything the name
machinery already does (rendezvous placement of named copies, the window, 409 across
the cluster, batch enqueue) applies unchanged; nothing new is stored or replicated.

The hash covers exactly what the target will get and nothing that varies per attempt:
the method, the URL (with the query string that GET/DELETE params become), the task's
own headers (names lower-cased, as HTTP compares them; sorted, so their order does not
matter) plus the Content-Type Miyamoto will send, and the body bytes (form-encoded
params, the encoded ``json``, or the raw ``body``). ``tests/unit/tasks/test_dedupe.py``
checks these against ``delivery.build_request``, so the two cannot drift apart. The
queue is not hashed: names are per queue already, and eta/countdown are not part of
the request. Each part is length-prefixed, so no two different requests can be framed
into the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Mapping
from urllib.parse import urlencode, urlsplit, urlunsplit

from miyamoto.tasks.task import Task

log = logging.getLogger(__name__)

FIELD = "dedupe"
MODES = ("content",)
PREFIX = "content:"  # so an operator tells a content name from a chosen one
FORM = "application/x-www-form-urlencoded"  # delivery.FORM (not imported: no cycle worth it)
_VERSION = b"miyamoto-dedupe-v1"  # bump if the framing ever changes


class DedupeError(ValueError):
    """A bad ``dedupe`` field; validate.py turns it into a 400 naming ``dedupe``."""


def mode(fields: Mapping[str, Any], named: bool) -> str | None:
    """The requested mode (None: no content de-duplication). ``named``: the request also
    gives a name (the field or the Idempotency-Key header), which the two cannot share."""
    value = fields.get(FIELD)
    if value is None:
        return None
    if not isinstance(value, str) or value not in MODES:
        raise DedupeError(f"must be one of {', '.join(repr(m) for m in MODES)}")
    if named:
        raise DedupeError("sets the task's name; give either dedupe or name "
                          "(or an Idempotency-Key header), not both")
    return value


def request_parts(task: Task) -> tuple[str, str, list[tuple[str, str]], bytes]:
    """(method, url, headers, body) as the target will receive them, less the headers
    Miyamoto adds per task or per attempt (X-Task-*, User-Agent, signatures)."""
    url = task.url
    headers = [(k.lower(), v) for k, v in task.headers.items()]
    if task.body is not None:
        body = task.body.encode("utf-8")
        content_type: str | None = task.content_type or "text/plain; charset=utf-8"
    elif task.method in ("GET", "DELETE"):
        body, content_type = b"", None
        if task.params:
            parts = urlsplit(url)
            query = urlencode(task.params, doseq=True)
            url = urlunsplit(parts._replace(
                query=f"{parts.query}&{query}" if parts.query else query))
    else:
        body, content_type = urlencode(task.params, doseq=True).encode(), FORM
    if content_type is not None:  # Miyamoto's Content-Type replaces the task's own
        headers = [(k, v) for k, v in headers if k != "content-type"]
        headers.append(("content-type", content_type))
    return task.method, url, sorted(headers), body


def content_name(task: Task) -> str:
    """``content:`` + the SHA-256 (hex) of the request the task will make."""
    method, url, headers, body = request_parts(task)
    h = hashlib.sha256()
    for part in (_VERSION, method.encode(), url.encode("utf-8"), *_header_bytes(headers), body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return PREFIX + h.hexdigest()


def _header_bytes(headers: list[tuple[str, str]]) -> list[bytes]:
    out = [str(len(headers)).encode()]
    for name, value in headers:
        out += [name.encode("latin-1"), value.encode("latin-1")]
    return out


def apply(task: Task, dedupe: str | None) -> Task:
    """The task, named after its content when ``dedupe`` asks for it."""
    if dedupe != "content":
        return task
    return task.evolve(name=content_name(task))
