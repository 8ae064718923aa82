"""Clock probes between members (``miyamoto.cluster.clocks``): CLOCK and its echo."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from miyamoto.wire import checks as c
from miyamoto.wire.messages import message
from miyamoto.wire.verbs import DecodeError, Verb

__all__ = ["Clock", "ClockEcho"]

MAX_TIME = 1e11  # a wall clock in seconds since 1970, with room to spare


def _time(d: dict, key: str) -> float:
    v = c.number(d, key)
    if not 0 < v < MAX_TIME:
        raise DecodeError(f"{key} must be a unix time")
    return v


@message(Verb.CLOCK)
@dataclass(frozen=True, slots=True)
class Clock:
    """What time is it on your clock? ``t1`` is the asker's wall time."""
    t1: float
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"t1": self.t1}

    @classmethod
    def from_payload(cls, d: dict) -> "Clock":
        return cls(_time(d, "t1"))


@message(Verb.CLOCK_ECHO)
@dataclass(frozen=True, slots=True)
class ClockEcho:
    """The answer: the asker's ``t1`` back, and the answerer's wall time ``t``."""
    t1: float
    t: float
    verb: ClassVar[Verb]

    def payload(self) -> dict:
        return {"t1": self.t1, "t": self.t}

    @classmethod
    def from_payload(cls, d: dict) -> "ClockEcho":
        return cls(_time(d, "t1"), _time(d, "t"))
