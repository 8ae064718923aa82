"""The election this node runs: its timeout, its rounds (pre-vote, then vote), who said yes.

``Membership`` owns one ``Campaign``: the machine decides when to campaign and whom to
believe (term, vote and role are the node's, in ``miyamoto.membership.machine``, whose
docstring states the rules: Election); this object only keeps the election's own
state, so that each rule reads as one call. Like ``miyamoto.membership.bootstrap``
(the seed-set election) it is pure: no clock, socket or global random, and its
randomness is the node's ``random.Random``.
"""

from __future__ import annotations

import random
from typing import Iterable

from miyamoto.membership.roster import Member, Timing


class Campaign:
    """Votes asked and counted, and the election timers of one node."""

    def __init__(self, timing: Timing, rng: random.Random):
        self._t = timing
        self._rng = rng
        self.timeout_at = float("inf")  # hear no leader until then: campaign
        self.resend_at = float("inf")  # next resend of unanswered vote requests
        self.transfer = False  # this election is a handover from the old leader
        self._votes: set[str] = set()
        self._prevotes: set[str] | None = None  # pre-vote under way: who would vote for us

    @property
    def pre(self) -> bool:
        """A pre-vote is under way (Raft thesis §9.6): no term was bumped for it."""
        return self._prevotes is not None

    def reset_timeout(self, now: float) -> None:
        """A random election timeout from now (Raft's, to keep candidates apart)."""
        self.timeout_at = now + self._rng.uniform(self._t.election_timeout_min,
                                                  self._t.election_timeout_max)

    def start_pre(self, me: str) -> None:
        self._prevotes = {me}

    def start(self, me: str, transfer: bool) -> int:
        """A real election for the next term, our own vote counted: the votes so far."""
        self._prevotes = None
        self._votes = {me}
        self.transfer = transfer
        return len(self._votes)

    def drop_pre(self) -> None:
        """No pre-vote any more (we back another candidate, or a leader is heard)."""
        self._prevotes = None

    def clear(self) -> None:
        """Whatever we were asking for is moot (a stall, or a rejoin)."""
        self._votes.clear()
        self._prevotes = None

    def add(self, voter: str, pre: bool) -> int:
        """Count a granted vote of the round under way: that round's votes so far."""
        if pre:
            assert self._prevotes is not None
            self._prevotes.add(voter)
            return len(self._prevotes)
        self._votes.add(voter)
        return len(self._votes)

    def unasked(self, members: Iterable[Member]) -> list[Member]:
        """The members not yet for us in the round under way (the pre-vote if one is)."""
        have = self._votes if self._prevotes is None else self._prevotes
        return [m for m in members if m.id not in have]
