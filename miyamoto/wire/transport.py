"""Cluster transport: one ROUTER in, one DEALER per peer out, on plain ``zmq`` sockets.

Why this shape (DESIGN.md §2): the ROUTER tells us who sent each message,
because every node's DEALERs carry its node id (plus a per-connection random tag, so
two connections never share a routing id: a dropped connection is redialled with a new
DEALER, ``_redial``) as their ZeroMQ identity; and
sending through a DEALER per peer address with ``ZMQ_IMMEDIATE`` set means a
message to a peer that is not connected fails at once (``send`` returns False)
instead of queueing forever. The protocol state machines decide what to retry.

A peer's bytes are untrusted. Everything that arrives goes through
``parse_frames`` (identity, verb, JSON object, stamp, or ``DecodeError``), its payload
decoded only once its key and freshness are checked; malformed
messages are counted, logged at warning level (rate-limited) and dropped.
``MAXMSGSIZE`` keeps a garbage peer from making libzmq allocate gigabytes. Every frame
carries its sender's incarnation and a sequence number, and one that is not fresh (a
replay) is dropped: ``miyamoto.wire.freshness``.

Keys (DESIGN §2, "Trust"). With a ``CurveKeys`` cluster key pair all traffic is
CurveZMQ-encrypted, and every node also has its own key pair (``node_key``, kept in its
data dir: ``miyamoto.wire.identity``). The cluster pair is the join secret: every ROUTER
serves under it, so a client must know the cluster's public key to finish a handshake,
and every DEALER authenticates with its node's own pair. The ZAP handler binds each
connection to the key that authenticated it (its ZAP user id, read off every message as
``User-Id``), and a node's routing id carries a join proof, an HMAC of its public key
under the cluster's secret (``join_proof``): a message whose connection's key has no
proof in its routing id is dropped and counted as a refused key. What reaches
``on_message`` is then (sender id, verb, payload, key); which member owns which key is
the roster's business (``miyamoto.cluster.layer`` drops a message under a member's id
from any other key). ZAP cannot check the proof itself (a ZAP request holds the key, not
the routing id), so it admits any CURVE client key; the proof is checked once per
connection and key.

Plain sockets, not ``zmq.green``, whose wrappers cost ~10 % of a node's CPU (see
miyamoto.wire.zmqio): DEALERs only send with NOBLOCK; the ROUTER and the ZAP socket are
drained until EAGAIN by their greenlets, which wait on the socket's ``zmq.FD``.

Each Transport owns its own ``zmq.Context``. The ZAP endpoint
(``inproc://zeromq.zap.01``) is per context, so this gives every Transport its
own ZAP handler, lets tests run several nodes in one process, and lets
``stop()`` terminate the context. The cost is one libzmq I/O thread per
Transport; a node has one.

``on_message`` runs in the receive greenlet, one message at a time, in
arrival order: it must not block for long (spawn work elsewhere instead).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import gevent
import zmq
from gevent.pool import Group
from zmq.utils import z85

from miyamoto.wire import verbs as protocol
from miyamoto.wire.freshness import Freshness, Verdict, put_bounded, read_stamp, stamp
from miyamoto.wire.handshakes import EVENTS, HandshakeWatch
from miyamoto.wire.verbs import DecodeError, Verb
from miyamoto.wire.zmqio import NOBLOCK, Readable, send_frames

log = logging.getLogger(__name__)

# Per-frame inbound limit enforced by libzmq (it disconnects the sender). The
# protocol caps payloads at protocol.MAX_FRAME (7 MiB); this leaves headroom.
MAX_MESSAGE_SIZE = 8 * 1024 * 1024
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000
# A connection that has not finished the ZMTP/CURVE handshake by then is closed.
HANDSHAKE_IVL_MS = 5000
# ZMTP heartbeats: a peer whose host vanished without a FIN is disconnected
# after HEARTBEAT_TIMEOUT_MS, so sends to it fail fast instead of queueing.
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000
# A DEALER whose connection dropped is replaced by a fresh one (see ``_redial``), at most
# once per REDIAL_EVERY seconds per address: a peer that drops every handshake (another
# cluster key) is not redialled in a loop.
REDIAL_EVERY = 1.0
# Yield to the hub after this many back-to-back messages, so a flood on the
# ROUTER cannot starve the other greenlets of the process.
YIELD_EVERY = 64
# Under load (a drain that took frames follows the last such drain within RX_BUSY), the
# loop waits RX_LINGER before the next drain, and again while each drain took frames:
# the frames of a busy peer then arrive many to a drain (one wake, one turn of the
# handlers: the STOREs among them share a waited commit) instead of one wake each.
RX_BUSY = 0.002
RX_LINGER = 0.002
# Warnings about malformed input: at most WARN_BURST per WARN_WINDOW seconds.
WARN_BURST = 10
WARN_WINDOW = 10.0

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "miyamoto"
ZAP_VERSION = b"1.0"
MAX_IDENTITY = 255  # ZeroMQ routing ids are 1..255 bytes
PROOF_SIZE = 16  # an HMAC-SHA256 of a node's public key, cut to 128 bits
# the routing id is the node id, NUL, 8 random bytes, the join proof
MAX_NODE_ID = MAX_IDENTITY - 9 - PROOF_SIZE
MAX_PROVEN = 4096  # connections whose proof was checked, remembered (oldest first out)

FRAMES = 4  # identity, verb, payload, stamp

OnMessage = Callable[[str, Verb, dict[str, Any], str], None]
_VERBS = frozenset(v.value for v in Verb)  # a stale frame's verb, counted before decoding


@dataclass(frozen=True)
class CurveKeys:
    """The cluster's CurveZMQ key pair, Z85 text (40 chars each).

    Every node of a cluster has the same pair. The secret never appears in a
    repr, and validation errors never quote either key.
    """

    public: str
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("public", "secret"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) != 40:
                raise ValueError(f"curve {name} key must be 40 Z85 characters")
            try:
                z85.decode(value.encode("ascii"))
            except (ValueError, UnicodeEncodeError, KeyError):
                raise ValueError(f"curve {name} key is not valid Z85") from None
        if zmq.curve_public(self.secret.encode("ascii")) != self.public.encode("ascii"):
            raise ValueError("curve public key does not belong to the secret key")


def keygen() -> CurveKeys:
    """A new key pair: the cluster's (give the same pair to every node), or a node's own."""
    public, secret = zmq.curve_keypair()
    return CurveKeys(public.decode("ascii"), secret.decode("ascii"))


def join_proof(cluster: CurveKeys, node_public: bytes) -> bytes:
    """The proof that the holder of ``node_public`` (32 raw bytes) holds the cluster's
    secret: it goes at the end of the node's routing ids."""
    mac = hmac.new(z85.decode(cluster.secret.encode("ascii")),
                   b"miyamoto join proof\x00" + node_public, hashlib.sha256)
    return mac.digest()[:PROOF_SIZE]


