"""Cluster wire protocol: the verbs, and the decoding of one message.

A cluster message is two ZeroMQ frames: a verb (ASCII, one of ``Verb``) and a
ujson payload that decodes to a JSON object. A peer's bytes are untrusted, so
every failure to decode becomes a ``DecodeError`` that the transport logs and
drops; nothing here ever unpickles or evaluates anything.
"""

from __future__ import annotations

import enum
from typing import Any

import ujson

MAX_FRAME = 7 * 1024 * 1024  # a 1 MiB body of control characters is ~6 MiB as JSON


class DecodeError(ValueError):
    """A frame that is not a valid cluster message."""


class Verb(str, enum.Enum):
    # membership and election (miyamoto.membership.machine)
    JOIN = "JOIN"
    REDIRECT = "REDIRECT"
    ROSTER = "ROSTER"
    HEARTBEAT = "HEARTBEAT"
    HEARTBEAT_ACK = "HEARTBEAT_ACK"
    VOTE_REQUEST = "VOTE_REQUEST"
    VOTE = "VOTE"
    LEAVE = "LEAVE"
    # replication (miyamoto.replicas.placement)
    STORE = "STORE"
    STORED = "STORED"
    CLAIM = "CLAIM"
    DONE = "DONE"
    RETRY = "RETRY"
    FAILED = "FAILED"
    CANCEL = "CANCEL"
    HANDOFF = "HANDOFF"
    REPLICAS = "REPLICAS"
    ASK = "ASK"  # every copy asks its live siblings before it delivers (miyamoto.replicas.siblings)
    ANSWER = "ANSWER"
    # cluster-wide queries and control (miyamoto.cluster.layer)
    REQUEST = "REQUEST"
    REPLY = "REPLY"
    # clock probes between members (miyamoto.cluster.clocks)
    CLOCK = "CLOCK"
    CLOCK_ECHO = "CLOCK_ECHO"
    # cluster-wide definitions: schedules, topics (miyamoto.definitions.machine)
    DEFS_PUT = "DEFS_PUT"
    DEFS_ACK = "DEFS_ACK"
    DEFS_DIGEST = "DEFS_DIGEST"
    DEFS_WRITE = "DEFS_WRITE"
    DEFS_WROTE = "DEFS_WROTE"
    # many messages for one peer in one frame (miyamoto.wire.outbox)
    BATCH = "BATCH"


_VERBS = {v.value.encode(): v for v in Verb}
# a verb's name as it goes on the wire, and a verb by its name: dict lookups (an Enum's
# ``.value`` is a property, and ``Verb(name)`` a call through the Enum machinery: each a
# few Python frames on every message)
VERB_BYTES = {v: k for k, v in _VERBS.items()}
VERB_NAMED: dict[str, Verb] = {v._value_: v for v in Verb}


def encode(verb: Verb, payload: dict[str, Any] | bytes) -> list[bytes]:
    """The two frames; a payload already encoded (bytes of a JSON object) goes as is."""
    if isinstance(payload, bytes):
        return [VERB_BYTES[verb], payload]
    return [VERB_BYTES[verb], dump(payload)]


def dump(payload: dict[str, Any]) -> bytes:
    return ujson.dumps(payload, ensure_ascii=False).encode()


def decode(frames: list[bytes]) -> tuple[Verb, dict[str, Any]]:
    """Turn two frames into (verb, payload) or raise DecodeError."""
    if len(frames) != 2:
        raise DecodeError(f"expected 2 frames, got {len(frames)}")
    raw_verb, raw_payload = frames
    verb = _VERBS.get(bytes(raw_verb))
    if verb is None:
        raise DecodeError(f"unknown verb {bytes(raw_verb)[:32]!r}")
    if len(raw_payload) > MAX_FRAME:
        raise DecodeError(f"payload of {len(raw_payload)} bytes is too large")
    try:
        payload = ujson.loads(bytes(raw_payload))
    except (ValueError, UnicodeDecodeError) as e:
        raise DecodeError(f"payload is not JSON: {e}") from e
    if not isinstance(payload, dict):
        raise DecodeError("payload is not a JSON object")
    return verb, payload
