"""Carries out what ``miyamoto.definitions.machine`` decides: the file, the sends, the waiting.

``DefSync`` owns the machine, its file (``definitions.json`` in the data dir, written
atomically: temp file, fsync, rename, fsync of the directory, so a crash leaves the old
set or the new one, never half of each; in memory only when the journal is
``:memory:``) and the greenlets that wait for writes. ``op`` is the one way to change a
definition: on the leader it reads, checks and writes; on a follower it forwards the op
to the leader (DEFS_WRITE) and returns the leader's answer, so a client may send writes
to any node. ``on_change`` is told, from this loop (never inside a receive), that the set
changed: the node carries the queue settings it holds into its engine.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Callable, Protocol

import gevent
import gevent.event
import gevent.lock
import gevent.pool
import ujson

from miyamoto.definitions import messages as m
from miyamoto.definitions.machine import Definitions, Finished, Full, NotLeader, Persist, Received, \
    Tick, View, Write
from miyamoto.wire.messages import Send
from miyamoto.errors import Unavailable
from miyamoto.wire.atomic import atomic_write as _atomic_write

log = logging.getLogger(__name__)

FILE = "definitions.json"
LeaderView = tuple[str | None, int, tuple[str, ...]]  # (leader, term, members)


class SendFn(Protocol):
    """The cluster layer's send: False if the member has no address; ``address`` where
    the answer goes to a reply address rather than the member's own."""

    def __call__(self, member_id: str, msg: object, address: str | None = None) -> bool: ...


