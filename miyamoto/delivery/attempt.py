"""What one delivery attempt sends, and what its answer means.

``build_request`` is pure (task, clock, secrets -> method, url, headers, body), so the
headers promised in the README are tested directly; ``Outcome`` is what the engine
records and decides on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus, urlencode, urlsplit, urlunsplit

import ujson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from miyamoto.tasks.task import CLOUDTASKS, HISTORY_ERROR_CHARS, LAST_BODY_BYTES, Task
from miyamoto.version import __version__

USER_AGENT = f"miyamoto/{__version__}"
FORM = "application/x-www-form-urlencoded"
UPSTASH_JWT_LIFETIME = 300  # s: QStash's signatures expire 5 minutes after they are made
RETRY_REASON_CHARS = 200


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None = None  # None: no HTTP response at all
    headers: dict[str, str] | None = None
    body: bytes = b""
    error: str | None = None
    at: float = 0.0  # when the attempt ended
    start: float = 0.0  # when it started
    node: str = ""  # which node made it

    def attempt(self) -> dict[str, Any]:
        """The attempt's entry in the task's history: small (no headers, no body, the
        error cut short), as it is kept 20 times over and sent to every sibling."""
        return {"start": self.start, "duration": round(max(0.0, self.at - self.start), 6),
                "node": self.node, "status": self.status,
                "error": None if self.error is None else self.error[:HISTORY_ERROR_CHARS]}

    def record(self) -> dict[str, Any]:
        """The last-response record kept with the task (first 4 KiB of the body)."""
        return {
            "status": self.status, "headers": self.headers or {},
            "body": self.body[:LAST_BODY_BYTES].decode("utf-8", "replace"),
            "error": self.error, "at": self.at,
        }

    def retry_after(self) -> str | None:
        for k, v in (self.headers or {}).items():
            if k.lower() == "retry-after":
                return v
        return None


def _header_value(s: str) -> str:
    """Header-safe text: ASCII as is, anything else percent-encoded (UTF-8)."""
    return s if s.isascii() and s.isprintable() else quote(s, safe="")


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks signature: v1,base64(HMAC-SHA256(key, id.timestamp.body))."""
    key = base64.b64decode(secret[len("whsec_"):] if secret.startswith("whsec_") else secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def sign_ed25519(key: Ed25519PrivateKey, msg_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' asymmetric signature: v1a,base64(Ed25519(id.timestamp.body))."""
    return "v1a," + base64.b64encode(key.sign(f"{msg_id}.{timestamp}.".encode() + body)).decode()


def signature_header(secrets: tuple[str, ...], msg_id: str, timestamp: int, body: bytes,
                     ed25519: Ed25519PrivateKey | None = None) -> str:
    """One ``v1,<sig>`` per secret, then ``v1a,<sig>`` with the Ed25519 key, space-separated,
    as Standard Webhooks allows: while a secret is rotated (or a receiver moves from HMAC
    to the public key) the worker verifies with whichever one it knows."""
    sigs = [sign(s, msg_id, timestamp, body) for s in secrets]
    if ed25519 is not None:
        sigs.append(sign_ed25519(ed25519, msg_id, timestamp, body))
    return " ".join(sigs)


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


_JWT_HEAD = _b64url(b'{"alg":"HS256","typ":"JWT"}')


def upstash_signature(key: str, url: str, body: bytes, now: float) -> str:
    """QStash's ``Upstash-Signature``: a JWT (HS256, the signing key's text as the HMAC
    key) whose claims are iss "Upstash", sub the URL the request goes to, iat/nbf now,
    exp 5 minutes on, a random jti, and body the base64url SHA-256 of the body, as
    ``qstash.Receiver.verify`` checks them (tests/unit/delivery/test_attempt.py runs it)."""
    t = int(now)
    claims = {"iss": "Upstash", "sub": url, "exp": t + UPSTASH_JWT_LIFETIME, "nbf": t,
              "iat": t, "jti": "jwt_" + os.urandom(12).hex(),
              "body": base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode()}
    signed = _JWT_HEAD + b"." + _b64url(ujson.dumps(claims, escape_forward_slashes=False).encode())
    mac = hmac.digest(key.encode(), signed, "sha256")  # one C call: ~2x hmac.new's speed
    return (signed + b"." + _b64url(mac)).decode()


def cloudtasks_headers(task: Task) -> dict[str, str]:
    """What Cloud Tasks sends an HTTP target: the short queue and task names (the task's
    id when it was created without one), the attempts before this one, those that got
    an answer, the schedule time in unix seconds, and on a retry the previous answer's
    status and why it was retried."""
    out = {"X-CloudTasks-QueueName": task.queue,
           "X-CloudTasks-TaskName": _header_value(task.name or task.id),
           "X-CloudTasks-TaskRetryCount": str(task.attempts),
           "X-CloudTasks-TaskExecutionCount": str(task.executions),
           "X-CloudTasks-TaskETA": f"{task.eta:.6f}"}
    last = task.last if task.attempts else None
    if last:
        status, error = last.get("status"), last.get("error")
        if status is not None:
            out["X-CloudTasks-TaskPreviousResponse"] = str(status)
        reason = f"HTTP status {status}" if status is not None else str(error or "no answer")
        out["X-CloudTasks-TaskRetryReason"] = _header_value(reason[:RETRY_REASON_CHARS])
    return out


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")  # what quote_plus leaves as it is


def form_encode(params: dict[str, Any]) -> str:
    """``urlencode(params, doseq=True)``, in one pass for the usual params (strings and
    lists of strings; anything else goes through urlencode itself): each delivery of a
    form task encodes one, and urlencode's generic layers were ~2 % of a node's CPU."""
    out = []
    for k, v in params.items():
        if type(k) is not str:
            return urlencode(params, doseq=True)
        key = k if _UNRESERVED.fullmatch(k) else quote_plus(k)
        if type(v) is str:
            out.append(f"{key}={v if _UNRESERVED.fullmatch(v) else quote_plus(v)}")
        elif type(v) is list and all(type(x) is str for x in v):
            out.extend(f"{key}={x if _UNRESERVED.fullmatch(x) else quote_plus(x)}" for x in v)
        else:
            return urlencode(params, doseq=True)
    return "&".join(out)


def build_request(task: Task, now: float, secrets: tuple[str, ...] = (),
                  traceparent: str | None = None,
                  upstash_key: str = "", ed25519: Ed25519PrivateKey | None = None,
                  bearer: str = "") -> tuple[str, str, dict[str, str], bytes]:
    """``traceparent``: the attempt's span (tracing on); else the task's own is sent, so a
    worker's trace continues the producer's with or without tracing here. ``upstash_key``:
    QStash's current signing key (qstash_current_signing_key), for Upstash-Signature.
    ``ed25519``: the key of the v1a signature; ``bearer``: an OIDC token for Authorization
    (both as ``delivery.identity`` gives them for the task's queue)."""
    url = task.url
    headers: dict[str, str] = {}  # the ones Miyamoto sets; the task's own are merged below
    if task.body is not None:
        body = task.body.encode("utf-8")
        headers["Content-Type"] = task.content_type or "text/plain; charset=utf-8"
    elif task.method in ("GET", "DELETE"):
        body = b""
        if task.params:
            parts = urlsplit(url)
            query = urlencode(task.params, doseq=True)
            url = urlunsplit(parts._replace(query=f"{parts.query}&{query}" if parts.query else query))
    else:
        body = form_encode(task.params).encode()
        headers["Content-Type"] = FORM
    headers["User-Agent"] = USER_AGENT
    headers["X-Task-Id"] = task.id
    headers["X-Task-Queue"] = task.queue
    if task.name:
        headers["X-Task-Name"] = headers["Idempotency-Key"] = _header_value(task.name)
    headers["X-Task-Retry-Count"] = str(task.attempts)
    headers["X-Task-Execution-Count"] = str(task.executions)
    headers["X-Task-Eta"] = f"{task.eta:.6f}"
    if task.attempts and task.last and task.last.get("status") is not None:
        headers["X-Task-Previous-Response"] = str(task.last["status"])
    if task.face == CLOUDTASKS:
        headers.update(cloudtasks_headers(task))
    trace = traceparent or task.traceparent
    if trace is not None:
        headers["traceparent"] = trace
    if secrets or ed25519 is not None:
        ts = int(now)
        headers["webhook-id"] = task.id
        headers["webhook-timestamp"] = str(ts)
        headers["webhook-signature"] = signature_header(secrets, task.id, ts, body, ed25519)
    if bearer:
        headers["Authorization"] = "Bearer " + bearer
    if upstash_key:  # what QStash's deliveries carry besides the signature
        headers["Upstash-Message-Id"] = task.id
        headers["Upstash-Retried"] = str(task.attempts)
        headers["Upstash-Signature"] = upstash_signature(upstash_key, url, body, now)
    if not task.headers:
        return task.method, url, headers, body
    # HTTP header names are case-insensitive: a task header "x-task-id" must neither
    # spoof nor duplicate the real X-Task-Id, so ours replace theirs whatever the case.
    ours = {k.lower() for k in headers}
    merged = {k: v for k, v in task.headers.items() if k.lower() not in ours}
    merged.update(headers)
    return task.method, url, merged, body
