"""Bootstrap: how nodes started together (each seeded with all) form ONE cluster.

Pure, like the rest of membership: ``Membership`` feeds it what it hears and asks it
what to do; the term and the vote stay with ``Membership``.

The rule, and why:
    The seed set C0 is my address plus my seeds. A joining node that holds no roster,
    has heard of no leader for ``failure_timeout``, and has heard JOINs from enough of
    C0, runs a Raft election among the seed *addresses*: VOTE_REQUEST carries C0; a
    voter must hold no roster, have the same C0, and votes once per term. The candidate
    wins with the votes of a majority of C0 — counting only *first-start* nodes, whose
    vote cannot have been forgotten — or with the votes of every seed. Its first roster
    is itself plus its voters, with a quorum floor of majority(|C0|) that holds until
    its first membership change, which waits until that floor has acknowledged it.
    Why no split brain: two bootstrap winners, or a bootstrap winner and a roster
    leader of the same term, need overlapping majorities of C0, and each node votes
    once per term. Once the first roster is acknowledged by a majority of C0 those
    nodes hold a roster and refuse bootstrap votes, so no second cluster can start; a
    node that may have forgotten a roster (``first_start=False``, or a roster it gave
    up) is only counted when every seed agrees, i.e. when no seed holds a roster.
    One unreachable seed delays nothing as long as a majority of C0 is up. Nodes take
    turns, lowest address first, so that a unanimous vote is not split for ever.
"""

from __future__ import annotations

import logging
import random
from typing import Sequence

from miyamoto.membership.roster import Member, Roster, Timing, majority

log = logging.getLogger(__name__)


class Bootstrap:
    """The seed-set election of one joining node (see the module docstring)."""

    def __init__(self, me: Member, seeds: Sequence[str], timing: Timing,
                 rng: random.Random, now: float):
        self._me = me
        self._t = timing
        self._rng = rng
        self.seeds = tuple(sorted({s for s in seeds if s and s != me.cluster}))
        self.boot = tuple(sorted({*self.seeds, me.cluster}))  # the seed set C0
        self.evidence_at = float("-inf")  # last time someone told us of a leader
        # fellow joiners: seed address -> (heard at, fresh, term)
        self._peers: dict[str, tuple[float, bool, int]] = {}
        self.at = now + self._timeout()  # next bootstrap attempt
        # the election under way: seed address -> (member, incarnation, fresh)
        self._votes: dict[str, tuple[Member, str, bool]] | None = None
        self._skipped = 0  # turns let pass to lower-ranked seeds

    @property
    def running(self) -> bool:
        return self._votes is not None

    def _timeout(self) -> float:
        return self._rng.uniform(self._t.election_timeout_min, self._t.election_timeout_max)

    # ------------------------------------------------------------------ hearing
    def evidence(self, now: float) -> None:
        """Someone told us of a leader: a cluster exists, so do not start another."""
        self.evidence_at = now

    def forget_evidence(self) -> None:
        """The cluster we knew is gone (its roster can never reach quorum again)."""
        self.evidence_at = float("-inf")

    def heard_joiner(self, address: str, boot: tuple[str, ...], fresh: bool, term: int,
                     now: float) -> None:
        """A JOIN from a fellow joiner: bootstrap needs to know who is up."""
        if boot == self.boot:
            self._peers[address] = (now, fresh, term)

    def cancel(self) -> None:
        """This term has a leader, or we adopted a higher term: our election is over."""
        self._votes = None

    def restart(self, now: float) -> None:
        """We are joining (again): no election under way, the next attempt later."""
        self._votes = None
        self.at = now + self._timeout()

    # ------------------------------------------------------------------ electing
    def start(self, now: float, fresh: bool, inc: str, term: int) -> int | None:
        """The term of a bootstrap election to start now, or None if it is not our turn.

        Needs enough of the seed set up and rosterless, and no news of a leader within
        the failure timeout. The term is above every fellow joiner's, so that no vote
        is refused as stale. Our own vote is counted at once.
        """
        self.at = now + self._timeout()
        self._votes = None
        recent = {a: p for a, p in self._peers.items()
                  if now - p[0] <= self._t.failure_timeout and a in self.boot}
        heard = {a: p[1] for a, p in recent.items()}
        heard[self._me.cluster] = fresh
        if now - self.evidence_at <= self._t.failure_timeout or not self._can_win(heard):
            return None
        # Take turns, lowest address first, so that nodes started together do not split
        # the vote forever (a unanimous bootstrap fails if any seed votes for itself).
        rank = sorted(heard).index(self._me.cluster)
        if self._skipped < rank:
            self._skipped += 1
            return None
        self._skipped = 0
        self._votes = {self._me.cluster: (self._me, inc, fresh)}
        return max([term, *(p[2] for p in recent.values())]) + 1

    def unasked(self) -> list[str]:
        """Seed addresses whose vote we still need (resent until the election ends)."""
        if self._votes is None:
            return []
        return [a for a in self.seeds if a not in self._votes]

    def may_grant(self, boot: tuple[str, ...] | None, now: float) -> bool:
        """Whether to back a bootstrap candidate of this seed set (the term rule aside)."""
        return boot == self.boot and now - self.evidence_at > self._t.failure_timeout

    def granted(self, now: float) -> None:
        """We voted for another seed: give it time before our own attempt."""
        self.at = now + self._timeout()
        self._skipped = 0

    def vote(self, voter: Member, inc: str, fresh: bool, term: int) -> Roster | None:
        """Count a granted vote; the first roster if we have won."""
        if self._votes is None or voter.cluster not in self.boot:
            return None
        taken = {v[0].id for a, v in self._votes.items() if a != voter.cluster}
        if voter.id in taken:
            return None
        self._votes[voter.cluster] = (voter, inc, fresh)
        if not self._can_win({a: v[2] for a, v in self._votes.items()}):
            return None
        votes = list(self._votes.values())
        self._votes = None
        log.info("bootstrapped a cluster of %d in term %d", len(votes), term)
        return Roster(1, term, self._me.id, tuple(v[0] for v in votes),
                      tuple(v[1] for v in votes), majority(len(self.boot)))

    def _can_win(self, voters: dict[str, bool]) -> bool:
        """Bootstrap quorum: a majority of first-start seeds, or every seed."""
        return (sum(voters.values()) >= majority(len(self.boot))
                or len(voters) == len(self.boot))
