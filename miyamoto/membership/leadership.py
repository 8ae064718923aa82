"""Leadership: heartbeats, CheckQuorum, acks, and the roster changes a leader makes.

Part of ``Membership`` (a mixin, like ``miyamoto.membership.election``: it shares the node's term,
role and roster); what to change is decided by ``miyamoto.membership.changes``, who is heard by
``miyamoto.membership.liveness``. The rules are stated in the ``miyamoto.membership.machine`` docstring
(Heartbeats and failures, CheckQuorum, Stalls, Leaving). Pure: no clock, socket or
global random.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from miyamoto.membership import messages as msgs
from miyamoto.membership.election import SharedState
from miyamoto.membership.roster import FOLLOWER, LEADER, Member, Roster, Send

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class Leading(SharedState):
    """What a leader does (a part of ``Membership``)."""

    _heartbeat_at: float

    def _lead_tick(self, now: float) -> list[Send]:
        r = self._roster
        self._live.recover_as_leader(r.ids(), r.quorum())
        out: list[Send] = []
        if now >= self._heartbeat_at:
            self._heartbeat_at = now + self._t.heartbeat_interval
            out += self._broadcast(msgs.Heartbeat, now)
        if self._changes.config_dead(r, leader=True):
            return out + self._abandon(now)
        out += self._next_change(now)
        r = self._roster
        heard = sum(1 for m in r.members if not self._live.silent(m.id, now))
        if heard < r.quorum():  # CheckQuorum
            log.warning("term %d: heard %d of %d members within %.1fs: stepping down",
                        self._term, heard, len(r.members), self._t.failure_timeout)
            self._role, self._leader = FOLLOWER, None
            self._reset_election(now)
        return out

    def _take_lead(self, now: float, roster: Roster) -> list[Send]:
        self._role, self._leader = LEADER, self._me.id
        self._prevotes = None
        self._had_roster = True
        self._roster = roster
        self._changes.reset()
        self._live.lead(roster.ids(), now)
        self._heartbeat_at = now + self._t.heartbeat_interval
        return self._broadcast(msgs.Heartbeat, now)

    def _next_change(self, now: float) -> list[Send]:
        """Make the next membership change: as leader, committed, and not stale."""
        if self._role != LEADER or self._live.stalled:
            return []
        change = self._changes.next_change(self._roster, self._term, now,
                                           lambda i: self._live.silent(i, now))
        if change is None:
            return []
        self._roster = change.roster
        out = self._broadcast(msgs.RosterUpdate, now)
        if change.removed is not None:
            self._live.removed(change.removed.id)
            out.append(self._to(change.removed, msgs.RosterUpdate(**self._env(),
                                                                  roster=self._roster)))
        if change.admitted is not None:
            self._live.admitted(change.admitted, now)
        return out

    def _on_ack(self, m: msgs.HeartbeatAck, now: float) -> list[Send]:
        if m.term > self._term:
            self._adopt_term(m.term, now)
            return []
        if self._role != LEADER or m.term != self._term or not m.ok:
            return []
        if not self._roster.has(m.sender.id, m.inc):
            return []
        self._changes.ack(m.voter, m.key)
        self._live.acked(m.voter, m.round, m.seq)
        r = self._roster
        self._live.recover_as_leader(r.ids(), r.quorum())
        return self._next_change(now)

    def _on_leave(self, m: msgs.Leave, now: float) -> list[Send]:
        if m.term > self._term:
            self._adopt_term(m.term, now)
            return []
        if self._role == LEADER and self._roster.has(m.sender.id, m.inc):
            self._changes.leaving.add(m.sender.id)
            return self._next_change(now)
        return []

    def _leader_msg(self, cls: type[msgs.Heartbeat] | type[msgs.RosterUpdate], to: Member,
                    inc: str, now: float, round_: int | None = None,
                    heard: tuple[str, ...] | None = None) -> Any:
        if heard is None:
            heard = tuple(sorted(self.reachable(now)))
        return cls(**self._env(), roster=self._roster, round=round_, heard=heard,
                   echo=self._live.echo_for((to.id, inc)))

    def _broadcast(self, cls: type[msgs.Heartbeat] | type[msgs.RosterUpdate],
                   now: float) -> list[Send]:
        """The roster to every other member, in one numbered round (see liveness)."""
        round_ = self._live.next_round(now)
        heard = tuple(sorted(self.reachable(now)))
        return [self._to(m, self._leader_msg(cls, m, inc, now, round_, heard))
                for m, inc in self._roster.pairs() if m.id != self._me.id]

    def _on_join_as_leader(self, m: msgs.Join, now: float) -> list[Send]:
        who = m.sender
        if who.id == self._me.id:
            return []
        if self._roster.has(who.id, m.inc):  # already in: rejoin is idempotent
            return [self._to(who, self._leader_msg(msgs.RosterUpdate, who, m.inc, now))]
        self._changes.ask_in(who, m.inc, now + max(3 * self._t.join_retry,
                                                   self._t.failure_timeout))
        return self._next_change(now)

    def _hand_over(self, now: float) -> list[Send]:
        """Leaving as leader: a roster without me, and the best-acknowledged member
        campaigns now (Raft's leadership transfer). Not on an uncommitted roster, nor on
        a stale view: then we just go quiet and the others elect and drop us."""
        r = self._roster
        if len(r.members) == 1 or self._live.stalled or not self._changes.committed(r):
            return []
        successor = self._changes.successor(r, self._live.heard)
        rest = [(m, i) for m, i in r.pairs() if m.id != self._me.id]
        self._roster = Roster(r.version + 1, self._term, None, tuple(m for m, _ in rest),
                              tuple(i for _, i in rest))
        return [self._to(m, msgs.RosterUpdate(**self._env(), roster=self._roster,
                                              elect=successor.id)) for m, _ in rest]

    if TYPE_CHECKING:  # provided by the other parts of Membership
        def _to(self, m: Member, msg: object) -> Send: ...
        def _env(self) -> dict: ...
        def _abandon(self, now: float) -> list[Send]: ...
        def _reset_election(self, now: float) -> None: ...
