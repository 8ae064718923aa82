"""The values membership is made of: members, rosters, timings (DESIGN §2).

All frozen. ``Roster`` is what the rest of the node reads (the ring is its members in
id order); ``Timing`` holds the protocol's timers and the stall threshold derived from
them. Payload checks go through
``miyamoto.wire.checks``, the one set of limits every cluster message uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from miyamoto.wire import checks as c
from miyamoto.wire.verbs import DecodeError

# A term beyond this does not decode. It is not what keeps the term space open: a message
# may raise a term by ``Timing.term_step`` at most (see ``miyamoto.membership.machine``).
MAX_TERM = 2**52
KEY_CHARS = 40  # a CurveZMQ public key in Z85

# a node's roles in membership
JOINING, FOLLOWER, CANDIDATE, LEADER, LEFT = "joining", "follower", "candidate", "leader", "left"


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    cluster: str  # ZeroMQ endpoint, e.g. "tcp://127.0.0.1:6000"
    http: str     # "host:port" of its HTTP API
    zone: str = ""  # its failure domain (replication.spread); "" = a zone of its own
    # its own public key (Z85), as the cluster layer authenticated it: the layer sets it on
    # every membership message's sender from the connection, whatever the payload says,
    # so a roster names the key each member joined with ("": none, an insecure cluster)
    key: str = ""

    def to_payload(self) -> dict[str, str]:
        p = {"id": self.id, "cluster": self.cluster, "http": self.http}
        if self.zone:
            p["zone"] = self.zone
        if self.key:
            p["key"] = self.key
        return p

    @classmethod
    def from_payload(cls, d: object) -> Member:
        if not isinstance(d, dict):
            raise DecodeError("a member must be an object")
        key = c.opt_string(d, "key") or ""
        if key and len(key) != KEY_CHARS:
            raise DecodeError(f"a member's key must be {KEY_CHARS} characters")
        return cls(c.string(d, "id"), c.string(d, "cluster"), c.string(d, "http"),
                   c.opt_string(d, "zone") or "", key)


@dataclass(frozen=True)
class Roster:
    """One version of the cluster's membership, as the leader of ``term`` made it.

    ``members`` is always sorted by id: that order is the ring. ``incarnations[i]``
    names the process of ``members[i]`` (see ``miyamoto.membership.machine``); ``quorum_floor``
    is the bootstrap's minimum quorum. Callers outside membership need neither.
    """

    version: int
    term: int
    leader: str | None
    members: tuple[Member, ...]
    incarnations: tuple[str, ...] = ()
    quorum_floor: int = 0
    _index: dict[str, int] = field(init=False, repr=False, hash=False,
                                   compare=False)  # made from members: equal with them
    _payload: dict | None = field(init=False, repr=False, compare=False, hash=False,
                                  default=None)
    _ids: tuple[str, ...] | None = field(init=False, repr=False, compare=False, hash=False,
                                         default=None)

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
        """The member ids, sorted (made once: the cluster layer asks for every task)."""
        ids = self._ids
        if ids is None:
            ids = tuple(m.id for m in self.members)
            object.__setattr__(self, "_ids", ids)
        return ids

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

    def pairs(self) -> list[tuple[Member, str]]:
        """(member, incarnation) in ring order."""
        return list(zip(self.members, self.incarnations))

    def to_payload(self) -> dict[str, Any]:
        """The wire form; built once per roster and shared: do not mutate it."""
        if self._payload is None:
            object.__setattr__(self, "_payload", {
                "version": self.version,
                "term": self.term,
                "leader": self.leader,
                "floor": self.quorum_floor,
                "members": [dict(m.to_payload(), inc=inc)
                            for m, inc in zip(self.members, self.incarnations)],
            })
        assert self._payload is not None
        return self._payload

    @classmethod
    def from_payload(cls, d: object) -> Roster:
        if not isinstance(d, dict):
            raise DecodeError("a roster must be an object")
        raw = c.payload_list(d, "members", c.MAX_MEMBERS)
        members = tuple(Member.from_payload(m) for m in raw)
        incs = tuple(m.get("inc", "") for m in raw)
        if not all(type(i) is str and len(i) <= c.MAX_NAME for i in incs):
            raise DecodeError("a member's inc must be a string")
        floor = d.get("floor", 0)
        if type(floor) is not int:
            raise DecodeError("floor must be an integer")
        try:
            return cls(c.integer(d, "version"), c.integer(d, "term"),
                       c.opt_string(d, "leader"), members, incs, floor)
        except ValueError as e:
            raise DecodeError(f"bad roster: {e}") from e


EMPTY = Roster(version=0, term=0, leader=None, members=())


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

    @property
    def stall(self) -> float:
        """A gap between two consecutive ``now`` values beyond this is a stall of our own.

        max(2 heartbeat intervals, half the failure timeout): 1.5 s by default. A live
        node is ticked at least every heartbeat interval (``next_deadline`` promises it),
        so a gap of two intervals already means we missed a beat of our own; and once
        half the failure timeout is gone, the others may be acting on our silence (a
        leader dropping us, a follower campaigning), so what we knew is no longer safe
        to act on. Below that bound a busy event loop (a slow journal commit, a burst of
        deliveries) is not taken for a pause.
        """
        return max(2 * self.heartbeat_interval, self.failure_timeout / 2)

    @property
    def term_step(self) -> int:
        """The most one message from a member raises our term by: 6 by default.

        A member sees every election of its cluster unless it is cut off, and one cut
        off for longer than ``failure_timeout`` is dropped and comes back through an
        admission (which sets any term); election rounds come at most one per
        ``election_timeout_min``. So an honest jump is at most the rounds within a
        failure timeout, plus a few for candidates that raced: 4 + failure_timeout /
        election_timeout_min. Measured in 450 of the simulator's random runs: 3 at most.
        """
        return 4 + math.ceil(self.failure_timeout / self.election_timeout_min)
