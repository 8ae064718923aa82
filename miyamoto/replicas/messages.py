"""The replica protocol's messages (miyamoto.replicas.siblings) and the request/answer pairs
(STORE/STORED, REQUEST/REPLY) of miyamoto.cluster.requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from miyamoto.tasks.task import REVISION_MAX
from miyamoto.wire import checks as c
from miyamoto.wire.messages import message
from miyamoto.wire.verbs import DecodeError, Verb

# ------------------------------------------------------------ siblings (miyamoto.replicas.siblings)
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
    """Copy ``replica`` starts a delivery (its siblings said ``go``): hold yours off
    for ``lease`` seconds from now. ``held``: a worker holds the task (a long task's
    202 or heartbeat), so the claim outlives its claimer's process: a restart of the
    claimer does not end the worker's lease.
    Times between nodes travel as durations, so the receiver's clock is the only one
    that matters."""
    id: str
    replica: int
    lease: float
    held: bool = False
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d = {"id": self.id, "replica": self.replica, "lease": self.lease}
        if self.held:  # left out otherwise: what a peer without the field sends
            d["held"] = True
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Claim":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   _seconds(d, "lease"), c.boolean(d, "held", False))


@message(Verb.RETRY)
@dataclass(frozen=True, slots=True)
class Retry:
    """Copy ``replica``'s attempt failed; it tries again in ``delay`` seconds."""
    id: str
    replica: int
    delay: float
    attempts: int
    last: dict | None = None
    attempt: dict | None = None  # the attempt's history entry (checks.opt_attempt)
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "replica": self.replica, "delay": self.delay,
                "attempts": self.attempts, "last": self.last, "attempt": self.attempt}

    @classmethod
    def from_payload(cls, d: dict) -> "Retry":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   _seconds(d, "delay"), c.integer(d, "attempts"), _last(d),
                   c.opt_attempt(d, "attempt"))


@dataclass(frozen=True, slots=True)
class _Ended:
    id: str
    attempts: int = 0
    last: dict | None = None
    attempt: dict | None = None  # the attempt's history entry (checks.opt_attempt)
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"id": self.id, "attempts": self.attempts, "last": self.last,
                "attempt": self.attempt}

    @classmethod
    def from_payload(cls, d: dict) -> Any:
        return cls(c.string(d, "id"), c.integer(d, "attempts"), _last(d),
                   c.opt_attempt(d, "attempt"))


@message(Verb.DONE)
@dataclass(frozen=True, slots=True)
class Done(_Ended):
    """A copy was delivered: the task succeeded."""


@message(Verb.FAILED)
@dataclass(frozen=True, slots=True)
class Failed(_Ended):
    """A copy used the task's last attempt: the task failed; or, ``expired``, it was
    not started by its ``expires_at`` (it ends as expired on every copy)."""
    expired: bool = False

    def payload(self) -> dict:
        d = _Ended.payload(self)
        if self.expired:
            d["expired"] = True
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Failed":
        return cls(c.string(d, "id"), c.integer(d, "attempts"), _last(d),
                   c.opt_attempt(d, "attempt"), c.boolean(d, "expired", False))


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
    """A copy about to deliver asks its siblings first (every delivery does): is the
    task still to be delivered, and by me? (``miyamoto.replicas.siblings``)"""
    id: str
    replica: int
    probe: bool = False  # only tell me if it ended or moved; I am not about to deliver
    n: int = 0  # the asker's round, echoed in the answer
    reruns: int = 0  # the asker's copy's Task.reruns: an end of an older run is not its end
    lease: float = 0.0  # the attempt's deadline plus claim_lease, if it goes (0: not said)
    # an ordered copy's (queue, ordering key, seq): a sibling that has no copy yet still
    # knows whether its line of that key has another task first (``engine.ordering``)
    order: tuple[str, str, int] | None = None
    # the asker's copy's Task.revision (its last replace, ``tasks/repeat.py``): a sibling
    # holding a newer one does not say ``go`` to that older version ("": never replaced)
    revision: str = ""
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"id": self.id, "replica": self.replica}
        if self.order is not None:
            d["order"] = list(self.order)
        if self.revision:
            d["revision"] = self.revision
        if self.probe:
            d["probe"] = True
        if self.n:
            d["n"] = self.n
        if self.reruns:
            d["reruns"] = self.reruns
        if self.lease:
            d["lease"] = self.lease
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Ask":
        return cls(c.string(d, "id"), c.integer(d, "replica", hi=c.MAX_MEMBERS),
                   c.boolean(d, "probe", False), _round(d),
                   c.integer(d, "reruns") if "reruns" in d else 0,
                   _seconds(d, "lease") if "lease" in d else 0.0, _order(d),
                   c.string(d, "revision", REVISION_MAX) if "revision" in d else "")


def _order(d: dict) -> tuple[str, str, int] | None:
    """An ASK's ``order``: [queue, ordering key, seq], or None."""
    v = d.get("order")
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 3:
        raise DecodeError("order must be [queue, ordering key, seq]")
    part = {"queue": v[0], "key": v[1], "seq": v[2]}
    return (c.string(part, "queue"), c.string(part, "key"), c.integer(part, "seq"))


