"""The primitive checks of an enqueue request's values, and the error they raise.

Both the task fields (``validate``) and the dispatch fields (``fields``) read numbers
the same way: form values arrive as strings, JSON ones as numbers, and a boolean is
never a number. Kept below both so the arrows point one way.
"""

from __future__ import annotations

import math
import re
from typing import Any

# W3C Trace Context's traceparent: version-trace_id-parent_id-flags, lower-case hex
_TRACEPARENT_RE = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


class ValidationError(ValueError):
    """A bad request; ``field`` names the culprit, ``status`` is the HTTP answer."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


def number(field: str, value: Any) -> float:
    """A finite number, from a JSON number or a form string."""
    if isinstance(value, bool):
        raise ValidationError(field, "must be a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValidationError(field, "must be a number") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationError(field, "must be a finite number")
    return float(value)


def integer(field: str, value: Any, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]``, from a JSON number (``3.0`` too) or a form string."""
    if isinstance(value, bool):
        raise ValidationError(field, "must be an integer")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValidationError(field, "must be an integer") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ValidationError(field, "must be an integer")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}")
    return value


MAX_AUDIENCE = 2083  # an OIDC audience: a URL as long as a target's at most


def is_audience(value: Any) -> bool:
    """An OIDC token's audience (aud): 1-2083 printable ASCII characters without spaces,
    usually the target's URL (config.values.audience holds a queue's to the same rule)."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_AUDIENCE and value.isascii()
            and value.isprintable() and " " not in value)


def audience(field: str, value: Any) -> str:
    if not is_audience(value):
        raise ValidationError(field, f"must be 1-{MAX_AUDIENCE} printable ASCII characters "
                                     "without spaces (usually the target's URL)")
    return value


def is_traceparent(value: Any) -> bool:
    """A W3C ``traceparent`` (version 00's 55 characters; version ff and all-zero ids are
    invalid), as kept with a task and sent on each attempt."""
    return isinstance(value, str) and _TRACEPARENT_RE.fullmatch(value) is not None


def traceparent(field: str, value: Any) -> str:
    if not is_traceparent(value):
        raise ValidationError(field, "must be a W3C traceparent: 00-<32 hex trace id>-"
                                     "<16 hex parent id>-<2 hex flags>, lower case")
    return value
