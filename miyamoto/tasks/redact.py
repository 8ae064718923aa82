"""What a task view shows of the request a task makes: its params, body and headers,
with the secrets among the headers hidden.

The task view (``GET /tasks/<id>``, the dashboard) is read by anyone with a read or
task token, while a task's headers often carry the target's credentials. So the value
of ``Authorization``, ``Proxy-Authorization``, ``Cookie``, and of any header whose name
holds ``token``, ``secret``, ``key`` or ``signature`` (``X-Api-Key``, ``X-Hub-Signature``)
is shown as REDACTED; its name stays, so an operator sees that it is set. The body is
cut to BODY_CHARS characters (``body_chars`` says how long it is): a view answers in
one REPLY from a peer, and a body may be 1 MiB.
"""

from __future__ import annotations

from typing import Any

from miyamoto.tasks.task import Task

REDACTED = "[redacted]"
BODY_CHARS = 65536
_SECRET_NAMES = frozenset({"authorization", "proxy-authorization", "cookie"})
_SECRET_PARTS = ("token", "secret", "key", "signature")


def is_secret(name: str) -> bool:
    """Whether a header's value is hidden from a task view (names are case-insensitive)."""
    low = name.lower()
    return low in _SECRET_NAMES or any(p in low for p in _SECRET_PARTS)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in headers.items()}


def request_view(t: Task) -> dict[str, Any]:
    """The request fields of ``t`` as a task view shows them."""
    return shown({"params": t.params, "body": t.body, "content_type": t.content_type,
                  "headers": t.headers})


def shown(d: Any) -> dict[str, Any]:
    """The request fields of a view ``d`` (ours or a peer's, so untrusted), well typed,
    redacted and cut; a field that does not fit is left empty."""
    if not isinstance(d, dict):
        d = {}
    params = d.get("params")
    headers = d.get("headers")
    body = d.get("body")
    ctype = d.get("content_type")
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        headers = {}
    out: dict[str, Any] = {
        "params": params if isinstance(params, dict) else {},
        "headers": redact_headers(headers),
        "content_type": ctype if isinstance(ctype, str) else None,
        "body": None, "body_chars": 0,
    }
    if isinstance(body, str):
        out["body_chars"] = d.get("body_chars") if type(d.get("body_chars")) is int \
            and d["body_chars"] >= len(body) else len(body)
        out["body"] = body[:BODY_CHARS]
    return out
