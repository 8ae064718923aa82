"""A task's labels: a few ``key=value`` pairs to find it by (GET /tasks?label=k=v).

Bounded, so a task's record and the journal's label index stay small: at most
MAX_LABELS pairs, a key 1-64 characters of ``[a-z0-9_.-]``, a value at most 256
characters. Two edges read them, as ``options``: an enqueue (``parse``: a
ValidationError naming the field; JSON an object, a form ``task.labels=k=v,k2=v2``)
and a stored or replicated copy (``check_decoded``: a DecodeError).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError
from miyamoto.wire.verbs import DecodeError

MAX_LABELS = 10
MAX_VALUE = 256
KEY_RE = re.compile(r"[a-z0-9_.-]{1,64}")


def parse(fields: Mapping[str, Any]) -> dict[str, str]:
    """The ``labels`` of an enqueue request; {} if none."""
    value = fields.get("labels")
    if value is None:
        return {}
    if isinstance(value, str):  # a form's k=v,k2=v2
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise ValidationError("labels", "must be key=value pairs, as a=1,b=2")
        value = {k.strip(): v for k, _, v in pairs}
    if not isinstance(value, dict):
        raise ValidationError("labels", "must be an object of key: value strings")
    if len(value) > MAX_LABELS:
        raise ValidationError("labels", f"has more than {MAX_LABELS} pairs")
    for k, v in value.items():
        if not KEY_RE.fullmatch(k):
            raise ValidationError(f"labels.{k[:64]}", "a key is 1-64 characters of "
                                                      "a-z, 0-9, _ . -")
        if not isinstance(v, str) or len(v) > MAX_VALUE:
            raise ValidationError(f"labels.{k}", f"must be a string of at most {MAX_VALUE} "
                                                 "characters")
    return dict(value)


def label_filter(text: str) -> tuple[str, str]:
    """``k=v`` of GET /tasks?label=, as (key, value); ValueError saying why."""
    k, sep, v = text.partition("=")
    if not sep or not KEY_RE.fullmatch(k) or len(v) > MAX_VALUE:
        raise ValueError("must be key=value, a key of 1-64 characters of a-z, 0-9, _ . -")
    return k, v


def check_decoded(kwargs: dict[str, Any]) -> None:
    """A peer's (or the journal's) labels, checked."""
    value = kwargs.get("labels")
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_LABELS or not all(
            isinstance(k, str) and KEY_RE.fullmatch(k) and isinstance(v, str)
            and len(v) <= MAX_VALUE for k, v in value.items()):
        raise DecodeError("task labels are not a few short key=value pairs")
