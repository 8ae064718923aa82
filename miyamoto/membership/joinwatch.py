"""When a joining node that hears nothing says so: a pure decision, clock passed in.

A joiner sends JOIN to its seeds every ``join_retry`` and waits; a seed that is not
there, an HTTP port given as a seed, or a peer with another key pair all look the same
from here: silence (ZeroMQ retries the connection, or drops the handshake, without a
word). So silence itself is the news: after ``first`` seconds of it, and then every
``every`` seconds while it lasts, ``check`` returns an ``Unanswered`` for the I/O layer
to log with the seeds and the likely causes. Any membership message heard (a seed's
REDIRECT, a fellow joiner's JOIN, a roster) ends the silence; so does leaving the
joining role. A healthy join answers within a second, so it never warns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

FIRST = 5.0  # s of silence before the first warning
EVERY = 5.0  # s between warnings while the silence lasts


@dataclass(frozen=True, slots=True)
class Unanswered:
    """No membership message heard for ``silent`` seconds while joining ``seeds``."""

    seeds: tuple[str, ...]
    silent: float


class JoinWatch:
    """Feed it ``heard(now)`` for every membership message and ``check(joining, now)`` as
    time passes; ``check`` says when to warn."""

    def __init__(self, seeds: Sequence[str], now: float, *, first: float = FIRST,
                 every: float = EVERY) -> None:
        self.seeds = tuple(seeds)
        self.first, self.every = first, every
        self._quiet_since = now
        self._warn_at = now + first

    def heard(self, now: float) -> None:
        self._quiet_since = now
        self._warn_at = now + self.first

    def check(self, joining: bool, now: float) -> Unanswered | None:
        if not joining or not self.seeds:
            self.heard(now)
            return None
        if now < self._warn_at:
            return None
        self._warn_at = now + self.every
        return Unanswered(self.seeds, now - self._quiet_since)
