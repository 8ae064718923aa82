"""Typed cluster messages: one frozen dataclass per verb, its fields checked in one place.

A message travels as a verb and a ujson payload (``miyamoto.protocol``). ``decode(verb,
payload)`` turns a peer's payload into the verb's dataclass or raises ``DecodeError``
naming the field (every check goes through ``miyamoto.checks``, one set of limits);
``msg.payload()`` is the dict that goes on the wire. Nothing outside this module builds
or reads a payload dict by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

from miyamoto import checks as c
from miyamoto.protocol import DecodeError, Verb

_DECODERS: dict[Verb, Callable[[dict], Any]] = {}
M = TypeVar("M")


def message(verb: Verb) -> Callable[[type[M]], type[M]]:
    """Register a dataclass as the message of ``verb`` (its ``from_payload`` decodes)."""
    def register(cls: type[M]) -> type[M]:
        cls.verb = verb  # type: ignore[attr-defined]
        _DECODERS[verb] = cls.from_payload  # type: ignore[attr-defined]
        return cls
    return register


def decode(verb: Verb, payload: dict) -> Any:
    """The message of ``verb`` carried by ``payload``; DecodeError if it does not fit."""
    decoder = _DECODERS.get(verb)
    if decoder is None:
        raise DecodeError(f"no message type for {verb.value}")
    if not isinstance(payload, dict):
        raise DecodeError("payload is not an object")
    return decoder(payload)


# ------------------------------------------------------------ siblings (miyamoto.siblings)
MAX_HANDOFF = 10_000  # copies named in one HANDOFF
MAX_LEASE = 30 * 86400.0  # seconds: a lease or delay beyond this is absurd


def _seconds(d: dict, key: str) -> float:
    v = c.number(d, key)
    if not 0 <= v <= MAX_LEASE:
        raise DecodeError(f"{key} must be between 0 and {MAX_LEASE} seconds")
    return v


def _last(d: dict) -> dict | None:
    return c.opt_obj(d, "last")


@message(Verb.CLAIM)
@dataclass(frozen=True, slots=True)
class Claim:
    """Copy ``replica`` starts a delivery: hold yours off for ``lease`` seconds from now.
    Times between nodes travel as durations, so the receiver's clock is the only one
    that matters."""
    id: str
    replica: int
    lease: float
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "replica": self.replica, "lease": self.lease}

    @classmethod
    def from_payload(cls, d: dict) -> "Claim":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   _seconds(d, "lease"))


@message(Verb.RETRY)
@dataclass(frozen=True, slots=True)
class Retry:
    """Copy ``replica``'s attempt failed; it tries again in ``delay`` seconds."""
    id: str
    replica: int
    delay: float
    attempts: int
    last: dict | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "replica": self.replica, "delay": self.delay,
                "attempts": self.attempts, "last": self.last}

    @classmethod
    def from_payload(cls, d: dict) -> "Retry":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   _seconds(d, "delay"), c.integer(d, "attempts"), _last(d))


@dataclass(frozen=True, slots=True)
class _Ended:
    id: str
    attempts: int = 0
    last: dict | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "attempts": self.attempts, "last": self.last}

    @classmethod
    def from_payload(cls, d: dict) -> Any:
        return cls(c.string(d, "id"), c.integer(d, "attempts"), _last(d))


@message(Verb.DONE)
@dataclass(frozen=True, slots=True)
class Done(_Ended):
    """A copy was delivered: the task succeeded."""


@message(Verb.FAILED)
@dataclass(frozen=True, slots=True)
class Failed(_Ended):
    """A copy used the task's last attempt: the task failed."""


