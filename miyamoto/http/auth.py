"""Bearer tokens with scopes for the HTTP API (``api_tokens = SCOPE:TOKEN,...``).

Scopes, widest first: ``admin`` may do everything; ``enqueue`` may enqueue and read a
task by its id (ids are random, so that is "its tasks": the ones it was answered);
``read`` may use every GET route and ``/metrics``. ``/healthz`` and ``/readyz`` stay
open, so load balancers and probes need no secret; so do the dashboard's page and
assets (``/``, ``/dashboard/<file>``) and ``/openapi.json``, which hold no data (the
dashboard's script asks for a token).

A presented token is compared with every configured one, each through
``hmac.compare_digest`` of SHA-256 digests: the time taken does not depend on how much
of a token matched, nor on which entry matched, nor on the tokens' lengths. Tokens are
never logged or echoed; errors say only "missing", "not valid" or which scope is needed.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Iterable

from miyamoto.config.values import TOKEN_SCOPES

OPEN = "open"
ADMIN, ENQUEUE, READ = TOKEN_SCOPES  # widest first
TASK = "task"  # GET /tasks/<id>: read, and the enqueuer reading what it was answered

# what each scope may do, by the route's need
_GRANTS = {ADMIN: {ADMIN, ENQUEUE, READ, TASK, OPEN}, ENQUEUE: {ENQUEUE, TASK, OPEN},
           READ: {READ, TASK, OPEN}}
_WHO = {ADMIN: "admin", ENQUEUE: "enqueue or admin", READ: "read or admin",
        TASK: "read, enqueue or admin"}


class Denied(Exception):
    """401 (no valid token) or 403 (a valid token without the scope); says which."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Tokens:
    def __init__(self, tokens: Iterable[tuple[str, str]]):
        self._digests = [(scope, _digest(token)) for scope, token in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def scope_of(self, authorization: str | None) -> str | None:
        """The scope of the token in an ``Authorization: Bearer ...`` value, or None."""
        if not authorization:
            return None
        kind, _, token = authorization.strip().partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            return None
        presented = _digest(token.strip())
        found = None
        for scope, digest in self._digests:  # no early exit: every entry is compared
            if hmac.compare_digest(presented, digest) and found is None:
                found = scope
        return found

    def check(self, authorization: str | None, need: str) -> None:
        """Raise Denied unless the request may use a route that needs ``need``."""
        if not self._digests or need == OPEN:
            return
        scope = self.scope_of(authorization)
        if scope is None:
            why = "is missing" if not authorization else "is not a valid API token"
            raise Denied(401, f"Authorization: Bearer token {why}")
        if need not in _GRANTS[scope]:
            raise Denied(403, f"this token's scope ({scope}) does not allow this route "
                              f"(it needs {_WHO[need]})")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
