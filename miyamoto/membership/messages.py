"""Membership and election messages (miyamoto.membership.machine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from miyamoto.membership.roster import MAX_TERM, Member, Roster
from miyamoto.wire import checks as c
from miyamoto.wire.messages import message
from miyamoto.wire.verbs import DecodeError, Verb

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
    """Ask the leader instead: its id and cluster address (None: I know of none), and
    its incarnation (``leader_inc``), by which a member told so knows its admission."""
    leader: str | None
    address: str | None
    leader_inc: str | None = None

    @classmethod
    def from_payload(cls, d: dict) -> Redirect:
        return cls(**cls._envelope(d), leader=c.opt_string(d, "leader"),
                   address=c.opt_string(d, "address"),
                   leader_inc=c.opt_string(d, "leader_inc"))

    def payload(self) -> dict[str, Any]:
        p = dict(self._base(), leader=self.leader, address=self.address)
        if self.leader_inc is not None:
            p["leader_inc"] = self.leader_inc
        return p


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
    a bootstrap election among this seed set (``fresh`` as in JOIN). ``to_inc``: the
    incarnation my roster names you as, by which a joiner knows it is one of my voters.
    """
    rterm: int
    version: int
    pre: bool = False
    transfer: bool = False
    boot: tuple[str, ...] | None = None
    fresh: bool = False
    to_inc: str | None = None

    @classmethod
    def from_payload(cls, d: dict) -> VoteRequest:
        return cls(**cls._envelope(d), rterm=c.integer(d, "rterm"),
                   version=c.integer(d, "version"), pre=c.boolean(d, "pre", False),
                   transfer=c.boolean(d, "transfer", False), boot=_opt_str_list(d, "boot"),
                   fresh=c.boolean(d, "fresh", False), to_inc=c.opt_string(d, "to_inc"))

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
        if self.to_inc is not None:
            p["to_inc"] = self.to_inc
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
