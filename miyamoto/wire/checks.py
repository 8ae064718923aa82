"""Field checks for a peer's payloads: one place, one set of limits.

A peer's bytes are untrusted input. Every cluster message (membership, siblings,
requests) reads its fields through these functions, which raise ``DecodeError`` naming
the field; the transport's caller logs and drops the message. Limits are chosen so that
every value round-trips through any JSON reader (integers below 2^53) and no peer can
make us hold a huge string or list.
"""

from __future__ import annotations

import math
from typing import Any

from miyamoto.wire.verbs import DecodeError

MAX_INT = 2**53 - 1  # the largest integer every JSON reader keeps exactly
MAX_NAME = 512       # ids, addresses, incarnations, request ids
MAX_MEMBERS = 1024   # members of a roster, replicas of a task


def integer(d: dict, key: str, lo: int = 0, hi: int = MAX_INT) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise DecodeError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def number(d: dict, key: str) -> float:
    v = d.get(key)
    if type(v) not in (int, float) or not math.isfinite(v):
        raise DecodeError(f"{key} must be a finite number")
    return float(v)


def string(d: dict, key: str, max_len: int = MAX_NAME) -> str:
    v = d.get(key)
    if type(v) is not str or not 0 < len(v) <= max_len:
        raise DecodeError(f"{key} must be a non-empty string of at most {max_len} characters")
    return v


def opt_string(d: dict, key: str, max_len: int = MAX_NAME) -> str | None:
    return None if d.get(key) is None else string(d, key, max_len)


def boolean(d: dict, key: str, default: bool | None = None) -> bool:
    v = d.get(key, default)
    if type(v) is not bool:
        raise DecodeError(f"{key} must be a boolean")
    return v


def obj(d: dict, key: str) -> dict:
    v = d.get(key)
    if not isinstance(v, dict):
        raise DecodeError(f"{key} must be an object")
    return v


def opt_obj(d: dict, key: str) -> dict | None:
    return None if d.get(key) is None else obj(d, key)


def str_list(d: dict, key: str, max_items: int = MAX_MEMBERS) -> tuple[str, ...]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) > max_items:
        raise DecodeError(f"{key} must be a list of at most {max_items} items")
    if not all(type(s) is str and 0 < len(s) <= MAX_NAME for s in v):
        raise DecodeError(f"{key} must hold non-empty strings")
    return tuple(v)


def payload_list(d: dict, key: str, max_items: int) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) > max_items:
        raise DecodeError(f"{key} must be a list of at most {max_items} items")
    return v



MAX_ERROR = 200  # characters of an attempt's error text (task.HISTORY_ERROR_CHARS)


def opt_attempt(d: dict, key: str) -> dict | None:
    """One attempt of a task's history (start, duration, node, status, error), rebuilt
    from its checked fields only, so a peer cannot grow our records with extra keys."""
    v = d.get(key)
    if v is None:
        return None
    a = obj(d, key)
    status, node, error = a.get("status"), a.get("node"), a.get("error")
    if status is not None and (type(status) is not int or not 0 <= status <= 999):
        raise DecodeError(f"{key}.status must be an HTTP status or null")
    if type(node) is not str or len(node) > MAX_NAME:
        raise DecodeError(f"{key}.node must be a string of at most {MAX_NAME} characters")
    if error is not None and (type(error) is not str or len(error) > MAX_ERROR):
        raise DecodeError(f"{key}.error must be null or at most {MAX_ERROR} characters")
    if number(a, "duration") < 0:
        raise DecodeError(f"{key}.duration must not be negative")
    return {"start": number(a, "start"), "duration": number(a, "duration"), "node": node,
            "status": status, "error": error}


def attempt_list(v: Any, max_items: int) -> tuple[dict, ...]:
    """A task's history as stored or sent: the well-formed entries of the last
    ``max_items``. A bad entry is left out rather than refusing the whole task (its
    journal row must never be lost over its history)."""
    if not isinstance(v, list):
        raise DecodeError("task history is not a list")
    out = []
    for a in v[-max_items:]:
        try:
            out.append(opt_attempt({"a": a}, "a"))
        except DecodeError:
            continue
    return tuple(a for a in out if a is not None)
