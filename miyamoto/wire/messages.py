"""Typed cluster messages: one frozen dataclass per verb, its fields checked in one place.

A message travels as a verb and a ujson payload (``miyamoto.wire.verbs``). ``decode(verb,
payload)`` turns a peer's payload into the verb's dataclass or raises ``DecodeError``
naming the field (every check goes through ``miyamoto.wire.checks``, one set of limits);
``msg.payload()`` is the dict that goes on the wire. Nothing outside this module builds
or reads a payload dict by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from miyamoto.wire.verbs import DecodeError, Verb

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


@dataclass(frozen=True, slots=True)
class Send:
    """An effect every protocol machine returns: send ``msg`` (a registered message) to
    member ``to``; ``address`` is given where ``to`` is not (yet) in the roster (a joiner,
    a seed known only by its endpoint)."""
    to: str | None
    msg: Any
    address: str | None = None
