"""Messages of the cluster-wide definitions (``miyamoto.definitions.machine``, ``miyamoto.definitions.sync``).

DEFS_PUT carries entries (a write, or a whole set in chunks), DEFS_ACK confirms a write
is on the sender's disk, DEFS_DIGEST reports a member's set in 32 hex digits, and
DEFS_WRITE / DEFS_WROTE carry a client's write from a follower to the leader and the
answer back. Values are JSON objects checked for shape here; their meaning is checked
again where they are used (``miyamoto.definitions.schedules``, ``miyamoto.definitions.topics``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import ujson

from miyamoto.wire import checks as c
from miyamoto.wire.messages import message
from miyamoto.wire.verbs import DecodeError, Verb

__all__ = ["Entry", "DefsPut", "DefsAck", "DefsDigest", "DefsWrite", "DefsWrote", "KINDS",
           "DEFS_MESSAGES"]

KINDS = frozenset({"schedule", "topic", "cursor", "queue",
                   "qstash_queue"})  # a QStash queue's parallelism (http/qstash.py)
# a write's op: "merge" sets the fields its value gives (a null one drops it), on the leader
OPS = ("put", "merge", "delete", "pause", "resume")
MAX_VALUE = 512 * 1024  # bytes of one definition as JSON (a topic of 100 long URLs fits)
MAX_PER_MESSAGE = 64
MAX_INDEX = 10000  # definitions.MAX_ENTRIES


def fits(value: dict) -> bool:
    """Is ``value`` within MAX_VALUE, measured as a peer measures it?"""
    return len(ujson.dumps(value)) <= MAX_VALUE


@dataclass(frozen=True, slots=True)
class Entry:
    """One definition: (kind, name), its stamp (term, seq) and value (None: deleted)."""
    kind: str
    name: str
    term: int
    seq: int
    value: dict | None

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "term": self.term, "seq": self.seq,
                "value": self.value}

    @classmethod
    def from_payload(cls, d: Any) -> Entry:
        if not isinstance(d, dict):
            raise DecodeError("entry must be an object")
        kind = c.string(d, "kind", 16)
        if kind not in KINDS:
            raise DecodeError(f"kind must be one of {', '.join(sorted(KINDS))}")
        value = c.opt_obj(d, "value")
        if value is not None and not fits(value):
            raise DecodeError("value is too large")
        return cls(kind, c.string(d, "name", 200), c.integer(d, "term"), c.integer(d, "seq"),
                   value)


def _entries(d: dict) -> tuple[Entry, ...]:
    return tuple(Entry.from_payload(e) for e in c.payload_list(d, "entries", MAX_PER_MESSAGE))


def _opt_int(d: dict, key: str) -> int | None:
    return None if d.get(key) is None else c.integer(d, key)


@message(Verb.DEFS_PUT)
@dataclass(frozen=True, slots=True)
class DefsPut:
    """Entries to merge. ``wid``: a leader's write, to ack; ``want``: answer with your
    whole set; ``last``: the last chunk of a whole set answering ``want``, whose
    ``index`` lists the stamp of every entry of that set (so a lost chunk shows)."""
    term: int
    entries: tuple[Entry, ...]
    wid: int | None = None
    want: bool = False
    last: bool = False
    index: tuple[tuple[str, str, int, int], ...] | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict[str, Any]:
        p = {"term": self.term, "entries": [e.to_payload() for e in self.entries],
             "wid": self.wid, "want": self.want, "last": self.last}
        if self.index is not None:
            p["index"] = [list(i) for i in self.index]
        return p

    @classmethod
    def from_payload(cls, d: dict) -> DefsPut:
        return cls(c.integer(d, "term"), _entries(d), _opt_int(d, "wid"),
                   c.boolean(d, "want", False), c.boolean(d, "last", False), _index(d))


def _index(d: dict) -> tuple[tuple[str, str, int, int], ...] | None:
    if d.get("index") is None:
        return None
    out = []
    for item in c.payload_list(d, "index", MAX_INDEX):
        if not isinstance(item, list) or len(item) != 4:
            raise DecodeError("index items must be [kind, name, term, seq]")
        e = Entry.from_payload({"kind": item[0], "name": item[1], "term": item[2],
                                "seq": item[3], "value": None})
        out.append((e.kind, e.name, e.term, e.seq))
    return tuple(out)


@message(Verb.DEFS_ACK)
@dataclass(frozen=True, slots=True)
class DefsAck:
    """Write ``wid`` of ``term`` is on my disk."""
    term: int
    wid: int
    verb: ClassVar[Verb]

    def payload(self) -> dict[str, Any]:
        return {"term": self.term, "wid": self.wid}

    @classmethod
    def from_payload(cls, d: dict) -> DefsAck:
        return cls(c.integer(d, "term"), c.integer(d, "wid"))


@message(Verb.DEFS_DIGEST)
@dataclass(frozen=True, slots=True)
class DefsDigest:
    """The digest of my whole set (``Definitions.digest``), the highest definitions
    term I promised and to whom (``owner``): a leader counts my set as synced only
    under a promise to it, and claims a higher term when I promised another."""
    term: int
    digest: str
    owner: str | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict[str, Any]:
        return {"term": self.term, "digest": self.digest, "owner": self.owner}

    @classmethod
    def from_payload(cls, d: dict) -> DefsDigest:
        return cls(c.integer(d, "term"), c.string(d, "digest", 64), c.opt_string(d, "owner"))


@message(Verb.DEFS_WRITE)
@dataclass(frozen=True, slots=True)
class DefsWrite:
    """A client's write, forwarded to the leader: ``op`` on (kind, name), ``value`` for
    a put. The answer goes to ``reply_to`` as DEFS_WROTE with the same ``req``."""
    req: str
    reply_to: str
    op: str
    kind: str
    name: str
    value: dict | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict[str, Any]:
        return {"req": self.req, "reply_to": self.reply_to, "op": self.op, "kind": self.kind,
                "name": self.name, "value": self.value}

    @classmethod
    def from_payload(cls, d: dict) -> DefsWrite:
        op = c.string(d, "op", 16)
        if op not in OPS:
            raise DecodeError("op must be one of " + ", ".join(OPS))
        kind = c.string(d, "kind", 16)
        if kind not in KINDS:
            raise DecodeError("unknown kind")
        value = c.opt_obj(d, "value")
        if value is not None and not fits(value):
            raise DecodeError("value is too large")
        return cls(c.string(d, "req"), c.string(d, "reply_to"), op, kind,
                   c.string(d, "name", 200), value)


@message(Verb.DEFS_WROTE)
@dataclass(frozen=True, slots=True)
class DefsWrote:
    """The leader's answer to DEFS_WRITE: an HTTP status and JSON body for the client."""
    req: str
    status: int
    body: dict
    verb: ClassVar[Verb]

    def payload(self) -> dict[str, Any]:
        return {"req": self.req, "status": self.status, "body": self.body}

    @classmethod
    def from_payload(cls, d: dict) -> DefsWrote:
        return cls(c.string(d, "req"), c.integer(d, "status", 100, 599), c.obj(d, "body"))


DEFS_MESSAGES = (DefsPut, DefsAck, DefsDigest, DefsWrite, DefsWrote)
