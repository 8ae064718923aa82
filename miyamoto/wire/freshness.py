"""Freshness: every frame carries its sender's incarnation and a sequence number.

Why: a frame that was once good stays well-formed forever, so without freshness a
captured or queued DONE, CANCEL or FAILED from earlier could be fed again (it once
ended an admin's rerun). So each frame a node sends carries a 16-byte stamp, its
``boot`` (the incarnation: it grows at every start and is kept on disk,
``miyamoto.wire.identity``) and ``seq`` (one counter per process, growing with every
frame it sends). The receiver drops a frame

- from an earlier boot than the highest it has seen from that sender, on any
  connection: a restarted node's old frames, wherever they were queued; and
- whose seq is not above the last one on the same connection: a replay, or a frame
  duplicated on its way (ZeroMQ keeps a connection's order, and a DEALER's reconnect
  keeps its routing id and its counter).

A sender is a (node id, key) pair: the key is the one the connection authenticated
with (``miyamoto.wire.transport``), so a key holder speaking under another's id moves
only its own entry, never the real member's. Sequences are per connection, not per
sender, so a node that reaches a peer at two addresses loses nothing to the two
connections' interleaving; a replay on a connection of its own under the current boot
needs the member's own secret key, which can say anything anyway. Memory is bounded
(MAX_SENDERS of each, oldest first out); a sender evicted is taken afresh.
"""

from __future__ import annotations

import struct
from enum import Enum

from miyamoto.wire.verbs import DecodeError

STAMP = struct.Struct(">QQ")  # boot, seq
STAMP_SIZE = STAMP.size
MAX_SENDERS = 4096


def stamp(boot: int, seq: int) -> bytes:
    return STAMP.pack(boot, seq)


def read_stamp(frame: bytes) -> tuple[int, int]:
    if len(frame) != STAMP_SIZE:
        raise DecodeError(f"a stamp is {STAMP_SIZE} bytes, got {len(frame)}")
    boot, seq = STAMP.unpack(frame)
    return boot, seq


class Verdict(Enum):
    FRESH = "fresh"
    EARLIER_BOOT = "from an earlier incarnation"
    OLD_SEQ = "a sequence number already seen"


class Freshness:
    """The highest boot per sender and the last (boot, seq) per connection; ``check``
    admits a frame and records it."""

    def __init__(self, max_senders: int = MAX_SENDERS) -> None:
        self.max_senders = max_senders
        self._boots: dict[tuple[str, str], int] = {}
        self._conns: dict[bytes, tuple[int, int]] = {}

    def check(self, sender: tuple[str, str], conn: bytes, boot: int, seq: int) -> Verdict:
        highest = self._boots.get(sender)
        if highest is not None and boot < highest:
            return Verdict.EARLIER_BOOT
        last = self._conns.get(conn)
        if last is not None and boot == last[0] and seq <= last[1]:
            return Verdict.OLD_SEQ
        if highest is None or boot > highest:
            put_bounded(self._boots, sender, boot, self.max_senders)
        put_bounded(self._conns, conn, (boot, seq), self.max_senders)
        return Verdict.FRESH

    def boot(self, sender: tuple[str, str]) -> int | None:
        return self._boots.get(sender)

    def last(self, conn: bytes) -> tuple[int, int] | None:
        return self._conns.get(conn)


def put_bounded(d: dict, key: object, value: object, bound: int) -> None:
    """``d[key] = value``, a new key first making room (oldest first out) under ``bound``."""
    if key not in d:
        while len(d) >= bound:
            d.pop(next(iter(d)))
    d[key] = value
