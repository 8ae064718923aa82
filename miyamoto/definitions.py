"""Cluster-wide definitions (schedules, topics): a pure state machine (DESIGN §2).

``Definitions`` holds no socket, clock, greenlet or file. The I/O layer
(``miyamoto.defsync``) feeds it the membership view (``view``), peers' messages
(``step``), client writes (``write``) and time (``tick``), and carries out the effects
it returns: ``Persist`` (write the whole set to disk before anything else), ``Send``
and ``Finished`` (a write's outcome, for the HTTP answer). ``tests/definitions_sim.py``
drives it with loss, delay, crashes and leader changes.

The rules, and why each is there:

A map of entries, last writer wins by stamp
    Each (kind, name) holds one ``Entry``: its value (a JSON object, or None for a
    deletion: a tombstone, kept so a member that missed the delete cannot bring the old
    value back) and a stamp ``(term, seq)``. Only a leader makes stamps: its own term
    and one more than the highest seq it holds. Terms have at most one leader (Raft),
    so no two different writes share a stamp, and a later leader's stamps beat every
    earlier one's. Merging is per entry, the higher stamp wins: it is commutative and
    idempotent, so messages may be lost, repeated or reordered and members still
    converge to one map.

Writes go through the leader, answered once a majority has them on disk
    ``write`` (leader only) stamps the changes, persists them and sends DEFS_PUT to
    every member; each member merges, persists, then acks (DEFS_ACK). The write is
    ``Finished(ok=True)`` once a majority of the roster (the leader counted) has acked,
    so an acknowledged write survives the loss of any minority. Unacked members get the
    PUT again every ``resend`` until ``deadline``, then the write is ``Finished(ok=
    False)``: it may still spread (like a 503'd enqueue may still run), never half.

A new leader adopts the newest set of a majority before it writes
    On taking office it sends its whole set (DEFS_PUT ``want``) to every member; each
    merges and answers with its whole set; the leader merges those. It accepts writes
    (``ready``) only once a majority (itself counted) has answered, or reported a
    digest equal to its own. Every acknowledged write is on some member of any
    majority, so a ready leader holds it: its read-modify-writes (pause, resume) and
    its schedule cursors start from the newest state.

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

from miyamoto.messages.definitions import DefsAck, DefsDigest, DefsPut, Entry

__all__ = ["Definitions", "Entry", "Finished", "Full", "NotLeader", "Persist", "Send", "CHUNK",
           "MAX_ENTRIES"]

CHUNK = 16           # entries per DEFS_PUT of a whole set (keeps a frame well under 7 MiB)
MAX_ENTRIES = 10000  # definitions and tombstones a cluster holds


@dataclass(frozen=True, slots=True)
class Send:
    to: str
    msg: Any


@dataclass(frozen=True, slots=True)
class Persist:
    """Write every entry, and the highest term seen, to stable storage before carrying
    out the effects after it."""
    entries: tuple[Entry, ...]
    term: int


@dataclass(frozen=True, slots=True)
class Finished:
    wid: int
    ok: bool
    error: str = ""


class Full(Exception):
    """The map holds MAX_ENTRIES definitions and tombstones: a new key is refused (a
    write that merge would drop must not be acknowledged)."""


class NotLeader(Exception):
    """Writes go to the leader; ``leader`` is its id (None: none known), ``ready`` False
    when this node leads but has not heard a majority's set yet."""

    def __init__(self, leader: str | None, ready: bool = True):
        super().__init__(leader)
        self.leader = leader
        self.ready = ready


