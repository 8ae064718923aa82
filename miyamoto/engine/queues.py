"""Which queues a node holds: the declared ones, and those enqueues made, bounded.

Found by trying it: an enqueue-scope token made 10,000 queues by naming them, and they
stayed; GET /queues took 0.5-0.9 s (3.4 MB, the dashboard polls it every 2 s) and
/metrics up to 0.5 s. So a queue exists only if the config declares it (``[queue:NAME]``)
or an enqueue created it while ``auto_create_queues`` is on, and at most ``max_queues``
exist (declared ones included): the enqueue that would make one more is refused, 400
naming ``queue``. A 400 and not a 429: waiting does not help (a queue expires only
after ``queue_idle_expiry``); the operator declares the queue or raises the cap.

A queue made through the API (``PUT /queues/<name>``, a cluster-wide definition) exists on
every node like a declared one, whatever ``auto_create_queues`` says: the admin who made it
is the authority; the PUT is refused past ``max_queues`` like an enqueue. Once its
settings are deleted it is an ordinary queue again (kept while it holds tasks).

What a sibling stores here, a schedule's tick, a reload from the journal or a pause
from another node is ``note``d without the cap: the node that took the enqueue judged
it, and a copy must never be refused for a name.

An auto-created queue that holds nothing (the caller says which are busy: live or
failed copies, a paused flag, a delivery in flight) and had no enqueue for
``queue_idle_expiry`` seconds is forgotten by ``expire``; declared queues never are.
Nothing here has a clock: ``now`` is passed in.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from miyamoto.tasks.checks import ValidationError

FIELD = "queue"


class Queues:
    def __init__(self, declared: Iterable[str], max_queues: int, auto_create: bool,
                 idle_expiry: float):
        self.declared = frozenset(declared)
        self.max_queues = max_queues
        self.auto_create = auto_create
        self.idle_expiry = idle_expiry
        self._last: dict[str, float] = {}  # an auto-created queue -> its last enqueue
        self.defined: frozenset[str] = frozenset()  # made through the API
        self._sorted: list[str] = sorted(self.declared)  # every name, for paging

    def __len__(self) -> int:
        return len(self._sorted)

    def __contains__(self, name: object) -> bool:
        return name in self.declared or name in self.defined or name in self._last

    def admit(self, name: str, now: float) -> None:
        """An enqueue to ``name``: creates it if it may, else ValidationError (400)."""
        if name in self:
            self.note(name, now)
            return
        if not self.auto_create:
            raise ValidationError(FIELD, f"names no queue ({name!r}): auto_create_queues is "
                                  "off, so only the queues the config declares or a PUT "
                                  "/queues/<name> made take tasks")
        if len(self) >= self.max_queues:
            raise ValidationError(FIELD, f"names no queue ({name!r}), and this node holds "
                                  f"max_queues ({self.max_queues}) already: use one of them, "
                                  "or ask the operator to declare it or raise max_queues")
        self.note(name, now)

    def room_for(self, name: str) -> None:
        """May a PUT make ``name``? ValidationError (400) past ``max_queues``."""
        if name not in self and len(self) >= self.max_queues:
            raise ValidationError(FIELD, f"names no queue ({name!r}), and this node holds "
                                  f"max_queues ({self.max_queues}) already: delete one or "
                                  "ask the operator to raise max_queues")

    def define(self, names: Iterable[str], now: float) -> None:
        """The queues made through the API are ``names`` now; one no longer named is an
        ordinary queue again (auto-created: it expires once idle and empty)."""
        names = frozenset(names) - self.declared
        for name in self.defined - names:
            self._last[name] = now
        for name in names - self.defined:
            if self._last.pop(name, None) is None:
                bisect.insort(self._sorted, name)
        self.defined = names

    def note(self, name: str, now: float) -> None:
        """``name`` is in use (a copy stored, a pause): known from now on, its idle time
        restarted. No cap: see the module's docstring."""
        if name in self.declared or name in self.defined:
            return
        if name not in self._last:
            bisect.insort(self._sorted, name)
        self._last[name] = now

    def expire(self, now: float, busy: Iterable[str]) -> list[str]:
        """Forget the auto-created queues idle for ``idle_expiry`` that are not ``busy``;
        returns their names."""
        if self.idle_expiry <= 0:
            return []
        keep = set(busy)
        gone = [n for n, t in self._last.items() if now - t >= self.idle_expiry and n not in keep]
        for name in gone:
            del self._last[name]
        if gone:
            dropped = set(gone)
            self._sorted = [n for n in self._sorted if n not in dropped]
        return gone

    def names(self) -> list[str]:
        """Every queue held, in order."""
        return list(self._sorted)


def page(names: list[str], limit: int, after: str = "") -> tuple[list[str], str | None]:
    """Up to ``limit`` of the sorted ``names`` after ``after``, and the cursor of the next
    page (None: that was the last): GET /queues?limit=&cursor=."""
    start = bisect.bisect_right(names, after) if after else 0
    out = names[start:start + limit]
    more = start + limit < len(names)
    return out, (out[-1] if more and out else None)
