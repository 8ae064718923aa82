"""Plain-text tables for the CLI's ``status`` and ``tasks`` (``--json`` gives the raw answer).

Pure functions from the API's JSON to lines, so the layout is tested without a node.
Columns are left-aligned and padded to their widest cell, like ``kubectl get``; values
a peer leaves out (an unknown clock offset) print as ``-``.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, Sequence

from miyamoto.cli.times import relative

STATES = ("scheduled", "running", "succeeded", "failed", "cancelled", "expired")
LAST_CHARS = 40  # an error message in the failed list's LAST column


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Aligned lines: the header, then one line per row."""
    cells = [list(header)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def status_lines(cluster: Mapping[str, Any], queues: Sequence[Mapping[str, Any]]) -> list[str]:
    """``miyamoto status``: who answered and who leads, the members, the queues' counts."""
    lines = [f"node {cluster.get('node')} ({cluster.get('role')}), leader {cluster.get('leader')}, "
             f"term {cluster.get('term')}, roster version {cluster.get('version')}", ""]
    lines += table(("MEMBER", "LEADER", "ZONE", "HTTP", "CLUSTER", "LAST HEARD", "CLOCK OFFSET"),
                   ([m.get("id"), "*" if m.get("leader") else "", m.get("zone"), m.get("http"),
                     m.get("cluster"), _seconds(m.get("last_heard")),
                     _seconds(m.get("clock_offset"), skewed=bool(m.get("clock_skewed")))]
                    for m in cluster.get("members", [])))
    lines.append("")
    lines += table(("QUEUE", "PAUSED", *(s.upper() for s in STATES), "COPIES"),
                   ([q.get("name"), "yes" if q.get("paused") else "no",
                     *((q.get("counts") or {}).get(s, 0) for s in STATES),
                     sum((q.get("copies") or {}).values())] for q in queues))
    return lines


def task_lines(tasks: Sequence[Mapping[str, Any]], now: float | None = None) -> list[str]:
    """``miyamoto tasks`` and ``browse``: one line per task, the time that matters for its
    state, its name and its ordering key."""
    now = time.time() if now is None else now
    return table(("ID", "STATE", "ATTEMPTS", "WHEN", "NAME", "KEY", "URL"),
                 ([t.get("id"), t.get("state"), t.get("attempts"),
                   _when(t.get("next_attempt") or t.get("finished"), now), t.get("name"),
                   t.get("ordering_key"), t.get("url")] for t in tasks))


def failed_lines(tasks: Sequence[Mapping[str, Any]], now: float | None = None) -> list[str]:
    """``miyamoto failed list``: when each task failed and what its last attempt got."""
    now = time.time() if now is None else now
    return table(("ID", "ATTEMPTS", "FAILED", "LAST", "NAME", "URL"),
                 ([t.get("id"), t.get("attempts"), _when(t.get("finished"), now),
                   _last(t.get("last_response")), t.get("name"), t.get("url")] for t in tasks))


def _last(last: Any) -> str:
    """``HTTP 500`` or the error, cut short: one cell of a table."""
    if not isinstance(last, Mapping):
        return "-"
    if last.get("status") is not None:
        return f"HTTP {last['status']}"
    error = str(last.get("error") or "-").splitlines()[0] if last.get("error") else "-"
    return error if len(error) <= LAST_CHARS else error[:LAST_CHARS - 3] + "..."


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _seconds(value: Any, skewed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.3f} s" + (" SKEWED" if skewed else "")


def _when(at: Any, now: float) -> str:
    """``in 5.0 s`` / ``3.2 s ago``: relative, as an operator reads it."""
    return relative(at, now)
