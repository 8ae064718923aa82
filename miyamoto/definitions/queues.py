"""A queue's settings made through the API: a cluster-wide definition (kind "queue").

``PUT /queues/<name>`` stores, for that queue on every node, the fields it was given;
each overrides the config's value ([queue:NAME], else [queue:default], else the
built-in default) field by field. A PUT merges into what the API set before (the
leader merges, ``definitions.sync`` "merge", so two PUTs of different fields made on
two nodes at once both hold): a field given sets it, a field given as null drops the
API's value (back to the config's), a field left out keeps its value. So
``miyamoto queue set q rate=5`` does not undo an earlier ``burst=10``, and a PUT of
``{}`` makes the queue with the config's settings. ``DELETE /queues/<name>`` drops
every value the API set. A definition's value comes from a peer, so it is checked
again (``stored``) before a node uses it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from miyamoto.config.settings import QUEUE_MODES, QueueConfig
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.validate import MAX_ATTEMPTS, MAX_TIMEOUT

KIND = "queue"
DAY = 86400.0
# field -> (type, lowest, highest): the [queue:NAME] options (config.settings.QUEUE_FIELDS),
# bounded above so that no value a client sends makes a bucket, a limit or a backoff absurd
FIELDS: dict[str, tuple[type, float, float]] = {
    "rate": (float, 0.0, 1e6),                  # tasks/s, cluster-wide; 0: unlimited
    "burst": (int, 1, 1_000_000),
    "max_concurrent": (int, 0, 1_000_000),      # on one node; 0: half of concurrency
    "max_attempts": (int, 1, MAX_ATTEMPTS),
    "min_backoff": (float, 0.0, 30 * DAY),
    "max_backoff": (float, 0.0, 30 * DAY),
    "max_doublings": (int, 0, 64),
    "max_retry_duration": (float, 0.0, 365 * DAY),  # 0: no limit
    "timeout": (float, 0.01, MAX_TIMEOUT),
    "paused": (bool, 0, 1),
    "mode": (str, 0, 0),                        # one of CHOICES["mode"]
}
# the fields whose value is one of a few words
CHOICES: dict[str, tuple[str, ...]] = {"mode": QUEUE_MODES}
# where a value comes from; "control": paused by POST /queues/<name>/pause (or resume)
# against what the settings say, so on a queue without API settings (node.queue says)
SOURCES = ("api", "config", "default", "control")


def _value(name: str, v: Any) -> Any:
    kind, lo, hi = FIELDS[name]
    if kind is str:
        if v not in CHOICES[name]:
            raise ValidationError(name, "must be " + " or ".join(f'"{c}"' for c in CHOICES[name]))
        return v
    if kind is bool:
        if not isinstance(v, bool):
            raise ValidationError(name, "must be true or false")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValidationError(name, "must be a number" if kind is float else "must be an integer")
    if kind is int:
        if isinstance(v, float):
            if not v.is_integer():
                raise ValidationError(name, "must be an integer")
            v = int(v)
    elif not math.isfinite(v):
        raise ValidationError(name, "must be a finite number")
    if not lo <= v <= hi:
        shown = (int(lo), int(hi)) if kind is int else (lo, hi)
        raise ValidationError(name, f"must be between {shown[0]:g} and {shown[1]:g}")
    return kind(v)


def parse_put(data: Any) -> dict[str, Any]:
    """The changes a PUT body asks for (a field's checked value, or None to drop the
    API's value), or ValidationError naming the field."""
    if not isinstance(data, dict):
        raise ValidationError("body", "must be a JSON object of queue settings")
    unknown = sorted(k for k in data if k not in FIELDS)
    if unknown:
        raise ValidationError(unknown[0], "is not a queue setting: give "
                              + ", ".join(FIELDS))
    return {k: None if v is None else _value(k, v) for k, v in data.items()}


def merged(current: dict[str, Any] | None, changes: dict[str, Any]) -> dict[str, Any]:
    """What the API has set once ``changes`` are made (as the leader makes them)."""
    out = dict(current or {})
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def stored(value: Any) -> dict[str, Any]:
    """A definition's value, from this node's set (a peer's bytes): its fields checked
    again; ValidationError if one does not fit."""
    checked = parse_put(value)
    if any(v is None for v in checked.values()):
        raise ValidationError(next(k for k, v in checked.items() if v is None), "is null")
    return checked


def resolve(base: QueueConfig, api: dict[str, Any] | None) -> QueueConfig:
    """The queue's settings in effect: the config's, overridden by the API's."""
    return dataclasses.replace(base, **api) if api else base


def check(base: QueueConfig, api: dict[str, Any]) -> None:
    """Settings that contradict each other once combined with the config's (400)."""
    q = resolve(base, api)
    if q.max_backoff < q.min_backoff:
        field = "max_backoff" if "max_backoff" in api else "min_backoff"
        raise ValidationError(field, f"would make max_backoff ({q.max_backoff:g}) less "
                              f"than min_backoff ({q.min_backoff:g})")


def sources(base: QueueConfig, api: dict[str, Any] | None) -> dict[str, str]:
    """Where each setting's value comes from: "api" (PUT), "config" (the INI's
    [queue:NAME] or [queue:default]) or "default" (built in)."""
    api = api or {}
    return {k: "api" if k in api else "config" if k in base.given else "default"
            for k in FIELDS}
