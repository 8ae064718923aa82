"""Cluster membership and leader election: a pure state machine (DESIGN §2).

``Membership`` holds no socket, clock, greenlet or thread; its only randomness is the
``random.Random`` it is given. It has one door, ``step(event, now)``, fed by the node's
I/O layer: ``Received(sender, msg)`` for each membership message (decoded by the layer,
like every other verb), ``Tick()`` as time passes, ``Leave()`` on a graceful stop. Each
returns the ``Send`` effects (``miyamoto.wire.messages``) for the layer to carry out.
That is what lets ``tests/unit/membership/test_membership.py`` run thousands of
simulated clusters with loss, delay, partitions, pauses, crashes and restarts in seconds.

Its parts, one role each, owned by the machine: ``miyamoto.membership.bootstrap`` (how
nodes started together form one cluster), ``miyamoto.membership.election`` (the election
this node runs: its timeout, rounds and votes), ``miyamoto.membership.changes`` (which
roster change a leader makes next), ``miyamoto.membership.liveness`` (who is heard, and
stalls); and the values they share: ``miyamoto.membership.roster`` (members, rosters,
timings) and ``miyamoto.membership.messages`` (the typed messages). This module holds
the node's term, vote, role and roster, its door, and the rules of each role that read
and write them: what a joiner, a follower, a candidate and a leader do.

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
    candidate's roster elects. A higher term makes the receiver adopt it and step down,
    as far as Terms below allows. A node alone in its roster leads itself; a node not in
    its roster never campaigns. Three refinements from the Raft thesis: a pre-vote
    round (§9.6) and leader stickiness (§4.2.3: no vote, nor pre-vote, while a leader
    was heard within election_timeout_min), so that a node that was cut off or removed
    cannot depose a healthy leader by bumping terms; and vote requests are resent every
    heartbeat interval, so that one lost message does not cost a whole election.

Terms: who may move ours, and how far
    Any holder of the cluster key can send us anything, so a term is evidence only from
    a member. A node that holds a roster takes a higher term only from a member of it
    (the id and the incarnation the roster names: a stranger, a joiner, a member that
    left or was dropped, or one that restarted since, moves nothing), and only if it is
    at most ``Timing.term_step`` above its own; a term further up is not believed at
    all, not even in part. A step is what an honest member can miss (see there); a
    member further behind has been dropped and comes back through an admission. So
    no sender can walk a term up to the largest that decodes, which once wedged every
    node (each candidate's term+1 then failed to decode). VOTEs are heard only while
    campaigning, from the members asked; LEAVE moves no term; a stranger's REDIRECT is
    ignored, and one from a member's newer incarnation is taken as news of its restart
    (``config_dead``). A joiner (no roster) cannot check members: it takes a vote
    request's term (within a step) only when the request names its own incarnation
    (``to_inc``: the candidate's roster names it), a bootstrap vote request's within a
    step (or below its own, if it voted in no term as high), and a fellow joiner's JOIN
    term, for its own bootstrap's, only up to a step.
    Admission: the cluster's term may be anything, so a leader's roster that names our
    incarnation and is newer than ours sets our term, however far up: for a joiner, and
    for a member that a member has just pointed (REDIRECT, with the leader's
    incarnation) to that leader. A joiner admitted in a term below its own takes the
    leader's when it voted in no term as high (an incarnation's votes are all that its
    term protects), else it joins again as a new incarnation; it never pulls the leader
    into its term. Each node has its own key, and the cluster layer hands the machine
    only what a member's id says from that member's key (JOINs aside: see
    ``live_namesake``), so a holder of the join secret cannot speak as a member. What
    this cannot stop: a joiner trusts whoever admits it.

Leaving
    ``Leave()``: a follower sends LEAVE and the leader removes it at once. A leader whose
    roster is committed publishes a roster without itself and names a successor (ROSTER
    ``elect``), which campaigns at once (Raft's leadership transfer). A leader whose last
    change is not committed yet (or that is back from a stall) just goes quiet: the
    others elect and drop it.

Clocks
    Absolute times (an eta, a schedule's tick) are judged on the cluster's clock, and
    only the leader fires schedules: a leader whose wall clock is further than
    ``max_clock_skew`` from the cluster's (``ClockSkew(off=True)``, from the layer's
    ``PeerClocks.place``) steps down as a leaving leader hands over, and while off a
    node starts no election (it still votes). Bootstrap is not held back: before a
    roster nobody's clock is placed, and the first leader steps down if it is off.

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
from dataclasses import dataclass, replace
from typing import Any, Sequence

from miyamoto.membership import messages as mm
from miyamoto.membership.bootstrap import Bootstrap
from miyamoto.membership.changes import RosterChanges
from miyamoto.membership.election import Campaign
from miyamoto.membership.liveness import Liveness
from miyamoto.membership.roster import CANDIDATE, EMPTY, FOLLOWER, JOINING, LEADER, LEFT, \
                                       MAX_TERM, Member, Roster, Timing, majority
from miyamoto.wire.messages import Send
from miyamoto.wire.verbs import Verb

__all__ = ["VERBS", "MAX_TERM", "ClockSkew", "Event", "Leave", "Member", "Membership", "Received",
           "Roster", "Send", "Tick", "Timing", "EMPTY", "majority"]

log = logging.getLogger(__name__)

MAX_CLASHES = 64  # addresses of nodes with our id remembered at once

VERBS = frozenset({Verb.JOIN, Verb.REDIRECT, Verb.ROSTER, Verb.HEARTBEAT,
                   Verb.HEARTBEAT_ACK, Verb.VOTE_REQUEST, Verb.VOTE, Verb.LEAVE})


# ----------------------------------------------------------------------- the door's events
@dataclass(frozen=True, slots=True)
class Received:
    """A membership message (``miyamoto.membership.messages``) from ``sender``: its
    DEALER identity, which must match the id the message names."""
    sender: str
    msg: mm.MembershipMessage


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (see ``Membership.next_deadline``)."""


