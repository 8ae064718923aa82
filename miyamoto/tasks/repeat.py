"""What a repeat of a named task does: ``on_duplicate`` and ``debounce``, decided purely.

A named task's repeat (the name is still reserved) is, by ``on_duplicate``:
- ``reject`` (the default): 409 with the first task's id, as before;
- ``keep``: 200 with the task already held, unchanged;
- ``replace``: the held task's params, body and eta become the repeat's, on every copy,
  while it has not started (a copy that has started refuses: 409 saying so).
``debounce`` (seconds) makes each repeat push the held task's eta back to
max(its eta, now + debounce), never past its first enqueue + ``debounce_max`` (default
``DEBOUNCE_MAX_FACTOR`` x debounce); with ``keep`` (debounce's default) only the eta moves.

Every copy converges on one version: the deciding node stamps a replace with a
``revision`` (its nanosecond clock, then the repeat's id: a total order), and a copy
applies only a revision greater than its own, so racing replaces sent to different
nodes leave every copy with the same winner (last writer wins), and a replace that
arrives twice or late changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError, number

FIELDS = ("on_duplicate", "debounce", "debounce_max")
MODES = ("reject", "replace", "keep")
DEBOUNCE_MAX_FACTOR = 10  # debounce_max's default, in debounces


@dataclass(frozen=True, slots=True)
class Repeat:
    on_duplicate: str = "reject"
    debounce: float | None = None
    debounce_max: float | None = None


REJECT = Repeat()


@dataclass(frozen=True, slots=True)
class Decision:
    """``keep``: answer with the held task; else ``changes`` (Task fields) and ``delay``
    (seconds from now of the new eta; None: the eta stays) go to every copy."""
    keep: bool
    changes: dict[str, Any]
    delay: float | None = None


def parse(fields: Mapping[str, Any], named: bool, max_delay: float) -> Repeat:
    """The repeat fields of an enqueue request; ValidationError naming the field."""
    if fields.keys().isdisjoint(FIELDS):  # (most requests: one C call)
        return REJECT
    given = [f for f in FIELDS if fields.get(f) is not None]
    if not given:
        return REJECT
    if not named:
        raise ValidationError(given[0], "needs a name (or an Idempotency-Key): only a "
                                        "named task has repeats")
    debounce = _seconds(fields, "debounce", max_delay)
    mode = fields.get("on_duplicate") or ("keep" if debounce is not None else "reject")
    if mode not in MODES:
        raise ValidationError("on_duplicate", f"must be one of {', '.join(MODES)}")
    most = _seconds(fields, "debounce_max", max_delay)
    if most is not None and debounce is None:
        raise ValidationError("debounce_max", "is given without debounce")
    if debounce is not None and mode == "reject":
        raise ValidationError("on_duplicate", "cannot be reject with debounce: a repeat "
                                              "that moves the eta is kept or replaces")
    if debounce is not None:
        most = min(max_delay, DEBOUNCE_MAX_FACTOR * debounce) if most is None else most
        if most < debounce:
            raise ValidationError("debounce_max", "is shorter than debounce")
    return Repeat(mode, debounce, most)


def _seconds(fields: Mapping[str, Any], field: str, max_delay: float) -> float | None:
    if fields.get(field) is None:
        return None
    v = number(field, fields[field])
    if not 0 < v <= max_delay:
        raise ValidationError(field, f"must be in (0, {max_delay:g}] seconds")
    return v


def decide(repeat: Repeat, held: Mapping[str, Any], new: Mapping[str, Any],
           now: float) -> Decision:
    """What a repeat does to the held task (its summary: ``eta``, ``created``, both on
    the clock of ``now``); ``new`` is the repeat's params, body, content_type and eta."""
    changes: dict[str, Any] = {}
    eta: float | None = None
    if repeat.on_duplicate == "replace":
        changes = {k: new.get(k) for k in ("params", "body", "content_type")}
        eta = float(new["eta"])
    if repeat.debounce is not None and repeat.debounce_max is not None:
        latest = float(held["created"]) + repeat.debounce_max
        eta = min(max(float(held["eta"]) if eta is None else eta, now + repeat.debounce),
                  latest)
        eta = max(eta, min(float(held["eta"]), latest))  # a repeat never pulls it forward
    if not changes and (eta is None or eta == float(held["eta"])):
        return Decision(True, {})
    return Decision(False, changes, None if eta is None else max(0.0, eta - now))


def stamp(now_ns: int, repeat_id: str) -> str:
    """A replace's revision: ordered by time, then by the repeat's id."""
    return f"{now_ns:020d}.{repeat_id}"


def newer(revision: str, than: str) -> bool:
    """Whether a copy at ``revision`` holds a later replace than one at ``than`` (""
    is a copy never replaced: older than any)."""
    return revision > than
