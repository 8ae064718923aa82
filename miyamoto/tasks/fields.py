"""A task's dispatch fields: ``priority``, the flow-control key and the ordering key,
checked in one place.

Two edges read them: an enqueue request (``parse``: a ``ValidationError`` naming the
field, answered 400) and a stored or replicated copy (``check_decoded``: a peer's or the
journal's bytes, a ``DecodeError``). The limits are the same on both, so a copy one node
accepted is never refused by its sibling.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError, integer, number
from miyamoto.wire.verbs import DecodeError

FIELDS = ("priority", "flow_key", "flow_rate", "flow_parallelism", "ordering_key")
PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = 0, 9, 5
MAX_FLOW_KEY = 200
MAX_FLOW_RATE = 1_000_000.0  # tasks/s: beyond it a limit means nothing
MAX_FLOW_PARALLELISM = 100_000
MAX_ORDERING_KEY = 200
# printable: no control characters (C0, DEL, C1), as it is shown in views and logs
_ORDERING_RE = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,%d}" % MAX_ORDERING_KEY)
_KEY_RE = re.compile(r"[^\x00-\x1f\x7f]{1,%d}" % MAX_FLOW_KEY)  # like a task name


def parse(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The dispatch fields of an enqueue request (form values arrive as strings), as
    ``Task`` keyword arguments; only those given, so defaults stay defaults."""
    out: dict[str, Any] = {}
    if fields.get("priority") is not None:
        out["priority"] = integer("priority", fields["priority"], PRIORITY_MIN, PRIORITY_MAX)
    key = fields.get("flow_key")
    if key is not None:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValidationError("flow_key", f"must be 1-{MAX_FLOW_KEY} characters without "
                                              "control characters")
        out["flow_key"] = key
    if fields.get("flow_rate") is not None:
        rate = number("flow_rate", fields["flow_rate"])
        if not 0 < rate <= MAX_FLOW_RATE:
            raise ValidationError("flow_rate", f"must be in (0, {MAX_FLOW_RATE:g}] tasks/s")
        out["flow_rate"] = rate
    if fields.get("flow_parallelism") is not None:
        out["flow_parallelism"] = integer("flow_parallelism", fields["flow_parallelism"], 1,
                                           MAX_FLOW_PARALLELISM)
    for name in ("flow_rate", "flow_parallelism"):
        if name in out and key is None:
            raise ValidationError(name, "goes with flow_key")
    ordering = fields.get("ordering_key")
    if ordering is not None:
        if not isinstance(ordering, str) or not _ORDERING_RE.fullmatch(ordering) \
                or ordering != ordering.strip():
            raise ValidationError("ordering_key", f"must be 1-{MAX_ORDERING_KEY} printable "
                                                  "characters, without control characters "
                                                  "or surrounding spaces")
        out["ordering_key"] = ordering
    return out


def check_decoded(d: dict[str, Any]) -> None:
    """The same limits on a decoded copy (types are checked by ``Task.decode``)."""
    p = d.get("priority", PRIORITY_DEFAULT)
    if not PRIORITY_MIN <= p <= PRIORITY_MAX:
        raise DecodeError("task priority is out of range")
    key = d.get("flow_key")
    if key is not None and not _KEY_RE.fullmatch(key):
        raise DecodeError("task flow_key is malformed")
    rate, par = d.get("flow_rate"), d.get("flow_parallelism")
    if rate is not None and not 0 < rate <= MAX_FLOW_RATE:
        raise DecodeError("task flow_rate is out of range")
    if par is not None and not 1 <= par <= MAX_FLOW_PARALLELISM:
        raise DecodeError("task flow_parallelism is out of range")
    if key is None and (rate is not None or par is not None):
        raise DecodeError("task flow limits without a flow_key")
    ordering = d.get("ordering_key")
    if ordering is not None and not _ORDERING_RE.fullmatch(ordering):
        raise DecodeError("task ordering_key is malformed")
    if d.get("ordering_seq", 0) < 0 or (d.get("ordering_seq") and ordering is None):
        raise DecodeError("task ordering_seq is out of place")
