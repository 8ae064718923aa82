"""Cluster membership and leader election: a pure state machine (DESIGN §2).

``Membership`` holds no socket, clock, greenlet or thread; its only randomness is the
``random.Random`` it is given. The node's I/O layer feeds it what happens —
``step(sender, verb, payload, now)`` for each membership message, ``tick(now)`` as time
passes, ``leave(now)`` on a graceful stop — and sends the ``Send`` actions it returns.
That is what lets ``tests/unit/membership/test_membership.py`` run thousands of simulated clusters with
loss, delay, partitions, pauses, crashes and restarts in seconds.

Its parts, one role each: ``miyamoto.membership.roster`` (the values), ``miyamoto.wire.messages`` (the
typed messages), ``miyamoto.membership.bootstrap`` (how nodes started together form one cluster),
``miyamoto.membership.election`` (votes asked, given and counted), ``miyamoto.membership.leadership`` (what a
leader does), ``miyamoto.membership.changes`` (which roster change comes next), ``miyamoto.membership.liveness``
(who is heard, and stalls). This module holds the node's state, its inputs (``tick``,
``step``, ``leave``), what it reports, and what a follower does.

The rules, and why each is there:

Roster and ring
    The leader owns the roster: the members sorted by id (the ring), a ``version``, the
    ``term`` in which that version was made, and the leader's id. Rosters are ordered
    by ``(term, version)`` (Raft's "last log term, last log index"): after a leader
    change two different rosters may carry the same version number, so the version
    alone cannot say which is newer.

Incarnations
    State lives in memory, so a restarted process has forgotten its term and its vote,
    and Raft's one-vote-per-term rule would fail silently (the old process votes for X,
    the new one for Y, in the same term). So every process draws a random incarnation
    at start, the roster records it next to each member, and votes and acks count only
    for the incarnation the roster names. A restarted node is a new member: the leader
    removes the old incarnation, then adds the new one (two single changes). A JOIN
    from the incarnation already in the roster just gets the roster back, so a rejoin
    is idempotent.

Joining
    A node with seeds starts ``joining`` and sends JOIN to every seed each
    ``join_retry``. A member that knows the leader answers REDIRECT with the leader's
    address; the joiner sends JOIN there; the leader admits it and sends ROSTER to all.
    Nodes started together bootstrap one cluster: see ``miyamoto.membership.bootstrap``.

Heartbeats and failures
    The leader sends HEARTBEAT (term and full roster) every ``heartbeat_interval``;
    members answer HEARTBEAT_ACK with their roster's (term, version). A member that
    acked no heartbeat sent within ``failure_timeout`` is removed, and told so (see
    ``miyamoto.membership.changes`` for when, and ``miyamoto.membership.liveness`` for how it is measured).

CheckQuorum (Raft thesis §6.2)
    A leader that has not heard from a quorum of its roster within ``failure_timeout``
    steps down, so a leader cut off in a minority stops acting as one (the majority has
    elected another by then). Alone in its roster a node is its own quorum.

Stalls: a stale node does nothing on a stale view
    After a gap in ``now`` beyond ``Timing.stall`` (a pause), the node makes no roster
    change, counts no member as failed and is not ``in_contact`` until it hears from a
    current majority (see ``miyamoto.membership.liveness``); an election it was running is dropped,
    since the votes in its inbox may be answers from before the stall. A leader back
    from a pause that the others used to elect a newer one hears the newer term in the
    first acks and steps down; if it hears nothing, CheckQuorum steps it down.

Election
    Raft's: a member that hears no leader for a random time in [election_timeout_min,
    election_timeout_max] asks for votes for term+1; a member votes once per term, only
    for a candidate whose roster is at least as new as its own; a quorum of the
    candidate's roster elects. A higher term in any message makes the receiver adopt it
    and step down. A node alone in its roster leads itself; a node not in its roster
    never campaigns. Three refinements from the Raft thesis: a pre-vote round (§9.6)
    and leader stickiness (§4.2.3), so that a node that was cut off or removed cannot
    depose a healthy leader by bumping terms; and vote requests are resent every
    heartbeat interval, so that one lost message does not cost a whole election.

Leaving
    ``leave()``: a follower sends LEAVE and the leader removes it at once. A leader whose
    roster is committed publishes a roster without itself and names a successor (ROSTER
    ``elect``), which campaigns at once (Raft's leadership transfer). A leader whose last
    change is not committed yet (or that is back from a stall) just goes quiet: the
    others elect and drop it.

A roster that can never reach quorum again (too many of its incarnations restarted) is
given up: the node becomes a joining node without a roster under a new incarnation, as
if it had restarted, and the bootstrap rule re-forms the cluster once every seed agrees.

Known limits. (1) Without stable storage, if every voter of some leader restarts before
anyone else hears of its term, a later re-bootstrap may reuse that term number (no two
*living* leaders ever share a term). (2) A restarted node must say so
(``first_start=False``, e.g. when its data directory already existed): nodes that restart
believing they are new could, together, bootstrap a second cluster while the first one
is cut off. (3) Every node must list the same seed set, written exactly as the nodes'
cluster addresses. (4) When a majority of a roster is lost for good, the rest wait:
restart the lost nodes, or restart everyone. (5) A roster of two whose leader stalls
while the other member is down waits for that member (neither alone is a quorum).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Sequence

from miyamoto.membership import messages as mm
from miyamoto.membership.bootstrap import Bootstrap
from miyamoto.membership.changes import RosterChanges
from miyamoto.membership.election import Electing
from miyamoto.membership.leadership import Leading
from miyamoto.membership.liveness import Liveness
from miyamoto.membership.roster import CANDIDATE, EMPTY, FOLLOWER, JOINING, LEADER, LEFT, \
                                       MAX_TERM, Member, Roster, Send, Timing, majority
from miyamoto.wire import messages as msgs
from miyamoto.wire.verbs import DecodeError, Verb

__all__ = ["VERBS", "MAX_TERM", "Member", "Membership", "Roster", "Send", "Timing",
           "EMPTY", "majority"]

log = logging.getLogger(__name__)

VERBS = frozenset({Verb.JOIN, Verb.REDIRECT, Verb.ROSTER, Verb.HEARTBEAT,
                   Verb.HEARTBEAT_ACK, Verb.VOTE_REQUEST, Verb.VOTE, Verb.LEAVE})



class Membership(Leading, Electing):
    """Membership and election for one node. See the module docstring for the rules.

    The I/O layer must:

    * call ``tick(now)`` right after construction, then whenever ``next_deadline()``
      has passed (it is never more than a heartbeat interval away; or simply every
      ``heartbeat_interval / 5``): a longer gap is taken for a stall of our own;
    * pass every message whose verb is in ``VERBS`` to ``step``, with the sender's id
      (its DEALER identity), and send every ``Send`` returned by any method: ``to`` is
      the member id, or None for a seed known only by its address;
    * take ``now`` from one monotonic clock;
    * pass ``first_start=False`` if this node has run before (its data dir existed);
    * on a graceful stop, call ``leave(now)``, send what it returns, then stop.

    Lost, duplicated and reordered messages are fine: all are retried or superseded.
    ``role`` is "joining", "follower", "candidate" or "leader"; "left" after ``leave``.

    For the layers above: ``in_contact(now)`` says whether this node hears a current
    majority (the delivery lease), ``reachable(now)`` which members it believes it can
    reach, ``health(now)`` how long ago it heard from each.
    """

    def __init__(self, me: Member, seeds: Sequence[str], timing: Timing,
                 rng: random.Random, now: float, *, first_start: bool = True):
        self._me = me
        self._t = timing
        self._rng = rng
        self._first_start = first_start
        self._inc = self._new_incarnation()
        self._boot = Bootstrap(me, seeds, timing, rng, now)
        self._seeds = self._boot.seeds
        self._changes = RosterChanges(me.id)
        self._live = Liveness(me.id, timing, now)

        self._role = JOINING
        self._term = 0
        self._voted_for: tuple[str, str] | None = None
        self._roster = EMPTY
        self._had_roster = False
        self._leader: str | None = None
        # follower / candidate
        self._leader_contact = float("-inf")
        self._election_at = float("inf")
        self._votes: set[str] = set()
        self._prevotes: set[str] | None = None  # pre-vote under way: who would vote for us
        self._transfer = False  # this election is a handover from the old leader
        self._resend_at = float("inf")  # next resend of unanswered vote requests
        # joining
        self._join_at = now
        self._join_target: tuple[str | None, str] | None = None  # (leader id, address)
        # leader
        self._heartbeat_at = float("inf")

        if not self._seeds:  # a cluster of one: lead it at once
            self._term = 1
            self._voted_for = (me.id, self._inc)
            self._take_lead(now, Roster(1, 1, me.id, (me,), (self._inc,)))

    # ----------------------------------------------------------------- read-only
    @property
    def me(self) -> Member:
        return self._me

    @property
    def incarnation(self) -> str:
        return self._inc

    @property
    def roster(self) -> Roster:
        return self._roster

    @property
    def role(self) -> str:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader(self) -> str | None:
        return self._leader

    @property
    def is_leader(self) -> bool:
        return self._role == LEADER

    @property
    def stalled(self) -> bool:
        """Back from a stall and not yet heard from a current majority."""
        return self._live.stalled

    def health(self, now: float) -> dict[str, float]:
        """Member id -> seconds since this node last heard from it (itself: 0)."""
        heard = self._live.heard
        out = {m.id: now - heard[m.id] for m in self._roster.members if m.id in heard}
        out[self._me.id] = 0.0
        return out

    def in_contact(self, now: float) -> bool:
        """Whether this node currently hears a majority of its roster: the delivery lease.

        Alone in its roster (and leading it): True. Back from a stall and not yet heard
        from a current majority: False. Else a leader needs acks, from a quorum of its
        roster (itself counted), to heartbeats it sent within ``failure_timeout``; a
        follower, a heartbeat from its leader within ``failure_timeout`` whose ``heard``
        list (when sent) is a quorum. Joining, candidate, not in the roster: False.
        """
        member = self._roster.has(self._me.id, self._inc)
        return member and self._live.in_contact(self._roster, self._role, self._leader, now)

    def reachable(self, now: float) -> frozenset[str]:
        """Member ids this node believes it can reach now (itself always).

        A leader: the members that acked a heartbeat it sent within ``failure_timeout``.
        A follower that heard its leader within ``failure_timeout``: the leader and the
        ids its last heartbeat listed as heard. Back from a stall, or out of touch: only
        itself (what it knew is stale; unreachable is the safe guess).
        """
        return self._live.reachable(self._roster, self._role, self._leader, now)

    def next_deadline(self) -> float:
        """The earliest time at which ``tick`` has something to do (at most a heartbeat
        interval after the last ``now`` seen, so that a driven node never looks stalled)."""
        if self._role == LEADER:
            at = self._heartbeat_at
        elif self._role in (FOLLOWER, CANDIDATE):
            at = min(self._election_at, self._resend_at)
        elif self._role == JOINING:
            at = min(self._join_at, self._boot.at, self._resend_at)
        else:
            return float("inf")
        return min(at, self._live.last_now + self._t.heartbeat_interval)

    # --------------------------------------------------------------------- input
    def tick(self, now: float) -> list[Send]:
        self._observe(now)
        if self._role == LEADER:
            return self._lead_tick(now)
        if self._role in (FOLLOWER, CANDIDATE):
            if now >= self._election_at:
                return self._start_election(now)
            return self._solicit(now) if now >= self._resend_at else []
        if self._role == JOINING:
            out = self._solicit(now) if now >= self._resend_at else []
            if now >= self._join_at:
                self._join_at = now + self._t.join_retry
                out += self._joins()
            if now >= self._boot.at:
                out += self._bootstrap(now)
            return out
        return []

    def step(self, sender: str, verb: Verb, payload: dict, now: float) -> list[Send]:
        """Handle one message. Never raises on what a peer sent: bad input is dropped."""
        if self._role == LEFT or not isinstance(verb, str) or verb not in VERBS:
            return []
        verb = Verb(verb)
        self._observe(now)
        try:
            msg = msgs.decode(verb, payload)
            if msg.sender.id != sender or sender == self._me.id:
                raise DecodeError(f"sender {sender!r:.80} does not match the payload")
        except DecodeError as e:
            log.warning("dropped %s from %.80r: %s", verb.value, sender, e)
            return []
        if verb is Verb.JOIN:
            self._changes.saw_join(sender, msg.inc)
        if self._roster.has(sender, msg.inc):
            self._live.heard[sender] = now
        return getattr(self, self._HANDLERS[verb])(msg, now)

    def leave(self, now: float) -> list[Send]:
        """Graceful stop. After this the node ignores everything."""
        role, self._role = self._role, LEFT
        if role in (FOLLOWER, CANDIDATE) and self._leader is not None:
            leader = self._roster.get(self._leader)
            return [self._to(leader, mm.Leave(**self._env()))] if leader else []
        return self._hand_over(now) if role == LEADER else []

    def _observe(self, now: float) -> None:
        gap = self._live.observe(now)
        if not gap:
            return
        if len(self._roster.members) > 1:
            log.warning("stalled for %.1fs: acting on nothing until a current majority "
                        "is heard", gap)
        if self._role == CANDIDATE:  # the votes in our inbox may predate the stall
            self._role, self._votes = FOLLOWER, set()
        self._prevotes = None
        if self._role == FOLLOWER:
            self._reset_election(now)  # read what came in before campaigning

    # ------------------------------------------------------------------ handlers
    def _on_join(self, m: mm.Join, now: float) -> list[Send]:
        if self._role == LEADER:
            return self._on_join_as_leader(m, now)
        if self._role == JOINING:
            self._boot.heard_joiner(m.sender.cluster, m.boot, m.fresh, m.term, now)
            return []
        return self._redirect(m.sender)

    def _on_redirect(self, m: mm.Redirect, now: float) -> list[Send]:
        if m.leader is None or m.address is None or m.leader == self._me.id:
            return []
        self._boot.evidence(now)
        if self._role == LEADER:
            return []
        # A joiner is pointed at the leader; a member is told "you are not in my roster":
        # either way, ask the leader, which answers with the roster or admits us.
        if self._join_target == (m.leader, m.address) and self._role == JOINING:
            return []
        self._join_target = (m.leader, m.address)
        return [Send(m.leader, m.address, Verb.JOIN, self._join_msg().payload())]

    def _on_leader(self, m: mm.Heartbeat | mm.RosterUpdate, now: float) -> list[Send]:
        """ROSTER and HEARTBEAT: the leader of ``m.term`` speaking."""
        rleader = m.roster.leader
        if m.term < self._term:  # a deposed leader: tell it the newer term
            if self._role == JOINING and not m.roster.has(self._me.id, self._inc):
                return []  # not ours to depose it; we JOIN whoever leads now
            return [self._ack(m.sender, ok=False)]
        if m.term > self._term:
            self._adopt_term(m.term, now)
        if self._role == LEADER:
            log.error("two leaders in term %d: %s and me", m.term, m.sender.id)
            return []
        self._boot.evidence(now)
        self._adopt_roster(m.roster, now)
        if rleader is not None:
            self._leader, self._leader_contact = rleader, now
            self._live.heard[rleader] = now
            self._join_target = (rleader, m.sender.cluster)
            self._boot.cancel()  # this term has a leader: our bootstrap lost
        else:
            self._leader = None
        if not self._roster.has(self._me.id, self._inc):
            if self._join_target is None or rleader is None:
                return []
            return [Send(rleader, m.sender.cluster, Verb.JOIN, self._join_msg().payload())]
        if self._role != FOLLOWER:
            self._role = FOLLOWER
            self._boot.cancel()
        if rleader is not None:
            self._prevotes = None
            self._live.beat(m.heard, m.echo, now)
        self._reset_election(now)
        out = [self._ack(m.sender, ok=True, round_=m.round)]
        if m.elect == self._me.id and rleader is None:  # the old leader handed over to us
            out += self._start_election(now, transfer=True)
        return out

    def _adopt_roster(self, new: Roster, now: float) -> None:
        if new.key <= self._roster.key:
            return
        if new.has(self._me.id, self._inc):
            self._roster = new
            self._had_roster = True
            self._changes.adopt(new)
        elif self._role != JOINING:  # removed from the cluster
            self._become_joining(now)

    _HANDLERS = {  # handlers here and in Electing and Leading
        Verb.JOIN: "_on_join",
        Verb.REDIRECT: "_on_redirect",
        Verb.ROSTER: "_on_leader",
        Verb.HEARTBEAT: "_on_leader",
        Verb.HEARTBEAT_ACK: "_on_ack",
        Verb.VOTE_REQUEST: "_on_vote_request",
        Verb.VOTE: "_on_vote",
        Verb.LEAVE: "_on_leave",
    }

    def _abandon(self, now: float) -> list[Send]:
        log.warning("roster v%d can never reach quorum again: rejoining from scratch",
                    self._roster.version)
        self._inc = self._new_incarnation()  # our old votes and acks count nowhere now
        self._boot.forget_evidence()  # the cluster we knew is gone
        self._become_joining(now)
        return []

    # -------------------------------------------------------------------- helpers
    @property
    def _fresh(self) -> bool:
        """A first-start node that never held a roster: its bootstrap vote is reliable."""
        return self._first_start and not self._had_roster

    def _adopt_term(self, term: int, now: float) -> None:
        self._term, self._voted_for = term, None
        self._leader = None
        self._prevotes = None
        self._boot.cancel()
        if self._role in (LEADER, CANDIDATE):
            self._role = FOLLOWER
            self._reset_election(now)

    def _become_joining(self, now: float) -> None:
        self._role, self._leader = JOINING, None
        self._roster = EMPTY
        self._votes.clear()
        self._prevotes = None
        self._join_at = now
        self._boot.restart(now)

    def _reset_election(self, now: float) -> None:
        self._election_at = now + self._rng.uniform(self._t.election_timeout_min,
                                                    self._t.election_timeout_max)

    def _new_incarnation(self) -> str:
        return f"{self._rng.getrandbits(64):016x}"

    def _env(self) -> dict[str, Any]:
        """The envelope every message of ours carries: term, incarnation, sender."""
        return {"term": self._term, "inc": self._inc, "sender": self._me}

    def _to(self, m: Member, msg: Any) -> Send:
        return Send(m.id, m.cluster, msg.verb, msg.payload())

    def _join_msg(self) -> mm.Join:
        return mm.Join(**self._env(), boot=self._boot.boot, fresh=self._fresh)

    def _ack(self, to: Member, ok: bool, round_: int | None = None) -> Send:
        r = self._roster
        return self._to(to, mm.HeartbeatAck(**self._env(), ok=ok, rterm=r.term,
                                              version=r.version, round=round_,
                                              seq=self._live.next_seq()))

    def _vote(self, to: Member, granted: bool) -> Send:
        return self._to(to, mm.Vote(**self._env(), granted=granted, fresh=self._fresh))

    def _redirect(self, to: Member) -> list[Send]:
        leader = self._roster.get(self._leader) if self._leader else None
        if leader is None or leader.id == to.id:
            return []
        return [self._to(to, mm.Redirect(**self._env(), leader=leader.id,
                                           address=leader.cluster))]

    def _joins(self) -> list[Send]:
        p = self._join_msg().payload()
        out = [Send(None, a, Verb.JOIN, p) for a in self._seeds]
        if self._join_target is not None and self._join_target[1] not in self._seeds:
            out.append(Send(self._join_target[0], self._join_target[1], Verb.JOIN, p))
        return out
