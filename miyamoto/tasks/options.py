"""A task's lifetime fields: ``expires_at`` / ``ttl`` and ``retry_delays``, checked in one place.

Like ``fields`` (the dispatch fields), two edges read them: an enqueue request (``parse``:
a ``ValidationError`` naming the field) and a stored or replicated copy (``check_decoded``:
a peer's or the journal's bytes, a ``DecodeError``), with the same limits.

- ``expires_at`` (a unix time) or ``ttl`` (seconds from the enqueue; ``expires_at`` wins):
  no attempt starts after it; a copy still waiting then (not yet due, behind a paused
  queue, a rate limit, a breaker or a flow key, or for a retry) ends as ``expired``.
- ``retry_delays``: the seconds before each retry, instead of the queue's backoff
  (``[1, 10, 60]``: 1 s after the first failed attempt, 10 s after the second, then 60 s
  after each one that follows, until max_attempts run out). A ``Retry-After`` still wins.
- ``async`` / ``lease``: a long task. Its worker may answer ``202`` and report the outcome
  later at the attempt's completion URL; the task stays running until then, or until its
  lease (``lease`` seconds, LEASE_DEFAULT when only ``async`` is given, extendable by a
  heartbeat) runs out and the attempt counts as failed. Without them a 202 is a success,
  as it always was: a worker that answers 202 today keeps its meaning.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from miyamoto.tasks.checks import ValidationError, number
from miyamoto.wire.verbs import DecodeError

FIELDS = ("expires_at", "ttl", "retry_delays", "async", "lease")
RETRY_DELAYS_MAX = 20  # entries of a task's retry_delays
RETRY_DELAY_MAX = 30 * 86400.0  # seconds, each (the longest delay an enqueue may ask)
LEASE_DEFAULT = 300.0  # s: a long task's lease when it asks for ``async`` without one
LEASE_MAX = 7 * 86400.0  # s: the longest lease (and heartbeat extension) a task may hold
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


def parse(fields: Mapping[str, Any], eta: float, now: float, max_delay: float) -> dict[str, Any]:
    """The lifetime fields of an enqueue request (form values arrive as strings), as
    ``Task`` keyword arguments; only those given."""
    out: dict[str, Any] = {}
    at = _expires_at(fields, now, max_delay)
    if at is not None:
        if at <= eta:
            field = "expires_at" if fields.get("expires_at") is not None else "ttl"
            raise ValidationError(field, "ends before the task is due (its eta or countdown): "
                                         "it would never run")
        out["expires_at"] = at
    if fields.get("retry_delays") is not None:
        out["retry_delays"] = _retry_delays(fields["retry_delays"])
    lease = _lease(fields)
    if lease is not None:
        out["lease"] = lease
    return out


def _lease(fields: Mapping[str, Any]) -> float | None:
    """``lease`` (seconds) makes a task long; ``async: true`` does with the default lease."""
    flag = fields.get("async")
    if isinstance(flag, str) and flag.strip().lower() in _TRUE + _FALSE:
        flag = flag.strip().lower() in _TRUE
    if flag is not None and not isinstance(flag, bool):
        raise ValidationError("async", "must be true or false")
    if fields.get("lease") is None:
        return LEASE_DEFAULT if flag else None
    if flag is False:
        raise ValidationError("lease", "is given with async false: a lease is for async tasks")
    lease = number("lease", fields["lease"])
    if not 0 < lease <= LEASE_MAX:
        raise ValidationError("lease", f"must be in (0, {LEASE_MAX:g}] seconds (7 days)")
    return lease


def check_lease(lease: Any) -> bool:
    """Whether ``lease`` (a peer's, the journal's, a heartbeat's) is a lease in bounds."""
    return (isinstance(lease, (int, float)) and not isinstance(lease, bool)
            and 0 < lease <= LEASE_MAX)


def _expires_at(fields: Mapping[str, Any], now: float, max_delay: float) -> float | None:
    if fields.get("expires_at") is not None:
        at = number("expires_at", fields["expires_at"])
        if at > now + 2 * max_delay:
            raise ValidationError("expires_at", f"is more than {2 * max_delay:g} s in the future")
        if at <= now:
            raise ValidationError("expires_at", "is in the past: the task would never run")
        return at
    if fields.get("ttl") is not None:
        ttl = number("ttl", fields["ttl"])
        if not 0 < ttl <= 2 * max_delay:
            raise ValidationError("ttl", f"must be in (0, {2 * max_delay:g}] seconds")
        return now + ttl
    return None


def _retry_delays(value: Any) -> tuple[float, ...]:
    """A JSON list of seconds, or a form's comma-separated ``1,10,60``."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()] if value.strip() else []
    if not isinstance(value, list) or not value:
        raise ValidationError("retry_delays", "must be a non-empty list of seconds, "
                                              "as [1, 10, 60] (a form: 1,10,60)")
    if len(value) > RETRY_DELAYS_MAX:
        raise ValidationError("retry_delays", f"has more than {RETRY_DELAYS_MAX} delays")
    out = []
    for i, v in enumerate(value):
        d = number(f"retry_delays[{i}]", v)
        if not 0 <= d <= RETRY_DELAY_MAX:
            raise ValidationError(f"retry_delays[{i}]", f"must be in [0, {RETRY_DELAY_MAX:g}] "
                                                        "seconds")
        out.append(d)
    return tuple(out)


def check_decoded(kwargs: dict[str, Any]) -> None:
    """A peer's (or the journal's) expires_at and retry_delays, checked in place (the
    list becomes the record's tuple)."""
    at = kwargs.get("expires_at")
    if at is not None and not math.isfinite(at):
        raise DecodeError("task expires_at is not finite")
    if "retry_delays" in kwargs:
        delays = kwargs["retry_delays"]
        if len(delays) > RETRY_DELAYS_MAX or not all(
                isinstance(d, (int, float)) and not isinstance(d, bool)
                and 0 <= d <= RETRY_DELAY_MAX for d in delays):
            raise DecodeError("task retry_delays is not a short list of delays")
        kwargs["retry_delays"] = tuple(float(d) for d in delays)
    if kwargs.get("lease") is not None and not check_lease(kwargs["lease"]):
        raise DecodeError("task lease is out of range")
    if kwargs.get("accepted", 0) < 0:
        raise DecodeError("task accepted is below 0")


def next_delay(delays: tuple[float, ...], attempts: int) -> float:
    """Seconds before the retry after the ``attempts``-th failed attempt (1-based)."""
    return delays[min(attempts, len(delays)) - 1]
