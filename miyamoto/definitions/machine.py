"""Cluster-wide definitions (schedules, topics, queue settings): a pure state machine (DESIGN §2).

``Definitions`` holds no socket, clock, greenlet or file. It has one door,
``step(event, now) -> Ready``: the I/O layer (``miyamoto.definitions.sync``) feeds it the
membership view (``View``), peers' messages (``Received``), client writes (``Write``) and
time (``Tick``), and carries out the effects it returns: ``Persist`` (write the whole set to disk before anything else), ``Send``
(the one every machine returns, ``miyamoto.wire.messages``)
and ``Finished`` (a write's outcome, for the HTTP answer). ``tests/sim/definitions_sim.py``
drives it with loss, delay, crashes and leader changes.

The rules, and why each is there:

A map of entries, last writer wins by stamp
    Each (kind, name) holds one ``Entry``: its value (a JSON object, or None for a
    deletion: a tombstone, kept so a member that missed the delete cannot bring the old
    value back) and a stamp ``(term, seq)``. Only a ready leader makes stamps: its
    definitions term (below) and one more than the highest seq it holds. A term has at
    most one ready leader, so no two different writes share a stamp, and a later
    leader's stamps beat every earlier one's. Merging is per entry, the higher stamp
    wins: it is commutative and idempotent, so messages may be lost, repeated or
    reordered and members still converge to one map.

The definitions' own term, monotonic across restarts
    The stamps' term is not the membership's: membership lives in memory and starts
    again at term 1 after a full-cluster restart, while the stamps and every member's
    refusal of older terms live on disk. A leader of membership term 1 stamping with 1
    would lose to the old stamps and have every write refused, for good. So each member
    keeps, on disk, ``seen_term`` (the highest definitions term it has promised) and
    ``owner`` (the leader it promised it to). A node that takes office (in any
    membership term) picks ``dterm`` = its own ``seen_term`` + 1, promises it to itself
    (persisted), and offers its set with that term (the sync below). A member promises
    ``d`` to leader L only if ``d`` is above its ``seen_term`` (or equal and promised to
    L already), persists the promise, then answers with its set; otherwise it refuses
    with a digest naming its own ``seen_term`` and ``owner``, and the leader starts a
    new round above it. So a leader learns, in the majority sync it does anyway, a term
    above what a majority holds, and a full restart costs one round, not the schedules.

    Why two leaders never confirm writes in one term: a leader is ``ready`` at ``d``
    only once a majority promised ``d`` to it; a member promises ``d`` to one leader
    only (strictly above, or the same owner), and any two majorities share a member.
    Why a ready leader holds every acknowledged write of an older term: a member acks a
    write of term ``t`` only while ``t`` >= its ``seen_term``; so a member in both the
    write's ack majority and the leader's promise majority acked before it promised,
    and its answer to the promise carried the write.

Writes go through the leader, answered once a majority has them on disk
    ``write`` (leader only) stamps the changes, persists them and sends DEFS_PUT to
    every member; each member merges, persists, then acks (DEFS_ACK). The write is
    ``Finished(ok=True)`` once a majority of the roster (the leader counted) has acked,
    so an acknowledged write survives the loss of any minority. Unacked members get the
    PUT again every ``resend`` until ``deadline``, then the write is ``Finished(ok=
    False)``: it may still spread (like a 503'd enqueue may still run), never half.

A new leader adopts the newest set of a majority before it writes
    On taking office it sends its whole set (DEFS_PUT ``want``, term ``dterm``) to
    every member; each promises (above), merges and answers with its whole set; the
    leader merges those. It accepts writes (``ready``) only once a majority (itself
    counted) has answered, or reported a digest equal to its own under a promise to it.
    Every acknowledged write is on some member of any majority, so a ready leader holds
    it: its read-modify-writes (pause, resume) and its schedule cursors start from the
    newest state.

Catch-up: digests
    Every member sends the leader a digest of its set (DEFS_DIGEST) every ``resend``;
    a leader that sees a different digest sends its whole set with ``want``, and the
    member answers with its own. So a member that was down during a write, or a new
    member, catches up within a round or two, and a member's newer entries reach the
    leader too.

Whole sets travel in chunks of ``CHUNK`` entries (a topic may hold 100 long URLs).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from miyamoto.definitions.messages import DefsAck, DefsDigest, DefsPut, Entry
from miyamoto.wire.messages import Send

__all__ = ["Definitions", "Entry", "Event", "Finished", "Full", "NotLeader", "Persist", "Ready",
           "Received", "Tick", "View", "Write", "CHUNK",
           "MAX_ENTRIES"]

CHUNK = 8            # entries per DEFS_PUT of a whole set: 8 of messages.MAX_VALUE (512 KiB)
#                      are 4 MiB, a frame well under verbs.MAX_FRAME (7 MiB)
MAX_ENTRIES = 10000  # definitions and tombstones a cluster holds


@dataclass(frozen=True, slots=True)
class Persist:
    """Write every entry, the highest definitions term promised and to whom, to stable
    storage before carrying out the effects after it."""
    entries: tuple[Entry, ...]
    term: int
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    wid: int
    ok: bool
    error: str = ""


@dataclass(frozen=True, slots=True)
class View:
    """The membership view, every tick: the leader, its term, the roster's members."""
    leader: str | None
    term: int
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Write:
    """A client's changes ((kind, name, value or None to delete)); leader only: the step
    raises NotLeader or Full instead of answering."""
    changes: tuple[tuple[str, str, dict | None], ...]


