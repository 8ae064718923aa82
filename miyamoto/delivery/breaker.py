"""Per-target circuit breakers: a dead target stops costing attempts, tokens and slots.

A target is an origin (``fairness.origin``: ``scheme://host:port``). After
``failures`` consecutive failed attempts the origin is *open*: its due tasks wait aside
in their ready lines (``fairness``), spending no attempt and no token, without holding
up the other targets of their queue. After ``cooldown`` seconds it is *half open*: one
probe delivery goes; its success closes the breaker, its failure reopens it with twice
the previous cooldown, at most ``MAX_COOLDOWN_FACTOR`` (10) times ``cooldown``, so a
target down for an hour costs a probe every 5 min (at the 30 s default), not one per
task per backoff, and one that comes back is found within that bound. The first
outcome heard while half open decides (an attempt started before the breaker opened may
be the one), so a few probes per cooldown at most.

What counts as a failure (``is_failure``): no HTTP answer (connection refused or reset,
timeout, a denied address), a 5xx, and a 429: a target that answers "too many requests"
asks every sender to back off, and the breaker is the origin-wide back-off (each task's
own retry honours ``Retry-After`` besides). Any other answer, a 4xx included, proves the
target alive: it resets the count (the task's own retry policy deals with the 4xx).

Per node: each node keeps its own breakers from its own attempts; no cluster traffic.
The table is a bounded LRU (``MAX_ORIGINS``) of the origins attempted recently, so a
stream of tasks to ever new hosts cannot grow it; an evicted origin starts closed.
Pure: no clock (``now`` is passed in), no socket, no greenlet.
"""

from __future__ import annotations

import collections
import enum
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_ORIGINS = 1000
MAX_COOLDOWN_FACTOR = 10.0


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


def is_failure(status: int | None) -> bool:
    """Whether an attempt's outcome counts against its target (None: no HTTP answer)."""
    return status is None or status >= 500 or status == 429


@dataclass
class Breaker:
    """One origin's state; ``failures`` counts consecutive failed attempts."""

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    retry_at: float | None = None  # open: when the probe may go
    cooldown: float = 0.0  # the cooldown of the last opening
    probing: bool = False  # half open: the probe is in flight


class Breakers:
    """Every origin's breaker; ``threshold`` 0 disables them (every call allows)."""

    def __init__(self, threshold: int, cooldown: float, size: int = MAX_ORIGINS):
        self.threshold = threshold
        self.cooldown = cooldown
        self.max_cooldown = cooldown * MAX_COOLDOWN_FACTOR
        self.size = max(1, size)
        self.opens = 0  # times a breaker opened (or reopened): /metrics
        self._by_origin: collections.OrderedDict[str, Breaker] = collections.OrderedDict()

    def get(self, origin: str) -> Breaker | None:
        """The origin's breaker, if it has one (a look neither creates nor refreshes)."""
        return self._by_origin.get(origin)

    def items(self) -> list[tuple[str, Breaker]]:
        """The origins, most recently attempted last."""
        return list(self._by_origin.items())

    def blocked_until(self, origin: str, now: float) -> float | None:
        """None if a delivery to ``origin`` may start now; else when to look again (an
        open breaker's ``retry_at``, or ``inf``: a probe is in flight, its end wakes)."""
        b = self._by_origin.get(origin)
        if b is None or b.state is BreakerState.CLOSED:
            return None
        if b.state is BreakerState.OPEN:
            if b.retry_at is not None and now < b.retry_at:
                return b.retry_at
            b.state, b.probing = BreakerState.HALF_OPEN, False
            log.info("breaker %s: half open after %.3g s, one probe may go", origin, b.cooldown)
        return float("inf") if b.probing else None

    def started(self, origin: str) -> bool:
        """A delivery to ``origin`` starts (after ``blocked_until`` said None); True if it
        is the half-open probe (the caller hands that to ``ended``)."""
        b = self._by_origin.get(origin)
        if b is not None and b.state is BreakerState.HALF_OPEN and not b.probing:
            b.probing = True
            return True
        return False

    def ended(self, origin: str) -> None:
        """The probe's delivery ended. If it recorded no outcome (the copy did not go:
        held, moved, ended meanwhile), another probe may go."""
        b = self._by_origin.get(origin)
        if b is not None and b.state is BreakerState.HALF_OPEN:
            b.probing = False

    def record(self, origin: str, failed: bool, now: float) -> None:
        """An attempt to ``origin`` ended: ``failed`` per ``is_failure``."""
        if self.threshold <= 0:
            return
        b = self._touch(origin)
        if not failed:
            if b.state is not BreakerState.CLOSED:
                log.info("breaker %s: closed, the target answered", origin)
            b.state, b.failures, b.retry_at, b.cooldown, b.probing = \
                BreakerState.CLOSED, 0, None, 0.0, False
            return
        b.failures += 1
        if b.state is BreakerState.HALF_OPEN:  # the probe failed: longer next time
            self._open(origin, b, min(self.max_cooldown, max(b.cooldown, self.cooldown) * 2), now)
        elif b.state is BreakerState.CLOSED and b.failures >= self.threshold:
            self._open(origin, b, self.cooldown, now)
        # open: attempts started before it opened end as failures; they change nothing

    def _open(self, origin: str, b: Breaker, cooldown: float, now: float) -> None:
        b.state, b.cooldown, b.retry_at, b.probing = BreakerState.OPEN, cooldown, now + cooldown, False
        self.opens += 1
        log.warning("breaker %s: open for %.3g s after %d consecutive failed attempts",
                    origin, cooldown, b.failures)

    def _touch(self, origin: str) -> Breaker:
        b = self._by_origin.get(origin)
        if b is None:
            b = self._by_origin[origin] = Breaker()
            while len(self._by_origin) > self.size:
                self._by_origin.popitem(last=False)
        else:
            self._by_origin.move_to_end(origin)
        return b
