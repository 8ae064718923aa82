"""Liveness: whom this node heard from and when, and whether its own view went stale.

Pure: ``now`` comes from the caller (``Membership``, fed by the cluster layer's monotonic
clock).

Rules, and why:

Evidence, not receipt
    A leader numbers its broadcasts (``round``) and remembers when it sent each; an ack
    echoes the round, so the leader learns the *send* time of the newest message each
    member answered (``contact``). That is the time from which the member's election
    timer ran, so it is what a lease may rely on; a message's receipt time is not
    (an ack that waited in our inbox during a pause says nothing about now).

Stalls
    A gap between two consecutive ``now`` values beyond ``Timing.stall`` means that this
    node was paused (SIGSTOP, a VM freeze, a long GC pause) or its loop was starved.
    Meanwhile the others may have elected a new leader and dropped members, so what we
    knew is stale: until we hear from a current majority *after* the stall we make no
    roster change, count no member as failed, and report ourselves not in contact. A
    leader recovers with acks, from a quorum of its roster, to rounds sent after the
    stall; a follower with a heartbeat from its leader that echoes an ack (``seq``) sent
    after the stall, i.e. one the leader sent after hearing from us post-stall. Timers
    of silence restart at the resume, so members are not dropped because *we* were
    paused.
"""

from __future__ import annotations

from miyamoto.membership.roster import FOLLOWER, LEADER, Roster, Timing


LAST_WORDS = 32  # removed members whose last message's receipt is kept


class Liveness:
    def __init__(self, me_id: str, timing: Timing, now: float):
        self._me = me_id
        self._t = timing
        self._last_now = now
        self.stalled = False
        self._stall_round = 0
        self._stall_seq = 0
        self._fresh: set[str] = set()  # leader: acked a round sent after the stall
        self.heard: dict[str, float] = {}  # id -> receipt of its last message (health)
        self.last_words: dict[str, float] = {}  # the same of removed members (the latest)
        # leader
        self._round = 0                       # broadcasts numbered so far
        self._sent: dict[int, float] = {}     # round -> when sent (recent rounds only)
        self.contact: dict[str, float] = {}   # id -> send time of the newest round it acked
        self._grace: dict[str, float] = {}    # id -> silence counted from here at least
        self._echo: dict[tuple[str, str], int] = {}  # voter -> highest ack seq it sent us
        # follower
        self._seq = 0                         # acks sent so far
        self.beat_at = float("-inf")          # last message from the leader we follow
        self.leader_heard: frozenset[str] | None = None  # what that message said it hears

    # -------------------------------------------------------------------- stalls
    @property
    def last_now(self) -> float:
        return self._last_now

    def observe(self, now: float) -> float:
        """Note the time; the length of the stall that ``now`` ends, or 0.0."""
        gap = now - self._last_now
        self._last_now = max(self._last_now, now)
        if gap <= self._t.stall:
            return 0.0
        self.stalled = True
        self._stall_round, self._stall_seq = self._round, self._seq
        self._fresh.clear()
        self.leader_heard = None
        for mid in list(self._grace) + list(self.contact):
            self._grace[mid] = max(self._grace.get(mid, now), now)
        return gap

    def recover_as_leader(self, ids: tuple[str, ...], quorum: int) -> bool:
        """Leader: True once a quorum of ``ids`` has acked rounds sent after the stall."""
        if self.stalled and sum(1 for i in ids if i == self._me or i in self._fresh) >= quorum:
            self.stalled = False
        return not self.stalled

    # -------------------------------------------------------------------- leader
    def lead(self, ids: tuple[str, ...], now: float) -> None:
        """A new leadership: no evidence yet; every member's silence counts from now."""
        self.contact.clear()
        self._grace = {i: now for i in ids}

    def admitted(self, member_id: str, now: float) -> None:
        self._grace[member_id] = now

    def removed(self, member_id: str) -> None:
        heard = self.heard.get(member_id)
        for d in (self.contact, self._grace, self.heard):
            d.pop(member_id, None)
        if heard is not None:  # its last word, for whoever shows it as down
            self.last_words[member_id] = heard
            while len(self.last_words) > LAST_WORDS:
                del self.last_words[next(iter(self.last_words))]

    def next_round(self, now: float) -> int:
        """Number a broadcast sent now (rounds older than the failure timeout are let go)."""
        self._round += 1
        self._sent[self._round] = now
        old = now - self._t.failure_timeout
        for r in [r for r, at in self._sent.items() if at < old]:
            del self._sent[r]
        return self._round

    def acked(self, voter: tuple[str, str], round_: int | None, seq: int | None) -> None:
        """An ok ack from a roster member, in our term, as leader."""
        sent = self._sent.get(round_) if round_ is not None else None
        mid = voter[0]
        if sent is not None:
            self.contact[mid] = max(self.contact.get(mid, sent), sent)
            if round_ is not None and round_ > self._stall_round:
                self._fresh.add(mid)
        if seq is not None:
            self._echo[voter] = max(self._echo.get(voter, seq), seq)

    def echo_for(self, voter: tuple[str, str]) -> int | None:
        return self._echo.get(voter)

    def silent(self, member_id: str, now: float) -> bool:
        """Leader: no ack to a round sent within the failure timeout (grace aside)."""
        last = max(self.contact.get(member_id, float("-inf")),
                   self._grace.get(member_id, float("-inf")))
        return member_id != self._me and now - last > self._t.failure_timeout

    def hears(self, ids: tuple[str, ...], now: float) -> frozenset[str]:
        """Leader: the ids with evidence within the failure timeout, and me."""
        cut = now - self._t.failure_timeout
        return frozenset(i for i in ids if i == self._me or self.contact.get(i, cut - 1) >= cut)

    # ------------------------------------------------------------------ follower
    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def beat(self, heard: tuple[str, ...] | None, echo: int | None, now: float) -> None:
        """A ROSTER/HEARTBEAT from the leader we follow."""
        self.beat_at = now
        self.leader_heard = None if heard is None else frozenset(heard)
        if self.stalled and echo is not None and echo > self._stall_seq:
            self.stalled = False

    def follows(self, now: float) -> bool:
        """Follower: heard our leader within the failure timeout."""
        return now - self.beat_at <= self._t.failure_timeout

    # ----------------------------------------------------------- what we report
    def in_contact(self, r: Roster, role: str, leader: str | None, now: float) -> bool:
        """``Membership.in_contact`` for a node in ``r`` (the rules are stated there)."""
        if role == LEADER and len(r.members) == 1:
            return True
        if self.stalled:
            return False
        if role == LEADER:
            return len(self.hears(r.ids(), now)) >= r.quorum()
        if role != FOLLOWER or leader is None or not self.follows(now):
            return False
        heard = self.leader_heard
        return heard is None or len(heard & set(r.ids())) >= r.quorum()

    def reachable(self, r: Roster, role: str, leader: str | None,
                  now: float) -> frozenset[str]:
        """``Membership.reachable`` (the rules are stated there)."""
        me = frozenset({self._me})
        ids = r.ids()
        if self.stalled and len(ids) > 1:
            return me
        if role == LEADER:
            return self.hears(ids, now) | me
        if role == FOLLOWER and leader is not None and self.follows(now):
            return (self.leader_heard or frozenset()) & set(ids) | me | {leader}
        return me
