"""Browsing tasks a page at a time: by state, with filters (queue, target, name prefix,
label, a range of the page key's time),
under a cursor, on one node and merged over the cluster.

A page is ordered by a key (time, task id): a live task's fire time, next first; an
ended one's end time, latest first. The cursor is the last key a page covered, so a
page is a range read of the journal's indexes from it. Each node reads at most
SCAN_ROWS rows per page (``Journal.browse``) and filters them here: a filter no row
matches does not turn into a scan of 10 M pending copies, it returns a short page and
a cursor further on. Only first copies are listed (one row per task; a task whose
first copy's node is down is missing until it is back).

The cluster's page merges every node's: all keys up to the nearest node's frontier
(the last key it read) are complete, so the page stops there, and ``next_cursor`` is
where the next page starts (None: every node has read to its end).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

import ujson

from miyamoto.tasks import labels
from miyamoto.tasks.task import QUEUE_NAME_RE, State, Task

SCAN_ROWS = 2000  # rows one node reads for one page, whatever the filters leave
MAX_LIMIT = 500
_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
Key = tuple[float, str]


@dataclass(frozen=True, slots=True)
class Filter:
    state: State
    queue: str | None = None
    target: str | None = None  # a prefix of the task's URL (an origin, a path)
    name_prefix: str | None = None
    label: tuple[str, str] | None = None  # (key, value): the journal's labels index
    since: float | None = None  # the page key's time (next fire, or end) at or after
    until: float | None = None  # ... and before

    def keeps_raw(self, replica: int, data: str) -> bool:
        """Whether a journal row may match, from its replica and its record's JSON
        (``store.rows``: ujson, so a field reads ``"url":"..."``), before decoding it."""
        if replica != 0:
            return False
        if "\\/" in data:  # a row written with escaped slashes: decode it and see
            return True
        return (self.target is None or f'"url":{_json_prefix(self.target)}' in data) and \
            (self.name_prefix is None or f'"name":{_json_prefix(self.name_prefix)}' in data)

    def keeps(self, t: Task) -> bool:
        return t.replica == 0 and t.state == self.state and \
            (self.target is None or t.url.startswith(self.target)) and \
            (self.name_prefix is None or (t.name or "").startswith(self.name_prefix)) and \
            (self.queue is None or t.queue == self.queue) and \
            (self.label is None or t.labels.get(self.label[0]) == self.label[1])

    def in_range(self, at: float) -> bool:
        return (self.since is None or at >= self.since) and \
            (self.until is None or at < self.until)

    @property
    def descending(self) -> bool:
        return self.state.ended

    def payload(self) -> dict[str, Any]:
        return {"state": self.state.value, "queue": self.queue, "target": self.target,
                "name_prefix": self.name_prefix,
                "label": list(self.label) if self.label is not None else None,
                "since": self.since, "until": self.until}


@dataclass(frozen=True, slots=True)
class Page:
    items: list[tuple[Key, dict[str, Any]]]  # (key, task summary), in the page's order
    frontier: Key | None  # the last key read; None: read to the end


def local_page(rows: list[tuple[float, Task]], last: Key | None, flt: Filter,
               limit: int) -> Page:
    """One node's page from the rows it read; ``last`` is the key of the last row read
    (decoded or not), None if it read to the end."""
    items: list[tuple[Key, dict[str, Any]]] = []
    for at, t in rows:
        if flt.keeps(t) and flt.in_range(at):
            items.append(((at, t.id), t.summary()))
            if len(items) == limit:
                return Page(items, (at, t.id))
    return Page(items, last)


def merge(pages: Iterable[Page], limit: int, descending: bool) -> tuple[list[dict], Key | None]:
    """The cluster's page: each task once, up to the nearest frontier, at most ``limit``."""
    seen: dict[str, tuple[Key, dict[str, Any]]] = {}
    frontiers: list[Key] = []
    for p in pages:
        if p.frontier is not None:
            frontiers.append(p.frontier)
        for key, s in p.items:
            seen.setdefault(key[1], (key, s))
    items = sorted(seen.values(), key=lambda kv: kv[0], reverse=descending)
    cutoff = (max(frontiers) if descending else min(frontiers)) if frontiers else None
    if cutoff is not None:
        items = [kv for kv in items if (kv[0] >= cutoff if descending else kv[0] <= cutoff)]
    if len(items) > limit:
        return [s for _, s in items[:limit]], items[limit - 1][0]
    return [s for _, s in items], cutoff


def encode_cursor(key: Key | None) -> str | None:
    return None if key is None else f"{key[0]!r}~{key[1]}"


def decode_cursor(text: str) -> Key | None:
    """The key of a ``next_cursor``; None if it is not one."""
    at, sep, task_id = text.partition("~")
    if not sep or not _ID_RE.fullmatch(task_id):
        return None
    try:
        t = float(at)
    except ValueError:
        return None
    return (t, task_id) if t == t and abs(t) < 1e12 else None


def page_of(d: Any) -> Page | None:
    """A peer's page, checked (its bytes are untrusted); None if it does not fit."""
    if not isinstance(d, dict) or not isinstance(d.get("items"), list):
        return None
    frontier = key_of(d.get("frontier")) if d.get("frontier") is not None else None
    if d.get("frontier") is not None and frontier is None:
        return None
    items = []
    for it in d["items"][:MAX_LIMIT]:
        if isinstance(it, list) and len(it) == 2 and isinstance(it[1], dict):
            key = key_of(it[0])
            if key is not None and it[1].get("id") == key[1]:
                items.append((key, it[1]))
    return Page(items, frontier)


def page_payload(p: Page) -> dict[str, Any]:
    return {"items": [[list(k), s] for k, s in p.items],
            "frontier": list(p.frontier) if p.frontier is not None else None}


def filter_of(d: Any) -> Filter | None:
    """A peer's filter, checked; None if it does not fit."""
    if not isinstance(d, dict):
        return None
    try:
        state = State(d.get("state"))
    except ValueError:
        return None
    queue, target, prefix = d.get("queue"), d.get("target"), d.get("name_prefix")
    if queue is not None and not (isinstance(queue, str) and QUEUE_NAME_RE.fullmatch(queue)):
        return None
    for v in (target, prefix):
        if v is not None and not (isinstance(v, str) and 0 < len(v) <= 2083):
            return None
    label = d.get("label")
    if label is not None:
        if not (isinstance(label, list) and len(label) == 2 and all(
                isinstance(x, str) for x in label)):
            return None
        try:
            label = labels.label_filter(f"{label[0]}={label[1]}")
        except ValueError:
            return None
    times = [d.get("since"), d.get("until")]
    if any(v is not None and (type(v) not in (int, float) or not abs(v) < 1e12)
           for v in times):
        return None
    return Filter(state, queue, target, prefix, label, *times)


@lru_cache(maxsize=64)
def _json_prefix(text: str) -> str:
    """``text`` as the journal's rows spell a string that starts with it (open quote)."""
    return ujson.dumps(text, escape_forward_slashes=False)[:-1]


def key_of(v: Any) -> Key | None:
    if isinstance(v, list) and len(v) == 2 and type(v[0]) in (int, float) \
            and isinstance(v[1], str) and _ID_RE.fullmatch(v[1]):
        return (float(v[0]), v[1])
    return None
