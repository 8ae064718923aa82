"""The sibling protocol: which copy of a task may deliver, as a pure state machine.

A task is stored on N nodes (its replicas); copy i fires ``i * offset`` after copy 0.
``Siblings`` is one node's side of the protocol between those copies. It holds no socket,
clock, greenlet or engine, and has one door, as etcd raft's ``Step``/``Ready``:
``step(event, now)`` takes what happened (``miyamoto.replicas.events``: a sibling's
message, a copy due, an attempt's outcome, the roster, time passing...) with the copies
it needs as the engine holds them, and returns a ``Ready``: the effects to carry out, in
order (``miyamoto.replicas.effects``), and the answer where the event asks one. What
follows an event (a tick's lost members: their claims released, then their copies
restored) is decided here, so the cluster layer and ``tests/sim/siblings_sim.py``, which
drives it with loss, delay, pauses, partitions, crashes and member drops, run the same.

The rules, and why each is there:

Every delivery is acknowledged first
    A copy about to deliver sends ASK to each live sibling (one in the roster) and
    delivers only once every one has answered ``go`` or ``unknown``, within half an
    ``ask_lease`` of its ASK; a sibling answering ``go`` holds its own copy off for
    ``ask_lease``, and the copy, if its attempt still runs a quarter of ``ask_lease``
    later (no later than its clearance ends), sends CLAIM(lease) one way to extend that
    to its attempt's deadline plus ``claim_lease`` (plus each sibling's distance in
    offsets), noted by the sibling, not written. One that has the task running, claimed or ended says so and the asker
    stands down; two copies asking each other: the lower replica index goes first. A
    sibling that does not answer is asked again; the copy waits as long as that sibling
    is in the roster. Why: a link cut between two nodes while both run is not a pause,
    and neither side sees it for a while (3 heartbeats at best, ``failure_timeout`` to
    be sure); the one-way CLAIM this protocol used to send and deliver on is lost in
    that while, and the other side delivered the task again (8-11 duplicates per 10 s
    cut at 100 tasks/s, 5 nodes in network namespaces). Acknowledged, no delivery starts
    after a cut began without an answer that crossed the cut before it: the majority
    side drops the cut-off member after ``failure_timeout`` and then goes, the minority
    side hears no answer and starts nothing. Only a delivery in flight at the cut may
    repeat. The cost on the healthy path: one round trip before each delivery and one
    ANSWER per sibling (the outbox batches messages per peer); no journal write on
    either side for the exchange (the held copy is fired again by ``Fire``, the answerer
    notes the claim). A new copy 0 due at once asks inside its siblings' STOREs
    (``Folded``) and their STOREDs carry the answers, so a task due now costs STORE,
    STORED and DONE per sibling, and a fast delivery no CLAIM. Times travel as durations (a lease, a delay), read against the
    receiver's clock. DONE / FAILED end the siblings' copies, RETRY moves them in step.

The newer version of a replaced task
    A named task replaced (``tasks/repeat.py``) carries a revision on every copy; a copy
    that missed replaces (its node was killed meanwhile and came back with its old copy)
    asks, and probes, with its older revision. A sibling whose copy holds a newer one
    answers ``wait``, not ``go``, and sends its version by the replace path (``Refresh``):
    the asker's copy takes the newer params, body and later eta, and asks again when
    that is due. Why: answered ``go``, a node restarted after kill -9 during eight
    replaces delivered the second one's payload 2.2 s early, about one run in four.

Out of touch: must ask, and probe
    A copy reloaded from the journal, a copy held while its node was out of the roster
    or out of contact, and every copy that fires while its node has just seen its own
    loop stall is marked ``must_ask``: a single-copy task asks too (its siblings may
    have been re-homed), and once back in touch the node probes the siblings of every
    marked copy (ASK ``probe``: answered only with an end or a move), since a copy due
    later would ask only when it fires, and by then the sibling that delivered it may
    have left the roster. Why: while the node was stopped its siblings fired and
    delivered, and that news sits unread in its inbox or was lost with the link. Such a
    copy whose siblings cannot tell (they left the roster, or dropped their copies) asks
    every member, since its task may have been re-homed to any of them; if none knows,
    it waits for a sibling to come back, at most ``claim_lease``. It is not used to
    restore lost copies either (``miyamoto.replicas.restore``): a copy made from a stale one
    would answer ``go``. (A rejoined node delivered again what its siblings delivered
    while it was cut off, measured with flapping links, until these two rules.)

Back after a drop: every copy reconciles
    A node back in touch after it may have been dropped (a start, a drop from the
    roster, ``away_after`` out of touch) walks every copy it holds, the journal's and
    the ended ones too, a page at a time (``Reconcile``), and probes their live
    siblings. A ``rehomed`` answer drops the copy (live or ended), an ``ended`` one
    ends a live copy, and an ended copy of an earlier run takes the later run's end
    (the answer carries its reruns and how long ago it ended), or joins the later run
    still under way (``same``, with its reruns: the copy is run again in that run). Why: a copy due beyond
    the memory window probed only when paged in, and an ended one never: after a kill
    -9 and a restart, a label search showed a third of its tasks twice (the stale first
    copies beside the ones restored elsewhere) until they came due, and a bulk resend
    of the ends before a time reran and counted 80 stale ends the cluster had resent
    already, resending none. The cost: one probe per copy and sibling at a rejoin
    (batched per peer by the outbox), an answer only where there is news.

Contact: no deliveries without a majority
    A node that cannot hear a majority of the roster (``contact`` is False: its lease
    from them ran out, see ``Membership.in_contact``) starts no delivery; its due copies
    are held and probe once contact is back. So during a partition only the majority
    side delivers, once it has dropped the cut-off members its copies wait for.

Early news
    STORE and the siblings' news travel on different connections, so an ASK or DONE may
    come before the copy it is about. It is kept (bounded in count and age) and replayed
    once the copy is stored: an ASK answered ``unknown`` is kept as the claim it is.

Members lost, stale views
    When the roster drops members, asks stop waiting for lost members, and the first
    live replica of each task that lost copies restores them (``Restore``). A lost
    member's claims are honoured until their lease runs out: it may only be paused or cut
    off, its attempt still running (a worker answering after 25 s while its node was
    stopped for 10 s got every task twice when the claims went with the roster entry).
    A member seen again under a new incarnation restarted: its earlier claims are void
    and the copies they held fire again at their distance from now, so a kill -9 and a
    restart cost no wait; one that never comes back costs at most one lease. Not a
    ``held`` claim (a long task's 202 or heartbeat): its worker still works, and the
    restarted holder reloads the accepted attempt and its lease's end (a restart that
    voided it delivered the task again 5 s before the lease ended). None of that
    happens while this node is out of contact: a node back from a pause acts on nothing until it hears a majority. When this
    node itself is dropped, every copy it holds must ask before it delivers, since the
    others re-home its tasks meanwhile.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.replicas import restore
from miyamoto.replicas.effects import (AskWhenPaged, CancelCopy, Drop, Effect, Fire, Move,
                                       JoinRun, MoveLone, Ready, Reconcile, Refresh, Replay,
                                       RestoreLost, SetReplicas, TakeEnd, Update)
from miyamoto.replicas.events import (EMPTY, Due, Event, Expiring, Folded, HandoffReceived,
                                      LeaseExtended, LostPage, Members, Outcome, Received,
                                      Reconciling, Reloaded, Restored, Stopping, Stored, Tick)
from miyamoto.tasks import repeat
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send

EARLY_MAX = 20_000   # sibling news held for copies not stored yet
EARLY_TTL = 120.0
EARLY_PER_TASK = 16
CLAIMS_MAX = 100_000  # claims heard whose outcome has not come yet
INCARNATIONS_MAX = 4096  # members' incarnations remembered (departed members' too)
HOLD_RETRY = 0.5      # a copy held for want of contact or membership looks again after this
PRUNE_MIN = 1024      # must-ask marks kept before the first pruning
PROBE_MAX = 100_000   # copies probed at once when this node is back in touch
EVER = float("inf")
# A delivery still running this fraction of ask_lease after it started sends its CLAIM
# (at the latest when its clearance ends, ask_lease / 2 after its round's first ASK, so
# the CLAIM still lands within the hold each ``go`` granted); most deliveries end first,
# and their DONE makes the CLAIM needless. Ticks come every 0.1 s at most.
CLAIM_AFTER = 0.25


@dataclass(frozen=True)
class SiblingTiming:
    offset: float = 5.0          # replica_offset
    claim_lease: float = 60.0    # extra hold past an attempt's deadline
    ask_timeout: float = 2.0     # an unanswered ASK is sent again after this
    ask_lease: float = 5.0       # a running copy says ``claimed`` for this long
    stall_gap: float = 1.5       # a gap between ticks this long is a stall of our loop
    away_after: float = 3.0      # out of touch this long: the others may have dropped us

    @classmethod
    def derive(cls, offset: float, claim_lease: float, replication_timeout: float,
               heartbeat_interval: float, failure_timeout: float) -> "SiblingTiming":
        """Timings from the node's options: an ASK is sent again after the time a
        STORE may take; a stall is a gap of two heartbeats, or half the failure timeout."""
        ask_timeout = max(0.05, replication_timeout)
        return cls(offset=offset, claim_lease=claim_lease, ask_timeout=ask_timeout,
                   ask_lease=max(2 * ask_timeout, offset),
                   stall_gap=max(2 * heartbeat_interval, failure_timeout / 2),
                   away_after=failure_timeout)


@dataclass
class _Claim:
    claimer: str
    theirs: int   # the claimer's replica index
    until: float  # our clock
    inc: str = ""  # the claimer's incarnation when we noted it ("": not known)
    held: bool = False  # a worker holds the task (a long task's lease): kept on a restart
    full: float = 0.0  # an ack's hold: its attempt's whole lease, should the asker be lost


@dataclass
class _Asking:
    replica: int
    n: int        # the task's number of copies
    deadline: float
    waiting: set[str]
    wide: bool = False  # asked every member, not only the copy's siblings
    answers: list[m.Answer] = field(default_factory=list)
    started: float = 0.0  # the round's first ASK: every answer's hold began after it
    round: int = 0
    reruns: int = 0  # the copy's Task.reruns, sent with every ASK
    lease: float = 0.0  # our attempt's deadline plus claim_lease, sent with every ASK
    order: tuple[str, str, int] | None = None  # an ordered copy's (queue, key, seq)
    revision: str = ""  # the copy's Task.revision (its last replace), sent with every ASK


class Siblings:
    def __init__(self, me: str, timing: SiblingTiming, members: Iterable[str] = ()):
        self.me = me
        self.t = timing
        self.members: frozenset[str] = frozenset(members) or frozenset({me})
        self.zones: dict[str, str] = {}  # member -> failure domain (restores spread by it)
        self.contact = True
        self.claims: dict[str, _Claim] = {}
        self.early: collections.OrderedDict[str, list[tuple[float, str, m.SiblingNews]]] = \
            collections.OrderedDict()
        self.must_ask: set[str] = set()    # copies that ask before they deliver
        self.asking: dict[str, _Asking] = {}
        self.cleared: dict[str, float] = {}  # answered ``go`` by all: deliver until then
        # our deliveries' CLAIMs not sent yet: id -> (send at, lease end, replica, replicas)
        self.claiming: dict[str, tuple[float, float, int, tuple[str, ...]]] = {}
        self.stale_since: dict[str, float] = {}  # a must-ask copy no one knows: since
        self.away: set[str] = set()  # must-ask copies whose node may have been dropped
        self._out_since: float | None = None  # out of contact (or stalled) since
        self.rounds = 0  # ASK rounds started (numbers them)
        self.last_tick: float | None = None
        self.stalled = False
        self._lost: set[str] = set()  # members lost while we were out of contact
        self.incarnations: dict[str, str] = {}  # member -> its latest incarnation seen
        self._restarted: set[str] = set()  # members seen with a new incarnation
        self._prune_at = PRUNE_MIN  # must-ask marks beyond this: drop those of ended copies
        # back in touch, every copy we hold probes its siblings (``Reconcile``): set at a
        # start that reloaded a journal, a drop from the roster, a long time out of touch
        self._rejoin = False
        self._joined = False  # a roster has named us (a drop from it is a drop)

    @property
    def rejoining(self) -> bool:
        """A ``Reconcile`` is due once this node is back in touch (its copies are not
        settled with their siblings' yet)."""
        return self._rejoin

    # ------------------------------------------------------------ the door
    def step(self, event: Event, now: float) -> Ready:
        """Take one event (``miyamoto.replicas.events``) at ``now``; what to do about it."""
        match event:
            case Tick(contact, live):
                return Ready(tuple(self._tick(now, contact, live)))
            case Members(members, live, zones, incarnations):
                self.zones = dict(zones)
                self._note_incarnations(incarnations)
                return Ready(tuple(self._set_members(members, now, live)))
            case Received(sender, msg, copy, behind):
                if behind and isinstance(msg, m.Ask) and self._holds_back(sender, msg, copy):
                    return Ready((Send(sender, m.Answer(msg.id, m.WAIT, n=msg.n,
                                                        lease=self.t.ask_timeout)),))
                return Ready(tuple(self._on_news(sender, msg, copy, now)))
            case HandoffReceived(sender, msg):
                return Ready(tuple(self._handoff(msg, now, sender)))
            case Due(copy, deadline):
                go, effects = self._fire(copy, now, deadline)
                return Ready(tuple(effects), go)
            case Expiring(copy):
                held = self._held_until(copy, now)
                if held > now:  # a sibling may be delivering it: not expired under it
                    return Ready((Update(copy.id, at=held, how=Move.LATER),), False)
                return Ready((), True)
            case Folded(copy, deadline):
                return Ready(n=self._fold(copy, now, deadline + self.t.claim_lease))
            case Outcome(copy):
                return Ready(tuple(self._outcome(copy, now)))
            case LeaseExtended(copy, lease):
                return Ready(tuple(self._extend(copy, lease)))
            case Reloaded(task_ids, start):
                self._rejoin = self._rejoin or start
                self.must_ask.update(task_ids)
                self.away.update(task_ids)
                return Ready()
            case Stored(task_id):  # news that came before our copy: replay it now
                return Ready(tuple(Replay(sender, msg)
                                   for _, sender, msg in self.early.pop(task_id, ())))
            case LostPage(lost, copies):
                return Ready(tuple(restore.plan_restores(
                    self.me, self.members, lost, copies, self.t.offset, self.zones,
                    self.must_ask)))
            case Restored(plan, copy, deadline):
                return Ready(tuple(restore.restored(self.me, plan, copy,
                                                    deadline + self.t.claim_lease, now)))
            case Reconciling(copies):
                return Ready(tuple(self._reconcile(copies)))
            case Stopping(copies):
                sends, lone = restore.handoff_plan(self.me, self.members, copies, now)
                return Ready(tuple(sends) + ((MoveLone(tuple(lone)),) if lone else ()))
            case _:
                raise TypeError(f"not a sibling event: {event!r}")

    # ------------------------------------------------------------ time and roster
    def _stalled(self, now: float) -> bool:
        """Our loop stalled (a pause, a frozen VM) and we are not back in contact yet;
        true at once, before the next tick, for the messages read right after it."""
        return self.stalled or (self.last_tick is not None
                                and now - self.last_tick > self.t.stall_gap)

    def _tick(self, now: float, contact: bool, live: Mapping[str, Task]) -> list[Effect]:
        """Each live copy asks first once this node has been out of touch (its loop
        stalled, its contact lapsed, or it is out of the roster): the others may have
        delivered or re-homed them meanwhile, and their news may never have reached us
        (a roster that dropped and re-admitted us while we slept). Then members lost
        are dealt with, once in contact: their claims released, their copies restored."""
        if self.last_tick is not None and now - self.last_tick > self.t.stall_gap:
            self.stalled = True  # until we are in contact again, on a later tick
            self._out_since = min(self._out_since or now, self.last_tick)
        elif contact:
            self.stalled = False
        was = self.contact
        self.last_tick = now
        self.contact = contact and not self.stalled and self.me in self.members
        effects: list[Effect] = []
        if was and not self.contact and len(self.members | {self.me}) > 1:
            self.must_ask.update(live)
            self.cleared.clear()
            self._out_since = self._out_since or now
        elif self.contact and not was:
            if self._out_since is not None and now - self._out_since > self.t.away_after:
                self.away.update(live)  # long enough to have been dropped and re-admitted
                self._rejoin = True
            if self._rejoin:  # every copy probes, the journal's and the ended ones too
                self._rejoin = False
                effects.append(Reconcile())
            else:
                effects += self._probe(live)
            effects.append(AskWhenPaged())  # the copies outside memory ask as well
        if self.contact:
            self._out_since = None
        for task_id, a in list(self.asking.items()):
            if now >= a.deadline:
                if live is not EMPTY and task_id not in live:
                    self._forget(task_id)  # ended or dropped meanwhile (a client's DELETE)
                else:
                    effects += self._ask_again(task_id, a, now)
        if live is not EMPTY and len(self.must_ask) > self._prune_at:
            self.must_ask.intersection_update(live)  # copies that ended by other ways
            self.away.intersection_update(live)
            self._prune_at = max(PRUNE_MIN, 2 * len(self.must_ask))
        effects += self._due_claims(now, live)
        self._expire(now)
        restarted = self._take_restarted()
        if restarted:
            effects += self._release_claims(restarted, live, now)
        lost = self._take_lost()
        if lost:
            effects.append(RestoreLost(frozenset(lost)))
        return effects

    def _expire(self, now: float) -> None:
        while self.early:
            first = next(iter(self.early.values()))
            if len(self.early) <= EARLY_MAX and now - first[0][0] < EARLY_TTL:
                break
            self.early.popitem(last=False)
        for task_id in [i for i, until in self.cleared.items() if until < now]:
            del self.cleared[task_id]

    def _set_members(self, members: Iterable[str], now: float,
                     live: Iterable[str]) -> list[Effect]:
        """The roster changed (``live``: this node's live copies). A node dropped from
        the roster marks every copy to ask first: the others re-home its tasks meanwhile."""
        new = frozenset(members)
        if self.me in self.members and self.me not in new:
            live = list(live)
            self.must_ask.update(live)
            self.away.update(live)
            self._rejoin = self._rejoin or self._joined  # not a joiner's first roster
        self._joined = self._joined or self.me in new
        lost = self.members - new - {self.me}
        self.members = new
        self._lost = (self._lost | lost) - new
        if lost:
            self._extend_holds(lost, now)
        effects: list[Effect] = []
        for task_id, a in list(self.asking.items()):
            a.waiting &= new
            if not a.waiting:
                effects += self._decide(task_id, a, now)
        return effects

    def _extend_holds(self, lost: set[str], now: float) -> None:
        """A lost member's acknowledged asks hold for the whole lease they named: the
        roster dropped it, but it may be delivering still (its CLAIM unsent)."""
        for cl in self.claims.values():
            if cl.claimer in lost and cl.full > max(cl.until, now):
                cl.until = cl.full

    def _take_lost(self) -> set[str]:
        """Members lost whose consequences (released claims, restores) are due now:
        only while in contact, so a node back from a pause acts on no stale view."""
        if not self.contact or self.me not in self.members or not self._lost:
            return set()
        lost, self._lost = self._lost, set()
        return lost

    def _note_incarnations(self, incarnations: Mapping[str, str]) -> None:
        """A member named with another incarnation than before restarted: the attempts
        its claims were for died with its earlier process. (Kept for members that left
        too: a restart shows as a removal, then an admission. Bounded: member ids.)"""
        for member, inc in incarnations.items():
            was = self.incarnations.get(member)
            if inc and was is not None and was != inc:
                self._restarted.add(member)
            if inc:
                self.incarnations[member] = inc
        while len(self.incarnations) > INCARNATIONS_MAX:
            self.incarnations.pop(next(iter(self.incarnations)))

    def _take_restarted(self) -> set[str]:
        """Restarted members whose old claims are to be released: once in contact, as
        for a loss, so a node back from a pause acts on no stale view."""
        if not self.contact or not self._restarted:
            return set()
        restarted, self._restarted = self._restarted, set()
        return restarted

    def _release_claims(self, restarted: set[str], copies: Mapping[str, Task],
                        now: float) -> list[Effect]:
        """Copies held off by a claim of a restarted member's earlier incarnation fire
        again at their distance from now. A member only lost keeps its claims until their
        lease ends: it may be paused or cut off with its attempt still running (a worker
        that answers after 25 s, a SIGSTOP of 10 s in the middle), and a sibling that
        went on its loss delivered the task twice; one that never comes back costs at
        most one lease."""
        effects: list[Effect] = []
        for task_id, cl in list(self.claims.items()):
            if cl.claimer not in restarted or cl.inc == self.incarnations.get(cl.claimer) \
                    or cl.held:
                continue
            del self.claims[task_id]
            t = copies.get(task_id)
            if t is not None and t.state == State.SCHEDULED:
                at = replication.sibling_fire_at(now, t.replica, cl.theirs, len(t.replicas),
                                                 self.t.offset)
                effects.append(Update(task_id, at=at, how=Move.EXACT))
        return effects

    # ------------------------------------------------------------ our copy fires
    def _fire(self, t: Task, now: float, deadline: float) -> tuple[bool, list[Effect]]:
        """Copy ``t`` is due (``deadline``: how long its attempt may take). (True,
        effects): deliver it now (its CLAIM follows from a tick if the attempt still runs
        then, ``_due_claims``); (False, effects):
        hold it, asking its siblings (their answers fire it again) or waiting."""
        if len(t.replicas) <= 1 and t.id not in self.must_ask:
            return True, []  # no sibling to collide with
        if self.me not in self.members or self._stalled(now) or (not self.contact and len(self.members) > 1):
            self.must_ask.add(t.id)
            self.cleared.pop(t.id, None)  # answers read after a stall may be stale
            return False, [Update(t.id, at=now + HOLD_RETRY, how=Move.LATER)]
        if t.id in self.asking:
            return False, []  # its answers fire it
        held = self._held_until(t, now)
        if held > now:  # a sibling we answered ``go`` (or that claimed) has it
            return False, [Update(t.id, at=held, how=Move.LATER)]
        siblings, wide = self._live_siblings(t), False
        if not siblings and t.id in self.must_ask and len(t.replicas) > 1:
            # its siblings all left while we were away: any member may hold it now
            siblings, wide = self._everyone_else(), True
        cleared = self.cleared.pop(t.id, -EVER)
        if siblings and cleared < now:  # no clearance, or a stale one
            return False, self._ask(t, siblings, now, wide, deadline + self.t.claim_lease)
        self.must_ask.discard(t.id)
        self.claims.pop(t.id, None)
        if self._live_siblings(t):
            send_at = min(cleared, now + CLAIM_AFTER * self.t.ask_lease)
            self.claiming[t.id] = (send_at, now + deadline + self.t.claim_lease, t.replica,
                                   t.replicas)
        return True, []

    def _due_claims(self, now: float, live: Mapping[str, Task]) -> list[Effect]:
        """The CLAIMs of our deliveries still running when their time came. One sent late
        (our loop stalled) claims only what is left of its lease; the siblings that
        answered ``go`` may have let their hold lapse by then, and their copies ask us
        first, which we answer ``claimed`` while the attempt runs."""
        effects: list[Effect] = []
        for task_id, (at, until, replica, replicas) in list(self.claiming.items()):
            if at > now:
                continue
            del self.claiming[task_id]
            t = live.get(task_id) if live is not EMPTY else None
            if (live is not EMPTY and (t is None or t.state != State.RUNNING)) or until <= now:
                continue  # it ended meanwhile (a sibling's news, a cancel), or long ago
            claim = m.Claim(task_id, replica, until - now)
            effects += [Send(r, claim) for r in replicas if r != self.me and r in self.members]
        return effects

    def _extend(self, t: Task, lease: float) -> list[Effect]:
        """Our attempt of ``t`` holds it ``lease`` more seconds: CLAIM that (plus
        claim_lease) from every live sibling now; a claim is honoured until it runs out,
        so a sibling delivers only once the lease ends without news (the holder died)."""
        self.claiming.pop(t.id, None)  # this CLAIM replaces the attempt's own
        if t.state != State.RUNNING:
            return []
        claim = m.Claim(t.id, t.replica, lease + self.t.claim_lease, held=True)
        return [Send(r, claim) for r in self._live_siblings(t)]

    def _fold(self, t: Task, now: float, lease: float) -> int:
        """Our new copy ``t`` is about to be stored on its siblings: if it is copy 0 and
        due at once, it asks now, in those STOREs (the round; 0: it asks when due, as
        any copy), and their STOREDs carry the answers. A round is a round: unanswered
        (a STORE lost, refused), it is asked again at its deadline, by ASK."""
        siblings = self._live_siblings(t)
        if (t.replica != 0 or not siblings or len(siblings) != len(t.replicas) - 1
                or t.fire_at > now + self.t.ask_lease / 4 or not self.contact
                or self._stalled(now) or t.id in self.asking or t.id in self.must_ask):
            return 0
        self._ask(t, siblings, now, lease=lease)  # not sent: the STOREs carry the ASK
        return self.asking[t.id].round

    def _live_siblings(self, t: Task) -> list[str]:
        return [r for r in t.replicas if r != self.me and r in self.members]

    # ------------------------------------------------------------ our attempt's outcome
    def _outcome(self, t: Task, now: float) -> list[Effect]:
        """Our attempt ended with ``t`` (succeeded, failed, or scheduled for a retry):
        its news replaces the CLAIM it did not need to send."""
        self.claiming.pop(t.id, None)
        siblings = [r for r in t.replicas if r != self.me]
        if not siblings:
            return []
        effects: list[Effect] = []
        attempt = t.history[-1] if t.history else None
        msg: m.Done | m.Failed | m.Retry
        if t.state == State.SUCCEEDED:
            msg = m.Done(t.id, t.attempts, t.last, attempt)
        elif t.state in (State.FAILED, State.EXPIRED):
            msg = m.Failed(t.id, t.attempts, t.last, attempt, t.state == State.EXPIRED)
        elif t.state == State.SCHEDULED:
            # a sibling claimed while our attempt ran (its CLAIM crossed ours): our retry
            # waits for its lease like any held copy, and the others wait with us
            at = max(t.fire_at, self._held_until(t, now))
            if at > t.fire_at:
                effects.append(Update(t.id, at=at, how=Move.LATER))
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
    def _on_news(self, sender: str, msg: m.SiblingNews, t: Task | None,
                 now: float) -> list[Effect]:
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
            return [Update(t.id, at=max(at, held), how=Move.EXACT, state=State.SCHEDULED,
                           attempts=msg.attempts, last=msg.last, attempt=msg.attempt)]
        self.claims.pop(t.id, None)
        if isinstance(msg, (m.Done, m.Failed)):
            self._forget(t.id)
            state = State.SUCCEEDED if isinstance(msg, m.Done) else \
                State.EXPIRED if msg.expired else State.FAILED
            return [Update(t.id, state=state, attempts=msg.attempts, last=msg.last,
                           attempt=msg.attempt)]
        if isinstance(msg, m.Cancel):
            self._forget(t.id)
            if not msg.abort:
                return [CancelCopy(t.id, False)]
            # a refused enqueue: its entry node knows only where it placed the copies; a
            # copy restored elsewhere meanwhile (a sibling lost during the enqueue) is
            # known to us, its restorer: tell every sibling we name but the sender
            return [CancelCopy(t.id, True)] + [Send(r, m.Cancel(t.id, abort=True))
                                               for r in t.replicas
                                               if r not in (self.me, sender)]
        if isinstance(msg, m.Replicas):
            return [SetReplicas(t.id, msg.replicas)] if self.me in msg.replicas else []
        return []

    def _handoff(self, msg: m.Handoff, now: float, sender: str) -> list[Effect]:
        """A sibling stopping gracefully hands us its due copies: fire ours then (its
        claims on them, if any, go with it)."""
        for task_id, _ in msg.tasks:
            if task_id in self.claims and self.claims[task_id].claimer == sender:
                del self.claims[task_id]
        return [Update(task_id, at=now + delay, how=Move.EARLIER) for task_id, delay in msg.tasks]

    def _on_claim(self, msg: m.Claim, t: Task, now: float) -> list[Effect]:
        """Noted, not written: ``_fire`` holds the copy by the claim when it comes due
        (and writes its later time then), so the healthy path, whose DONE comes before
        the copy is due, costs no journal write here. A restart forgets the claim, but
        every reloaded copy asks before it delivers, and a running claimer says so."""
        n = len(t.replicas)
        self.cleared.pop(t.id, None)
        if 0 <= msg.replica < n:
            self._note_claim(t.id, _Claim(t.replicas[msg.replica], msg.replica, now + msg.lease,
                                          held=msg.held))
            return []
        at = replication.sibling_fire_at(now + msg.lease, t.replica, msg.replica, n,
                                         self.t.offset)
        return [Update(t.id, at=at, how=Move.LATER)]

    def _note_claim(self, task_id: str, claim: _Claim) -> None:
        claim.inc = self.incarnations.get(claim.claimer, "")
        self.claims.pop(task_id, None)
        self.claims[task_id] = claim
        while len(self.claims) > CLAIMS_MAX:
            self.claims.pop(next(iter(self.claims)))

    def _forget(self, task_id: str) -> None:
        self.claiming.pop(task_id, None)
        self.must_ask.discard(task_id)
        self.away.discard(task_id)
        self.asking.pop(task_id, None)
        self.stale_since.pop(task_id, None)

    def _keep_early(self, sender: str, msg: m.SiblingNews, now: float) -> None:
        news = self.early.setdefault(msg.id, [])
        if len(news) < EARLY_PER_TASK:
            news.append((now, sender, msg))
            self.early.move_to_end(msg.id)
        self._expire(now)

    # ------------------------------------------------------------ asking
    # A copy about to deliver sends ASK (numbered: its round) to every live sibling; each
    # answers in one ANSWER shape that echoes the round:
    # - ``go`` (or ``unknown``: no copy here yet; the ASK is kept as a claim for the copy
    #   on its way): the acknowledgement. The sibling notes the asker's claim, which holds
    #   its own copy off for ``ask_lease`` from when it read the ASK (noted, not written:
    #   on the healthy path the asker's DONE ends the copy before it is due). The asker,
    #   once cleared, delivers; if its attempt still runs ``CLAIM_AFTER * ask_lease``
    #   later (at most until its clearance ends) it sends CLAIM(lease) one way, which
    #   extends the hold to the attempt's deadline plus ``claim_lease``;
    # - ``claimed`` (a copy is running here, or another sibling holds a live claim) and
    #   ``wait`` (two copies asking each other: the lower replica index goes first):
    #   stand down, look again once the lease ends;
    # - ``ended`` / ``rehomed``: the task is over, or its copies moved (ours may go).
    # The copy delivers only once every live sibling has answered the round, and only
    # within ``ask_lease / 2`` of the round's first ASK: every hold began after that, so
    # the copy starts, and its CLAIM arrives, while they all last; a round decided later
    # (a sibling kept silent until the roster dropped it) is asked again. Answers to an
    # older round are ignored (but for an end or a move, which are facts).
    def _ask(self, t: Task, siblings: list[str], now: float, wide: bool = False,
             lease: float = 0.0) -> list[Effect]:
        """Ask. The held copy is not rescheduled (nothing is written): it waits, out of
        the engine's schedule, until the last answer fires it (``Fire``) or holds it
        off; an unanswered ask is sent again at its deadline (a tick)."""
        self.rounds += 1
        order = None if t.ordering_key is None else (t.queue, t.ordering_key, t.ordering_seq)
        a = _Asking(t.replica, len(t.replicas), now + self.t.ask_timeout, set(siblings), wide,
                    started=now, round=self.rounds, reruns=t.reruns, lease=lease, order=order,
                    revision=t.revision)
        self.asking[t.id] = a
        ask = m.Ask(t.id, t.replica, n=a.round, reruns=a.reruns, lease=a.lease, order=order,
                    revision=a.revision)
        return [Send(r, ask) for r in siblings]

    def _ask_again(self, task_id: str, a: _Asking, now: float) -> list[Effect]:
        a.waiting &= self.members
        if not a.waiting:
            return self._decide(task_id, a, now)
        a.deadline = now + self.t.ask_timeout
        ask = m.Ask(task_id, a.replica, n=a.round, reruns=a.reruns, lease=a.lease,
                    order=a.order, revision=a.revision)
        return [Send(r, ask) for r in sorted(a.waiting)]

    def _decide(self, task_id: str, a: _Asking, now: float) -> list[Effect]:
        """Every live sibling answered (or left): go, or stand down until a lease ends.

        A copy that must ask (its node was away) and has no sibling left in the roster
        (none answered, they all left) asks every member: its task may have been
        re-homed to any of them and delivered there. If none knows it either and this
        node may have been dropped meanwhile (``away``: out of the roster, restarted, or
        out of touch for longer than ``away_after``), it waits, asking again, for one of
        its siblings to come back (the one that may have delivered it while we were
        away), at most ``claim_lease``: a sibling gone for good must not hold it forever."""
        if task_id in self.must_ask and a.n > 1 and not a.wide and not a.answers:
            others = self._everyone_else()  # its siblings left the roster, none answered
            if others:
                a.wide, a.waiting, a.deadline = True, set(others), now + self.t.ask_timeout
                ask = m.Ask(task_id, a.replica, n=a.round, reruns=a.reruns, lease=a.lease,
                            order=a.order, revision=a.revision)
                return [Send(r, ask) for r in others]
        if a.wide and task_id in self.away and all(x.verdict == m.UNKNOWN for x in a.answers):
            since = self.stale_since.setdefault(task_id, now)
            if now - since < self.t.claim_lease:
                del self.asking[task_id]
                return [Update(task_id, at=now + self.t.ask_timeout, how=Move.LATER)]
        self.stale_since.pop(task_id, None)
        self.away.discard(task_id)
        del self.asking[task_id]
        holds = [x.lease for x in a.answers if x.verdict in (m.WAIT, m.CLAIMED)]
        if holds:
            return [Update(task_id, at=now + max(holds), how=Move.LATER)]
        # each ``go`` holds its sibling off for ask_lease from when it read our ASK, so
        # at least from ``started``: we must start, and our CLAIM arrive, well within
        # that (a go read long ago, while another sibling kept silent, is stale)
        self.must_ask.discard(task_id)
        self.cleared[task_id] = a.started + self.t.ask_lease / 2
        return [Fire(task_id)]

    def _everyone_else(self) -> list[str]:
        """Whom a copy back from away asks when its own siblings cannot tell."""
        return sorted(self.members - {self.me})

    def _probe(self, live: Mapping[str, Task]) -> list[Effect]:
        """Back in touch: ask the siblings of every copy that must ask whether they know
        its end. A copy due later would ask only when it fires, and by then the sibling
        that delivered it may have left the roster, its news lost with it."""
        effects: list[Effect] = []
        for task_id in list(self.must_ask)[:PROBE_MAX]:
            t = live.get(task_id)
            if t is not None and task_id not in self.asking:
                effects += self._probe_one(t)
        return effects

    def _probe_one(self, t: Task, n: int = 0) -> list[Effect]:
        """ASK ``probe`` for copy ``t`` to its live siblings, with its run (reruns): an
        end of an earlier run than ours is not news of ours. Numbered (``n``), it is
        answered whatever the news (``_on_probe``)."""
        probe = m.Ask(t.id, t.replica, probe=True, n=n, reruns=t.reruns, revision=t.revision)
        return [Send(r, probe) for r in self._live_siblings(t)]

    def _reconcile(self, copies: Iterable[Task]) -> list[Effect]:
        """Back after we may have been dropped: every copy we held then, live or ended,
        in memory or only in the journal, probes its live siblings. A copy due later
        would ask only when it fires, and an ended one never: until then a search
        showed a copy restored elsewhere twice, and a bulk resend reran (and counted)
        ends the cluster had rerun since. The answers that are news: ``rehomed`` (the
        copy is dropped), ``ended`` (a live copy ends; an ended one of an earlier run
        takes the later end). A copy running or asking now says what it must itself.
        Not an ordered copy (an ordering key's): its stale record stays in our line of
        the key until it comes due and asks, as before; dropped at once, it no longer
        held the key's next task back here while the task it stood for ran elsewhere
        (``tests/sim`` ordered runs with the owner killed: two of a key at a time)."""
        self.rounds += 1  # the page's probes are numbered: each is answered, news or not
        effects: list[Effect] = []
        for t in copies:
            if t.id not in self.asking and t.state != State.RUNNING and len(t.replicas) > 1 \
                    and t.ordering_key is None:
                effects += self._probe_one(t, self.rounds)
        return effects

    # ------------------------------------------------------------ answering
    @staticmethod
    def _holds_back(sender: str, msg: m.Ask, t: Task | None) -> bool:
        """An ASK for an ordered copy while another task of its key comes first in our
        line (``behind``): the asker's line lacks that one (a copy being restored, a
        restarted owner, news in flight) and must not run ahead of it, so it hears
        ``wait`` and asks again after ``ask_timeout``, whether our copy is here yet
        or not. An end, a move or a running copy of ours is still told as it is."""
        if msg.probe:
            return False
        return t is None or (sender in t.replicas and t.state == State.SCHEDULED)

    def _on_ask(self, sender: str, msg: m.Ask, t: Task | None, now: float) -> list[Effect]:
        def answer(verdict: str, **kw: Any) -> list[Effect]:
            return [Send(sender, m.Answer(msg.id, verdict, n=msg.n, **kw))]
        # read after our loop stalled, the ASK may be as old as the stall: its asker
        # has long given up on it (and may have delivered since, once the roster dropped
        # us). It is answered, but nothing is held for it: a hold would keep our copy
        # from asking, and so from hearing that the task is over, for an ask_lease. Our
        # copy asks before it delivers instead (must_ask), so an asker that does still
        # wait is not run over by it.
        stale = self._stalled(now)
        if stale and t is not None and not t.state.ended:
            self.must_ask.add(t.id)
        if msg.probe:
            return self._on_probe(sender, msg, t, now)
        if t is None:
            # our copy may still be on its way (STORE and ASK travel apart): it holds
            # for this claim once stored
            if not stale:
                self._keep_early(sender, m.Claim(msg.id, msg.replica, self.t.ask_lease), now)
            return answer(m.UNKNOWN)
        if sender not in t.replicas:
            # the task's copies moved while the asker was away (its copy was restored
            # elsewhere): it drops its copy, ended here or not. Told ENDED instead, it kept
            # an ended copy 0 beside the one that replaced it, and /queues counted the
            # task twice after a kill -9 and a restart
            return answer(m.REHOMED, replicas=t.replicas)
        if t.state.ended and msg.reruns <= t.reruns:
            return answer(m.ENDED, **_end_of(t, now))
        if t.state.ended:
            # the asker's copy was run again after ours ended (a retry of a failed task
            # reaches the copies one by one): our end is of the run before, so the asker
            # goes, as if we had no copy; our own rerun, when it comes, asks in turn
            if not stale:
                self._note_claim(t.id, self._ack_hold(sender, msg, now))
            return answer(m.GO)
        if t.state == State.RUNNING:
            return answer(m.CLAIMED, lease=self.t.ask_lease)
        claim = self.claims.get(t.id)
        if claim is not None and claim.until > now and claim.claimer != sender:
            return answer(m.CLAIMED, lease=claim.until - now)
        if t.id in self.asking and t.replica < msg.replica:
            return answer(m.WAIT, lease=self.t.ask_timeout)
        if repeat.newer(t.revision, msg.revision):
            # the asker's copy is an older version of the task (a replace it missed: its
            # node was down, say): it waits while ours sends it the newer one (params,
            # body and a later eta), and asks again when that one is due. A ``go`` here
            # delivered the old payload, early (a kill -9 during repeated replaces)
            return [Refresh(t.id, sender)] + answer(m.WAIT, lease=self.t.ask_timeout)
        # the asker goes: our copy is held off by its claim (for ``ask_lease``, then for
        # the lease of the CLAIM it sends as it delivers). Noted, not written: ``_fire``
        # looks at the claims, so the healthy path, whose DONE comes long before our
        # copy is due, costs no journal write here
        if 0 <= msg.replica < len(t.replicas) and not stale:
            self._note_claim(t.id, self._ack_hold(sender, msg, now))
        self.cleared.pop(t.id, None)
        return answer(m.GO)

    @staticmethod
    def _on_probe(sender: str, msg: m.Ask, t: Task | None, now: float) -> list[Effect]:
        """ASK ``probe``: the prober is not about to deliver, so only an end or a move
        is news to it (and a newer version of its copy, sent by ``Refresh``). A
        rejoin's probe (numbered, ``_reconcile``) hears ``same`` (or ``unknown``: no
        copy here) otherwise, so that its prober knows when its copies are settled."""
        def answer(verdict: str, **kw: Any) -> list[Effect]:
            return [Send(sender, m.Answer(msg.id, verdict, n=msg.n, **kw))] if msg.n or \
                verdict in (m.ENDED, m.REHOMED) else []
        if t is None:
            return answer(m.UNKNOWN)
        if sender not in t.replicas:
            return answer(m.REHOMED, replicas=t.replicas)
        if t.state.ended:
            return answer(m.ENDED, **_end_of(t, now)) if msg.reruns <= t.reruns \
                else answer(m.SAME)
        newer = [Refresh(t.id, sender)] if repeat.newer(t.revision, msg.revision) else []
        return newer + answer(m.SAME, reruns=t.reruns)  # a later run is live here: said

    def _stale_end(self, msg: m.Answer, t: Task, now: float) -> list[Effect]:
        """A probe's answer about our ended copy ``t`` (``_reconcile``): the task moved
        away from us (our record is dropped), a later run of it ended (we take that
        end, so a bulk resend of ends before a time does not rerun ours), or a later
        run is under way (our copy joins it, as a rerun reaches each copy: its DONE,
        unread by an ended copy of an earlier run, left ours stale for good)."""
        if msg.verdict == m.REHOMED and self.me not in msg.replicas:
            return [Drop(t.id)]
        if msg.verdict == m.ENDED and msg.reruns > t.reruns and msg.state is not None:
            return [TakeEnd(t.id, State(msg.state), msg.reruns, msg.attempts, msg.last,
                            now - msg.ago)]
        if msg.verdict == m.SAME and msg.reruns > t.reruns:  # a later run, live there
            return [JoinRun(t.id, msg.reruns)]
        return []

    def _ack_hold(self, sender: str, msg: m.Ask, now: float) -> _Claim:
        """The hold a ``go`` grants: ``ask_lease``, or, should the asker be lost from the
        roster meanwhile, the whole lease its ASK named (it may be delivering, paused or
        cut off before its CLAIM went, which a fast attempt never sends)."""
        return _Claim(sender, msg.replica, now + self.t.ask_lease,
                      full=now + msg.lease if msg.lease else 0.0)

    def _on_answer(self, sender: str, msg: m.Answer, t: Task | None,
                   now: float) -> list[Effect]:
        a = self.asking.get(msg.id)
        if a is None:  # the answer to a probe: only an end or a move is news
            if t is None or sender not in t.replicas:
                return []
            if t.state.ended:
                return self._stale_end(msg, t, now)
            if t.state != State.SCHEDULED:
                return []
            if msg.verdict == m.ENDED:
                self._forget(msg.id)
                return [Update(msg.id, state=State(msg.state), attempts=msg.attempts,
                               last=msg.last)]
            if msg.verdict == m.REHOMED:
                return [Drop(msg.id)] if self.me not in msg.replicas else \
                    [SetReplicas(msg.id, msg.replicas)]
            return []
        if sender not in a.waiting or (msg.n != a.round and msg.verdict not in (m.ENDED, m.REHOMED)):
            return []  # an answer to an earlier round: its hold may be over
        a.waiting.discard(sender)
        if msg.verdict == m.ENDED:
            self._forget(msg.id)
            return [Update(msg.id, state=State(msg.state), attempts=msg.attempts, last=msg.last)]
        effects: list[Effect] = []
        if msg.verdict == m.REHOMED:
            if self.me not in msg.replicas:
                self._forget(msg.id)
                return [Drop(msg.id)]
            a.waiting &= set(msg.replicas)
            effects.append(SetReplicas(msg.id, msg.replicas))
        a.answers.append(msg)
        if not a.waiting:
            effects += self._decide(msg.id, a, now)
        return effects


def _end_of(t: Task, now: float) -> dict[str, Any]:
    """An ``ended`` answer's account of ended copy ``t``: its end state, attempts and last
    response, its run (reruns) and how long ago it ended (times travel as durations)."""
    return {"state": t.state.value, "attempts": t.attempts, "last": t.last,
            "reruns": t.reruns, "ago": min(m.MAX_LEASE, max(0.0, now - (t.finished or now)))}