@dataclass
class _Pending:
    entries: tuple[Entry, ...]
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
    term: int = 0       # the membership's term, as last viewed
    seen_term: int = 0  # the highest term seen in a view or a message (kept on disk)
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
        """This node leads and holds the newest set of a majority: it may write."""
        return (self.leading and self.term == self.seen_term
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
    def load(self, entries: Iterable[Entry], term: int = 0) -> None:
        """Entries and the highest term seen, read back from disk at start."""
        self._merge(entries)
        self.seen_term = max(self.seen_term, term)

    def view(self, leader: str | None, term: int, members: Iterable[str],
             now: float) -> list[Any]:
        """The membership view changed (or not: calling it every tick is cheap)."""
        members = tuple(members)
        out: list[Any] = []
        took_office = leader == self.me and (self.leader != self.me or term != self.term)
        lost_office = self.leader == self.me and (leader != self.me or term != self.term)
        self.leader, self.term, self.members = leader, term, members
        if term > self.seen_term:
            self.seen_term = term
            out.append(self._persist())
        if lost_office:
            out.extend(self._fail_all("leadership lost"))
        if took_office:
            self.synced = {self.me}
            self._offered.clear()
            for mem in members:
                if mem != self.me:
                    out.extend(self._offer(mem, now))
        return out

    def write(self, changes: list[tuple[str, str, dict | None]], now: float
              ) -> tuple[int, list[Any]]:
        """Stamp and send ``changes`` ((kind, name, value or None to delete)); raises
        NotLeader unless ready. The write's ``Finished`` comes from a later step/tick
        (or at once, when this node is a majority alone)."""
        if not self.ready:
            raise NotLeader(self.leader if not self.leading else self.me, ready=False
                            if self.leading else True)
        new_keys = {(kind, name) for kind, name, _ in changes} - set(self.entries)
        if len(self.entries) + len(new_keys) > MAX_ENTRIES:
            raise Full(f"the cluster holds {MAX_ENTRIES} definitions and tombstones")
        seq = max((e.seq for e in self.entries.values()), default=0)
        stamped = []
        for kind, name, value in changes:
            seq += 1
            stamped.append(Entry(kind, name, self.term, seq, value))
        self._merge(stamped)
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        p = _Pending(tuple(stamped), {self.me}, now + self.timeout, now + self.resend)
        self._pending[wid] = p
        out: list[Any] = [self._persist()]
        for mem in self.members:
            if mem != self.me:
                out.append(Send(mem, DefsPut(self.term, p.entries, wid=wid)))
        out.extend(self._check_done(wid))
        return wid, out

    def step(self, sender: str, msg: Any, now: float) -> list[Any]:
        out: list[Any] = []
        if msg.term > self.seen_term:  # persisted with what this message changes
            self.seen_term = msg.term
            out.append(self._persist())
        return out + self._step(sender, msg, now)

    def _step(self, sender: str, msg: Any, now: float) -> list[Any]:
        if isinstance(msg, DefsPut):
            return self._on_put(sender, msg, now)
        if isinstance(msg, DefsAck):
            p = self._pending.get(msg.wid)
            if p is None or msg.term != self.term:
                return []
            p.acked.add(sender)
            return self._check_done(msg.wid)
        if isinstance(msg, DefsDigest):
            if not self.leading or msg.term != self.term:
                return []
            if msg.digest == self.digest():
                self.synced.add(sender)
                return []
            return self._offer(sender, now)
        return []

    def tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        for wid, p in list(self._pending.items()):
            if now >= p.deadline:
                del self._pending[wid]
                out.append(Finished(wid, False, "a majority did not confirm in time"))
            elif now >= p.resend_at:
                p.resend_at = now + self.resend
                out.extend(Send(mem, DefsPut(self.term, p.entries, wid=wid))
                           for mem in self.members if mem not in p.acked)
        if now >= self._next_digest:
            self._next_digest = now + self.resend
            if self.leader is not None and not self.leading and self.me in self.members:
                out.append(Send(self.leader, DefsDigest(self.seen_term, self.digest())))
        return out

    # ------------------------------------------------------------ inside
    def _on_put(self, sender: str, msg: DefsPut, now: float) -> list[Any]:
        changed = self._merge(msg.entries)
        out: list[Any] = [self._persist()] if changed else []
        # a write of an older term than one we answered a leader in is not acked: a
        # leader of that newer term may have taken our set without it (see "adopts")
        if msg.wid is not None and msg.term >= self.seen_term:
            out.append(Send(sender, DefsAck(msg.term, msg.wid)))
        if msg.want:  # the leader offers its set and wants ours back
            out.extend(self._whole(sender, want=False, last_flag=True))
        if msg.last and self.leading and msg.term == self.term and self._covers(msg.index):
            self.synced.add(sender)  # we hold all it holds: a chunk lost would show here
        if changed and self.leading:
            self._offered.clear()  # what others hold may now differ: offer again
        return out

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
        for i, chunk in enumerate(chunks):
            end = i == len(chunks) - 1
            out.append(Send(to, DefsPut(self.seen_term, chunk, want=want and end,
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
        return Persist(tuple(self.entries[k] for k in sorted(self.entries)), self.seen_term)

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
