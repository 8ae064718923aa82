"""Freshness: every frame carries its sender's incarnation and a sequence number.

Why: a frame that was once good stays well-formed forever, so without freshness a
captured or queued DONE, CANCEL or FAILED from earlier could be fed again (it once
ended an admin's rerun). So each frame a node sends carries a 16-byte stamp, its
``boot`` (the incarnation: it grows at every start and is kept on disk,
``miyamoto.wire.identity``) and ``seq`` (one counter per process, over all its
connections); the receiver keeps the highest (boot, seq) per sender and drops a frame
from an earlier boot, or with a seq not above the last one of its boot.

That is exact for one connection per pair of nodes (ZeroMQ keeps a connection's order,
and the DEALER of a reconnect is the same socket): what a node sends to a peer reaches
it with growing seqs. A node that reaches one peer at two addresses (a seed written
another way than the peer's advertised address) may have a few frames of the slower
connection dropped: the protocols resend what matters.

A sender is a (node id, key) pair: the key is the one the connection authenticated
with (``miyamoto.wire.transport``), so a key holder speaking under another's id moves
only its own entry, never the real member's. Memory is bounded (MAX_SENDERS, oldest
first out); a sender evicted is taken afresh at its next frame.
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
    """The highest (boot, seq) seen per sender; ``check`` admits a frame and records it."""

    def __init__(self, max_senders: int = MAX_SENDERS) -> None:
        self.max_senders = max_senders
        self._last: dict[tuple[str, str], tuple[int, int]] = {}

    def check(self, sender: tuple[str, str], boot: int, seq: int) -> Verdict:
        last = self._last.get(sender)
        if last is not None:
            if boot < last[0]:
                return Verdict.EARLIER_BOOT
            if boot == last[0] and seq <= last[1]:
                return Verdict.OLD_SEQ
        else:
            while len(self._last) >= self.max_senders:
                self._last.pop(next(iter(self._last)))
        self._last[sender] = (boot, seq)
        return Verdict.FRESH

    def last(self, sender: tuple[str, str]) -> tuple[int, int] | None:
        return self._last.get(sender)

    def __len__(self) -> int:
        return len(self._last)
