"""The task record and its states.

A ``Task`` is a frozen dataclass: every state change makes a new record with
``dataclasses.replace`` (``Task.evolve``), so a record handed to the journal or to a
peer can never change under it. ``encode``/``decode`` turn it into a plain dict for
ujson (the journal row and the STORE message); ``decode`` turns any malformed input
into ``DecodeError``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from miyamoto.tasks import fields as dispatchfields
from miyamoto.tasks import labels, options
from miyamoto.tasks.checks import is_audience, is_traceparent
from miyamoto.wire import checks
from miyamoto.wire.verbs import DecodeError

QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,100}")
LAST_BODY_BYTES = 4096
HISTORY_MAX = 20  # attempts kept with a task (newest last)
REVISION_MAX = 80  # characters of a replace's revision stamp (tasks/repeat.py)
HISTORY_ERROR_CHARS = 200  # an attempt's error text is cut to this


def new_id() -> str:
    """A random (version 4) UUID string, without uuid.UUID's slow constructor."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


class State(str, enum.Enum):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # not started by its expires_at (ends like a failure: the
    #                      failure_callback is told, the siblings' copies end too)

    ended: bool  # set on each member below: a plain attribute (a property was a
    #              visible share of a node's CPU: it runs on every state check)


for _state in State:
    _state.ended = _state.value in ("succeeded", "failed", "cancelled", "expired")


ENDED = tuple(s.value for s in State if s.ended)  # what POST /queues/<q>/resend may pick
METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
# the API face a task came through, when not the native one: its deliveries carry that
# service's headers (delivery/attempt.py)
CLOUDTASKS = "cloudtasks"
FACES = (CLOUDTASKS,)


@dataclass(frozen=True, slots=True)
class Task:
    # what the client asked for
    id: str
    queue: str
    url: str
    method: str = "POST"
    params: dict[str, Any] = field(default_factory=dict)
    body: str | None = None  # raw body (or encoded JSON) instead of params
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    eta: float = 0.0
    max_attempts: int | None = None
    timeout: float | None = None
    callback: str | None = None
    failure_callback: str | None = None
    priority: int = 5  # 0..9: who goes first among a queue's waiting due tasks (dispatch)
    flow_key: str | None = None  # tasks sharing a key share flow_rate and flow_parallelism
    flow_rate: float | None = None
    flow_parallelism: int | None = None
    created: float = 0.0
    traceparent: str | None = None  # W3C Trace Context: the producer's (or enqueue's) span
    oidc_audience: str | None = None  # an OIDC token for this audience on each attempt
    expires_at: float | None = None  # no attempt starts after this (unix time): it expires
    retry_delays: tuple[float, ...] = ()  # seconds before retry n (the last repeats), not backoff
    labels: dict[str, str] = field(default_factory=dict)  # a few k=v to find it by (labels.py)
    lease: float | None = None  # a long task: a 202 holds it running this long (options.py)
    ordering_key: str | None = None  # tasks of one key in a queue go one at a time, in order
    ordering_seq: int = 0  # its place in its key's line, given by the key's owner (0: none yet)
    # where it is in its life (this node's copy)
    state: State = State.SCHEDULED
    fire_at: float = 0.0  # when this copy fires next: eta + replica * offset, or a retry time
    attempts: int = 0  # deliveries attempted
    executions: int = 0  # attempts that got an HTTP response
    first_attempt: float | None = None
    last: dict[str, Any] | None = None  # last response: status, headers, body, error, at
    history: tuple[dict[str, Any], ...] = ()  # the last HISTORY_MAX attempts, oldest first
    finished: float | None = None
    replicas: tuple[str, ...] = ()
    replica: int = 0  # this copy's index in replicas
    reruns: int = 0  # times it was run again after it ended (retry of a failed task)
    accepted: int = 0  # the attempt whose 202 holds this copy running till fire_at (0: none)
    face: str | None = None  # one of FACES, or None: made through the native API
    revision: str = ""  # the last replace applied to this copy (tasks/repeat.py): newer wins

    def evolve(self, **changes: Any) -> "Task":
        """A copy with ``changes``: dataclasses.replace without re-running __init__.
        The body is generated once below (``_compile_copiers``): one straight line per
        field, no loop of getattr calls; it was a measurable share of a node's CPU."""
        raise NotImplementedError  # replaced at import

    def encode(self) -> dict[str, Any]:
        """Fields that differ from their defaults (the journal row and STORE payload);
        generated below like ``evolve``."""
        raise NotImplementedError  # replaced at import

    def summary(self) -> dict[str, Any]:
        """The public view served by GET /tasks/<id>."""
        return {
            "id": self.id, "queue": self.queue, "state": self.state.value, "name": self.name,
            "url": self.url, "method": self.method, "eta": self.eta, "created": self.created,
            "next_attempt": self.fire_at if self.state == State.SCHEDULED else None,
            "attempts": self.attempts, "executions": self.executions,
            "max_attempts": self.max_attempts, "timeout": self.timeout,
            "last_response": self.last, "finished": self.finished,
            "history": list(reversed(self.history)),  # newest first
            "replicas": list(self.replicas), "replica": self.replica,
            "callback": self.callback, "failure_callback": self.failure_callback,
            "priority": self.priority, "flow_key": self.flow_key, "flow_rate": self.flow_rate,
            "flow_parallelism": self.flow_parallelism, "expires_at": self.expires_at,
            "retry_delays": list(self.retry_delays) or None, "labels": self.labels,
            "lease": self.lease, "ordering_key": self.ordering_key,
            "ordering_seq": self.ordering_seq or None,
            "lease_until": self.fire_at if self.accepted and self.state == State.RUNNING
            else None,
        }

    @classmethod
    def decode(cls, d: Any) -> "Task":
        """Rebuild a task from ``encode()``'s dict; DecodeError on anything malformed."""
        if not isinstance(d, dict):
            raise DecodeError("task is not an object")
        try:
            kwargs = _typed(d)
            if kwargs["method"] not in METHODS:
                raise DecodeError("task has a bad method")
            for k in ("params", "headers"):
                v = kwargs.get(k, {})
                if not isinstance(v, dict) or not _all_str(v):
                    raise DecodeError(f"task {k} is not an object")
            if not _all_str(kwargs.get("headers", {}).values()):
                raise DecodeError("task header values are not strings")
            kwargs["state"] = _state(kwargs.get("state", "scheduled"))
            replicas = kwargs.get("replicas", [])
            if not isinstance(replicas, list) or not _all_str(replicas):
                raise DecodeError("task replicas are not a list of ids")
            kwargs["replicas"] = tuple(replicas)
            for k in ("eta", "created", "fire_at"):
                kwargs[k] = float(kwargs.get(k, 0.0))
                if not math.isfinite(kwargs[k]):
                    raise DecodeError(f"task field {k!r} is not finite")
            for k in ("attempts", "executions", "replica"):
                kwargs[k] = int(kwargs.get(k, 0))
            if kwargs["replicas"] and not 0 <= kwargs["replica"] < len(kwargs["replicas"]):
                raise DecodeError("task replica index is out of range")
            if not _RARE_FIELDS.isdisjoint(kwargs):
                _check_rare(kwargs)
            if not _DISPATCH_FIELDS.isdisjoint(kwargs):
                dispatchfields.check_decoded(kwargs)
            if not _OPTION_FIELDS.isdisjoint(kwargs):
                options.check_decoded(kwargs)
            if "labels" in kwargs:
                labels.check_decoded(kwargs)
            return cls(**kwargs)
        except DecodeError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise DecodeError(f"malformed task: {e}") from e


