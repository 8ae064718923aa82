"""Elections: Raft's pre-vote, vote and campaign, and the bootstrap election's votes.

Part of ``Membership`` (a mixin: these rules read and write the same term, vote, role and
roster as every other rule in one step, so they share its state rather than own a copy);
the rules are stated in the ``miyamoto.membership.machine`` docstring (Election) and in
``miyamoto.membership.bootstrap``. Pure: no clock, socket or global random.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

from miyamoto.membership import messages as msgs
from miyamoto.membership.roster import CANDIDATE, JOINING, LEADER, Member, Roster, Send, Timing
from miyamoto.wire.verbs import Verb

if TYPE_CHECKING:
    from miyamoto.membership.bootstrap import Bootstrap
    from miyamoto.membership.changes import RosterChanges
    from miyamoto.membership.liveness import Liveness


class SharedState:
    """Membership's state that its parts (``Electing``, ``Leading``) read and write
    (see Membership.__init__)."""

    _me: Member
    _inc: str
    _t: Timing
    _rng: random.Random
    _role: str
    _term: int
    _voted_for: tuple[str, str] | None
    _roster: Roster
    _leader: str | None
    _had_roster: bool
    _boot: Bootstrap
    _changes: RosterChanges
    _live: Liveness


class Electing(SharedState):
    """Votes asked, given and counted (a part of ``Membership``)."""

    _leader_contact: float
    _votes: set[str]
    _prevotes: set[str] | None
    _transfer: bool
    _resend_at: float

    def _on_vote_request(self, m: msgs.VoteRequest, now: float) -> list[Send]:
        if m.boot is not None:
            return self._on_boot_vote_request(m, now)
        # A joining node votes too: it may be in the candidate's roster without knowing
        # it yet (admitted, but the roster was lost with the leader that made it).
        member = self._roster.has(m.sender.id, m.inc)
        sticky = self._role == LEADER or (
            self._leader is not None
            and now - self._leader_contact < self._t.election_timeout_min)
        if sticky and not m.transfer:
            return [] if member else self._redirect(m.sender)
        if m.pre:  # changes nothing here: would we vote for it in its next term?
            grant = m.term + 1 > self._term and m.key >= self._roster.key
            return [self._to(m.sender, msgs.Vote(**self._env(), granted=grant, pre=True,
                                                 fresh=self._fresh))]
        if m.term < self._term:
            return [self._vote(m.sender, False)]
        if m.term > self._term:
            self._adopt_term(m.term, now)
        grant = self._voted_for in (None, m.voter) and m.key >= self._roster.key
        if grant:
            self._voted_for = m.voter
            self._prevotes = None  # we back this candidate: no campaign of our own
            self._reset_election(now)
        return [self._vote(m.sender, grant)]

    def _on_boot_vote_request(self, m: msgs.VoteRequest, now: float) -> list[Send]:
        if self._role != JOINING:
            return self._redirect(m.sender)  # a cluster exists: join it
        if m.term < self._term:
            return [self._vote(m.sender, False)]
        if m.term > self._term:
            self._adopt_term(m.term, now)
        grant = self._voted_for in (None, m.voter) and self._boot.may_grant(m.boot, now)
        if grant:
            self._voted_for = m.voter
            self._boot.granted(now)
        return [self._vote(m.sender, grant)]

    def _on_vote(self, m: msgs.Vote, now: float) -> list[Send]:
        if m.term > self._term:
            self._adopt_term(m.term, now)
            return []
        if m.pre:  # the voter's term may be older than ours: that is why it would vote
            if (m.granted and self._prevotes is not None
                    and self._roster.has(m.sender.id, m.inc)):
                self._prevotes.add(m.sender.id)
                if len(self._prevotes) >= self._roster.quorum():
                    return self._campaign(now)
            return []
        if m.term != self._term or not m.granted:
            return []
        if self._role == CANDIDATE:
            if self._roster.has(m.sender.id, m.inc):
                self._votes.add(m.sender.id)
                if len(self._votes) >= self._roster.quorum():
                    return self._win(now)
            return []
        if self._role == JOINING:
            first = self._boot.vote(m.sender, m.inc, m.fresh, self._term)
            if first is not None:
                return self._take_lead(now, first)
        return []

    def _start_election(self, now: float, transfer: bool = False) -> list[Send]:
        """Election timeout: first a pre-vote (Raft thesis §9.6), then the election.

        The pre-vote asks "would you vote for me in term+1?" without bumping any term,
        so a node that was cut off, or removed, cannot depose a healthy leader when it
        comes back. A handover (``transfer``) skips it.
        """
        if not self._roster.has(self._me.id, self._inc):
            return []
        if self._changes.config_dead(self._roster, leader=False):
            return self._abandon(now)
        self._reset_election(now)
        if not transfer and self._roster.quorum() > 1:
            self._prevotes = {self._me.id}
            return self._solicit(now)
        return self._campaign(now, transfer)

    def _campaign(self, now: float, transfer: bool = False) -> list[Send]:
        self._prevotes = None
        self._term += 1
        self._role, self._leader = CANDIDATE, None
        self._voted_for = (self._me.id, self._inc)
        self._votes = {self._me.id}
        self._transfer = transfer
        self._reset_election(now)
        if len(self._votes) >= self._roster.quorum():
            return self._win(now)
        return self._solicit(now)

    def _solicit(self, now: float) -> list[Send]:
        """(Re)send the vote requests of the election under way to those not yet for us.

        Resent every heartbeat interval until the election ends: on a lossy network one
        lost request or answer must not cost a whole election timeout.
        """
        r = self._roster
        self._resend_at = now + self._t.heartbeat_interval
        if self._prevotes is not None:
            req = msgs.VoteRequest(**self._env(), rterm=r.term, version=r.version, pre=True)
            return [self._to(m, req) for m in r.members if m.id not in self._prevotes]
        if self._role == CANDIDATE:
            req = msgs.VoteRequest(**self._env(), rterm=r.term, version=r.version,
                                   transfer=self._transfer)
            return [self._to(m, req) for m in r.members if m.id not in self._votes]
        if self._role == JOINING and self._boot.running:
            p = msgs.VoteRequest(**self._env(), rterm=0, version=0, boot=self._boot.boot,
                                 fresh=self._fresh).payload()
            return [Send(None, a, Verb.VOTE_REQUEST, p) for a in self._boot.unasked()]
        self._resend_at = float("inf")
        return []

    def _win(self, now: float) -> list[Send]:
        r = self._roster
        return self._take_lead(now, replace(r, version=r.version + 1, term=self._term,
                                            leader=self._me.id))

    def _bootstrap(self, now: float) -> list[Send]:
        """Start a bootstrap election if enough of the seed set is up and rosterless."""
        term = self._boot.start(now, self._fresh, self._inc, self._term)
        if term is None:
            return []
        self._term = term
        self._voted_for = (self._me.id, self._inc)
        return self._solicit(now)

    if TYPE_CHECKING:  # provided by the other parts of Membership
        def _to(self, m: Member, msg: object) -> Send: ...
        def _env(self) -> dict: ...
        def _vote(self, to: Member, granted: bool) -> Send: ...
        def _redirect(self, to: Member) -> list[Send]: ...
        def _abandon(self, now: float) -> list[Send]: ...
        def _adopt_term(self, term: int, now: float) -> None: ...
        def _reset_election(self, now: float) -> None: ...
        def _take_lead(self, now: float, roster: Roster) -> list[Send]: ...

        @property
        def _fresh(self) -> bool: ...