def _round(d: dict) -> int:
    return c.integer(d, "n") if "n" in d else 0


GO, WAIT, CLAIMED, ENDED, UNKNOWN, REHOMED = "go", "wait", "claimed", "ended", "unknown", "rehomed"
SAME = "same"  # to a numbered probe: no news (the prober's copy is settled with ours)
VERDICTS = frozenset({GO, WAIT, CLAIMED, ENDED, UNKNOWN, REHOMED, SAME})
ENDED_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})


@message(Verb.ANSWER)
@dataclass(frozen=True, slots=True)
class Answer:
    """A sibling's answer to ASK: ``go`` (deliver; I hold my copy off for a lease),
    ``wait`` / ``claimed`` (ask again after ``lease`` seconds), ``ended`` (with the
    end ``state``), ``rehomed`` (the task's ``replicas`` are now these), ``unknown``;
    to a numbered probe (a rejoin's), ``same``: no news."""
    id: str
    verdict: str
    lease: float = 0.0
    state: str | None = None
    attempts: int = 0
    last: dict | None = None
    replicas: tuple[str, ...] = ()
    n: int = 0  # the round of the ASK answered
    # with ``ended``: the run that ended (the answerer's Task.reruns) and how long ago
    # (seconds): a prober whose own copy ended in an earlier run takes this end instead;
    # with ``same``: the run the answerer's live copy is in (a prober's ended copy of an
    # earlier run joins it)
    reruns: int = 0
    ago: float = 0.0
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"id": self.id, "verdict": self.verdict}
        if self.n:
            d["n"] = self.n
        if self.reruns:
            d["reruns"] = self.reruns
        if self.ago:
            d["ago"] = self.ago
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
                   state, c.integer(d, "attempts") if "attempts" in d else 0, _last(d), replicas,
                   _round(d), c.integer(d, "reruns") if "reruns" in d else 0,
                   _seconds(d, "ago") if "ago" in d else 0.0)


def news_of_an_end(a: Answer) -> bool:
    """An answer that may be news to an ended copy (a probe's, ``Siblings._stale_end``):
    the task moved, ended in some run, or runs again (``same`` with a later run)."""
    return a.verdict in (ENDED, REHOMED) or (a.verdict == SAME and a.reruns > 0)


# a sibling's news about one task (every message ``Siblings`` reads but HANDOFF, which
# names many); SIBLING_NEWS is the same set, for isinstance
SiblingNews = Claim | Retry | Done | Failed | Cancel | Replicas | Ask | Answer
SIBLING_NEWS = (Claim, Retry, Done, Failed, Cancel, Replicas, Ask, Answer)

# ------------------------------------------------------------ requests (miyamoto.cluster.requests)
@message(Verb.STORE)
@dataclass(frozen=True, slots=True)
class Store:
    """Store this copy (``task`` as Task.encode() gives it) and answer STORED.
    ``ask``: the sender's copy 0 is due at once and asks with this STORE, in that round
    (``Siblings`` folds it): once the copy is admitted, answer it as an ASK, in STORED."""
    req: str
    reply_to: str
    task: dict
    ask: int = 0
    lease: float = 0.0  # the folded ASK's lease (``Ask.lease``)
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d = {"req": self.req, "reply_to": self.reply_to, "task": self.task}
        if self.ask:
            d["ask"] = self.ask
            d["lease"] = self.lease
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Store":
        ask = c.integer(d, "ask") if "ask" in d else 0
        return cls(c.string(d, "req"), _address(d), c.obj(d, "task"), ask,
                   _seconds(d, "lease") if ask and "lease" in d else 0.0)


@message(Verb.STORED)
@dataclass(frozen=True, slots=True)
class Stored:
    req: str
    id: str
    ok: bool
    duplicate: str | None = None  # the name is taken by this task id
    error: str | None = None
    answer: Answer | None = None  # to the ASK its STORE carried (for this task only)
    seq: int = 0  # an ordered task's place in its key's line, given by the key's owner
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        d: dict[str, Any] = {"req": self.req, "id": self.id, "ok": self.ok}
        if self.seq:
            d["seq"] = self.seq
        if self.duplicate is not None:
            d["duplicate"] = self.duplicate
        if self.error is not None:
            d["error"] = self.error
        if self.answer is not None:
            d["answer"] = self.answer.payload()
        return d

    @classmethod
    def from_payload(cls, d: dict) -> "Stored":
        task_id = c.string(d, "id")
        answer = None
        if "answer" in d:
            answer = Answer.from_payload(c.obj(d, "answer"))
            if answer.id != task_id:
                raise DecodeError("the answer is about another task than the STORED")
        seq = c.integer(d, "seq") if "seq" in d else 0
        return cls(c.string(d, "req"), task_id, c.boolean(d, "ok"),
                   c.opt_string(d, "duplicate"), c.opt_string(d, "error"), answer, seq)


OPS = frozenset({"get", "cancel", "rerun", "resend", "paused", "counts", "list", "control",
                 "delete", "failed", "resend_many", "name", "browse", "rates",
                 "replace", "complete", "heartbeat", "lease", "nack", "blocked"})


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