class DefSync:
    """Built by the cluster layer, which hands it its ``send``, its membership ``view``
    and the greenlet group it runs in, and routes the definitions' messages to
    ``on_message``."""

    def __init__(self, me: str, data_dir: str, send: SendFn, reply_to: str, *,
                 monotonic: Callable[[], float], resend: float, timeout: float,
                 view: Callable[[], LeaderView] | None = None,
                 group: gevent.pool.Group | None = None,
                 on_change: Callable[[], None] | None = None):
        self.machine = Definitions(me, resend=resend, timeout=timeout)
        self.view = view  # (leader, term, members) of the membership, for run()
        self.path = None if data_dir == ":memory:" else os.path.join(data_dir, FILE)
        self._send = send
        self._reply_to = reply_to
        self.monotonic = monotonic
        self.timeout = timeout
        self.group = group if group is not None else gevent.pool.Group()
        self.period = max(0.01, min(0.1, resend / 4))
        self._lock = gevent.lock.RLock()  # one writer of the file at a time
        self._writes: dict[int, gevent.event.AsyncResult] = {}
        self._asks: dict[str, gevent.event.AsyncResult] = {}
        self._on_change = on_change
        self._changed = False  # the set changed since on_change was last told

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start ticking (after ``load``: a member must never answer with a set it has
        not read back yet, or a new leader would count it as holding nothing)."""
        self.group.spawn(self.run)

    def run(self) -> None:
        assert self.view is not None
        while True:
            try:
                self.tick(*self.view())
            except Exception:
                log.exception("definitions: tick failed")
            self.settle()
            gevent.sleep(self.period)

    def load(self) -> None:
        """Read the set back (after the journal took the data dir's lock)."""
        if self.path is None or not os.path.exists(self.path):
            return
        try:
            with open(self.path, "rb") as f:
                data = ujson.loads(f.read())
            entries = [m.Entry.from_payload(e) for e in data["entries"]]
            term = int(data.get("term", 0))
            owner = data.get("owner")
            if owner is not None and not isinstance(owner, str):
                raise TypeError("owner must be a string")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("definitions: %s is unreadable (%s): starting from the cluster's set",
                      self.path, e)
            return
        self.machine.load(entries, term, owner)
        self._changed = True
        log.info("definitions: loaded %d entries from %s", len(entries), self.path)

    def settle(self) -> None:
        """Tell ``on_change`` that the set changed, if it did since last told."""
        if not self._changed or self._on_change is None:
            return
        self._changed = False
        try:
            self._on_change()
        except Exception:
            log.exception("definitions: applying a change failed")

    # ------------------------------------------------------------ inputs
    def tick(self, leader: str | None, term: int, members: tuple[str, ...]) -> None:
        now = self.monotonic()
        self.carry_out(self.machine.step(View(leader, term, tuple(members)), now).effects)
        self.carry_out(self.machine.step(Tick(), now).effects)

    def on_message(self, sender: str, msg: Any) -> None:
        if isinstance(msg, m.DefsWrite):
            self.group.spawn(self._serve_write, sender, msg)
        elif isinstance(msg, m.DefsWrote):
            ask = self._asks.get(msg.req)
            if ask is not None:
                ask.set((msg.status, msg.body))
        else:
            self.carry_out(self.machine.step(Received(sender, msg), self.monotonic()).effects)

    def carry_out(self, effects: list[Any]) -> None:
        for e in effects:
            match e:
                case Persist():
                    self._persist()
                    self._changed = True
                case Send(to=to, msg=msg):
                    self._send(to, msg)
                case Finished(wid=wid, ok=ok, error=error):
                    waiter = self._writes.pop(wid, None)
                    if waiter is not None:
                        waiter.set((ok, error))
                case _:
                    raise TypeError(f"definitions: no way to carry out {e!r}")

    def _persist(self) -> None:
        if self.path is None:
            return
        with self._lock:
            snapshot = [self.machine.entries[k].to_payload() for k in sorted(self.machine.entries)]
            data = ujson.dumps({"term": self.machine.seen_term, "owner": self.machine.owner,
                                "entries": snapshot}, ensure_ascii=False).encode()
            gevent.get_hub().threadpool.apply(_atomic_write, (self.path, data))

    # ------------------------------------------------------------ writes
    def write(self, changes: list[tuple[str, str, dict | None]]) -> None:
        """Write on the leader; returns once a majority has it on disk, else Unavailable."""
        ready = self.machine.step(Write(tuple(changes)), self.monotonic())
        wid, effects = ready.wid, ready.effects
        waiter: gevent.event.AsyncResult = gevent.event.AsyncResult()
        self._writes[wid] = waiter
        try:
            self.carry_out(effects)
            ok, error = waiter.get(timeout=self.timeout + 1)
        finally:
            self._writes.pop(wid, None)
        if not ok:
            raise Unavailable(f"definition not confirmed: {error}")

    def op(self, op: str, kind: str, name: str, value: dict | None = None
           ) -> tuple[int, dict[str, Any]]:
        """Put, merge, delete, pause or resume one definition, wherever the leader is: (HTTP
        status, body) where the body holds the new ``value`` or an ``error``."""
        try:
            return self._op_here(op, kind, name, value)
        except NotLeader as e:
            if e.leader is None or e.leader == self.machine.me:
                return 503, _err("no leader has the cluster's definitions yet; try again")
            return self._forward(e.leader, op, kind, name, value)

    def _op_here(self, op: str, kind: str, name: str, value: dict | None
                 ) -> tuple[int, dict[str, Any]]:
        if not self.machine.ready:
            raise NotLeader(self.machine.leader if not self.machine.leading else None)
        current = self.machine.get(kind, name)
        if op == "put":
            new = value
        elif op == "merge":  # read, change, write on the leader: two merges both hold
            new = {k: v for k, v in {**(current or {}), **(value or {})}.items()
                   if v is not None}
        elif current is None:
            return 404, _err(f"names no known {kind}", "name")
        elif op == "delete":
            new = None
        else:
            new = dict(current, paused=op == "pause")
        changes = [(kind, name, new)]
        if kind == "schedule" and op in ("put", "delete") \
                and self.machine.get("cursor", name) is not None:
            changes.append(("cursor", name, None))  # a new schedule starts afresh
        try:
            self.write(changes)
        except NotLeader:
            raise
        except Full as e:
            return 409, _err(str(e), "name")
        except (Unavailable, gevent.Timeout) as e:
            return 503, _err(str(e))
        return 200, {"value": new if new is not None else current}

    def _forward(self, leader: str, op: str, kind: str, name: str, value: dict | None
                 ) -> tuple[int, dict[str, Any]]:
        req = uuid.uuid4().hex
        ask: gevent.event.AsyncResult = gevent.event.AsyncResult()
        self._asks[req] = ask
        try:
            if not self._send(leader, m.DefsWrite(req, self._reply_to, op, kind, name, value)):
                return 503, _err("the leader cannot be reached")
            return ask.get(timeout=self.timeout + 2)
        except gevent.Timeout:
            return 503, _err("the leader did not answer in time")
        finally:
            self._asks.pop(req, None)

    def _serve_write(self, sender: str, msg: m.DefsWrite) -> None:
        try:
            status, body = self._op_here(msg.op, msg.kind, msg.name, msg.value)
        except NotLeader:
            status, body = 503, _err("this node is not the ready leader; try again")
        self._send(sender, m.DefsWrote(msg.req, status, body), address=msg.reply_to)


def _err(message: str, field: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "error", "error": message}
    if field is not None:
        out["error"], out["field"] = f"{field} {message}", field
    return out