@message(Verb.CANCEL)
@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel your copy; ``abort``: the enqueue was refused, free the name as well."""
    id: str
    abort: bool = False
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "abort": self.abort}

    @classmethod
    def from_payload(cls, d: dict) -> "Cancel":
        return cls(c.string(d, "id"), c.boolean(d, "abort", False))


@message(Verb.HANDOFF)
@dataclass(frozen=True, slots=True)
class Handoff:
    """A node stopping gracefully: fire these copies (id, in seconds) at the latest then."""
    tasks: tuple[tuple[str, float], ...]
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"tasks": [[i, s] for i, s in self.tasks]}

    @classmethod
    def from_payload(cls, d: dict) -> "Handoff":
        items = []
        for item in c.payload_list(d, "tasks", MAX_HANDOFF):
            if not isinstance(item, list) or len(item) != 2:
                raise DecodeError("tasks must hold [id, delay] pairs")
            pair = {"id": item[0], "delay": item[1]}
            items.append((c.string(pair, "id"), _seconds(pair, "delay")))
        return cls(tuple(items))


@message(Verb.REPLICAS)
@dataclass(frozen=True, slots=True)
class Replicas:
    """The task's replica set changed (a lost member's copy was restored elsewhere)."""
    id: str
    replicas: tuple[str, ...]
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "replicas": list(self.replicas)}

    @classmethod
    def from_payload(cls, d: dict) -> "Replicas":
        replicas = c.str_list(d, "replicas")
        if not replicas:
            raise DecodeError("replicas must not be empty")
        return cls(c.string(d, "id"), replicas)


@message(Verb.ASK)
@dataclass(frozen=True, slots=True)
class Ask:
    """A copy firing late (or reloaded, or held while its node was cut off) asks its
    siblings before delivering: is the task still to be delivered, and by me?"""
    id: str
    replica: int
    probe: bool = False  # only tell me if it ended or moved; I am not about to deliver
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"id": self.id, "replica": self.replica}
        if self.probe:
            d["probe"] = True
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Ask":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   c.boolean(d, "probe", False))


GO, WAIT, CLAIMED, ENDED, UNKNOWN, REHOMED = "go", "wait", "claimed", "ended", "unknown", "rehomed"
VERDICTS = frozenset({GO, WAIT, CLAIMED, ENDED, UNKNOWN, REHOMED})
ENDED_STATES = frozenset({"succeeded", "failed", "cancelled"})


@message(Verb.ANSWER)
@dataclass(frozen=True, slots=True)
class Answer:
    """A sibling's answer to ASK: ``go`` (deliver; I hold my copy off for a lease),
    ``wait`` / ``claimed`` (ask again after ``lease`` seconds), ``ended`` (with the
    end ``state``), ``rehomed`` (the task's ``replicas`` are now these), ``unknown``."""
    id: str
    verdict: str
    lease: float = 0.0
    state: str | None = None
    attempts: int = 0
    last: dict | None = None
    replicas: tuple[str, ...] = ()
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"id": self.id, "verdict": self.verdict}
        if self.lease:
            d["lease"] = self.lease
        if self.state is not None:
            d.update(state=self.state, attempts=self.attempts, last=self.last)
        if self.replicas:
            d["replicas"] = list(self.replicas)
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Answer":
        verdict = c.string(d, "verdict")
        if verdict not in VERDICTS:
            raise DecodeError("verdict is not one of " + ", ".join(sorted(VERDICTS)))
        state = c.opt_string(d, "state")
        if verdict == ENDED and state not in ENDED_STATES:
            raise DecodeError("an ended answer needs an end state")
        replicas = c.str_list(d, "replicas") if "replicas" in d else ()
        if verdict == REHOMED and not replicas:
            raise DecodeError("a rehomed answer needs the replicas")
        return cls(c.string(d, "id"), verdict, _seconds(d, "lease") if "lease" in d else 0.0,
                   state, c.integer(d, "attempts") if "attempts" in d else 0, _last(d), replicas)


# ------------------------------------------------------------ requests (miyamoto.requests)
@message(Verb.STORE)
@dataclass(frozen=True, slots=True)
class Store:
    """Store this copy (``task`` as Task.encode() gives it) and answer STORED."""
    req: str
    reply_to: str
    task: dict
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"req": self.req, "reply_to": self.reply_to, "task": self.task}

    @classmethod
    def from_payload(cls, d: dict) -> "Store":
        return cls(c.string(d, "req"), _address(d), c.obj(d, "task"))


@message(Verb.STORED)
@dataclass(frozen=True, slots=True)
class Stored:
    req: str
    id: str
    ok: bool
    duplicate: str | None = None  # the name is taken by this task id
    error: str | None = None
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"req": self.req, "id": self.id, "ok": self.ok}
        if self.duplicate is not None:
            d["duplicate"] = self.duplicate
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Stored":
        return cls(c.string(d, "req"), c.string(d, "id"), c.boolean(d, "ok"),
                   c.opt_string(d, "duplicate"), c.opt_string(d, "error"))


OPS = frozenset({"get", "cancel", "rerun", "paused", "counts", "list", "control"})


@message(Verb.REQUEST)
@dataclass(frozen=True, slots=True)
class Request:
    """A cluster-wide query or control (``op`` with ``args``), answered by REPLY."""
    req: str
    reply_to: str
    op: str
    args: dict
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"req": self.req, "reply_to": self.reply_to, "op": self.op, "args": self.args}

    @classmethod
    def from_payload(cls, d: dict) -> "Request":
        op = c.string(d, "op")
        if op not in OPS:
            raise DecodeError(f"unknown op {op[:32]!r}")
        return cls(c.string(d, "req"), _address(d), op, c.opt_obj(d, "args") or {})


