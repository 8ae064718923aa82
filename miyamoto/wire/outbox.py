"""Coalesce cluster messages per peer: everything queued for one peer during one turn
of the event loop leaves as one BATCH message.

Under load a node sends several messages per task (STORE, STORED, CLAIM, DONE), and
each ZeroMQ send and receive costs microseconds of CPU plus a wake
of the hub. Batching them per loop turn cuts that to one send per peer per turn,
without delaying anything: the flush runs as soon as the current greenlet yields, as a
callback of the hub's loop (not a greenlet of its own: a spawn per loop turn was a
tenth of a busy node's greenlet spawns). It never blocks: sends do not, nor do the
``on_fail`` callbacks, which only hand a stand-in answer to a waiting request.
A message that cannot be sent (peer not connected) calls its ``on_fail``, so callers
waiting for an answer can give up at once instead of at their timeout.

Under load (the last flush was less than BUSY ago) a flush waits LINGER instead, so
that the STOREs and STOREDs of the next turns of the loop join the same frames: a
cluster node's enqueues come one HTTP request per turn, and each turn's lone STORE
otherwise costs its own send, wake and drain on the sibling. A message whose lateness
could change what a sibling decides (URGENT: the end of an attempt, a claim, a clock
probe) never waits: it takes everything queued with it at the end of its turn.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import gevent

from miyamoto.wire.verbs import VERB_BYTES, VERB_NAMED, Verb, dump

log = logging.getLogger(__name__)

MAX_BATCH = 256  # messages in one BATCH frame
MAX_BATCH_BYTES = 1024 * 1024  # a larger message (a big STORE) travels alone
BUSY = 0.002  # a flush this soon after the last one means load ...
LINGER = 0.001  # ... and waits this long (gevent's timers: about a millisecond at least)
# an attempt's end and its claims decide when a sibling's copy may fire; a clock probe's
# delay would read as an offset
URGENT = frozenset({Verb.DONE, Verb.RETRY, Verb.FAILED, Verb.CLAIM, Verb.CANCEL,
                    Verb.CLOCK, Verb.CLOCK_ECHO})

Send = Callable[[str | None, str, Verb, dict], bool]
Count = Callable[[list[Verb], str], None]  # the verbs inside a BATCH, "sent"


class Outbox:
    def __init__(self, send: Send, count: Count | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        """``count(verbs, "sent")`` is told of the messages sent inside a BATCH, in one
        call per BATCH (the transport counts frames: a BATCH once, by its own verb;
        ``Stats.count_all``); ``monotonic`` times
        the flushes (on virtual time, the simulation's clock)."""
        self._send = send
        self._count = count
        self._monotonic = monotonic
        self._loop = gevent.get_hub().loop
        self._queued: dict[str, tuple[str | None, list[tuple[Verb, dict, Callable | None]]]] = {}
        self._scheduled = False  # a flush at the end of this turn
        self._timer = self._loop.timer(LINGER)  # or, under load, after LINGER
        self._last = -BUSY  # when the last flush ran

    def put(self, to: str | None, address: str, verb: Verb, payload: dict,
            on_fail: Callable[[], Any] | None = None) -> None:
        entry = self._queued.get(address)
        if entry is None:
            entry = self._queued[address] = (to, [])
        entry[1].append((verb, payload, on_fail))
        if self._scheduled:
            return
        if verb in URGENT or self._monotonic() - self._last >= BUSY:
            self._timer.stop()
            self._scheduled = True
            self._loop.run_callback(self.flush)  # runs once the current greenlet yields
        elif not self._timer.active:
            self._timer.start(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        self._timer.stop()
        self._last = self._monotonic()
        queued, self._queued = self._queued, {}
        for address, (to, items) in queued.items():
            if len(items) == 1:
                verb, payload, on_fail = items[0]
                if not self._send(to, address, verb, payload):
                    _failed([on_fail])
                continue
            for verb, data, fails, inner in _chunks(items):
                if not self._send(to, address, verb, data):
                    _failed(fails)
                elif self._count is not None:
                    self._count(inner, "sent")


def _chunks(items: list[tuple[Verb, dict, Callable | None]]):
    """Encode each message once and pack them into BATCH frames of bounded size:
    (verb, data, on_fails, the verbs inside a BATCH)."""
    parts: list[bytes] = []
    fails: list[Callable | None] = []
    verbs: list[Verb] = []
    size = 0
    for verb, payload, on_fail in items:
        data = dump(payload)
        if len(data) > MAX_BATCH_BYTES:
            yield verb, data, [on_fail], ()
            continue
        if parts and (size + len(data) > MAX_BATCH_BYTES or len(parts) >= MAX_BATCH):
            yield Verb.BATCH, b'{"m":[' + b",".join(parts) + b"]}", fails, verbs
            parts, fails, verbs, size = [], [], [], 0
        parts.append(b'["' + VERB_BYTES[verb] + b'",' + data + b"]")
        fails.append(on_fail)
        verbs.append(verb)
        size += len(data) + 16
    if parts:
        yield Verb.BATCH, b'{"m":[' + b",".join(parts) + b"]}", fails, verbs


def _failed(fails: list[Callable | None]) -> None:
    for on_fail in fails:
        if on_fail is not None:
            try:
                on_fail()
            except Exception:
                log.exception("outbox: on_fail callback failed")


def unbatch(payload: dict) -> list[tuple[Verb, dict]]:
    """The messages inside a BATCH payload; malformed entries are skipped."""
    items = payload.get("m")
    if not isinstance(items, list):
        return []
    out = []
    for item in items[:MAX_BATCH]:
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], dict)):
            verb = VERB_NAMED.get(item[0])
            if verb is not None and verb is not Verb.BATCH:
                out.append((verb, item[1]))
    return out