@dataclass(frozen=True, slots=True)
class Received:
    """A peer's definitions message (DEFS_PUT, DEFS_ACK, DEFS_DIGEST)."""
    sender: str
    msg: DefsPut | DefsAck | DefsDigest


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: resends, deadlines, digests."""


Event = View | Write | Received | Tick


@dataclass(frozen=True, slots=True)
class Ready:
    """What one step decided: ``effects`` to carry out in order (``Persist`` before the
    rest), and for a ``Write`` its ``wid``, which a later ``Finished`` names."""
    effects: list[Any]
    wid: int | None = None


class Full(Exception):
    """The map holds MAX_ENTRIES definitions and tombstones: a new key is refused (a
    write that merge would drop must not be acknowledged)."""


class NotLeader(Exception):
    """Writes go to the leader; ``leader`` is its id (None: none known; this node's own
    id when it leads but has not heard a majority's set yet)."""

    def __init__(self, leader: str | None):
        super().__init__(leader)
        self.leader = leader


@dataclass
class _Pending:
    entries: tuple[Entry, ...]
    term: int
    acked: set[str]
    deadline: float
    resend_at: float


@dataclass
class Definitions:
    me: str
    resend: float = 0.5
    timeout: float = 3.0
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)
    leader: str | None = None
    term: int = 0       # the membership's term, as last viewed (says when office changes)
    seen_term: int = 0  # the highest definitions term promised (kept on disk) ...
    owner: str | None = None  # ... and to whom (kept on disk)
    dterm: int = 0      # leading: the definitions term this node claims (0: none)
    members: tuple[str, ...] = ()
    synced: set[str] = field(default_factory=set)
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _next_wid: int = 1
    _next_digest: float = 0.0
    _offered: dict[str, float] = field(default_factory=dict)  # member -> last full offer
    _digest: str | None = None

    # ------------------------------------------------------------ reading
    def get(self, kind: str, name: str) -> dict | None:
        e = self.entries.get((kind, name))
        return None if e is None else e.value

    def items(self, kind: str) -> list[tuple[str, dict]]:
        return sorted((e.name, e.value) for e in self.entries.values()
                      if e.kind == kind and e.value is not None)

    @property
    def leading(self) -> bool:
        return self.leader == self.me

    @property
    def ready(self) -> bool:
        """This node leads, a majority promised it ``dterm`` and gave it their sets: it
        may write."""
        return (self.leading and self.dterm > 0 and self.seen_term == self.dterm
                and self.owner == self.me
                and len(self.synced & set(self.members)) >= self._majority())

    def digest(self) -> str:
        if self._digest is None:
            h = hashlib.sha256()
            for key in sorted(self.entries):
                e = self.entries[key]
                h.update(f"{e.kind}\0{e.name}\0{e.term}\0{e.seq}\n".encode())
            self._digest = h.hexdigest()[:32]
        return self._digest

    def _majority(self) -> int:
        return len(self.members) // 2 + 1

    # ------------------------------------------------------------ inputs
    def load(self, entries: Iterable[Entry], term: int = 0, owner: str | None = None) -> None:
        """Entries and the highest term promised (and to whom), read back from disk."""
        self._merge(entries)
        if term > self.seen_term:
            self.seen_term, self.owner = term, owner

    def step(self, event: Event, now: float) -> Ready:
        """The machine's one door: what happened, and what to do about it."""
        match event:
            case View(leader=leader, term=term, members=members):
                return Ready(self._view(leader, term, members, now))
            case Write(changes=changes):
                wid, effects = self._write(list(changes), now)
                return Ready(effects, wid)
            case Received(sender=sender, msg=msg):
                return Ready(self._receive(sender, msg, now))
            case Tick():
                return Ready(self._tick(now))
            case _:
                raise TypeError(f"not a definitions event: {event!r}")

    def _view(self, leader: str | None, term: int, members: Iterable[str],
              now: float) -> list[Any]:
        """The membership view changed (or not: calling it every tick is cheap)."""
        members = tuple(members)
        out: list[Any] = []
        took_office = leader == self.me and (self.leader != self.me or term != self.term)
        lost_office = self.leader == self.me and (leader != self.me or term != self.term)
        self.leader, self.term, self.members = leader, term, members
        if lost_office:
            self.dterm = 0
            out.extend(self._fail_all("leadership lost"))
        if took_office:
            out.extend(self._new_round(self._next_term(), now))
        return out

    def _write(self, changes: list[tuple[str, str, dict | None]], now: float
               ) -> tuple[int, list[Any]]:
        """Stamp and send ``changes`` ((kind, name, value or None to delete)); raises
        NotLeader unless ready. The write's ``Finished`` comes from a later step/tick
        (or at once, when this node is a majority alone)."""
        if not self.ready:
            raise NotLeader(self.leader if not self.leading else self.me)
        new_keys = {(kind, name) for kind, name, _ in changes} - set(self.entries)
        if len(self.entries) + len(new_keys) > MAX_ENTRIES:
            raise Full(f"the cluster holds {MAX_ENTRIES} definitions and tombstones")
        seq = max((e.seq for e in self.entries.values()), default=0)
        stamped = []
        for kind, name, value in changes:
            seq += 1
            stamped.append(Entry(kind, name, self.dterm, seq, value))
        self._merge(stamped)
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        p = _Pending(tuple(stamped), self.dterm, {self.me}, now + self.timeout,
                     now + self.resend)
        self._pending[wid] = p
        out: list[Any] = [self._persist()]
        for mem in self.members:
            if mem != self.me:
                out.append(Send(mem, DefsPut(self.dterm, p.entries, wid=wid)))
        out.extend(self._check_done(wid))
        return wid, out

    def _receive(self, sender: str, msg: Any, now: float) -> list[Any]:
        if isinstance(msg, DefsPut):
            return self._on_put(sender, msg, now)
        if isinstance(msg, DefsAck):
            p = self._pending.get(msg.wid)
            if p is None or msg.term != p.term:
                return []
            p.acked.add(sender)
            return self._check_done(msg.wid)
        if isinstance(msg, DefsDigest):
            return self._on_digest(sender, msg, now)
        return []

    def _tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        for wid, p in list(self._pending.items()):
            if now >= p.deadline:
                del self._pending[wid]
                out.append(Finished(wid, False, "a majority did not confirm in time"))
            elif now >= p.resend_at:
                p.resend_at = now + self.resend
                out.extend(Send(mem, DefsPut(p.term, p.entries, wid=wid))
                           for mem in self.members if mem not in p.acked)
        if now >= self._next_digest:
            self._next_digest = now + self.resend
            if self.leader is not None and not self.leading and self.me in self.members:
                out.append(Send(self.leader, DefsDigest(self.seen_term, self.digest(),
                                                        self.owner)))
            elif self.leading and self.dterm and not self.ready:
                for mem in self.members:  # an offer or its answer was lost: again
                    if mem != self.me and mem not in self.synced:
                        out.extend(self._offer(mem, now))
        return out

    # ------------------------------------------------------------ inside
    def _next_term(self, above: int = 0) -> int:
        """The term a new round claims: above ``above`` and every one this node promised
        (never the membership's: that one starts again at 1 after a full restart)."""
        return max(above, self.seen_term) + 1

    def _new_round(self, dterm: int, now: float) -> list[Any]:
        """Claim ``dterm`` (promised to itself, on disk first) and offer every member
        the set, asking for their promise and theirs."""
        self.dterm = dterm
        if dterm > self.seen_term:
            self.seen_term, self.owner = dterm, self.me
        self.synced = {self.me}
        self._offered.clear()
        out: list[Any] = [self._persist()]
        for mem in self.members:
            if mem != self.me:
                out.extend(self._offer(mem, now))
        return out

    def _promise(self, sender: str, term: int) -> bool:
        """May ``sender`` lead term ``term`` here? Records (not yet persists) a new
        promise; the caller persists before answering."""
        if term > self.seen_term:
            self.seen_term, self.owner = term, sender
            return True
        return term == self.seen_term and self.owner == sender

    def _on_put(self, sender: str, msg: DefsPut, now: float) -> list[Any]:
        before = (self.seen_term, self.owner)
        changed = self._merge(msg.entries)
        # a write (wid) or an offer (want) is a leader's claim of msg.term; a write of
        # an older term than one we promised is not acked: a leader of that newer term
        # may have taken our set without it (see "adopts")
        granted = (msg.wid is not None or msg.want) and self._promise(sender, msg.term)
        out: list[Any] = [self._persist()] if changed or (self.seen_term, self.owner) \
            != before else []
        if msg.wid is not None and granted:
            out.append(Send(sender, DefsAck(msg.term, msg.wid)))
        if msg.want:  # the leader offers its set and wants ours back
            if granted:
                out.extend(self._whole(sender, want=False, last_flag=True))
            else:  # refused: say what we promised, so it claims a higher term
                out.append(Send(sender, DefsDigest(self.seen_term, self.digest(),
                                                   self.owner)))
        if msg.last and self.leading and msg.term == self.dterm and self._covers(msg.index):
            self.synced.add(sender)  # we hold all it holds: a chunk lost would show here
        if changed and self.leading:
            self._offered.clear()  # what others hold may now differ: offer again
        return out

    def _on_digest(self, sender: str, msg: DefsDigest, now: float) -> list[Any]:
        if not self.leading or not self.dterm:
            return []
        if msg.term > self.dterm or (msg.term == self.dterm and msg.owner != self.me):
            # it promised a term at or above ours to another: claim one above it
            above = self._next_term(msg.term)
            return self._new_round(above, now) if above > self.dterm else []
        if msg.term == self.dterm and msg.digest == self.digest():
            self.synced.add(sender)
            return []
        return self._offer(sender, now)

    def _offer(self, mem: str, now: float) -> list[Any]:
        """Send ``mem`` the whole set and ask for its own (at most once per resend)."""
        if now < self._offered.get(mem, -1e18) + self.resend:
            return []
        self._offered[mem] = now
        return self._whole(mem, want=True, last_flag=False)

    def _whole(self, to: str, *, want: bool, last_flag: bool) -> list[Any]:
        entries = [self.entries[k] for k in sorted(self.entries)]
        chunks = [tuple(entries[i:i + CHUNK]) for i in range(0, len(entries), CHUNK)] or [()]
        out: list[Any] = []
        index = tuple((e.kind, e.name, e.term, e.seq) for e in entries) if last_flag else None
        term = self.dterm if want else self.seen_term
        for i, chunk in enumerate(chunks):
            end = i == len(chunks) - 1
            out.append(Send(to, DefsPut(term, chunk, want=want and end,
                                        last=last_flag and end, index=index if end else None)))
        return out

    def _covers(self, index: tuple[tuple[str, str, int, int], ...] | None) -> bool:
        """We hold every entry of ``index`` (a member's whole set), or a newer one."""
        if index is None:
            return False
        for kind, name, term, seq in index:
            e = self.entries.get((kind, name))
            if e is None or (e.term, e.seq) < (term, seq):
                return False
        return True

    def _merge(self, entries: Iterable[Entry]) -> bool:
        changed = False
        for e in entries:
            key = (e.kind, e.name)
            old = self.entries.get(key)
            if old is None and len(self.entries) >= MAX_ENTRIES:
                continue
            if old is None or (e.term, e.seq) > (old.term, old.seq):
                self.entries[key] = e
                changed = True
        if changed:
            self._digest = None
        return changed

    def _persist(self) -> Persist:
        return Persist(tuple(self.entries[k] for k in sorted(self.entries)), self.seen_term,
                       self.owner)

    def _check_done(self, wid: int) -> list[Any]:
        p = self._pending.get(wid)
        if p is None or len(p.acked & set(self.members)) < self._majority():
            return []
        del self._pending[wid]
        return [Finished(wid, True)]

    def _fail_all(self, why: str) -> list[Any]:
        out = [Finished(wid, False, why) for wid in self._pending]
        self._pending.clear()
        return out
