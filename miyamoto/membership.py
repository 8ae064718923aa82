"""Cluster membership and leader election: a pure state machine (DESIGN §2).

``Membership`` holds no socket, clock, greenlet or thread; its only randomness is the
``random.Random`` it is given. The node's I/O layer feeds it what happens —
``step(sender, verb, payload, now)`` for each membership message, ``tick(now)`` as time
passes, ``leave(now)`` on a graceful stop — and sends the ``Send`` actions it returns.
That is what lets ``tests/test_membership.py`` run thousands of simulated clusters with
loss, delay, partitions, crashes and restarts in seconds.

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

Bootstrap: how nodes started together (each seeded with all) form ONE cluster
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

Heartbeats and failures
    The leader sends HEARTBEAT (term and full roster) every ``heartbeat_interval``;
    members answer HEARTBEAT_ACK with their roster's (term, version). A member not heard
    from for ``failure_timeout`` is removed, and told so.

Roster changes
    One at a time: the leader makes the next change only once a quorum of the current
    roster has acknowledged the current version (Raft's single-server rule), so any two
    consecutive rosters have overlapping majorities. A new leader first publishes a
    version naming itself (Raft's no-op entry), which must be acknowledged before any
    membership change. Removals (restarted, silent, leaving) go before admissions.

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
    change is not committed yet just goes quiet: the others elect and drop it.

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
restart the lost nodes, or restart everyone.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from miyamoto.protocol import DecodeError, Verb

log = logging.getLogger(__name__)

VERBS = frozenset({Verb.JOIN, Verb.REDIRECT, Verb.ROSTER, Verb.HEARTBEAT,
                   Verb.HEARTBEAT_ACK, Verb.VOTE_REQUEST, Verb.VOTE, Verb.LEAVE})

MAX_INT = 2**53 - 1  # the largest integer every JSON reader keeps exactly
MAX_TERM = 2**52     # a peer's term beyond this is absurd: adopting it would wedge us
MAX_NAME = 512       # ids, addresses, incarnations
MAX_MEMBERS = 1024

JOINING, FOLLOWER, CANDIDATE, LEADER, LEFT = "joining", "follower", "candidate", "leader", "left"


def majority(n: int) -> int:
    return n // 2 + 1


# ------------------------------------------------------------------- payload checks
def _int(d: dict, key: str) -> int:
    v = d.get(key)
    if type(v) is not int or not 0 <= v <= MAX_INT:
        raise DecodeError(f"{key} must be an integer in [0, 2^53)")
    return v


def _str(d: dict, key: str) -> str:
    v = d.get(key)
    if type(v) is not str or not 0 < len(v) <= MAX_NAME:
        raise DecodeError(f"{key} must be a non-empty string of at most {MAX_NAME} characters")
    return v


def _opt_str(d: dict, key: str) -> str | None:
    return None if d.get(key) is None else _str(d, key)


def _bool(d: dict, key: str, default: bool | None = None) -> bool:
    v = d.get(key, default)
    if type(v) is not bool:
        raise DecodeError(f"{key} must be a boolean")
    return v


def _dict(d: dict, key: str) -> dict:
    v = d.get(key)
    if not isinstance(v, dict):
        raise DecodeError(f"{key} must be an object")
    return v


def _str_list(d: dict, key: str) -> tuple[str, ...]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) > MAX_MEMBERS:
        raise DecodeError(f"{key} must be a list")
    if not all(type(s) is str and 0 < len(s) <= MAX_NAME for s in v):
        raise DecodeError(f"{key} must hold non-empty strings")
    return tuple(v)


# ------------------------------------------------------------------------ values
@dataclass(frozen=True, slots=True)
class Member:
    id: str
    cluster: str  # ZeroMQ endpoint, e.g. "tcp://127.0.0.1:6000"
    http: str     # "host:port" of its HTTP API

    def to_payload(self) -> dict[str, str]:
        return {"id": self.id, "cluster": self.cluster, "http": self.http}

    @classmethod
    def from_payload(cls, d: object) -> Member:
        if not isinstance(d, dict):
            raise DecodeError("a member must be an object")
        return cls(_str(d, "id"), _str(d, "cluster"), _str(d, "http"))


@dataclass(frozen=True)
class Roster:
    """One version of the cluster's membership, as the leader of ``term`` made it.

    ``members`` is always sorted by id: that order is the ring. ``incarnations[i]``
    names the process of ``members[i]`` (see the module docstring); ``quorum_floor`` is
    the bootstrap's minimum quorum. Callers outside this module need neither.
    """

    version: int
    term: int
    leader: str | None
    members: tuple[Member, ...]
    incarnations: tuple[str, ...] = ()
    quorum_floor: int = 0
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        members = tuple(self.members)
        incs = tuple(self.incarnations) or ("",) * len(members)
        if len(incs) != len(members):
            raise ValueError("one incarnation per member")
        pairs = sorted(zip(members, incs), key=lambda p: p[0].id)
        index = {m.id: i for i, (m, _) in enumerate(pairs)}
        if len(index) != len(pairs):
            raise ValueError("duplicate member id")
        if self.leader is not None and self.leader not in index:
            raise ValueError("the leader is not a member")
        if not 0 <= self.quorum_floor <= max(len(pairs), 1):
            raise ValueError("quorum floor out of range")
        object.__setattr__(self, "members", tuple(m for m, _ in pairs))
        object.__setattr__(self, "incarnations", tuple(i for _, i in pairs))
        object.__setattr__(self, "_index", index)

    @property
    def key(self) -> tuple[int, int]:
        """(term, version): the larger key is the newer roster."""
        return (self.term, self.version)

    def ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members)

    def get(self, member_id: str) -> Member | None:
        i = self._index.get(member_id)
        return None if i is None else self.members[i]

    def incarnation(self, member_id: str) -> str | None:
        i = self._index.get(member_id)
        return None if i is None else self.incarnations[i]

    def has(self, member_id: str, incarnation: str) -> bool:
        return self.incarnation(member_id) == incarnation

    def quorum(self) -> int:
        return max(majority(len(self.members)), self.quorum_floor)

    def to_payload(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "term": self.term,
            "leader": self.leader,
            "floor": self.quorum_floor,
            "members": [dict(m.to_payload(), inc=inc)
                        for m, inc in zip(self.members, self.incarnations)],
        }

    @classmethod
    def from_payload(cls, d: object) -> Roster:
        if not isinstance(d, dict):
            raise DecodeError("a roster must be an object")
        raw = d.get("members")
        if not isinstance(raw, list) or len(raw) > MAX_MEMBERS:
            raise DecodeError("roster members must be a list")
        members = tuple(Member.from_payload(m) for m in raw)
        incs = tuple(m.get("inc", "") for m in raw)
        if not all(type(i) is str and len(i) <= MAX_NAME for i in incs):
            raise DecodeError("a member's inc must be a string")
        floor = d.get("floor", 0)
        if type(floor) is not int:
            raise DecodeError("floor must be an integer")
        try:
            return cls(_int(d, "version"), _int(d, "term"), _opt_str(d, "leader"),
                       members, incs, floor)
        except ValueError as e:
            raise DecodeError(f"bad roster: {e}") from e


EMPTY = Roster(version=0, term=0, leader=None, members=())


@dataclass(frozen=True)
class Send:
    """One message to send. ``payload`` is JSON-serialisable and shared: do not mutate it."""

    to: str | None  # member id, or None when only an address is known (a seed)
    address: str    # cluster endpoint to send to
    verb: Verb
    payload: dict


@dataclass(frozen=True)
class Timing:
    heartbeat_interval: float = 0.5
    failure_timeout: float = 3.0
    election_timeout_min: float = 1.5
    election_timeout_max: float = 3.0
    join_retry: float = 1.0

    def __post_init__(self) -> None:
        if min(self.heartbeat_interval, self.failure_timeout, self.election_timeout_min,
               self.join_retry) <= 0:
            raise ValueError("timings must be positive")
        if self.election_timeout_max < self.election_timeout_min:
            raise ValueError("election_timeout_max < election_timeout_min")
        if self.heartbeat_interval >= self.election_timeout_min:
            raise ValueError("heartbeat_interval must be below election_timeout_min")


@dataclass(frozen=True, slots=True)
class _Envelope:
    """What every membership message carries: who sent it, which process, its term."""
    member: Member
    inc: str
    term: int

    @property
    def voter(self) -> tuple[str, str]:
        return (self.member.id, self.inc)


# --------------------------------------------------------------------- the machine
class Membership:
    """Membership and election for one node. See the module docstring for the rules.

    The I/O layer must:

    * call ``tick(now)`` right after construction, then whenever ``next_deadline()``
      has passed (or simply every ``heartbeat_interval / 5``);
    * pass every message whose verb is in ``VERBS`` to ``step``, with the sender's id
      (its DEALER identity), and send every ``Send`` returned by any method: ``to`` is
      the member id, or None for a seed known only by its address;
    * take ``now`` from one monotonic clock;
    * pass ``first_start=False`` if this node has run before (its data dir existed);
    * on a graceful stop, call ``leave(now)``, send what it returns, then stop.

    Lost, duplicated and reordered messages are fine: all are retried or superseded.
    ``role`` is "joining", "follower", "candidate" or "leader"; "left" after ``leave``.
    """

    def __init__(self, me: Member, seeds: Sequence[str], timing: Timing,
                 rng: random.Random, now: float, *, first_start: bool = True):
        self._me = me
        self._me_payload = me.to_payload()
        self._t = timing
        self._rng = rng
        self._first_start = first_start
        self._inc = self._new_incarnation()
        self._seeds = tuple(sorted({s for s in seeds if s and s != me.cluster}))
        self._boot = tuple(sorted({*self._seeds, me.cluster}))  # the seed set C0

        self._role = JOINING
        self._term = 0
        self._voted_for: tuple[str, str] | None = None
        self._roster = EMPTY
        self._roster_payload: dict = EMPTY.to_payload()
        self._had_roster = False
        self._leader: str | None = None
        self._last_heard: dict[str, float] = {}
        self._latest_inc: dict[str, str] = {}  # id -> incarnation of its latest JOIN
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
        self._evidence_at = float("-inf")  # last time someone told us of a leader
        # fellow joiners: seed address -> (heard at, fresh, term)
        self._peers: dict[str, tuple[float, bool, int]] = {}
        self._boot_at = now + self._election_timeout()
        self._boot_votes: dict[str, tuple[Member, str, bool]] | None = None
        self._boot_skipped = 0  # bootstrap turns let pass to lower-ranked seeds
        # leader
        self._heartbeat_at = float("inf")
        self._acked: dict[tuple[str, str], tuple[int, int]] = {}
        self._pending: dict[str, tuple[Member, str, float]] = {}  # joins: id -> (m, inc, until)
        self._leaving: set[str] = set()

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

    def health(self, now: float) -> dict[str, float]:
        """Member id -> seconds since this node last heard from it (itself: 0)."""
        out = {m.id: now - self._last_heard[m.id]
               for m in self._roster.members if m.id in self._last_heard}
        out[self._me.id] = 0.0
        return out

    def next_deadline(self) -> float:
        """The earliest time at which ``tick`` has something to do."""
        if self._role == LEADER:
            return self._heartbeat_at
        if self._role in (FOLLOWER, CANDIDATE):
            return min(self._election_at, self._resend_at)
        if self._role == JOINING:
            return min(self._join_at, self._boot_at, self._resend_at)
        return float("inf")

    # --------------------------------------------------------------------- input
    def tick(self, now: float) -> list[Send]:
        if self._role == LEADER:
            out: list[Send] = []
            if now >= self._heartbeat_at:
                self._heartbeat_at = now + self._t.heartbeat_interval
                out += self._broadcast(Verb.HEARTBEAT)
            if self._config_dead():
                return out + self._abandon(now)
            return out + self._next_change(now)
        if self._role in (FOLLOWER, CANDIDATE):
            if now >= self._election_at:
                return self._start_election(now)
            return self._solicit(now) if now >= self._resend_at else []
        if self._role == JOINING:
            out = self._solicit(now) if now >= self._resend_at else []
            if now >= self._join_at:
                self._join_at = now + self._t.join_retry
                out += self._joins()
            if now >= self._boot_at:
                self._boot_at = now + self._election_timeout()
                out += self._bootstrap(now)
            return out
        return []

    def step(self, sender: str, verb: Verb, payload: dict, now: float) -> list[Send]:
        """Handle one message. Never raises on what a peer sent: bad input is dropped."""
        if self._role == LEFT or not isinstance(verb, str) or verb not in VERBS:
            return []
        verb = Verb(verb)
        try:
            if not isinstance(payload, dict):
                raise DecodeError("payload is not an object")
            env = _Envelope(Member.from_payload(payload.get("from")),
                            _str(payload, "inc"), _int(payload, "term"))
            if env.term > MAX_TERM:
                raise DecodeError("absurd term")
            if env.member.id != sender or sender == self._me.id:
                raise DecodeError(f"sender {sender!r:.80} does not match the payload")
            if verb is Verb.JOIN:  # a process asking in: any other incarnation is gone
                self._latest_inc[sender] = env.inc
            if self._roster.has(sender, env.inc):
                self._last_heard[sender] = now
            return self._HANDLERS[verb](self, env, payload, now)
        except DecodeError as e:
            log.warning("dropped %s from %.80r: %s", verb.value, sender, e)
            return []

    def leave(self, now: float) -> list[Send]:
        """Graceful stop. After this the node ignores everything."""
        role, self._role = self._role, LEFT
        if role in (FOLLOWER, CANDIDATE) and self._leader is not None:
            leader = self._roster.get(self._leader)
            if leader is not None:
                return [self._to(leader, Verb.LEAVE)]
            return []
        if role != LEADER or len(self._roster.members) == 1 or not self._committed():
            return []
        # Hand over: a roster without me, and the best-acknowledged member campaigns now.
        r = self._roster
        rest = [(m, i) for m, i in zip(r.members, r.incarnations) if m.id != self._me.id]
        successor = max(rest, key=lambda p: (self._acked.get((p[0].id, p[1]), (-1, -1)),
                                             self._last_heard.get(p[0].id, 0.0)))[0]
        new = Roster(r.version + 1, self._term, None, tuple(m for m, _ in rest),
                     tuple(i for _, i in rest))
        self._set_roster(new)
        return [self._to(m, Verb.ROSTER, roster=self._roster_payload,
                         elect=successor.id) for m, _ in rest]

    # ------------------------------------------------------------------ handlers
    def _on_join(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        boot, fresh = _str_list(p, "boot"), _bool(p, "fresh")
        if self._role == LEADER:
            m = env.member
            if m.id == self._me.id:
                return []
            if self._roster.has(m.id, env.inc):  # already in: rejoin is idempotent
                return [self._to(m, Verb.ROSTER, roster=self._roster_payload)]
            self._pending[m.id] = (m, env.inc, now + max(3 * self._t.join_retry,
                                                          self._t.failure_timeout))
            return self._next_change(now)
        if self._role == JOINING:
            if boot == self._boot:  # a fellow joiner: bootstrap needs to know who is up
                self._peers[env.member.cluster] = (now, fresh, env.term)
            return []
        return self._redirect(env)

    def _on_redirect(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        leader, address = _opt_str(p, "leader"), _opt_str(p, "address")
        if leader is None or address is None or leader == self._me.id:
            return []
        self._evidence_at = now
        if self._role == LEADER:
            return []
        # A joiner is pointed at the leader; a member is told "you are not in my roster":
        # either way, ask the leader, which answers with the roster or admits us.
        if self._join_target == (leader, address) and self._role == JOINING:
            return []
        self._join_target = (leader, address)
        return [Send(leader, address, Verb.JOIN, self._payload(Verb.JOIN))]

    def _on_leader(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        """ROSTER and HEARTBEAT: the leader of ``env.term`` speaking."""
        rp = _dict(p, "roster")
        rkey = (_int(rp, "term"), _int(rp, "version"))
        rleader = _opt_str(rp, "leader")
        elect = _opt_str(p, "elect")
        if rleader not in (None, env.member.id) or rkey[0] > env.term:
            raise DecodeError("roster does not match its sender")
        if env.term < self._term:  # a deposed leader: tell it the newer term
            if self._role == JOINING and not Roster.from_payload(rp).has(self._me.id, self._inc):
                return []  # not ours to depose it; we JOIN whoever leads now
            return [self._ack(env.member, ok=False)]
        if env.term > self._term:
            self._adopt_term(env.term, now)
        if self._role == LEADER:
            log.error("two leaders in term %d: %s and me", env.term, env.member.id)
            return []
        self._evidence_at = now
        if rkey > self._roster.key:
            new = Roster.from_payload(rp)
            if new.has(self._me.id, self._inc):
                self._set_roster(new)
                self._had_roster = True
                # the leader admitted these incarnations after any JOIN we saw: a JOIN
                # heard earlier from an older process must not make us, as a later
                # leader, remove the member's live incarnation as "restarted"
                for m, inc in zip(new.members, new.incarnations):
                    self._latest_inc[m.id] = inc
            elif self._role != JOINING:  # removed from the cluster
                self._become_joining(now)
        if rleader is not None:
            self._leader, self._leader_contact = rleader, now
            self._last_heard[rleader] = now
            self._join_target = (rleader, env.member.cluster)
            self._boot_votes = None  # this term has a leader: our bootstrap lost
        else:
            self._leader = None
        if not self._roster.has(self._me.id, self._inc):
            if self._join_target is None or rleader is None:
                return []
            return [Send(rleader, env.member.cluster, Verb.JOIN, self._payload(Verb.JOIN))]
        if self._role != FOLLOWER:
            self._role, self._boot_votes = FOLLOWER, None
        if rleader is not None:
            self._prevotes = None
        self._reset_election(now)
        out = [self._ack(env.member, ok=True)]
        if elect == self._me.id and rleader is None:  # the old leader handed over to us
            out += self._start_election(now, transfer=True)
        return out

    def _on_ack(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        ok, key = _bool(p, "ok"), (_int(p, "rterm"), _int(p, "version"))
        if env.term > self._term:
            self._adopt_term(env.term, now)
            return []
        if self._role != LEADER or env.term != self._term or not ok:
            return []
        if not self._roster.has(env.member.id, env.inc):
            return []
        if key > self._acked.get(env.voter, (-1, -1)):
            self._acked[env.voter] = key
        return self._next_change(now)

    def _on_vote_request(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        key = (_int(p, "rterm"), _int(p, "version"))
        transfer, pre = _bool(p, "transfer", False), _bool(p, "pre", False)
        if p.get("boot") is not None:
            return self._on_boot_vote_request(env, _str_list(p, "boot"), now)
        # A joining node votes too: it may be in the candidate's roster without knowing
        # it yet (admitted, but the roster was lost with the leader that made it).
        member = self._roster.has(env.member.id, env.inc)
        sticky = self._role == LEADER or (
            self._leader is not None
            and now - self._leader_contact < self._t.election_timeout_min)
        if sticky and not transfer:
            return [] if member else self._redirect(env)
        if pre:  # changes nothing here: would we vote for it in its next term?
            grant = env.term + 1 > self._term and key >= self._roster.key
            return [self._to(env.member, Verb.VOTE, granted=grant, pre=True)]
        if env.term < self._term:
            return [self._vote(env.member, False)]
        if env.term > self._term:
            self._adopt_term(env.term, now)
        grant = self._voted_for in (None, env.voter) and key >= self._roster.key
        if grant:
            self._voted_for = env.voter
            self._prevotes = None  # we back this candidate: no campaign of our own
            self._reset_election(now)
        return [self._vote(env.member, grant)]

    def _on_boot_vote_request(self, env: _Envelope, boot: tuple[str, ...],
                              now: float) -> list[Send]:
        if self._role != JOINING:
            return self._redirect(env)  # a cluster exists: join it
        if env.term < self._term:
            return [self._vote(env.member, False)]
        if env.term > self._term:
            self._adopt_term(env.term, now)
        grant = (self._voted_for in (None, env.voter) and boot == self._boot
                 and now - self._evidence_at > self._t.failure_timeout)
        if grant:
            self._voted_for = env.voter
            self._boot_at = now + self._election_timeout()
            self._boot_skipped = 0
        return [self._vote(env.member, grant)]

    def _on_vote(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        granted, fresh = _bool(p, "granted"), _bool(p, "fresh", False)
        pre = _bool(p, "pre", False)
        if env.term > self._term:
            self._adopt_term(env.term, now)
            return []
        if pre:  # the voter's term may be older than ours: that is why it would vote
            if (granted and self._prevotes is not None
                    and self._roster.has(env.member.id, env.inc)):
                self._prevotes.add(env.member.id)
                if len(self._prevotes) >= self._roster.quorum():
                    return self._campaign(now)
            return []
        if env.term != self._term or not granted:
            return []
        if self._role == CANDIDATE:
            if self._roster.has(env.member.id, env.inc):
                self._votes.add(env.member.id)
                if len(self._votes) >= self._roster.quorum():
                    return self._win(now)
            return []
        if self._role == JOINING and self._boot_votes is not None:
            m = env.member
            taken = {v[0].id for a, v in self._boot_votes.items() if a != m.cluster}
            if m.cluster in self._boot and m.id not in taken:
                self._boot_votes[m.cluster] = (m, env.inc, fresh)
                return self._maybe_win_bootstrap(now)
        return []

    def _on_leave(self, env: _Envelope, p: dict, now: float) -> list[Send]:
        if env.term > self._term:
            self._adopt_term(env.term, now)
            return []
        if self._role == LEADER and self._roster.has(env.member.id, env.inc):
            self._leaving.add(env.member.id)
            return self._next_change(now)
        return []

    _HANDLERS = {
        Verb.JOIN: _on_join,
        Verb.REDIRECT: _on_redirect,
        Verb.ROSTER: _on_leader,
        Verb.HEARTBEAT: _on_leader,
        Verb.HEARTBEAT_ACK: _on_ack,
        Verb.VOTE_REQUEST: _on_vote_request,
        Verb.VOTE: _on_vote,
        Verb.LEAVE: _on_leave,
    }

    # ----------------------------------------------------------------- elections
    def _start_election(self, now: float, transfer: bool = False) -> list[Send]:
        """Election timeout: first a pre-vote (Raft thesis §9.6), then the election.

        The pre-vote asks "would you vote for me in term+1?" without bumping any term,
        so a node that was cut off, or removed, cannot depose a healthy leader when it
        comes back. A handover (``transfer``) skips it.
        """
        if not self._roster.has(self._me.id, self._inc):
            return []
        if self._config_dead():
            return self._abandon(now)
        r = self._roster
        self._reset_election(now)
        if not transfer and r.quorum() > 1:
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
            return [self._to(m, Verb.VOTE_REQUEST, rterm=r.term, version=r.version, pre=True)
                    for m in r.members if m.id not in self._prevotes]
        if self._role == CANDIDATE:
            return [self._to(m, Verb.VOTE_REQUEST, rterm=r.term, version=r.version,
                             transfer=self._transfer)
                    for m in r.members if m.id not in self._votes]
        if self._role == JOINING and self._boot_votes is not None:
            payload = self._payload(Verb.VOTE_REQUEST, rterm=0, version=0,
                                    boot=list(self._boot), fresh=self._fresh)
            return [Send(None, a, Verb.VOTE_REQUEST, payload)
                    for a in self._seeds if a not in self._boot_votes]
        self._resend_at = float("inf")
        return []

    def _win(self, now: float) -> list[Send]:
        r = self._roster
        return self._take_lead(now, replace(r, version=r.version + 1, term=self._term,
                                            leader=self._me.id))

    def _bootstrap(self, now: float) -> list[Send]:
        """Start a bootstrap election if enough of the seed set is up and rosterless."""
        self._boot_votes = None
        recent = {a: p for a, p in self._peers.items()
                  if now - p[0] <= self._t.failure_timeout and a in self._boot}
        heard = {a: p[1] for a, p in recent.items()}
        heard[self._me.cluster] = self._fresh
        if now - self._evidence_at <= self._t.failure_timeout or not self._can_win(heard):
            return []
        # Take turns, lowest address first, so that nodes started together do not split
        # the vote forever (a unanimous bootstrap fails if any seed votes for itself).
        rank = sorted(heard).index(self._me.cluster)
        if self._boot_skipped < rank:
            self._boot_skipped += 1
            return []
        self._boot_skipped = 0
        # A term above every fellow joiner's, so that no vote is refused as stale.
        self._term = max([self._term, *(p[2] for p in recent.values())]) + 1
        self._voted_for = (self._me.id, self._inc)
        self._boot_votes = {self._me.cluster: (self._me, self._inc, self._fresh)}
        return self._solicit(now)

    def _can_win(self, voters: dict[str, bool]) -> bool:
        """Bootstrap quorum: a majority of first-start seeds, or every seed."""
        return (sum(voters.values()) >= majority(len(self._boot))
                or len(voters) == len(self._boot))

    def _maybe_win_bootstrap(self, now: float) -> list[Send]:
        assert self._boot_votes is not None
        if not self._can_win({a: v[2] for a, v in self._boot_votes.items()}):
            return []
        votes = list(self._boot_votes.values())
        self._boot_votes = None
        first = Roster(1, self._term, self._me.id, tuple(v[0] for v in votes),
                       tuple(v[1] for v in votes), majority(len(self._boot)))
        log.info("bootstrapped a cluster of %d in term %d", len(votes), self._term)
        return self._take_lead(now, first)

    def _take_lead(self, now: float, roster: Roster) -> list[Send]:
        self._role, self._leader = LEADER, self._me.id
        self._prevotes = None
        self._had_roster = True
        self._set_roster(roster)
        self._acked.clear()
        self._pending.clear()
        self._leaving.clear()
        self._last_heard = {m.id: now for m in roster.members}
        self._heartbeat_at = now + self._t.heartbeat_interval
        return self._broadcast(Verb.HEARTBEAT)

    # ------------------------------------------------------------- leader duties
    def _committed(self) -> bool:
        r = self._roster
        n = sum(1 for m, inc in zip(r.members, r.incarnations)
                if m.id == self._me.id or self._acked.get((m.id, inc), (-1, -1)) >= r.key)
        return n >= r.quorum()

    def _next_change(self, now: float) -> list[Send]:
        """Make the next membership change, if the current roster is committed."""
        if self._role != LEADER or not self._committed():
            return []
        r = self._roster
        others = [(m, inc) for m, inc in zip(r.members, r.incarnations) if m.id != self._me.id]
        gone = ([p for p in others if self._latest_inc.get(p[0].id, p[1]) != p[1]]
                or [p for p in others
                    if now - self._last_heard.get(p[0].id, now) > self._t.failure_timeout]
                or [p for p in others if p[0].id in self._leaving])
        if gone:
            out_m, _ = gone[0]
            log.info("removing %s from the roster", out_m.id)
            self._leaving.discard(out_m.id)
            self._last_heard.pop(out_m.id, None)
            kept = [p for p in zip(r.members, r.incarnations) if p[0].id != out_m.id]
            self._set_roster(Roster(r.version + 1, self._term, self._me.id,
                                    tuple(m for m, _ in kept), tuple(i for _, i in kept)))
            return self._broadcast(Verb.ROSTER) + [
                self._to(out_m, Verb.ROSTER, roster=self._roster_payload)]
        for mid, (m, inc, until) in sorted(self._pending.items()):
            if until < now or r.get(mid) is not None:
                if until < now or r.has(mid, inc):
                    del self._pending[mid]
                continue  # an older incarnation is still in: it goes first (above)
            del self._pending[mid]
            log.info("admitting %s", mid)
            self._last_heard[mid] = now
            self._latest_inc[mid] = inc
            self._set_roster(Roster(r.version + 1, self._term, self._me.id,
                                    r.members + (m,), r.incarnations + (inc,)))
            return self._broadcast(Verb.ROSTER)
        return []

    def _config_dead(self) -> bool:
        """True when this roster can never again reach quorum (its members restarted)."""
        r = self._roster
        live = sum(1 for m, inc in zip(r.members, r.incarnations)
                   if m.id == self._me.id or self._latest_inc.get(m.id, inc) == inc)
        if live >= r.quorum():
            return False
        # A committed leader can still shrink the roster one removal at a time.
        n = len(r.members)
        return not (self._role == LEADER and n >= 2 and live >= majority(n - 1)
                    and self._committed())

    def _abandon(self, now: float) -> list[Send]:
        log.warning("roster v%d can never reach quorum again: rejoining from scratch",
                    self._roster.version)
        self._inc = self._new_incarnation()  # our old votes and acks count nowhere now
        self._evidence_at = float("-inf")  # the cluster we knew is gone
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
        self._boot_votes = self._prevotes = None
        if self._role in (LEADER, CANDIDATE):
            self._role = FOLLOWER
            self._reset_election(now)

    def _become_joining(self, now: float) -> None:
        self._role, self._leader = JOINING, None
        self._set_roster(EMPTY)
        self._votes.clear()
        self._boot_votes = self._prevotes = None
        self._join_at = now
        self._boot_at = now + self._election_timeout()

    def _set_roster(self, roster: Roster) -> None:
        self._roster = roster
        self._roster_payload = roster.to_payload()

    def _reset_election(self, now: float) -> None:
        self._election_at = now + self._election_timeout()

    def _election_timeout(self) -> float:
        return self._rng.uniform(self._t.election_timeout_min, self._t.election_timeout_max)

    def _new_incarnation(self) -> str:
        return f"{self._rng.getrandbits(64):016x}"

    def _payload(self, verb: Verb, **fields: Any) -> dict:
        p = {"term": self._term, "inc": self._inc, "from": self._me_payload}
        if verb is Verb.JOIN:
            p.update(boot=list(self._boot), fresh=self._fresh)
        p.update(fields)
        return p

    def _to(self, m: Member, verb: Verb, **fields: Any) -> Send:
        return Send(m.id, m.cluster, verb, self._payload(verb, **fields))

    def _broadcast(self, verb: Verb) -> list[Send]:
        return [self._to(m, verb, roster=self._roster_payload)
                for m in self._roster.members if m.id != self._me.id]

    def _ack(self, to: Member, ok: bool) -> Send:
        r = self._roster
        return self._to(to, Verb.HEARTBEAT_ACK, ok=ok, rterm=r.term, version=r.version)

    def _vote(self, to: Member, granted: bool) -> Send:
        return self._to(to, Verb.VOTE, granted=granted, fresh=self._fresh)

    def _redirect(self, env: _Envelope) -> list[Send]:
        leader = self._roster.get(self._leader) if self._leader else None
        if leader is None or leader.id == env.member.id:
            return []
        return [self._to(env.member, Verb.REDIRECT, leader=leader.id, address=leader.cluster)]

    def _joins(self) -> list[Send]:
        payload = self._payload(Verb.JOIN)
        out = [Send(None, a, Verb.JOIN, payload) for a in self._seeds]
        if self._join_target is not None and self._join_target[1] not in self._seeds:
            out.append(Send(self._join_target[0], self._join_target[1], Verb.JOIN, payload))
        return out