def add_attempt(history: tuple[dict[str, Any], ...],
                attempt: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """``history`` with ``attempt`` appended (once: a sibling's news may repeat it), the
    oldest dropped beyond HISTORY_MAX, so a task's record stays bounded however often
    it is retried or rerun."""
    key = (attempt.get("start"), attempt.get("node"))
    if any((a.get("start"), a.get("node")) == key for a in history[-HISTORY_MAX:]):
        return history
    return (*history[-(HISTORY_MAX - 1):], attempt)


def _all_str(xs: Any) -> bool:
    """Every item of ``xs`` is a str: in C (map over isinstance), with no generator frame
    per item; a task from a peer is checked this way on every STORE."""
    return all(map(isinstance, xs, _STR))


def _state(value: Any) -> State:
    """The State named ``value``: a dict lookup (``State(value)`` goes through the Enum
    machinery, a few Python frames)."""
    state = _STATES.get(value)
    if state is None:
        raise DecodeError(f"malformed task: {value!r} is not a valid State")
    return state


def _typed(d: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``d`` whose fields are all Task's and of their types (None allowed for
    an optional one; a bool is no number): only the fields present are walked, so a
    peer's plain copy (about ten fields of forty) costs ten lookups, not eighty."""
    unknown = d.keys() - _FIELD_NAMES
    if unknown:
        raise DecodeError(f"task has unknown fields {sorted(unknown)[:5]}")
    if not _REQUIRED_NAMES <= d.keys():
        missing = next(k for k in _REQUIRED_TYPES if k not in d)
        raise DecodeError(f"task field {missing!r} is missing or of the wrong type")
    for k, v in d.items():
        types = _TYPES.get(k)
        if types is None or (v is None and k in _OPTIONAL_TYPES):
            continue  # checked by decode itself (params, state, replicas ...) or absent
        if not isinstance(v, types) or v.__class__ is bool:
            what = "is missing or of the wrong type" if k in _REQUIRED_TYPES \
                else "is of the wrong type"
            raise DecodeError(f"task field {k!r} {what}")
    return dict(d)


def _check_rare(kwargs: dict[str, Any]) -> None:
    """The limits of the fields a plain copy leaves out (``_RARE_FIELDS``), in place."""
    if "history" in kwargs:
        kwargs["history"] = checks.attempt_list(kwargs["history"], HISTORY_MAX)
    if kwargs.get("max_attempts") is not None and kwargs["max_attempts"] < 1:
        raise DecodeError("task max_attempts is below 1")
    if kwargs.get("timeout") is not None and not 0 < kwargs["timeout"] <= 86400:
        raise DecodeError("task timeout is out of range")
    if kwargs.get("face") is not None and kwargs["face"] not in FACES:
        raise DecodeError("task face is not known")
    if kwargs.get("traceparent") is not None and not is_traceparent(kwargs["traceparent"]):
        raise DecodeError("task traceparent is not a W3C traceparent")
    if kwargs.get("oidc_audience") is not None and not is_audience(kwargs["oidc_audience"]):
        raise DecodeError("task oidc_audience is not an audience")
    if len(kwargs.get("revision", "")) > REVISION_MAX:
        raise DecodeError("task revision is too long")


_STR = itertools.repeat(str)  # endless: map stops at the end of xs
_STATES: dict[Any, State] = {s._value_: s for s in State}
_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(Task))
_MISSING = object()
_DEFAULTS: dict[str, Any] = {
    f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
    for f in dataclasses.fields(Task)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}