@dataclass(frozen=True, slots=True)
class Leave:
    """A graceful stop: after it the node ignores everything."""


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """Our wall clock is (``off``), or is again not, further than ``max_clock_skew``
    from the cluster's (``miyamoto.cluster.clocks.PeerClocks.place``)."""
    off: bool


Event = Received | Tick | Leave | ClockSkew


class Membership:
    """Membership and election for one node. See the module docstring for the rules.

    The I/O layer must:

    * step ``Tick()`` right after construction, then whenever ``next_deadline()`` has
      passed (it is never more than a heartbeat interval away; or simply every
      ``heartbeat_interval / 5``): a longer gap is taken for a stall of our own;
    * step ``Received(sender, msg)`` for every message whose verb is in ``VERBS``, with
      the sender's id (its DEALER identity), once it decoded (a payload that does not
      decode is dropped before it gets here);
    * send every ``Send`` returned: ``to`` is the member id (None for a seed known only
      by its address); ``address`` is given exactly where ``to`` is not in ``roster``
      (as it stands when ``step`` returns) at that address;
    * take ``now`` from one monotonic clock;
    * pass ``first_start=False`` if this node has run before (its data dir existed);
    * on a graceful stop, step ``Leave()``, send what it returns, then stop;
    * step ``ClockSkew(off)`` when its clock goes off the cluster's, or back.

    Lost, duplicated and reordered messages are fine: all are retried or superseded.
    ``role`` is "joining", "follower", "candidate" or "leader"; "left" after ``Leave``.

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
        self._election = Campaign(timing, rng)

        self._role = JOINING
        self._term = 0
        self._voted_for: tuple[str, str] | None = None
        self._cast_up_to = 0  # the highest term in which this incarnation cast a vote
        self._admitter: tuple[str, str] | None = None  # a leader a member named (Terms)
        self._admitter_until = float("-inf")
        self._roster = EMPTY
        self._had_roster = False
        self._leader: str | None = None
        self._leader_contact = float("-inf")  # follower: last word from the leader
        # joining
        self._join_at = now
        self._join_target: tuple[str | None, str] | None = None  # (leader id, address)
        # leader
        self._heartbeat_at = float("inf")
        self._clash_told: dict[str, float] = {}  # address of a node with our id -> next
        self._clock_off = False  # our clock is off the cluster's: we do not lead (Clocks)

        if not self._seeds:  # a cluster of one: lead it at once
            self._term = 1
            self._cast((me.id, self._inc))
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

    def silence(self, member_id: str, now: float) -> float | None:
        """Seconds since this node last heard from ``member_id``, in the roster or not
        (a dropped member's last word); None if it never did."""
        heard = self._live.heard.get(member_id, self._live.last_words.get(member_id))
        return None if heard is None else now - heard

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

    def live_namesake(self, msg: mm.MembershipMessage, now: float) -> Member | None:
        """The live member whose id a JOIN takes from another address or key, if any.

        A JOIN under a member's id with a new incarnation is that member restarted, and
        replaces it; but when it comes from another cluster address, or with another
        key (the layer sets the key the connection authenticated with), while the
        member is still heard (``reachable``), it is a second node with the same id,
        which would otherwise push the live one out: refused (the layer logs it). A
        member that really moved, or lost its data dir and so its key, is admitted
        once its old process is no longer heard. Another key never speaks for the
        incarnation the roster names."""
        if not isinstance(msg, mm.Join) or msg.sender.id == self._me.id:
            return None
        old = self._roster.get(msg.sender.id)
        if old is None:
            return None
        same_inc = self._roster.has(old.id, msg.inc)
        if old.key != msg.sender.key and (same_inc or old.id in self.reachable(now)):
            return old
        if old.cluster == msg.sender.cluster or same_inc or old.id not in self.reachable(now):
            return None
        return old

    def next_deadline(self) -> float:
        """The earliest time at which a ``Tick`` has something to do (at most a heartbeat
        interval after the last ``now`` seen, so that a driven node never looks stalled)."""
        e = self._election
        if self._role == LEADER:
            at = self._heartbeat_at
        elif self._role in (FOLLOWER, CANDIDATE):
            at = min(e.timeout_at, e.resend_at)
        elif self._role == JOINING:
            at = min(self._join_at, self._boot.at, e.resend_at)
        else:
            return float("inf")
        return min(at, self._live.last_now + self._t.heartbeat_interval)

    # ---------------------------------------------------------------------- door
    def step(self, event: Event, now: float) -> list[Send]:
        """Take one event; the messages to send. Never raises on what a peer sent."""
        if isinstance(event, Received):
            out = self._receive(event.sender, event.msg, now)
        elif isinstance(event, Tick):
            out = self._tick(now)
        elif isinstance(event, Leave):
            out = self._leave(now)
        elif isinstance(event, ClockSkew):
            out = self._clock_skew(event.off, now)
        else:
            raise TypeError(f"not a membership event: {event!r:.80}")
        return self._addressed(out)

    def _addressed(self, out: list[Send]) -> list[Send]:
        """Keep the address only where the roster we return with cannot give it.

        Rules build every send with the recipient's address; the roster may change
        later in the same step (a member removed after this round's heartbeat), so
        whether the layer can look the address up is known only here.
        """
        r = self._roster
        for i, s in enumerate(out):
            m = r.get(s.to) if s.to is not None else None
            if m is not None and m.cluster == s.address:
                out[i] = Send(s.to, s.msg)
        return out

    def _tick(self, now: float) -> list[Send]:
        self._observe(now)
        e = self._election
        if self._role == LEADER:
            return self._lead_tick(now)
        if self._role in (FOLLOWER, CANDIDATE):
            if now >= e.timeout_at:
                return self._start_election(now)
            return self._solicit(now) if now >= e.resend_at else []
        if self._role == JOINING:
            out = self._solicit(now) if now >= e.resend_at else []
            if now >= self._join_at:
                self._join_at = now + self._t.join_retry
                out += self._joins()
            if now >= self._boot.at:
                out += self._bootstrap(now)
            return out
        return []

    def _receive(self, sender: str, msg: mm.MembershipMessage, now: float) -> list[Send]:
        handler = self._HANDLERS.get(type(msg))
        if self._role == LEFT or handler is None:
            return []
        self._observe(now)
        if sender == self._me.id and msg.sender.id == sender:
            return self._clash(msg, now)
        if msg.sender.id != sender:
            log.warning("dropped %s from %.80r: the payload names sender %.80r",
                        msg.verb.value, sender, msg.sender.id)
            return []
        if isinstance(msg, mm.Join):
            if self.live_namesake(msg, now) is not None:
                return []  # not a restart: another node with a live member's id
            self._changes.saw_join(sender, msg.inc)
        if self._roster.has(sender, msg.inc):
            self._live.heard[sender] = now
        return getattr(self, handler)(msg, now)

    def _clash(self, msg: mm.MembershipMessage, now: float) -> list[Send]:
        """Another live node uses our id (our own message, echoed, has our incarnation).
        Nothing it says is taken; it is told, by a JOIN of ours to its address (at most
        once per ``join_retry``, so two such nodes do not echo each other forever),
        which it drops the same way: each side sees the clash (the layer logs it)."""
        address = msg.sender.cluster
        if msg.inc == self._inc or address == self._me.cluster \
                or now < self._clash_told.get(address, float("-inf")):
            return []
        if len(self._clash_told) >= MAX_CLASHES:
            self._clash_told.clear()
        self._clash_told[address] = now + self._t.join_retry
        return [Send(None, self._join_msg(), address)]

    def _leave(self, now: float) -> list[Send]:
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
            self._role = FOLLOWER
            self._election.clear()  # (moot: a new round starts its own count)
        self._election.drop_pre()
        if self._role == FOLLOWER:
            self._election.reset_timeout(now)  # read what came in before campaigning

    _HANDLERS: dict[type, str] = {
        mm.Join: "_on_join",
        mm.Redirect: "_on_redirect",
        mm.RosterUpdate: "_on_leader",
        mm.Heartbeat: "_on_leader",
        mm.HeartbeatAck: "_on_ack",
        mm.VoteRequest: "_on_vote_request",
        mm.Vote: "_on_vote",
        mm.Leave: "_on_leave",
    }

    # ---------------------------------------------------- joiners and followers
    def _on_join(self, m: mm.Join, now: float) -> list[Send]:
        if self._role == LEADER:
            return self._on_join_as_leader(m, now)
        if self._role == JOINING:
            # a fellow joiner's term sets our bootstrap's, so it is held to a step too
            self._boot.heard_joiner(m.sender.cluster, m.boot, m.fresh,
                                    min(m.term, self._term + self._t.term_step - 1), now)
            return []
        return self._redirect(m.sender)

    def _on_redirect(self, m: mm.Redirect, now: float) -> list[Send]:
        if m.leader is None or m.address is None or m.leader == self._me.id:
            return []
        if self._role != JOINING and not self._member(m):
            if self._roster.get(m.sender.id) is not None:
                self._changes.saw_join(m.sender.id, m.inc)  # a member restarted since
            return []  # only a member may point us to a leader that would admit us
        self._boot.evidence(now)
        if self._role == LEADER:
            return []
        if self._role != JOINING and m.leader_inc is not None:  # we expect its answer
            self._admitter = (m.leader, m.leader_inc)
            self._admitter_until = now + self._t.failure_timeout + self._t.join_retry
        # A joiner is pointed at the leader; a member is told "you are not in my roster":
        # either way, ask the leader, which answers with the roster or admits us.
        if self._join_target == (m.leader, m.address) and self._role == JOINING:
            return []
        self._join_target = (m.leader, m.address)
        return [Send(m.leader, self._join_msg(), m.address)]

    def _on_leader(self, m: mm.Heartbeat | mm.RosterUpdate, now: float) -> list[Send]:
        """ROSTER and HEARTBEAT: the leader of ``m.term`` speaking (Terms: whom we hear)."""
        rleader = m.roster.leader
        admission = self._admits_us(m, now)
        if not (admission or self._role == JOINING or self._member(m)):
            return []  # a stranger to our roster: not a leader of ours
        if m.term != self._term:
            answer = self._leader_term(m, admission, now)
            if answer is not None:
                return answer
        if admission:
            self._admitter = None
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
            return [Send(rleader, self._join_msg(), m.sender.cluster)]
        if self._role != FOLLOWER:
            self._role = FOLLOWER
            self._boot.cancel()
        if rleader is not None:
            self._election.drop_pre()
            self._live.beat(m.heard, m.echo, now)
        self._election.reset_timeout(now)
        out = [self._ack(m.sender, ok=True, round_=m.round)]
        if m.elect == self._me.id and rleader is None:  # the old leader handed over to us
            out += self._start_election(now, transfer=True)
        return out

    def _leader_term(self, m: mm.Heartbeat | mm.RosterUpdate, admission: bool,
                     now: float) -> list[Send] | None:
        """A leader of another term: None once we are in its term, else our answer."""
        if m.term > self._term:
            if admission:  # the cluster's term may be anything: take it
                self._adopt_term(m.term, now)
            elif self._role != JOINING and not self._raise(m.term, now):
                return []
            return None  # a joiner it does not name only learns where it is
        if self._role != JOINING:  # a deposed leader: tell it the newer term
            return [self._ack(m.sender, ok=False)]
        if not admission:
            return []  # not ours to depose it; we JOIN whoever leads now
        if m.term > self._cast_up_to:
            self._adopt_term(m.term, now)  # we voted in no term as high: take the leader's
            return None
        log.warning("term %d: admitted in term %d, below a term we voted in: joining "
                    "again as a new incarnation", self._term, m.term)
        self._take_incarnation()  # our votes in those terms count nowhere now
        self._become_joining(now)
        return []

    def _adopt_roster(self, new: Roster, now: float) -> None:
        if new.key <= self._roster.key:
            return
        if new.has(self._me.id, self._inc):
            self._roster = new
            self._had_roster = True
            self._changes.adopt(new)
        elif self._role != JOINING:  # removed from the cluster
            self._become_joining(now)

    # ------------------------------------------------------------------ election
    def _on_vote_request(self, m: mm.VoteRequest, now: float) -> list[Send]:
        if m.boot is not None:
            return self._on_boot_vote_request(m, now)
        # A joining node votes too: it may be in the candidate's roster without knowing
        # it yet (admitted, but the roster was lost with the leader that made it), which
        # the request says by naming this incarnation (a stranger cannot know it).
        member = self._member(m)
        if self._role == JOINING and m.to_inc != self._inc:
            return []
        if self._role != JOINING and not member:
            return self._redirect(m.sender)  # not in our roster: only a leader admits it
        sticky = self._role == LEADER or (
            self._leader is not None
            and now - self._leader_contact < self._t.election_timeout_min)
        if sticky and not m.transfer:
            return [] if member else self._redirect(m.sender)
        if m.pre:  # changes nothing here: would we vote for it in its next term?
            grant = m.term + 1 > self._term and m.key >= self._roster.key
            return [self._to(m.sender, mm.Vote(**self._env(), granted=grant, pre=True,
                                               fresh=self._fresh))]
        if m.term < self._term:
            return [self._vote(m.sender, False)]
        if m.term > self._term and not self._raise(m.term, now):
            return []
        grant = self._voted_for in (None, m.voter) and m.key >= self._roster.key
        if grant:
            self._cast(m.voter)
            self._election.drop_pre()  # we back this candidate: no campaign of our own
            self._election.reset_timeout(now)
        return [self._vote(m.sender, grant)]

    def _on_boot_vote_request(self, m: mm.VoteRequest, now: float) -> list[Send]:
        if self._role != JOINING:
            return self._redirect(m.sender)  # a cluster exists: join it
        if not self._boot.may_grant(m.boot, now):
            return [self._vote(m.sender, False)]
        if self._cast_up_to < m.term < self._term:
            self._adopt_term(m.term, now)  # we voted in no term as high: ours says nothing
        elif m.term < self._term:
            return [self._vote(m.sender, False)]
        elif m.term > self._term and not self._raise(m.term, now):
            return []
        grant = self._voted_for in (None, m.voter)
        if grant:
            self._cast(m.voter)
            self._boot.granted(now)
        return [self._vote(m.sender, grant)]

    def _on_vote(self, m: mm.Vote, now: float) -> list[Send]:
        """An answer to our vote request: heard only while we ask, and from whom we ask."""
        e = self._election
        if self._role == JOINING:
            if not self._boot.running:
                return []
        elif not ((e.pre or self._role == CANDIDATE) and self._member(m)):
            return []
        if m.term > self._term:
            self._raise(m.term, now)
            return []
        if m.pre:  # the voter's term may be older than ours: that is why it would vote
            if (m.granted and e.pre and self._roster.has(m.sender.id, m.inc)
                    and e.add(m.sender.id, pre=True) >= self._roster.quorum()):
                return self._campaign(now)
            return []
        if m.term != self._term or not m.granted:
            return []
        if self._role == CANDIDATE:
            if (self._roster.has(m.sender.id, m.inc)
                    and e.add(m.sender.id, pre=False) >= self._roster.quorum()):
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
        self._election.reset_timeout(now)
        if self._clock_off:  # (Clocks) another member leads; we only vote
            return []
        if not transfer and self._roster.quorum() > 1:
            self._election.start_pre(self._me.id)
            return self._solicit(now)
        return self._campaign(now, transfer)

    def _campaign(self, now: float, transfer: bool = False) -> list[Send]:
        self._term += 1
        self._role, self._leader = CANDIDATE, None
        self._cast((self._me.id, self._inc))
        votes = self._election.start(self._me.id, transfer)
        self._election.reset_timeout(now)
        if votes >= self._roster.quorum():
            return self._win(now)
        return self._solicit(now)

    def _solicit(self, now: float) -> list[Send]:
        """(Re)send the vote requests of the election under way to those not yet for us.

        Resent every heartbeat interval until the election ends: on a lossy network one
        lost request or answer must not cost a whole election timeout.
        """
        r, e = self._roster, self._election
        e.resend_at = now + self._t.heartbeat_interval
        if e.pre or self._role == CANDIDATE:
            req = mm.VoteRequest(**self._env(), rterm=r.term, version=r.version, pre=e.pre,
                                 transfer=e.transfer and not e.pre)
            return [self._to(m, replace(req, to_inc=r.incarnation(m.id)))
                    for m in e.unasked(r.members)]
        if self._role == JOINING and self._boot.running:
            req = mm.VoteRequest(**self._env(), rterm=0, version=0, boot=self._boot.boot,
                                 fresh=self._fresh)
            return [Send(None, req, a) for a in self._boot.unasked()]
        e.resend_at = float("inf")
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
        self._cast((self._me.id, self._inc))
        return self._solicit(now)

    # -------------------------------------------------------------------- leader
    def _lead_tick(self, now: float) -> list[Send]:
        r = self._roster
        self._live.recover_as_leader(r.ids(), r.quorum())
        out: list[Send] = []
        if now >= self._heartbeat_at:
            self._heartbeat_at = now + self._t.heartbeat_interval
            out += self._broadcast(mm.Heartbeat, now)
        if self._changes.config_dead(r, leader=True):
            return out + self._abandon(now)
        out += self._next_change(now)
        r = self._roster
        heard = sum(1 for m in r.members if not self._live.silent(m.id, now))
        if heard < r.quorum():  # CheckQuorum
            log.warning("term %d: heard %d of %d members within %.1fs: stepping down",
                        self._term, heard, len(r.members), self._t.failure_timeout)
            self._role, self._leader = FOLLOWER, None
            self._election.reset_timeout(now)
        return out

    def _take_lead(self, now: float, roster: Roster) -> list[Send]:
        self._role, self._leader = LEADER, self._me.id
        self._election.drop_pre()
        self._had_roster = True
        self._roster = roster
        self._changes.reset()
        self._live.lead(roster.ids(), now)
        self._heartbeat_at = now + self._t.heartbeat_interval
        return self._broadcast(mm.Heartbeat, now)

    def _next_change(self, now: float) -> list[Send]:
        """Make the next membership change: as leader, committed, and not stale."""
        if self._role != LEADER or self._live.stalled:
            return []
        change = self._changes.next_change(self._roster, self._term, now,
                                           lambda i: self._live.silent(i, now))
        if change is None:
            return []
        self._roster = change.roster
        out = self._broadcast(mm.RosterUpdate, now)
        if change.removed is not None:
            self._live.removed(change.removed.id)
            out.append(self._to(change.removed, mm.RosterUpdate(**self._env(),
                                                                roster=self._roster)))
        if change.admitted is not None:
            self._live.admitted(change.admitted, now)
        return out

    def _on_ack(self, m: mm.HeartbeatAck, now: float) -> list[Send]:
        if not self._member(m):
            return []
        if m.term > self._term:
            self._raise(m.term, now)
            return []
        if self._role != LEADER or m.term != self._term or not m.ok:
            return []
        self._changes.ack(m.voter, m.key)
        self._live.acked(m.voter, m.round, m.seq)
        r = self._roster
        self._live.recover_as_leader(r.ids(), r.quorum())
        return self._next_change(now)

    def _on_leave(self, m: mm.Leave, now: float) -> list[Send]:
        if self._role == LEADER and self._member(m):  # its term moves nothing: it is going
            self._changes.leaving.add(m.sender.id)
            return self._next_change(now)
        return []

    def _leader_msg(self, cls: type[mm.Heartbeat] | type[mm.RosterUpdate], to: Member,
                    inc: str, now: float, round_: int | None = None,
                    heard: tuple[str, ...] | None = None) -> mm.Heartbeat | mm.RosterUpdate:
        if heard is None:
            heard = tuple(sorted(self.reachable(now)))
        return cls(**self._env(), roster=self._roster, round=round_, heard=heard,
                   echo=self._live.echo_for((to.id, inc)))

    def _broadcast(self, cls: type[mm.Heartbeat] | type[mm.RosterUpdate],
                   now: float) -> list[Send]:
        """The roster to every other member, in one numbered round (see liveness)."""
        round_ = self._live.next_round(now)
        heard = tuple(sorted(self.reachable(now)))
        return [self._to(m, self._leader_msg(cls, m, inc, now, round_, heard))
                for m, inc in self._roster.pairs() if m.id != self._me.id]

    def _on_join_as_leader(self, m: mm.Join, now: float) -> list[Send]:
        who = m.sender
        if who.id == self._me.id:
            return []  # (never reached: _receive drops a message in our own name)
        if self._roster.has(who.id, m.inc):  # already in: rejoin is idempotent
            return [self._to(who, self._leader_msg(mm.RosterUpdate, who, m.inc, now))]
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
        return [self._to(m, mm.RosterUpdate(**self._env(), roster=self._roster,
                                            elect=successor.id)) for m, _ in rest]

    def _clock_skew(self, off: bool, now: float) -> list[Send]:
        """(Clocks) A leader whose clock is off the cluster's steps down, handing over
        to its best-acknowledged member as a leaving leader does (no election timeout
        without a leader); on an uncommitted roster or a stale view it just goes quiet."""
        self._clock_off = off
        if not off:
            return []
        self._election.drop_pre()  # an election under way would make us lead
        if self._role == CANDIDATE:
            self._role = FOLLOWER  # (its votes are heard only while campaigning)
        if self._role != LEADER:
            return []
        r = self._roster
        log.warning("term %d: our clock is off the cluster's by more than max_clock_skew: "
                    "stepping down", self._term)
        self._role, self._leader = FOLLOWER, None
        self._election.reset_timeout(now)
        if len(r.members) == 1 or self._live.stalled or not self._changes.committed(r):
            return []
        successor = self._changes.successor(r, self._live.heard)
        self._roster = replace(r, version=r.version + 1, leader=None)
        return [self._to(m, mm.RosterUpdate(**self._env(), roster=self._roster,
                                            elect=successor.id))
                for m, _ in r.pairs() if m.id != self._me.id]

    def _abandon(self, now: float) -> list[Send]:
        log.warning("roster v%d can never reach quorum again: rejoining from scratch",
                    self._roster.version)
        self._take_incarnation()  # our old votes and acks count nowhere now
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
        self._election.drop_pre()
        self._boot.cancel()
        if self._role in (LEADER, CANDIDATE):
            self._role = FOLLOWER
            self._election.reset_timeout(now)

    def _raise(self, term: int, now: float) -> bool:
        """A higher ``term`` from a peer: taken if it is at most ``Timing.term_step``
        above ours, else not believed (see Terms). Whether it was taken."""
        if term > self._term + self._t.term_step:
            return False
        self._adopt_term(term, now)
        return True

    def _cast(self, voter: tuple[str, str]) -> None:
        """Our vote in the current term (for ``voter``, maybe ourselves)."""
        self._voted_for = voter
        self._cast_up_to = max(self._cast_up_to, self._term)

    def _member(self, m: mm.MembershipMessage) -> bool:
        """Whether ``m`` comes from a member of our roster, as the roster names it."""
        return self._roster.has(m.sender.id, m.inc)

    def _admits_us(self, m: mm.Heartbeat | mm.RosterUpdate, now: float) -> bool:
        """Whether ``m`` is our admission: a roster newer than ours naming this
        incarnation, from its leader, which we asked for (we are joining, or a member
        just pointed us to that leader's incarnation)."""
        r = m.roster
        return (r.leader == m.sender.id and r.has(self._me.id, self._inc)
                and r.key > self._roster.key
                and (self._role == JOINING
                     or (m.voter == self._admitter and now <= self._admitter_until)))

    def _take_incarnation(self) -> None:
        self._inc = self._new_incarnation()
        self._cast_up_to = 0  # this one has voted nowhere yet

    def _become_joining(self, now: float) -> None:
        self._role, self._leader = JOINING, None
        self._admitter = None
        self._roster = EMPTY
        self._election.clear()
        self._join_at = now
        self._boot.restart(now)

    def _new_incarnation(self) -> str:
        return f"{self._rng.getrandbits(64):016x}"

    def _env(self) -> dict[str, Any]:
        """The envelope every message of ours carries: term, incarnation, sender."""
        return {"term": self._term, "inc": self._inc, "sender": self._me}

    def _to(self, m: Member, msg: mm.MembershipMessage) -> Send:
        return Send(m.id, msg, m.cluster)

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
                                         address=leader.cluster,
                                         leader_inc=self._roster.incarnation(leader.id)))]

    def _joins(self) -> list[Send]:
        join = self._join_msg()
        out = [Send(None, join, a) for a in self._seeds]
        if self._join_target is not None and self._join_target[1] not in self._seeds:
            out.append(Send(self._join_target[0], join, self._join_target[1]))
        return out