@dataclass
class TransportStats:
    """Counters for /metrics and for tests that wait on what happened."""

    received: int = 0  # delivered to on_message
    dropped: int = 0  # malformed, never delivered
    handler_errors: int = 0  # on_message raised
    stale: int = 0  # replays: an earlier incarnation's, or a sequence number seen before
    sent: int = 0
    send_failed: int = 0  # peer not connected, HWM reached, bad address
    zap_denied: int = 0  # CURVE clients refused by the ZAP handler
    # refused keys: ZAP denials and CURVE handshakes that failed (another key pair)
    auth_refused: int = 0
    # (verb, "sent" | "received" | "dropped") -> messages; verb "invalid" if undecodable
    messages: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, verb: str, direction: str) -> None:
        key = (verb, direction)
        self.messages[key] = self.messages.get(key, 0) + 1

    def count_all(self, verbs: Iterable[Verb], direction: str) -> None:
        """``count`` of each verb (a BATCH's messages), in one call."""
        messages = self.messages
        for verb in verbs:
            key = (verb._value_, direction)
            messages[key] = messages.get(key, 0) + 1


def parse_head(frames: list[bytes]) -> tuple[str, tuple[int, int]]:
    """[identity, verb, payload, stamp] from the ROUTER -> (sender id, (boot, seq)), the
    parts checked before the payload is decoded (who sent it, and whether it is fresh).

    Raises DecodeError for anything else. Identities that start with a zero
    byte are the ones libzmq makes up for peers that set none: not a node.
    """
    if len(frames) != FRAMES:
        raise DecodeError(f"expected {FRAMES} frames with the identity, got {len(frames)}")
    identity = bytes(frames[0])
    if not identity or identity[0] == 0:
        raise DecodeError("anonymous peer (no identity set)")
    try:
        sender = identity.split(b"\x00", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"identity is not utf-8: {identity[:32]!r}") from None
    return sender, read_stamp(frames[3])


