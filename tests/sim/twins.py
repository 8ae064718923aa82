"""In-memory twins of a node's three I/O edges, for the cluster simulator on virtual time.

- ``InlineDb`` runs the journal's SQLite calls in the calling greenlet (the virtual loop
  allows no second OS thread); it yields once first, as the real hand-off does, so other
  greenlets run where they would. ``crash()`` refuses every later call: what the journal
  had not committed by then is lost, as in ``kill -9``.
- ``SimTransport`` is what ``Cluster`` uses of ``miyamoto.wire.transport.Transport``; its
  frames go through the shared ``Network`` (miyamoto.wire.verbs encodes and
  ``parse_frames`` decodes them, so no object is shared between nodes).
- ``FakeWorker`` is the delivery client: latencies, 5xx, connection errors and hangs past
  the timeout drawn from the run's seed; it tells the simulator of every delivery start.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Protocol, TypeVar

import gevent
import gevent.event
import gevent.pool

from miyamoto.delivery.types import DeliveryError, Response
from miyamoto.store.dbthread import DbThreadClosed
from miyamoto.wire import verbs as protocol
from miyamoto.wire.transport import TransportStats, parse_frames
from miyamoto.wire.freshness import stamp
from miyamoto.wire.verbs import Verb

SIM_STAMP = stamp(1, 1)

log = logging.getLogger(__name__)
T = TypeVar("T")


class InlineDb:
    """A DbRunner that runs each call at once, in the caller's greenlet."""

    def __init__(self) -> None:
        self.crashed = False
        self.closed = False

    def apply(self, fn: Callable[..., T], *args: Any) -> T:
        if self.crashed or self.closed:
            raise DbThreadClosed("the database thread is closed (crashed)")
        gevent.sleep(0)
        if self.crashed or self.closed:
            raise DbThreadClosed("the database thread is closed (crashed)")
        return fn(*args)

    def apply_here(self, fn: Callable[..., T], *args: Any) -> T:
        """As on a node whose database thread is idle: at once, without a yield."""
        if self.crashed or self.closed:
            raise DbThreadClosed("the database thread is closed (crashed)")
        return fn(*args)

    def close(self) -> None:
        self.closed = True

    def crash(self) -> None:
        self.crashed = True


class InlinePool:
    """The hub's threadpool for the simulation (the definitions file is written
    through it): each call runs at once, in the caller's greenlet."""

    def apply(self, fn: Callable[..., T], args: tuple = (), kwds: dict | None = None) -> T:
        return fn(*args, **(kwds or {}))

    def kill(self) -> None:
        """No threads to stop."""

    join = close = kill


class Wire(Protocol):
    """What a transport twin needs of the network model."""

    def attach(self, node_id: str, transport: SimTransport) -> None: ...
    def detach(self, node_id: str) -> None: ...
    def send(self, src: str, address: str, frames: list[bytes]) -> bool: ...
    def knows(self, address: str) -> bool: ...


class SimTransport:
    """One node's cluster endpoint on the simulated network; on_message runs in one
    receive greenlet, in arrival order, as with the real transport."""

    def __init__(self, wire: Wire, node_id: str, bind: str,
                 on_message: Callable[[str, Verb, dict[str, Any], str], None]) -> None:
        self.wire = wire
        self.node_id = node_id
        self.bind = bind
        self.on_message = on_message
        self.stats = TransportStats()
        self._inbox: deque[tuple[str, list[bytes]]] = deque()
        self._ready = gevent.event.Event()
        self._group = gevent.pool.Group()
        self._started = self._stopped = False

    def start(self) -> None:
        self._started = True
        self.wire.attach(self.node_id, self)
        self._group.spawn(self._receive_loop)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.wire.detach(self.node_id)
        current = gevent.getcurrent()
        gevent.killall([g for g in self._group if g is not current])
        self._inbox.clear()

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    @property
    def address(self) -> str:
        return self.bind

    def send(self, to: str | None, address: str, verb: Verb, payload: dict[str, Any]) -> bool:
        frames = protocol.encode(verb, payload)
        if not self.running or not self.wire.knows(address):
            self.stats.send_failed += 1
            return False
        self.stats.sent += 1
        return self.wire.send(self.node_id, address, frames)

    def connect(self, address: str) -> bool:
        return self.running and self.wire.knows(address)

    def forget(self, address: str) -> None:
        """Nothing queued per peer here: the network holds what is in flight."""

    def deliver(self, src: str, frames: list[bytes]) -> None:
        """From the network (a hub callback): queue it for the receive greenlet."""
        if self.running:
            self._inbox.append((src, frames))
            self._ready.set()

    def _receive_loop(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            while self._inbox:
                src, frames = self._inbox.popleft()
                # the stamp is not checked here: the simulated network reorders and
                # duplicates on purpose (real ZeroMQ keeps a connection's order), and
                # the layer above must stand duplicates anyway (wire/freshness.py)
                sender, verb, payload, _ = parse_frames([src.encode() + b"\x00sim", *frames,
                                                         SIM_STAMP])
                self.stats.received += 1
                try:
                    self.on_message(sender, verb, payload, "")  # no keys: insecure
                except Exception:
                    self.stats.handler_errors += 1
                    log.exception("on_message failed for %s from %s", verb.value, sender)


class Deliveries(Protocol):
    """What the fake worker tells the simulator, and asks of it."""

    def delivery_started(self, node: str, task_id: str, ok: bool,
                         name: str | None = None) -> None: ...
    def delivery_answered(self, node: str, task_id: str) -> None: ...
    def delivery_ended(self, node: str, task_id: str) -> None: ...
    def wait_running(self, node: str) -> None: ...


class FakeWorker:
    """A webhook target of one node: answers after a drawn latency, or fails."""

    guard = None  # the engine builds its target guard from the config

    def __init__(self, sim: Deliveries, node: str, draw: Callable[[], tuple[str, float]]):
        self.sim = sim
        self.node = node
        self.draw = draw

    def request(self, method: str, url: str, *, body: bytes, headers: dict[str, str],
                timeout: float, egress: object = None) -> Response:
        self.sim.wait_running(self.node)  # a paused node sends nothing
        kind, latency = self.draw()
        task_id = headers["X-Task-Id"]
        if kind == "refused":  # the request never reached the worker
            gevent.sleep(latency)
            self.sim.wait_running(self.node)
            raise DeliveryError("connection refused")
        self.sim.delivery_started(self.node, task_id, kind == "ok", headers.get("X-Task-Name"))
        try:
            if kind == "hang" or latency >= timeout:
                gevent.sleep(timeout)
                self.sim.delivery_answered(self.node, task_id)
                self.sim.wait_running(self.node)
                raise DeliveryError("timed out")
            gevent.sleep(latency)
            self.sim.delivery_answered(self.node, task_id)  # the worker is done with it
            self.sim.wait_running(self.node)
            return Response(200 if kind == "ok" else 503, {}, b"")
        finally:
            self.sim.delivery_ended(self.node, task_id)

    def close(self) -> None:
        """No connections to close."""