_ALWAYS = frozenset({"id", "queue", "url", "method", "eta", "fire_at"})
_FIELD_NAMES = frozenset(_FIELD_ORDER)
_set = object.__setattr__


def _compile_copiers() -> None:
    """Generate ``Task.evolve`` and ``Task.encode``: straight-line code over the fields,
    in field order (the encoded dict keeps that order), from the dataclass's own fields,
    so a field added to Task is copied and encoded without anyone touching this."""
    ev = ["def evolve(self, **changes):",
          "    for name in changes:",
          "        if name not in _FIELD_NAMES:",
          "            raise TypeError(f'Task has no field {name!r}')",
          "    new = _new(Task)"]
    # each slot's own descriptor sets it (object.__setattr__ looks the name up first:
    # several times slower, and the frozen class allows no plain assignment)
    ev += [f"    _s_{n}(new, self.{n})" for n in _FIELD_ORDER]
    ev += ["    for name, value in changes.items():",
           "        _S[name](new, value)",
           "    return new"]
    en = ["def encode(self):", "    d = {}"]
    for n in _FIELD_ORDER:
        if n in _ALWAYS:
            en.append(f"    d[{n!r}] = self.{n}")
        elif _DEFAULTS.get(n) == ():  # a tuple field: stored as a list, left out when empty
            en += [f"    v = self.{n}", "    if v:", f"        d[{n!r}] = list(v)"]
        else:
            en += [f"    v = self.{n}", f"    if v != _D[{n!r}]:", f"        d[{n!r}] = v"]
    en += ["    d['state'] = self.state._value_", "    return d"]
    setters = {n: Task.__dict__[n].__set__ for n in _FIELD_ORDER}
    scope = {"_FIELD_NAMES": _FIELD_NAMES, "_new": object.__new__, "Task": Task,
             "_S": setters, "_D": _DEFAULTS, **{f"_s_{n}": f for n, f in setters.items()}}
    exec("\n".join(ev) + "\n\n" + "\n".join(en), scope)  # our own field names only
    Task.evolve = scope["evolve"]  # type: ignore[method-assign]
    Task.encode = scope["encode"]  # type: ignore[method-assign]
    Task.evolve.__doc__, Task.encode.__doc__ = _EVOLVE_DOC, _ENCODE_DOC


_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "body": (str,), "content_type": (str,), "name": (str,), "max_attempts": (int,),
    "timeout": (int, float), "callback": (str,), "failure_callback": (str,),
    "first_attempt": (int, float), "last": (dict,), "finished": (int, float),
    "attempts": (int,), "executions": (int,), "replica": (int,), "created": (int, float),
    "priority": (int,), "flow_key": (str,), "flow_rate": (int, float), "flow_parallelism": (int,),
    "reruns": (int,), "face": (str,), "traceparent": (str,),
    "oidc_audience": (str,), "expires_at": (int, float), "retry_delays": (list,),
    "revision": (str,), "labels": (dict,), "lease": (int, float), "accepted": (int,),
    "ordering_key": (str,), "ordering_seq": (int,),
}
_REQUIRED_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "queue": (str,), "url": (str,), "method": (str,),
    "eta": (int, float), "fire_at": (int, float),
}
_TYPES = {**_OPTIONAL_TYPES, **_REQUIRED_TYPES}
_REQUIRED_NAMES = frozenset(_REQUIRED_TYPES)
# the fields whose limits the other modules check: their checks run only when one is there
_DISPATCH_FIELDS = frozenset({"priority", "flow_key", "flow_rate", "flow_parallelism",
                              "ordering_key", "ordering_seq"})
_OPTION_FIELDS = frozenset({"expires_at", "retry_delays", "lease", "accepted"})
_RARE_FIELDS = frozenset({"history", "max_attempts", "timeout", "face", "traceparent",
                          "oidc_audience", "revision"})
_EVOLVE_DOC, _ENCODE_DOC = Task.evolve.__doc__, Task.encode.__doc__
_compile_copiers()