@message(Verb.REPLY)
@dataclass(frozen=True, slots=True)
class Reply:
    req: str
    ok: bool
    result: Any = None
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"req": self.req, "ok": self.ok, "result": self.result}

    @classmethod
    def from_payload(cls, d: dict) -> "Reply":
        return cls(c.string(d, "req"), c.boolean(d, "ok", True), d.get("result"))


def _address(d: dict) -> str:
    address = c.string(d, "reply_to", 300)
    if not address.startswith("tcp://"):
        raise DecodeError("reply_to must be a tcp:// address")
    return address


# ---------------------------------------------------------- membership (miyamoto.membership)
from miyamoto.roster import MAX_TERM, Member, Roster  # noqa: E402 (kept below the line: one section per owner)

# Every membership message carries who sent it (``from``: id and addresses), which
# process (``inc``, its incarnation) and the sender's ``term``; the rest is per verb.
# The wire format is the one membership always used; fields added since are optional
# (absent means "not said"), so an older peer's messages still decode.


def _opt_int(d: dict, key: str) -> int | None:
    return None if d.get(key) is None else c.integer(d, key)


def _opt_str_list(d: dict, key: str) -> tuple[str, ...] | None:
    return None if d.get(key) is None else c.str_list(d, key)


@dataclass(frozen=True, kw_only=True)
class _Membership:
    term: int
    inc: str
    sender: Member
    verb: ClassVar[Verb]

    @property
    def voter(self) -> tuple[str, str]:
        """(id, incarnation): whom a vote or an ack counts for."""
        return (self.sender.id, self.inc)

    @staticmethod
    def _envelope(d: dict) -> dict[str, Any]:
        term = c.integer(d, "term")
        if term > MAX_TERM:
            raise DecodeError("absurd term")
        return {"term": term, "inc": c.string(d, "inc"),
                "sender": Member.from_payload(d.get("from"))}

    def _base(self) -> dict[str, Any]:
        return {"term": self.term, "inc": self.inc, "from": self.sender.to_payload()}


@message(Verb.JOIN)
@dataclass(frozen=True, kw_only=True)
class Join(_Membership):
    """Let me in. ``boot`` is my seed set, ``fresh``: a first start that never held a roster."""
    boot: tuple[str, ...]
    fresh: bool

    @classmethod
    def from_payload(cls, d: dict) -> Join:
        return cls(**cls._envelope(d), boot=c.str_list(d, "boot"), fresh=c.boolean(d, "fresh"))

    def payload(self) -> dict[str, Any]:
        return dict(self._base(), boot=list(self.boot), fresh=self.fresh)


@message(Verb.REDIRECT)
@dataclass(frozen=True, kw_only=True)
class Redirect(_Membership):
    """Ask the leader instead: its id and cluster address (None: I know of none)."""
    leader: str | None
    address: str | None

    @classmethod
    def from_payload(cls, d: dict) -> Redirect:
        return cls(**cls._envelope(d), leader=c.opt_string(d, "leader"),
                   address=c.opt_string(d, "address"))

    def payload(self) -> dict[str, Any]:
        return dict(self._base(), leader=self.leader, address=self.address)


@dataclass(frozen=True, kw_only=True)
class _FromLeader(_Membership):
    """ROSTER and HEARTBEAT: the leader of ``term`` (or, handing over, the last one) speaking.

    ``elect``: the successor a leaving leader names. ``round``: the leader's broadcast
    number, echoed by the ack so that the leader knows when the acked message was sent.
    ``heard``: the ids the leader heard from within the failure timeout (itself too).
    ``echo``: the highest ack ``seq`` the leader has from the receiver, so that a
    follower back from a stall can tell a heartbeat sent after it resumed.
    """
    roster: Roster
    elect: str | None = None
    round: int | None = None
    heard: tuple[str, ...] | None = None
    echo: int | None = None

    @classmethod
    def from_payload(cls, d: dict) -> _FromLeader:
        env = cls._envelope(d)
        roster = Roster.from_payload(c.obj(d, "roster"))
        if roster.leader not in (None, env["sender"].id) or roster.term > env["term"]:
            raise DecodeError("roster does not match its sender")
        return cls(**env, roster=roster, elect=c.opt_string(d, "elect"),
                   round=_opt_int(d, "round"), heard=_opt_str_list(d, "heard"),
                   echo=_opt_int(d, "echo"))

    def payload(self) -> dict[str, Any]:
        p = dict(self._base(), roster=self.roster.to_payload())
        for key in ("elect", "round", "echo"):
            if getattr(self, key) is not None:
                p[key] = getattr(self, key)
        if self.heard is not None:
            p["heard"] = list(self.heard)
        return p