def parse_frames(frames: list[bytes]) -> tuple[str, Verb, dict[str, Any], tuple[int, int]]:
    """[identity, verb, payload, stamp] from the ROUTER -> (sender id, verb, payload,
    (boot, seq)) (the stamp: ``miyamoto.wire.freshness``). Raises DecodeError for
    anything else."""
    sender, boot_seq = parse_head(frames)
    verb, payload = protocol.decode([frames[1], frames[2]])
    return sender, verb, payload, boot_seq


def zap_reply(request: list[bytes]) -> tuple[list[bytes], bool]:
    """Answer one ZAP request (RFC 27): admit a CURVE client, its key as its user id.

    Request: version, request id, domain, address, identity, mechanism,
    credentials... For CURVE the one credential is the client's 32-byte public
    key. Reply: version, request id, status code, status text, user id,
    metadata. Returns (reply, admitted). The user id, the key in Z85, is what every
    message of the connection carries as its ``User-Id``.
    """
    request_id = request[1] if len(request) > 1 else b""
    if len(request) < 6 or request[0] != ZAP_VERSION:
        return [ZAP_VERSION, request_id, b"500", b"Malformed ZAP request", b"", b""], False
    mechanism, credentials = request[5], request[6:]
    if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
        user = z85.encode(bytes(credentials[0]))
        return [ZAP_VERSION, request_id, b"200", b"OK", user, b""], True
    return [ZAP_VERSION, request_id, b"400", b"Not a CURVE key", b"", b""], False


