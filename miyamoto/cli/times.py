"""How the CLI shows and takes a time: RFC 3339 or relative, never a bare unix float.

The API speaks unix seconds (``eta``, ``next_attempt``, ...), which a program wants and a
person cannot read. The commands print the node's JSON with each such time as RFC 3339
in UTC (``2026-12-02T03:00:00.250Z``: still JSON, still sortable, and ``date -d`` reads
it); ``--raw`` prints the answer as the node gave it. Tables say how far off a time is
(``in 4.0 s``, ``3.2 s ago``). ``--eta`` takes either form. Pure functions, no clock read
unless the caller leaves ``now`` out.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

# the keys of the API's answers that hold a unix time (``duration``, ``last_heard`` and
# ``clock_offset`` are spans of seconds, not times)
TIME_KEYS = frozenset({"created", "eta", "fire_at", "next_attempt", "finished", "start", "at",
                       "retry_at", "last_tick", "next"})


def rfc3339(t: float) -> str:
    """``2026-12-02T03:00:00Z``, with milliseconds when the time has a fraction."""
    whole = math.floor(t)
    d = datetime.fromtimestamp(whole, timezone.utc)
    text = d.strftime("%Y-%m-%dT%H:%M:%S")
    ms = round((t - whole) * 1000)
    if ms == 1000:
        text, ms = datetime.fromtimestamp(whole + 1, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"), 0
    return f"{text}.{ms:03d}Z" if ms else f"{text}Z"


def relative(at: Any, now: float | None = None) -> str:
    """``in 5.0 s`` / ``3.2 s ago`` / ``in 2 h 5 min``: how an operator reads a time."""
    if not _is_time(at):
        return "-"
    now = time.time() if now is None else now
    delta = at - now
    span = abs(delta)
    if span < 60:
        text = f"{span:.1f} s"
    elif span < 3600:
        text = f"{int(span // 60)} min {int(span % 60)} s"
    elif span < 86400:
        text = f"{int(span // 3600)} h {int(span % 3600 // 60)} min"
    else:
        text = f"{int(span // 86400)} d {int(span % 86400 // 3600)} h"
    return f"in {text}" if delta >= 0 else f"{text} ago"


def readable(data: Any) -> Any:
    """The answer with every unix time under a TIME_KEYS key (or in a list under one, as
    a schedule's ``next``) shown as RFC 3339; everything else as it was."""
    if isinstance(data, dict):
        return {k: _shown(v) if k in TIME_KEYS else readable(v) for k, v in data.items()}
    if isinstance(data, list):
        return [readable(v) for v in data]
    return data


def parse_time(text: str) -> float:
    """``--eta``: unix seconds, or an RFC 3339 time (``2026-12-02T03:00:00Z``, an offset,
    or none: UTC). ValueError says what it takes."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither unix seconds nor an RFC 3339 time such as "
                         "2026-12-02T03:00:00Z") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


def _shown(value: Any) -> Any:
    if _is_time(value):
        return rfc3339(value)
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return readable(value)


_LAST = 253402300799.0  # 9999-12-31T23:59:59Z, the last second datetime can show


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 <= value <= _LAST
