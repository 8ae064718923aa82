"""The sibling protocol: which copy of a task may deliver, as a pure state machine.

A task is stored on N nodes (its replicas); copy i fires ``i * offset`` after copy 0.
``Siblings`` is one node's side of the protocol between those copies. It holds no socket,
clock, greenlet or engine: the cluster layer hands it what happened — a sibling's message
(``step``), a copy about to be delivered (``fire``), an attempt's outcome (``outcome``),
the roster (``members``), time passing (``tick``) — with the copy as the engine holds it,
and carries out the effects it returns (``miyamoto.effects``). ``tests/siblings_sim.py``
drives it with loss, delay, pauses, partitions, crashes and member drops.

The rules, and why each is there:

On time: CLAIM, one way
    A copy that fires on time tells its siblings CLAIM(lease) and delivers; a sibling
    holds its copy until the lease (the attempt's deadline plus ``claim_lease``) plus its
    distance in offsets. The healthy path costs one message per sibling and no wait.
    DONE / FAILED end the siblings' copies, RETRY moves them in step with the retry time.
    Times travel as durations (a lease, a delay), read against the receiver's clock.

Late: ASK first
    A copy that fires later than planned by more than ``late_after`` (its node stalled,
    was overloaded, or was cut off), a copy reloaded from the journal, a copy held while
    its node was out of the roster or out of contact, and every copy that fires while
    its node has just seen its own loop stall: each ASKs its live siblings and delivers
    only once every one has answered ``go`` or ``unknown``. Why: while the node was
    stopped its siblings fired, claimed and delivered, and that news sits unread in its
    inbox; a one-way CLAIM sent now would cross it. A sibling that has the task running,
    claimed or ended says so (``claimed``/``ended``) and the asker stands down; one that
    answers ``go`` holds its own copy off for ``ask_lease``, as if claimed, so the two
    cannot both start. Two late copies asking each other: the lower replica index goes
    first (the other answers it ``go`` and is answered ``wait``). A sibling that does not
    answer is asked again; the copy waits as long as that sibling is in the roster.

Out of touch with a sibling: ASK first
    A copy that fires on time, but while this node has not heard from one of its
    siblings' nodes for ``fresh`` (members probe each other every heartbeat), asks too.
    Why: a link cut between the two while both run is not a pause. The cut-off side
    keeps delivering until its contact lease runs out, and its CLAIMs are lost; a
    sibling firing a one-way CLAIM now would deliver those tasks again. Asking waits
    until the silent sibling answers or leaves the roster, and a node dropped from the
    roster has stopped delivering by then. So a cut costs at most the deliveries of
    the ``fresh`` window before it was noticed, not those of a whole lease.

Contact: no deliveries without a majority
    A node that cannot hear a majority of the roster (``contact`` is False: its lease
    from them ran out, see ``Membership.in_contact``) starts no delivery; its due copies
    are held and ask once contact is back. So during a partition only the majority side
    delivers, and the minority side's copies, late by then, ask before they fire.

Early news
    STORE and the siblings' news travel on different connections, so a CLAIM or DONE may
    come before the copy it is about. It is kept (bounded in count and age) and replayed
    once the copy is stored.

Members lost, stale views
    When the roster drops members, copies held off by a lost member's claim fire again
    at their distance from now (the dead claimer's lease would hold them for no one),
    asks stop waiting for lost members, and the first live replica of each task that lost
    copies restores them (``Restore``). None of that happens while this node is out of
    contact: a node back from a pause acts on nothing until it hears a majority. When this
    node itself is dropped, every copy it holds must ask before it delivers, since the
    others re-home its tasks meanwhile.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from miyamoto import messages as m
from miyamoto import replication
from miyamoto.effects import EARLIER, EXACT, LATER, CancelCopy, Drop, Send, \
    SetReplicas, Update
from miyamoto.task import State, Task

EARLY_MAX = 20_000   # sibling news held for copies not stored yet
EARLY_TTL = 120.0
EARLY_PER_TASK = 16
CLAIMS_MAX = 100_000  # claims heard whose outcome has not come yet
HOLD_RETRY = 0.5      # a copy held for want of contact or membership looks again after this
PROBE_MAX = 100_000   # copies probed at once when this node is back in touch
PRUNE_MIN = 1024      # must-ask marks kept before the first pruning
EMPTY: Mapping[str, Task] = {}
EVER = float("inf")


@dataclass(frozen=True)
class SiblingTiming:
    offset: float = 5.0          # replica_offset
    claim_lease: float = 60.0    # extra hold past an attempt's deadline
    late_after: float = 1.25     # a copy this late asks first
    ask_timeout: float = 2.0     # an unanswered ASK is sent again after this
    ask_lease: float = 5.0       # a sibling answering ``go`` holds its copy this long
    stall_gap: float = 1.5       # a gap between ticks this long is a stall of our loop
    fresh: float = 1.5           # a sibling unheard this long is out of touch: ask it

    @classmethod
    def derive(cls, offset: float, claim_lease: float, replication_timeout: float,
               heartbeat_interval: float, failure_timeout: float) -> "SiblingTiming":
        """Timings from the node's options: late means a quarter of the offset (the next
        sibling fires one offset after us; our CLAIM must reach it well before), at
        least half a second, so that an ordinary scheduling lag does not ask."""
        ask_timeout = max(0.05, replication_timeout)
        return cls(offset=offset, claim_lease=claim_lease,
                   late_after=max(0.5, offset / 4), ask_timeout=ask_timeout,
                   ask_lease=max(2 * ask_timeout, offset),
                   stall_gap=max(2 * heartbeat_interval, failure_timeout / 2),
                   fresh=3 * heartbeat_interval)


@dataclass
class _Claim:
    claimer: str
    theirs: int   # the claimer's replica index
    until: float  # our clock


@dataclass
class _Asking:
    replica: int
    n: int
    deadline: float
    waiting: set[str]
    answers: list[m.Answer] = field(default_factory=list)


class Siblings:
    def __init__(self, me: str, timing: SiblingTiming, members: Iterable[str] = ()):
        self.me = me
        self.t = timing
        self.members: frozenset[str] = frozenset(members) or frozenset({me})
        self.contact = True
        self.claims: dict[str, _Claim] = {}
        self.early: collections.OrderedDict[str, list[tuple[float, str, Any]]] = \
            collections.OrderedDict()
        self.must_ask: set[str] = set()    # copies that ask before they deliver
        self.asking: dict[str, _Asking] = {}
        self.cleared: dict[str, float] = {}  # answered ``go`` by all: deliver until then
        self.last_tick: float | None = None
        self.stalled = False
        self._lost: set[str] = set()  # members lost while we were out of contact
        self._prune_at = PRUNE_MIN  # must-ask marks beyond this: drop those of ended copies
        self.heard_at: dict[str, float] = {}  # member -> when we last heard from it

    # ------------------------------------------------------------ time and roster
    def tick(self, now: float, contact: bool, live: Mapping[str, Task] = EMPTY) -> list[Any]:
        """Time passes; ``contact``: this node hears a majority of the roster now;
        ``live``: its live copies. Each of them asks first once this node has been out
        of touch (its loop stalled, its contact lapsed, or it is out of the roster): the
        others may have delivered or re-homed them meanwhile, and their news may never
        have reached us (a roster that dropped and re-admitted us while we slept)."""
        if self.last_tick is not None and now - self.last_tick > self.t.stall_gap:
            self.stalled = True  # until we are in contact again, on a later tick
        elif contact:
            self.stalled = False
        was = self.contact
        self.last_tick = now
        self.contact = contact and not self.stalled and self.me in self.members
        effects: list[Any] = []
        if was and not self.contact and len(self.members | {self.me}) > 1:
            self.must_ask.update(live)
        elif self.contact and not was:
            effects += self._probe(live)
        for task_id, a in list(self.asking.items()):
            if now >= a.deadline:
                if live is not EMPTY and task_id not in live:
                    self._forget(task_id)  # ended or dropped meanwhile (a client's DELETE)
                else:
                    effects += self._ask_again(task_id, a, now)
        if live is not EMPTY and len(self.must_ask) > self._prune_at:
            self.must_ask.intersection_update(live)  # copies that ended by other ways
            self._prune_at = max(PRUNE_MIN, 2 * len(self.must_ask))
        self._expire(now)
        return effects

    def _probe(self, live: Mapping[str, Task]) -> list[Any]:
        """Back in touch: ask the siblings of every copy that must ask whether they know
        its end. A copy due later would ask only when it fires, and by then the sibling
        that delivered it may have left the roster, its news lost with it."""
        effects: list[Any] = []
        for task_id in list(self.must_ask)[:PROBE_MAX]:
            t = live.get(task_id)
            if t is not None and task_id not in self.asking:
                probe = m.Ask(task_id, t.replica, probe=True)
                effects += [Send(r, probe) for r in self._live_siblings(t)]
        return effects

    def _expire(self, now: float) -> None:
        while self.early:
            first = next(iter(self.early.values()))
            if len(self.early) <= EARLY_MAX and now - first[0][0] < EARLY_TTL:
                break
            self.early.popitem(last=False)
        for task_id in [i for i, until in self.cleared.items() if until < now]:
            del self.cleared[task_id]

    def set_members(self, members: Iterable[str], now: float,
                    live: Iterable[str] = ()) -> list[Any]:
        """The roster changed (``live``: this node's live copies). A node dropped from
        the roster marks every copy to ask first: the others re-home its tasks meanwhile."""
        new = frozenset(members)
        if self.me in self.members and self.me not in new:
            self.must_ask.update(live)
        lost = self.members - new - {self.me}
        self.members = new
        self._lost = (self._lost | lost) - new
        effects: list[Any] = []
        for task_id, a in list(self.asking.items()):
            a.waiting &= new
            if not a.waiting:
                effects += self._decide(task_id, a, now)
        return effects

    def take_lost(self) -> set[str]:
        """Members lost whose consequences (released claims, restores) are due now:
        only while in contact, so a node back from a pause acts on no stale view."""
        if not self.contact or self.me not in self.members or not self._lost:
            return set()
        lost, self._lost = self._lost, set()
        return lost

    def release_claims(self, lost: set[str], copies: dict[str, Task], now: float) -> list[Any]:
        """Copies held off by a lost member's claim fire again at their distance from now."""
        effects: list[Any] = []
        for task_id, cl in list(self.claims.items()):
            if cl.claimer not in lost:
                continue
            del self.claims[task_id]
            t = copies.get(task_id)
            if t is not None and t.state == State.SCHEDULED:
                at = replication.sibling_fire_at(now, t.replica, cl.theirs, len(t.replicas),
                                                 self.t.offset)
                effects.append(Update(task_id, at=at, how=EXACT))
        return effects

    def dropped(self, task_ids: Iterable[str]) -> None:
        """This node left the roster (or is back after a restart): every copy asks first."""
        self.must_ask.update(task_ids)

    def heard(self, member: str, now: float) -> None:
        """A message (any) came from ``member`` now."""
        self.heard_at[member] = now

    # ------------------------------------------------------------ our copy fires
    def fire(self, t: Task, now: float, deadline: float) -> tuple[bool, list[Any]]:
        """Copy ``t`` is due. (True, effects): deliver it, after sending the effects'
        CLAIMs; (False, effects): hold it; the effects reschedule it."""
        if len(t.replicas) <= 1 and t.id not in self.must_ask:
            return True, []  # no sibling to collide with
        stalled = self.stalled or (self.last_tick is not None
                                   and now - self.last_tick > self.t.stall_gap)
        if self.me not in self.members or stalled or (not self.contact and len(self.members) > 1):
            self.must_ask.add(t.id)
            return False, [Update(t.id, at=now + HOLD_RETRY, how=LATER)]
        if t.id in self.asking:
            return False, [Update(t.id, at=self.asking[t.id].deadline, how=LATER)]
        siblings = self._live_siblings(t)
        cleared = self.cleared.pop(t.id, None)
        late = now - t.fire_at > self.t.late_after or \
            any(now - self.heard_at.get(r, -EVER) > self.t.fresh for r in siblings)
        if siblings and cleared is None and (late or t.id in self.must_ask):
            return False, self._ask(t, siblings, now)
        self.must_ask.discard(t.id)
        self.claims.pop(t.id, None)
        claim = m.Claim(t.id, t.replica, deadline + self.t.claim_lease)
        return True, [Send(r, claim) for r in siblings]

    def _live_siblings(self, t: Task) -> list[str]:
        return [r for r in t.replicas if r != self.me and r in self.members]

    def _ask(self, t: Task, siblings: list[str], now: float) -> list[Any]:
        self.must_ask.add(t.id)
        a = _Asking(t.replica, len(t.replicas), now + self.t.ask_timeout, set(siblings))
        self.asking[t.id] = a
        ask = m.Ask(t.id, t.replica)
        return [Send(r, ask) for r in siblings] + [Update(t.id, at=a.deadline, how=LATER)]

    def _ask_again(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        a.waiting &= self.members
        if not a.waiting:
            return self._decide(task_id, a, now)
        a.deadline = now + self.t.ask_timeout
        ask = m.Ask(task_id, a.replica)
        return [Send(r, ask) for r in sorted(a.waiting)] + \
            [Update(task_id, at=a.deadline, how=LATER)]

    def _decide(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        """Every live sibling answered (or left): go, or stand down until a lease ends."""
        del self.asking[task_id]
        holds = [x.lease for x in a.answers if x.verdict in (m.WAIT, m.CLAIMED)]
        if holds:
            return [Update(task_id, at=now + max(holds), how=LATER)]
        self.must_ask.discard(task_id)
        self.cleared[task_id] = now + self.t.ask_lease / 2
        return [Update(task_id, at=now, how=EARLIER)]

    # ------------------------------------------------------------ our attempt's outcome
    def outcome(self, t: Task, now: float) -> list[Any]:
        """Our attempt ended with ``t`` (succeeded, failed, or scheduled for a retry)."""
        siblings = [r for r in t.replicas if r != self.me]
        if not siblings:
            return []
        effects: list[Any] = []
        attempt = t.history[-1] if t.history else None
        if t.state == State.SUCCEEDED:
            msg: Any = m.Done(t.id, t.attempts, t.last, attempt)
        elif t.state == State.FAILED:
            msg = m.Failed(t.id, t.attempts, t.last, attempt)
        elif t.state == State.SCHEDULED:
            # a sibling claimed while our attempt ran (its CLAIM crossed ours): our retry
            # waits for its lease like any held copy, and the others wait with us
            at = max(t.fire_at, self._held_until(t, now))
            if at > t.fire_at:
                effects.append(Update(t.id, at=at, how=LATER))
            msg = m.Retry(t.id, t.replica, max(0.0, at - now), t.attempts, t.last, attempt)
        else:
            return []
        return effects + [Send(r, msg) for r in siblings]

    def _held_until(self, t: Task, now: float, but: str | None = None) -> float:
        """When a live claim of another sibling (not ``but``) lets copy ``t`` fire."""
        cl = self.claims.get(t.id)
        if cl is None or cl.until <= now or cl.claimer in (self.me, but):
            return 0.0
        return replication.sibling_fire_at(cl.until, t.replica, cl.theirs, len(t.replicas),
                                           self.t.offset)

    # ------------------------------------------------------------ a sibling's news
    def step(self, sender: str, msg: Any, t: Task | None, now: float) -> list[Any]:
        """A sibling's message about task ``msg.id``; ``t`` is our live copy, if any
        (for ASK: our copy or its ended record)."""
        if isinstance(msg, m.Ask):
            return self._on_ask(sender, msg, t, now)
        if isinstance(msg, m.Answer):
            return self._on_answer(sender, msg, t, now)
        if t is None or t.state.ended:
            if not isinstance(msg, m.Replicas):
                self._keep_early(sender, msg, now)
            return []
        if isinstance(msg, m.Claim):
            return self._on_claim(msg, t, now)
        self.cleared.pop(t.id, None)
        if isinstance(msg, m.Retry):
            at = replication.sibling_fire_at(now + msg.delay, t.replica, msg.replica,
                                             len(t.replicas), self.t.offset)
            held = self._held_until(t, now, but=sender)  # another claimer's lease stands
            if not held:
                self.claims.pop(t.id, None)
            return [Update(t.id, at=max(at, held), how=EXACT, state=State.SCHEDULED,
                           attempts=msg.attempts, last=msg.last, attempt=msg.attempt)]
        self.claims.pop(t.id, None)
        if isinstance(msg, (m.Done, m.Failed)):
            self._forget(t.id)
            state = State.SUCCEEDED if isinstance(msg, m.Done) else State.FAILED
            return [Update(t.id, state=state, attempts=msg.attempts, last=msg.last,
                           attempt=msg.attempt)]
        if isinstance(msg, m.Cancel):
            self._forget(t.id)
            return [CancelCopy(t.id, msg.abort)]
        if isinstance(msg, m.Replicas):
            return [SetReplicas(t.id, msg.replicas)] if self.me in msg.replicas else []
        return []

    def handoff(self, msg: m.Handoff, now: float) -> list[Any]:
        """A sibling stopping gracefully hands us its due copies: fire ours then."""
        return [Update(task_id, at=now + delay, how=EARLIER) for task_id, delay in msg.tasks]

    def _on_claim(self, msg: m.Claim, t: Task, now: float) -> list[Any]:
        n = len(t.replicas)
        self.cleared.pop(t.id, None)
        at = replication.sibling_fire_at(now + msg.lease, t.replica, msg.replica, n,
                                         self.t.offset)
        if 0 <= msg.replica < n:
            self._note_claim(t.id, _Claim(t.replicas[msg.replica], msg.replica, now + msg.lease))
        return [Update(t.id, at=at, how=LATER)]

    def _note_claim(self, task_id: str, claim: _Claim) -> None:
        self.claims.pop(task_id, None)
        self.claims[task_id] = claim
        while len(self.claims) > CLAIMS_MAX:
            self.claims.pop(next(iter(self.claims)))

    def _forget(self, task_id: str) -> None:
        self.must_ask.discard(task_id)
        self.asking.pop(task_id, None)

    def _on_ask(self, sender: str, msg: m.Ask, t: Task | None, now: float) -> list[Any]:
        def answer(verdict: str, **kw: Any) -> list[Any]:
            return [Send(sender, m.Answer(msg.id, verdict, **kw))]
        if t is None:
            return [] if msg.probe else answer(m.UNKNOWN)
        if t.state.ended:
            return answer(m.ENDED, state=t.state.value, attempts=t.attempts, last=t.last)
        if sender not in t.replicas:
            return answer(m.REHOMED, replicas=t.replicas)
        if msg.probe:
            return []  # nothing the prober does not know
        if t.state == State.RUNNING:
            return answer(m.CLAIMED, lease=self.t.ask_lease)
        claim = self.claims.get(t.id)
        if claim is not None and claim.until > now and claim.claimer != sender:
            return answer(m.CLAIMED, lease=claim.until - now)
        if t.id in self.asking and t.replica < msg.replica:
            return answer(m.WAIT, lease=self.t.ask_timeout)
        # the asker goes: hold our copy off as if it had claimed
        n = len(t.replicas)
        if 0 <= msg.replica < n:
            self._note_claim(t.id, _Claim(sender, msg.replica, now + self.t.ask_lease))
        self.cleared.pop(t.id, None)
        at = replication.sibling_fire_at(now + self.t.ask_lease, t.replica, msg.replica, n,
                                         self.t.offset)
        return [Update(t.id, at=at, how=LATER)] + answer(m.GO)

    def _on_answer(self, sender: str, msg: m.Answer, t: Task | None, now: float) -> list[Any]:
        a = self.asking.get(msg.id)
        if a is None:  # the answer to a probe: only an end or a move is news
            if t is None or t.state != State.SCHEDULED or sender not in t.replicas:
                return []
            if msg.verdict == m.ENDED:
                self._forget(msg.id)
                return [Update(msg.id, state=State(msg.state), attempts=msg.attempts,
                               last=msg.last)]
            if msg.verdict == m.REHOMED:
                return [Drop(msg.id)] if self.me not in msg.replicas else \
                    [SetReplicas(msg.id, msg.replicas)]
            return []
        if sender not in a.waiting:
            return []
        a.waiting.discard(sender)
        if msg.verdict == m.ENDED:
            self._forget(msg.id)
            return [Update(msg.id, state=State(msg.state), attempts=msg.attempts, last=msg.last)]
        if msg.verdict == m.REHOMED:
            if self.me not in msg.replicas:
                self._forget(msg.id)
                return [Drop(msg.id)]
            a.waiting &= set(msg.replicas)
            effects: list[Any] = [SetReplicas(msg.id, msg.replicas)]
        else:
            a.answers.append(msg)
            effects = []
        if not a.waiting:
            effects += self._decide(msg.id, a, now)
        return effects

    def _keep_early(self, sender: str, msg: Any, now: float) -> None:
        news = self.early.setdefault(msg.id, [])
        if len(news) < EARLY_PER_TASK:
            news.append((now, sender, msg))
            self.early.move_to_end(msg.id)
        self._expire(now)

    def take_early(self, task_id: str) -> list[tuple[str, Any]]:
        """News that came before our copy was stored (or rerun): replay it now."""
        return [(sender, msg) for _, sender, msg in self.early.pop(task_id, ())]
