"""The primitive checks of an enqueue request's values, and the error they raise.

Both the task fields (``validate``) and the dispatch fields (``fields``) read numbers
the same way: form values arrive as strings, JSON ones as numbers, and a boolean is
never a number. Kept below both so the arrows point one way.
"""

from __future__ import annotations

import math
from typing import Any


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
