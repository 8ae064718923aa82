"""The completion URL of a long task: its signed token and the worker's report.

A worker that answers ``202`` to an attempt of a task with a ``lease`` takes it
asynchronously; the attempt's request carried ``X-Task-Complete-Url``, whose token is an
HMAC-SHA256 over (task id, run, attempt, expiry) under the cluster's completion key. Any
node that holds the key checks a token without a lookup, so the worker may reach any
node; a token names one attempt, so an old attempt's token cannot end a later one.
Pure: no clock read, no I/O; the key is handed in and never logged or put in an error.
"""

from __future__ import annotations

import base64
import hmac
import math
import os
from dataclasses import dataclass
from typing import Any

import ujson

TOKEN_LIFETIME = 8 * 86400.0  # s: a token outlives a lease's longest span (7 days) by a
#                             day, so a late report is told 409 (over), not 403
LEASE_FALLBACK = 300.0  # s: a heartbeat's extension when neither it nor the task names one
RESULT_MAX_BYTES = 4096  # a report's result, encoded (kept with the task like a body)
STATES = ("succeeded", "failed")
_DERIVE = b"miyamoto completion key v1"


class TokenError(ValueError):
    """A token that is malformed, forged, for another task or out of date (a 403);
    its message follows the word "token"."""


class ReportError(ValueError):
    """A completion body that is not a report (a 400 naming ``field``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Grant:
    """What a valid token allows: reporting on attempt ``attempt`` of run ``run``."""

    task_id: str
    run: int
    attempt: int
    expiry: float


@dataclass(frozen=True)
class Report:
    state: str  # one of STATES
    result: Any = None


def derive_key(secret: bytes) -> bytes:
    """The completion key from a secret every node shares (never the secret itself, so
    a token's MAC tells nothing of the key that signs webhooks)."""
    return hmac.digest(secret, _DERIVE, "sha256")


def key_of(completion_secret: str, signing_secrets: tuple[str, ...],
           cluster_secret: str = "") -> bytes:
    """The node's completion key: from ``completion_secret``, else from the first webhook
    signing secret, else from the cluster's key pair's secret (each the same on every
    node, so any node checks a token another made, and a restarted node its own),
    else random (this process only)."""
    if completion_secret:
        return derive_key(completion_secret.encode())
    if signing_secrets:
        return derive_key(signing_secrets[0].encode())
    if cluster_secret:
        return derive_key(cluster_secret.encode())
    return os.urandom(32)


def _mac(key: bytes, task_id: str, run: int, attempt: int, expiry: int) -> str:
    msg = f"{task_id}\n{run}\n{attempt}\n{expiry}".encode()
    return base64.urlsafe_b64encode(hmac.digest(key, msg, "sha256")).rstrip(b"=").decode()


def mint(key: bytes, task_id: str, run: int, attempt: int, expiry: float) -> str:
    """The token for one attempt: ``run.attempt.expiry.mac`` (URL-safe)."""
    exp = int(math.ceil(expiry))
    return f"{run}.{attempt}.{exp}.{_mac(key, task_id, run, attempt, exp)}"


def verify(key: bytes, task_id: str, token: str, now: float) -> Grant:
    """The grant ``token`` carries for ``task_id``; TokenError when it is malformed,
    signed for another task or attempt, or expired."""
    parts = str(token).split(".")
    if len(parts) != 4 or not all(p.isdigit() and len(p) <= 12 for p in parts[:3]):
        raise TokenError("is malformed")
    run, attempt, exp = (int(p) for p in parts[:3])
    if not hmac.compare_digest(parts[3], _mac(key, task_id, run, attempt, exp)):
        raise TokenError("is not valid for this task")
    if exp <= now:
        raise TokenError("has expired")
    return Grant(task_id, run, attempt, float(exp))


def url(base: str, task_id: str, token: str, action: str = "complete") -> str:
    """The completion (or heartbeat) URL a delivery carries (``base``: the node's public
    HTTP URL)."""
    return f"{base.rstrip('/')}/tasks/{task_id}/{action}?token={token}"


def parse_report(body: Any) -> Report:
    """A decoded JSON body as a report: ``state`` succeeded or failed, an optional
    ``result`` at most RESULT_MAX_BYTES encoded."""
    if not isinstance(body, dict):
        raise ReportError("body", "must be a JSON object with a state")
    unknown = set(body) - {"state", "result"}
    if unknown:
        raise ReportError(sorted(unknown)[0], "is not a field of a report (state, result)")
    state = body.get("state")
    if state not in STATES:
        raise ReportError("state", "must be \"succeeded\" or \"failed\"")
    result = body.get("result")
    if result is not None and len(ujson.dumps(result)) > RESULT_MAX_BYTES:
        raise ReportError("result", f"is longer than {RESULT_MAX_BYTES} bytes")
    return Report(state, result)