@message(Verb.ROSTER)
@dataclass(frozen=True, kw_only=True)
class RosterUpdate(_FromLeader):
    """A new roster version (or the current one, to a member that asked or was removed)."""


@message(Verb.HEARTBEAT)
@dataclass(frozen=True, kw_only=True)
class Heartbeat(_FromLeader):
    """The leader's beat, every heartbeat interval, with the full roster."""


@message(Verb.HEARTBEAT_ACK)
@dataclass(frozen=True, kw_only=True)
class HeartbeatAck(_Membership):
    """The answer to ROSTER/HEARTBEAT: ``ok`` (False: your term is stale) and my roster key.

    ``round`` echoes the leader's; ``seq`` counts this follower's acks (see ``echo``).
    """
    ok: bool
    rterm: int
    version: int
    round: int | None = None
    seq: int | None = None

    @classmethod
    def from_payload(cls, d: dict) -> HeartbeatAck:
        return cls(**cls._envelope(d), ok=c.boolean(d, "ok"), rterm=c.integer(d, "rterm"),
                   version=c.integer(d, "version"), round=_opt_int(d, "round"),
                   seq=_opt_int(d, "seq"))

    @property
    def key(self) -> tuple[int, int]:
        return (self.rterm, self.version)

    def payload(self) -> dict[str, Any]:
        p = dict(self._base(), ok=self.ok, rterm=self.rterm, version=self.version)
        if self.round is not None:
            p["round"] = self.round
        if self.seq is not None:
            p["seq"] = self.seq
        return p


@message(Verb.VOTE_REQUEST)
@dataclass(frozen=True, kw_only=True)
class VoteRequest(_Membership):
    """Vote for me in ``term``; my roster is (``rterm``, ``version``).

    ``pre``: a pre-vote (would you?), ``transfer``: a leader handed over to me, ``boot``:
    a bootstrap election among this seed set (``fresh`` as in JOIN).
    """
    rterm: int
    version: int
    pre: bool = False
    transfer: bool = False
    boot: tuple[str, ...] | None = None
    fresh: bool = False

    @classmethod
    def from_payload(cls, d: dict) -> VoteRequest:
        return cls(**cls._envelope(d), rterm=c.integer(d, "rterm"),
                   version=c.integer(d, "version"), pre=c.boolean(d, "pre", False),
                   transfer=c.boolean(d, "transfer", False), boot=_opt_str_list(d, "boot"),
                   fresh=c.boolean(d, "fresh", False))

    @property
    def key(self) -> tuple[int, int]:
        return (self.rterm, self.version)

    def payload(self) -> dict[str, Any]:
        p = dict(self._base(), rterm=self.rterm, version=self.version)
        if self.pre:
            p["pre"] = True
        if self.transfer:
            p["transfer"] = True
        if self.boot is not None:
            p.update(boot=list(self.boot), fresh=self.fresh)
        return p


@message(Verb.VOTE)
@dataclass(frozen=True, kw_only=True)
class Vote(_Membership):
    """The answer to VOTE_REQUEST (``pre`` to a pre-vote); ``fresh`` as in JOIN."""
    granted: bool
    fresh: bool = False
    pre: bool = False

    @classmethod
    def from_payload(cls, d: dict) -> Vote:
        return cls(**cls._envelope(d), granted=c.boolean(d, "granted"),
                   fresh=c.boolean(d, "fresh", False), pre=c.boolean(d, "pre", False))

    def payload(self) -> dict[str, Any]:
        p = dict(self._base(), granted=self.granted, fresh=self.fresh)
        if self.pre:
            p["pre"] = True
        return p


@message(Verb.LEAVE)
@dataclass(frozen=True, kw_only=True)
class Leave(_Membership):
    """I am stopping: take me out of the roster now."""

    @classmethod
    def from_payload(cls, d: dict) -> Leave:
        return cls(**cls._envelope(d))

    def payload(self) -> dict[str, Any]:
        return self._base()


MembershipMessage = (Join | Redirect | RosterUpdate | Heartbeat | HeartbeatAck | VoteRequest
                     | Vote | Leave)
