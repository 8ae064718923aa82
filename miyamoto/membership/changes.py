"""The leader's roster bookkeeping: acks, pending joins, leaves, and the one next change.

Pure. ``Membership`` tells it what it heard and asks for the next change; liveness
(who is silent) is passed in, so this module holds no timer of its own.

Rules, and why:

Roster changes
    One at a time: the leader makes the next change only once a quorum of the current
    roster has acknowledged the current version (Raft's single-server rule), so any two
    consecutive rosters have overlapping majorities. A new leader first publishes a
    version naming itself (Raft's no-op entry), which must be acknowledged before any
    membership change. Removals (restarted, silent, leaving) go before admissions.

A silent member is removed only while the rest is heard
    A silent member is removed only if a quorum of the roster without it is still
    heard. A leader cut off in a minority therefore removes nobody (it would publish a
    roster, uncommitted but acted on by the node's cluster layer, on a view that the
    majority has already moved past); CheckQuorum makes it step down instead. A leader
    that lost one of two members still removes it: alone, it is its own quorum.

Incarnations
    ``latest_inc`` is the incarnation of each member's latest JOIN (or the one the
    leader's roster named, when we adopted it): a roster whose quorum names older
    incarnations can never be acknowledged again (``config_dead``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from miyamoto.membership.roster import Member, Roster, majority

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """A new roster; ``removed`` must be told too (it is no longer in ``roster``)."""
    roster: Roster
    removed: Member | None = None
    admitted: str | None = None


class RosterChanges:
    def __init__(self, me_id: str):
        self._me = me_id
        self.acked: dict[tuple[str, str], tuple[int, int]] = {}  # voter -> roster key
        self.pending: dict[str, tuple[Member, str, float]] = {}  # id -> (m, inc, until)
        self.leaving: set[str] = set()
        self.latest_inc: dict[str, str] = {}  # id -> incarnation of its latest JOIN

    def reset(self) -> None:
        """A new leadership: nothing acknowledged, asked or announced yet."""
        self.acked.clear()
        self.pending.clear()
        self.leaving.clear()

    # ------------------------------------------------------------------ hearing
    def saw_join(self, member_id: str, inc: str) -> None:
        """A process asking in: any other incarnation of that member is gone."""
        self.latest_inc[member_id] = inc

    def adopt(self, roster: Roster) -> None:
        """The leader admitted these incarnations after any JOIN we saw: a JOIN heard
        earlier from an older process must not make us, as a later leader, remove the
        member's live incarnation as "restarted"."""
        for m, inc in roster.pairs():
            self.latest_inc[m.id] = inc

    def ack(self, voter: tuple[str, str], key: tuple[int, int]) -> None:
        if key > self.acked.get(voter, (-1, -1)):
            self.acked[voter] = key

    def ask_in(self, m: Member, inc: str, until: float) -> None:
        self.pending[m.id] = (m, inc, until)

    # ------------------------------------------------------------------ deciding
    def committed(self, r: Roster) -> bool:
        """A quorum of ``r`` has acknowledged ``r`` (I count: I made it)."""
        n = sum(1 for m, inc in r.pairs()
                if m.id == self._me or self.acked.get((m.id, inc), (-1, -1)) >= r.key)
        return n >= r.quorum()

    def next_change(self, r: Roster, term: int, now: float,
                    silent: Callable[[str], bool]) -> Change | None:
        """The next membership change, if ``r`` is committed (the caller checks the rest)."""
        if not self.committed(r):
            return None
        others = [(m, inc) for m, inc in r.pairs() if m.id != self._me]
        gone = ([p for p in others if self.latest_inc.get(p[0].id, p[1]) != p[1]]
                or [p for p in others if silent(p[0].id) and self._heard_without(r, p[0].id,
                                                                                silent)]
                or [p for p in others if p[0].id in self.leaving])
        if gone:
            out, _ = gone[0]
            log.info("term %d: removing %s from the roster", term, out.id)
            self.leaving.discard(out.id)
            kept = [p for p in r.pairs() if p[0].id != out.id]
            return Change(Roster(r.version + 1, term, self._me, tuple(m for m, _ in kept),
                                 tuple(i for _, i in kept)), removed=out)
        return self._admission(r, term, now)

    def _heard_without(self, r: Roster, out: str, silent: Callable[[str], bool]) -> bool:
        rest = [m.id for m in r.members if m.id != out]
        return sum(1 for i in rest if i == self._me or not silent(i)) >= majority(len(rest))

    def _admission(self, r: Roster, term: int, now: float) -> Change | None:
        for mid, (m, inc, until) in sorted(self.pending.items()):
            if until < now or r.get(mid) is not None:
                if until < now or r.has(mid, inc):
                    del self.pending[mid]
                continue  # an older incarnation is still in: it goes first (above)
            del self.pending[mid]
            log.info("term %d: admitting %s", term, mid)
            self.latest_inc[mid] = inc
            return Change(Roster(r.version + 1, term, self._me, r.members + (m,),
                                 r.incarnations + (inc,)), admitted=mid)
        return None

    def config_dead(self, r: Roster, leader: bool) -> bool:
        """True when this roster can never again reach quorum (its members restarted)."""
        live = sum(1 for m, inc in r.pairs()
                   if m.id == self._me or self.latest_inc.get(m.id, inc) == inc)
        if live >= r.quorum():
            return False
        # A committed leader can still shrink the roster one removal at a time.
        n = len(r.members)
        return not (leader and n >= 2 and live >= majority(n - 1) and self.committed(r))

    def successor(self, r: Roster, heard: dict[str, float]) -> Member:
        """The best-acknowledged other member: the one a leaving leader hands over to."""
        rest = [(m, i) for m, i in r.pairs() if m.id != self._me]
        return max(rest, key=lambda p: (self.acked.get((p[0].id, p[1]), (-1, -1)),
                                        heard.get(p[0].id, 0.0)))[0]