class _Throttle:
    """Log at most `burst` warnings per `window` seconds, then say how many were hidden."""

    def __init__(self, burst: int = WARN_BURST, window: float = WARN_WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window, self.clock = burst, window, clock
        self.started = -window
        self.count = 0
        self.suppressed = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = self.clock()
        if now - self.started >= self.window:
            if self.suppressed:
                log.warning("%d more such warnings suppressed in the last %.0f s",
                            self.suppressed, now - self.started)
            self.started, self.count, self.suppressed = now, 0, 0
        if self.count < self.burst:
            self.count += 1
            log.warning(msg, *args)
        else:
            self.suppressed += 1


class Transport:
    """One node's cluster endpoint: a ROUTER bound at `bind`, DEALERs to peers.

    Lifecycle: ``start()`` binds and spawns the greenlets, ``stop()`` closes
    every socket and kills them (idempotent). All greenlets belong to a Group
    owned by the Transport.
    """

    def __init__(self, node_id: str, bind: str, on_message: OnMessage,
                 curve: CurveKeys | None = None, hwm: int = 10_000, *,
                 boot: int | None = None, node_key: CurveKeys | None = None) -> None:
        identity = node_id.encode("utf-8") if isinstance(node_id, str) else b""
        if not identity or len(identity) > MAX_NODE_ID or b"\x00" in identity:
            raise ValueError(f"node_id must be 1-{MAX_NODE_ID} utf-8 bytes without NUL")
        if hwm < 1:
            raise ValueError("hwm must be at least 1")
        self.node_id = node_id
        self.bind = bind
        self.on_message = on_message
        self.curve = curve
        # this node's own pair (a node passes the one kept in its data dir; without one,
        # a fresh pair for this process); its public key is who the peers hear
        self.node_key = (node_key or keygen()) if curve is not None else None
        self._proof = b""
        if curve is not None:
            assert self.node_key is not None
            self._proof = join_proof(curve, z85.decode(self.node_key.public.encode("ascii")))
        self._proven: dict[tuple[bytes, str], bool] = {}  # (routing id, key) -> proof ok
        self.hwm = hwm
        self.stats = TransportStats()
        # this start's incarnation (a node passes the one kept in its data dir:
        # miyamoto.wire.identity) and the sequence of the frames it sent
        self.boot = int(time.time() * 1000) if boot is None else boot
        self._seq = 0
        self._fresh = Freshness()
        self._identity = identity
        self._ctx: zmq.Context | None = None
        self._router: zmq.Socket | None = None
        self._zap: zmq.Socket | None = None
        self._zap_greenlet: gevent.Greenlet | None = None
        self._monitor: zmq.Socket | None = None
        self._dealers: dict[str, zmq.Socket] = {}
        self._redials: dict[str, gevent.Greenlet] = {}  # address -> its DEALER's watcher
        self._redialed: dict[str, float] = {}  # address -> when its DEALER was replaced
        # each DEALER's monitor endpoint is numbered: pyzmq's default name is the socket's
        # FD, which a new DEALER can reuse while the old monitor's endpoint is still bound
        self._monitors = itertools.count()
        self._group = Group()
        self._started = False
        self._stopped = False
        self._address: str | None = None
        self._warn = _Throttle()

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Bind the ROUTER and spawn the receive (and ZAP) greenlets."""
        if self._started:
            raise RuntimeError("Transport.start() called twice")
        self._started = True
        self._ctx = zmq.Context()
        try:
            if self.curve is not None:
                # The ZAP handler must be listening before the first handshake.
                self._zap = self._ctx.socket(zmq.REP)
                self._zap.setsockopt(zmq.LINGER, 0)
                self._zap.bind(ZAP_ENDPOINT)
                self._zap_greenlet = self._group.spawn(
                    self._serve_zap)
            router = self._router = self._ctx.socket(zmq.ROUTER)
            self._common_options(router)
            # No ROUTER_HANDOVER: with it, any client presenting a member's id took that
            # member's connection over (and libzmq 4.3.5 aborted when the member came
            # back). Routing ids never collide anyway (see _connect).
            if self.curve is not None:
                router.setsockopt(zmq.CURVE_SERVER, 1)
                router.setsockopt(zmq.CURVE_SECRETKEY, self.curve.secret.encode("ascii"))
                router.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
                # Fail closed: no ZAP handler reachable means no admission.
                router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            router.bind(self.bind)
            self._address = router.getsockopt_string(zmq.LAST_ENDPOINT)
            if self.curve is not None:
                self._monitor = router.get_monitor_socket(EVENTS)
                self._monitor.setsockopt(zmq.LINGER, 0)
                watch = HandshakeWatch(self._monitor, self._handshake_refused,
                                       lambda: self._stopped)
                self._group.spawn(watch.serve)
        except BaseException:
            self.stop()
            raise
        self._group.spawn(self._receive_loop)
        log.info("node %s listening on %s%s", self.node_id, self._address,
                 " (CurveZMQ)" if self.curve else "")

    def stop(self) -> None:
        """Close every socket (linger 0) and kill the greenlets. Idempotent.

        Safe to call from inside on_message: the receive loop then ends when
        the handler returns.
        """
        if self._stopped:
            return
        self._stopped = True
        current = gevent.getcurrent()
        others = [g for g in self._group if g is not current]
        # monitoring ends before any monitor socket closes (see _unmonitor)
        for sock in [*self._dealers.values(), self._router]:
            _unmonitor(sock)
        gevent.killall(others, block=True, timeout=2)
        for sock in list(self._dealers.values()):
            sock.close(linger=0)
        self._dealers.clear()
        self._redials.clear()  # (killed above: each closed its monitor)
        for sock in (self._monitor, self._router, self._zap):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)  # closes anything left, then terminates
        log.info("node %s transport stopped", self.node_id)

    def __enter__(self) -> "Transport":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """The bound endpoint, with the real port when `bind` asked for port 0.

        For a wildcard bind (tcp://*:P) this is tcp://0.0.0.0:P: advertise a
        reachable address to peers yourself.
        """
        if self._address is None:
            raise RuntimeError("Transport is not started")
        return self._address

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    # -- sending -------------------------------------------------------------

    def send(self, to: str | None, address: str, verb: Verb, payload: dict[str, Any]) -> bool:
        """Queue one message for the peer at `address`; never blocks.

        Returns False when the peer is not connected (yet), its queue is at
        the HWM, the address is invalid, or the transport is stopped. The first
        send to a new address usually returns False because the connection is
        still being made (see ``connect``). `to` is only used in logs.
        Raises only for a payload ujson cannot encode (a caller bug).
        """
        frames = protocol.encode(verb, payload)
        if not self._started or self._stopped:  # a cluster of one never starts it
            return False
        self._seq += 1
        frames.append(stamp(self.boot, self._seq))
        sock = self._dealers.get(address) or self._connect(address)
        if sock is None:
            self.stats.send_failed += 1
            self.stats.count(verb.value, "dropped")
            return False
        try:
            send_frames(sock, frames)
        except zmq.Again:
            self.stats.send_failed += 1
            self.stats.count(verb.value, "dropped")
            log.debug("%s to %s at %s not sent: not connected or queue full",
                      verb.value, to or "?", address)
            return False
        except zmq.ZMQError as e:
            self.stats.send_failed += 1
            self.stats.count(verb.value, "dropped")
            log.debug("%s to %s at %s not sent: %s", verb.value, to or "?", address, e)
            return False
        self.stats.sent += 1
        self.stats.count(verb._value_, "sent")
        return True

    def connect(self, address: str) -> bool:
        """Create the DEALER for `address` now, so that later sends find it
        connected. Optional: ``send`` connects lazily. False for a bad address."""
        if not self.running:
            return False
        return address in self._dealers or self._connect(address) is not None

    def forget(self, address: str) -> None:
        """Close the DEALER for `address` (dropping anything queued for it)."""
        sock = self._dealers.pop(address, None)
        watcher = self._redials.pop(address, None)
        if watcher is not None and watcher is not gevent.getcurrent():
            watcher.kill(block=False)  # it closes its monitor on the way out
        if sock is not None:
            _unmonitor(sock)
            sock.close(linger=0)

    def _connect(self, address: str) -> zmq.Socket | None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        monitor: zmq.Socket | None = None
        try:
            self._common_options(sock)
            # node id, NUL, a fresh random tag: every connection has its own routing id,
            # so a restarted peer (or a client claiming a member's id) never collides
            # with a live connection; the receiver reads the id before the NUL
            # (and the join proof for our key: see the module's docstring)
            sock.setsockopt(zmq.ROUTING_ID,
                            self._identity + b"\x00" + os.urandom(8) + self._proof)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if self.curve is not None and self.node_key is not None:
                sock.setsockopt(zmq.CURVE_PUBLICKEY, self.node_key.public.encode("ascii"))
                sock.setsockopt(zmq.CURVE_SECRETKEY, self.node_key.secret.encode("ascii"))
                sock.setsockopt(zmq.CURVE_SERVERKEY, self.curve.public.encode("ascii"))
            monitor = sock.get_monitor_socket(
                zmq.EVENT_DISCONNECTED, addr=f"inproc://miyamoto.dealer.{next(self._monitors)}")
            sock.connect(address)
        except zmq.ZMQError as e:
            if monitor is not None:
                monitor.close(linger=0)
            sock.close(linger=0)
            self._warn.warning("cannot connect to %r: %s", address[:200], e)
            return None
        self._dealers[address] = sock
        self._redials[address] = self._group.spawn(self._redial, address, sock, monitor)
        return sock

    def _redial(self, address: str, sock: zmq.Socket, monitor: zmq.Socket) -> None:
        """Replace ``sock``, the DEALER for ``address``, by a fresh one once its connection
        drops. libzmq would reconnect it under the same routing id, and a peer that was
        paused past HEARTBEAT_TIMEOUT_MS still holds the old connection under that id when
        it resumes: its ROUTER then takes the new connection as a duplicate and silently
        discards everything that comes over it, for good (libzmq 4.3.5, no handover). The
        fresh DEALER has a fresh routing id, so it can never collide."""
        readable = Readable(monitor)
        try:
            while True:
                try:
                    monitor.recv_multipart(NOBLOCK)  # DISCONNECTED (or the monitor's end)
                    break
                except zmq.Again:
                    readable.wait()
                except zmq.ZMQError:
                    return  # the DEALER or the context was closed
        finally:
            readable.close()
            _unmonitor(sock)
            monitor.close(linger=0)
        wait = self._redialed.get(address, float("-inf")) + REDIAL_EVERY - time.monotonic()
        if wait > 0:
            gevent.sleep(wait)
        if self._stopped or self._dealers.get(address) is not sock:
            return  # forgotten, stopped, or replaced already
        self._redialed[address] = time.monotonic()
        log.debug("connection to %s dropped: redialling with a fresh routing id", address)
        self.forget(address)
        self._connect(address)

    def _common_options(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.RCVHWM, self.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_SIZE)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)

    # -- receiving -----------------------------------------------------------

    def _receive_loop(self) -> None:
        """Drain the ROUTER, yield to the hub every YIELD_EVERY messages, wait on its FD;
        under load, let frames pile up between drains (RX_LINGER)."""
        sock = self._router
        assert sock is not None
        readable = Readable(sock)
        last = -RX_BUSY  # when the last drain that took frames ended
        try:
            while not self._stopped:
                taken = self._drain(sock)
                if 0 < taken < YIELD_EVERY:
                    busy = time.monotonic() - last < RX_BUSY
                    while busy and not self._stopped:  # under load: frames pile up
                        gevent.sleep(RX_LINGER)
                        taken = self._drain(sock)
                        busy = 0 < taken < YIELD_EVERY
                    last = time.monotonic()
                if taken >= YIELD_EVERY:
                    gevent.sleep(0)  # fairness: a flood must not starve the process
                elif not self._stopped:
                    readable.wait()
        except zmq.ZMQError:
            return  # closed under us (see _drain)
        finally:
            readable.close()

    def _drain(self, sock: zmq.Socket) -> int:
        """Handle queued messages until EAGAIN or YIELD_EVERY of them: how many it took
        (YIELD_EVERY, too, after a receive error: the loop yields before it tries again).

        Frames past the fourth are read and thrown away, never kept. A multipart
        message is delivered whole, so its later frames never raise Again.
        """
        recv = sock.recv
        for taken in range(YIELD_EVERY):
            if self._stopped:
                return taken
            try:
                first = part = recv(NOBLOCK, False)
                frames = [first.bytes]
                count = 1
                while part.more:
                    part = recv(NOBLOCK, False)
                    count += 1
                    if count <= FRAMES:
                        frames.append(part.bytes)
            except zmq.Again:
                return taken
            except zmq.ZMQError as e:
                if self._stopped or e.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    raise  # the socket or its context is gone: the loop ends
                log.error("receive failed on %s: %s", self._address, e)
                gevent.sleep(0.1)
                return YIELD_EVERY
            self._handle(frames, count, first)
        return YIELD_EVERY

    def _handle(self, frames: list[bytes], count: int, first: zmq.Frame) -> None:
        """One message: its sender, key and freshness are checked before its payload is
        decoded, so bytes from a connection without the cluster's proof, or a replay, are
        never parsed as JSON."""
        try:
            if count != len(frames):
                raise DecodeError(f"expected {FRAMES} frames with the identity, got {count}")
            sender, (boot, seq) = parse_head(frames)
        except Exception as e:  # DecodeError, or anything else a peer's bytes provoke
            self._malformed(frames, first, e)
            return
        key = self._key_of(frames[0], first) if self.curve is not None else ""
        if key is None:
            return
        # a sender is its id and its key: a key holder under a member's id moves only its
        # own entry (without keys, insecure, anyone may speak as anyone anyway)
        verdict = self._fresh.check((sender, key), frames[0], boot, seq)
        if verdict is not Verdict.FRESH:
            name = bytes(frames[1][:32]).decode("utf-8", "replace")
            self.stats.stale += 1
            self.stats.count(name if name in _VERBS else "invalid", "stale")
            self._warn.warning("dropped %s from %r: %s (incarnation %d, sequence %d)",
                               name, sender[:64], verdict.value, boot, seq)
            return
        try:
            verb, payload = protocol.decode([frames[1], frames[2]])
        except Exception as e:  # DecodeError, or anything else a peer's bytes provoke
            self._malformed(frames, first, e)
            return
        self.stats.received += 1
        self.stats.count(verb._value_, "received")
        try:
            self.on_message(sender, verb, payload, key)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("on_message failed for %s from %s", verb.value, sender)

    def _malformed(self, frames: list[bytes], first: zmq.Frame, e: Exception) -> None:
        self.stats.dropped += 1
        self.stats.count("invalid", "dropped")
        self._warn.warning("dropped malformed message from %s (identity %r): %s",
                           _peer_address(first), frames[0][:64], e)

    def _key_of(self, identity: bytes, first: zmq.Frame) -> str | None:
        """The key this message's connection authenticated with, if its routing id
        carries the join proof for it; else None (counted once per connection)."""
        try:
            key = first.get("User-Id")
        except (zmq.ZMQError, UnicodeDecodeError):
            key = ""
        ok = self._proven.get((identity, key))
        if ok is None:
            assert self.curve is not None
            try:
                raw = z85.decode(key.encode("ascii")) if len(key) == 40 else b""
            except (ValueError, KeyError):
                raw = b""
            ok = len(raw) == 32 and hmac.compare_digest(identity[-PROOF_SIZE:],
                                                        join_proof(self.curve, raw))
            put_bounded(self._proven, (identity, key), ok, MAX_PROVEN)
            if not ok:
                self.stats.auth_refused += 1
                self._warn.warning(
                    "refused CURVE client %r from %s: not the cluster key (its routing id "
                    "carries no join proof for its key)", identity.split(b"\x00", 1)[0][:64],
                    _peer_address(first))
        if not ok:
            self.stats.count("unproven", "dropped")
            return None
        return key

    # -- ZAP -----------------------------------------------------------------

    def _serve_zap(self) -> None:
        """Answer ZAP requests (one at a time: REP) until stopped; same drain-and-wait as
        the ROUTER. The reply cannot hit a HWM: libzmq's ZAP pipe has none."""
        sock = self._zap
        assert sock is not None
        readable = Readable(sock)
        try:
            while not self._stopped:
                try:
                    request = sock.recv_multipart(NOBLOCK)
                except zmq.Again:
                    readable.wait()
                    continue
                except zmq.ZMQError:
                    if self._stopped:
                        return
                    raise
                sock.send_multipart(self._zap_answer(request), NOBLOCK)
        finally:
            readable.close()

    def _zap_answer(self, request: list[bytes]) -> list[bytes]:
        try:
            reply, admitted = zap_reply(request)
        except Exception:  # never leave the REP socket waiting for a reply
            log.exception("ZAP request handling failed")
            reply, admitted = [ZAP_VERSION, request[1] if len(request) > 1 else b"",
                               b"500", b"Internal error", b"", b""], False
        if not admitted:
            self.stats.zap_denied += 1
            self.stats.auth_refused += 1
            address = request[3].decode("utf-8", "replace") if len(request) > 3 else "?"
            mechanism = request[5][:16] if len(request) > 5 else b"?"
            self._warn.warning("refused %s client from %s: not a CURVE key",
                               mechanism.decode("ascii", "replace"), address[:64])
        return reply


    def _handshake_refused(self, kind: str, address: str) -> None:
        if kind == "key":
            self.stats.auth_refused += 1
            self._warn.warning("refused CURVE client from %s: not the cluster key (it holds "
                               "another key pair, or uses no CURVE)", address[:64])
        else:
            self._warn.warning("dropped a connection from %s to %s: not a ZeroMQ peer (an "
                               "HTTP client at the cluster port?)", address[:64], self._address)


def _unmonitor(sock: zmq.Socket | None) -> None:
    """End `sock`'s socket monitor, if it is open and has one. Do this before its monitor
    socket closes: libzmq sends a monitor event without NOBLOCK, from its I/O thread, so
    an event for a monitor socket that is gone blocks that thread, and with it every
    socket of the context, for good (a DEALER that kept reconnecting to a peer that
    refused its key, after its watcher had closed the monitor, left the node deaf)."""
    if sock is None or sock.closed:
        return
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass  # it had none, or the context is ending


def _peer_address(frame: zmq.Frame) -> str:
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, TypeError, ValueError, UnicodeDecodeError):
        return "?"
