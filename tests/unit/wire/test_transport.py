"""miyamoto.wire.transport on real sockets (loopback, OS-assigned ports).

Waits are conditions with deadlines (``wait_until``), never bare sleeps. A
test that proves something did NOT arrive first waits for a later event that
the same connection (or the server's counters) shows was processed after it.
Raw peers use plain synchronous pyzmq sockets in their own context and are
only ever used with non-blocking calls, so they never block the gevent hub.
"""

from __future__ import annotations

import logging
import random
import time

import gevent
import pytest
import zmq
from gevent import socket as gsocket
from gevent.event import Event
from hypothesis import given, settings
from hypothesis import strategies as st
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from miyamoto.wire import verbs as protocol
from miyamoto.wire.verbs import DecodeError, Verb
from miyamoto.wire.transport import (
    MAX_MESSAGE_SIZE,
    YIELD_EVERY,
    CurveKeys,
    Transport,
    _Throttle,
    join_proof,
    keygen,
    parse_frames,
    zap_reply,
)
from miyamoto.wire import zmqio
from miyamoto.wire.freshness import stamp
from miyamoto.wire.zmqio import Readable

LOOPBACK = "tcp://127.0.0.1:0"


def wait_until(condition, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        gevent.sleep(0.005)


class Inbox:
    """An on_message callback that records what it is given."""

    def __init__(self, fail_on=None):
        self.messages: list[tuple[str, Verb, dict]] = []
        self.keys: dict[str, set[str]] = {}  # sender -> the keys its messages came with
        self.fail_on = fail_on

    def __call__(self, sender, verb, payload, key):
        self.messages.append((sender, verb, payload))
        self.keys.setdefault(sender, set()).add(key)
        if self.fail_on is not None and self.fail_on(payload):
            raise RuntimeError("handler failure for the test")

    def payloads(self):
        return [p for _, _, p in self.messages]

    def wait_for(self, predicate, timeout=5.0):
        wait_until(lambda: any(predicate(m) for m in self.messages), timeout,
                   "a matching message")


def send_until_ok(t: Transport, to, address, verb, payload, timeout=5.0) -> None:
    """The first sends to a new peer fail while it connects: retry until queued."""
    wait_until(lambda: t.send(to, address, verb, payload), timeout, f"send to {address}")


@pytest.fixture
def make():
    """Factory for started Transports, all stopped at teardown."""
    made: list[Transport] = []

    def _make(node_id: str, inbox=None, bind=LOOPBACK, **kw) -> tuple[Transport, Inbox]:
        inbox = inbox if inbox is not None else Inbox()
        t = Transport(node_id, bind, inbox, **kw)
        made.append(t)
        t.start()
        return t, inbox

    yield _make
    for t in made:
        t.stop()


class Stamping:
    """A raw DEALER that stamps what it sends as a node does (``stamp=None``: not at
    all; a (boot, seq): that one, a replay)."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock, self.boot, self.seq = sock, int(time.time() * 1000), 0

    def send_multipart(self, frames, flags=0, stamp_=True):
        if stamp_ is True:
            self.seq += 1
            frames = [*frames, stamp(self.boot, self.seq)]
        elif stamp_ is not None:
            frames = [*frames, stamp(*stamp_)]
        return self.sock.send_multipart(frames, flags)

    def __getattr__(self, name):
        return getattr(self.sock, name)


@pytest.fixture
def raw():
    """Plain pyzmq sockets (and their monitors) for misbehaving peers."""
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []

    def _dealer(identity: bytes | None = None, curve: tuple[bytes, bytes, bytes] | None = None):
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        if identity is not None:
            s.routing_id = identity
        if curve is not None:
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = curve
        socks.append(s)
        return Stamping(s)

    yield _dealer
    for s in socks:
        s.close(linger=0)
    ctx.destroy(linger=0)


def monitor_events(sock: zmq.Socket):
    """Start monitoring `sock`; returns a function that drains events seen so far."""
    mon = sock.get_monitor_socket()
    seen: list[int] = []

    def drain() -> list[int]:
        while True:
            try:
                seen.append(recv_monitor_message(mon, zmq.NOBLOCK)["event"])
            except zmq.Again:
                return seen

    return drain


# -- pure parts --------------------------------------------------------------

STAMP = stamp(7, 1)


def test_parse_frames_accepts_a_message():
    frames = [b"node-\xc3\xa9", *protocol.encode(Verb.STORE, {"a": [1, {"b": "c"}]}),
              stamp(2**40, 9)]
    assert parse_frames(frames) == ("node-é", Verb.STORE, {"a": [1, {"b": "c"}]}, (2**40, 9))


@pytest.mark.parametrize("frames", [
    [b"id"],
    [b"id", b"HEARTBEAT"],
    [b"id", b"HEARTBEAT", b"{}"],  # no stamp
    [b"id", b"HEARTBEAT", b"{}", STAMP, b"extra"],
    [b"id", b"HEARTBEAT", b"{}", STAMP[:15]],
    [b"id", b"HEARTBEAT", b"{}", STAMP + b"x"],
    [b"id", b"NOPE", b"{}", STAMP],
    [b"id", b"HEARTBEAT", b"not json", STAMP],
    [b"id", b"HEARTBEAT", b"[1, 2]", STAMP],
    [b"id", b"HEARTBEAT", b"\xff\xfe", STAMP],
    [b"\xff\xfe", b"HEARTBEAT", b"{}", STAMP],
    [b"\x00\x01\x02\x03\x04", b"HEARTBEAT", b"{}", STAMP],
    [b"", b"HEARTBEAT", b"{}", STAMP],
    [b"id", b"HEARTBEAT", b"[" * 100_000, STAMP],
    [b"id", b"HEARTBEAT", b" " * (protocol.MAX_FRAME + 1), STAMP],
])
@pytest.mark.timeout(10)
def test_parse_frames_rejects_garbage(frames):
    with pytest.raises(DecodeError):
        parse_frames(frames)


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_parse_frames_raises_only_decode_error(frames):
    try:
        parse_frames(frames)
    except DecodeError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Verb)), st.dictionaries(st.text(), json_values, max_size=5))
def test_parse_frames_round_trips(verb, payload):
    assert parse_frames([b"n1", *protocol.encode(verb, payload), STAMP]) == \
        ("n1", verb, payload, (7, 1))


@pytest.mark.timeout(10)
def test_zap_reply_admits_a_curve_key_as_its_user_id():
    key = z85.decode(keygen().public.encode())

    def request(mechanism, *credentials):
        return [b"1.0", b"req-7", b"miyamoto", b"127.0.0.1", b"", mechanism, *credentials]

    reply, ok = zap_reply(request(b"CURVE", key))
    assert ok and reply[:3] == [b"1.0", b"req-7", b"200"] and len(reply) == 6
    assert reply[4] == z85.encode(key)  # the key, which every message then carries
    for bad in (request(b"CURVE", key[:31]),
                request(b"CURVE"),
                request(b"CURVE", key, key),
                request(b"PLAIN", b"user", b"pass"),
                request(b"NULL"),
                [b"1.0", b"req-7"],
                [b"0.9", b"req-7", b"d", b"a", b"", b"CURVE", key]):
        reply, ok = zap_reply(bad)
        assert not ok and reply[2] in (b"400", b"500") and reply[1] == b"req-7"


@pytest.mark.timeout(10)
def test_the_join_proof_binds_a_key_to_the_cluster_secret():
    cluster, other = keygen(), keygen()
    key = z85.decode(keygen().public.encode())
    proof = join_proof(cluster, key)
    assert len(proof) == 16 and proof == join_proof(cluster, key)
    assert proof != join_proof(other, key)  # another cluster's secret
    assert proof != join_proof(cluster, z85.decode(keygen().public.encode()))  # another key


def test_curve_keys_validate_and_hide_the_secret():
    keys = keygen()
    assert len(keys.public) == 40 and len(keys.secret) == 40
    assert keys.secret not in repr(keys)
    with pytest.raises(ValueError) as e:
        CurveKeys(keys.public, keygen().secret)  # a pair that does not match
    assert keys.public not in str(e.value)
    with pytest.raises(ValueError):
        CurveKeys("short", keys.secret)
    with pytest.raises(ValueError):
        CurveKeys(keys.public, "~" * 40)  # '~' is not a Z85 character


@pytest.mark.timeout(10)
def test_throttle_limits_warnings(caplog):
    now = [0.0]
    throttle = _Throttle(burst=3, window=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="miyamoto.wire.transport"):
        for _ in range(100):
            throttle.warning("garbage")
        assert [r.getMessage() for r in caplog.records] == ["garbage"] * 3
        now[0] = 11.0
        throttle.warning("garbage")
    assert "97 more" in caplog.records[3].getMessage()
    assert caplog.records[4].getMessage() == "garbage"


@pytest.mark.timeout(10)
def test_node_id_is_validated():
    for bad in ("", "\x00abc", "x" * 256, "x" * 231, "é" * 116):
        with pytest.raises(ValueError):
            Transport(bad, LOOPBACK, Inbox())
    # a routing id is 1-255 bytes: the id, a NUL, 8 random bytes and the 16-byte join
    # proof leave 230 for the id
    Transport("x" * 230, LOOPBACK, Inbox())
    Transport("é" * 115, LOOPBACK, Inbox())


# -- 1. two transports, both ways ---------------------------------------------

@pytest.mark.timeout(20)
def test_two_transports_exchange_messages_both_ways(make):
    a, inbox_a = make("node-a")
    b, inbox_b = make("nœud-b")
    assert not a.address.endswith(":0") and a.address != b.address

    payload = {"text": "ünïcødé ✓ 東京", "nested": {"list": [1, 2.5, None, True, {"k": "v"}]},
               "empty": {}, "big": 2**62}
    send_until_ok(a, "nœud-b", b.address, Verb.STORE, payload)
    inbox_b.wait_for(lambda m: True)
    assert inbox_b.messages == [("node-a", Verb.STORE, payload)]

    send_until_ok(b, "node-a", a.address, Verb.STORED, {"id": "t1", "ok": True})
    inbox_a.wait_for(lambda m: True)
    assert inbox_a.messages == [("nœud-b", Verb.STORED, {"id": "t1", "ok": True})]

    # once connected, a burst arrives complete and in order
    for i in range(500):
        assert a.send("nœud-b", b.address, Verb.HEARTBEAT, {"i": i})
    wait_until(lambda: len(inbox_b.messages) == 501, what="the burst")
    assert [p["i"] for p in inbox_b.payloads()[1:]] == list(range(500))
    assert b.stats.received == 501 and b.stats.dropped == 0


@pytest.mark.timeout(20)
def test_send_to_self_and_to_unknown_seed(make):
    a, inbox_a = make("a")
    send_until_ok(a, None, a.address, Verb.JOIN, {"from": "seed"})
    inbox_a.wait_for(lambda m: m == ("a", Verb.JOIN, {"from": "seed"}))


# -- 2. dead peer, then reconnect ---------------------------------------------

@pytest.mark.timeout(20)
def test_send_to_nobody_fails_fast_then_reconnects(make):
    a, _ = make("a")
    b, _ = make("b")
    address = b.address
    b.stop()  # frees the port: nothing listens at `address` now

    started = time.monotonic()
    results = [a.send("b", address, Verb.HEARTBEAT, {"i": i}) for i in range(200)]
    assert time.monotonic() - started < 1.0
    assert not any(results)
    assert a.stats.send_failed == 200 and a.stats.sent == 0
    assert a.send(None, "not-an-endpoint", Verb.HEARTBEAT, {}) is False
    assert a.send(None, "tcp://", Verb.HEARTBEAT, {}) is False

    b2, inbox_b2 = make("b", bind=address)
    assert b2.address == address
    send_until_ok(a, "b", address, Verb.HEARTBEAT, {"back": True})
    inbox_b2.wait_for(lambda m: m == ("a", Verb.HEARTBEAT, {"back": True}))
    # nothing sent while b was down was queued for it
    assert [p for p in inbox_b2.payloads() if "i" in p] == []


@pytest.mark.timeout(20)
def test_a_dropped_connection_is_redialled_under_a_fresh_routing_id(make):
    # libzmq reconnects a DEALER under its old routing id; a peer that was paused past
    # the heartbeat timeout still holds the old connection under that id when it resumes,
    # and its ROUTER then discards everything the new connection brings, for good. So a
    # dropped connection is replaced by a new DEALER, whose routing id is new too.
    a, _ = make("a")
    b, _ = make("b")
    address = b.address
    send_until_ok(a, "b", address, Verb.HEARTBEAT, {"n": 1})
    first = a._dealers[address]
    first_id = first.getsockopt(zmq.ROUTING_ID)
    b.stop()  # the connection drops
    b2, inbox_b2 = make("b", bind=address)
    wait_until(lambda: a._dealers.get(address) not in (None, first), what="a new DEALER")
    assert first.closed
    assert a._dealers[address].getsockopt(zmq.ROUTING_ID) != first_id
    send_until_ok(a, "b", address, Verb.HEARTBEAT, {"n": 2})
    inbox_b2.wait_for(lambda m: m == ("a", Verb.HEARTBEAT, {"n": 2}))
    watchers = list(a._redials.values())
    assert len(watchers) == 1 and not watchers[0].dead  # one watcher, for the new DEALER
    a.forget(address)
    wait_until(lambda: watchers[0].dead, what="the forgotten DEALER's watcher to end")
    assert a._redials == {}


@pytest.mark.timeout(20)
def test_a_peer_that_drops_every_connection_is_redialled_at_most_once_a_second(make):
    a, _ = make("a")
    b, _ = make("b", curve=keygen())  # another cluster: it drops every handshake of ours
    started = time.monotonic()
    a.connect(b.address)
    made = set()  # routing ids, each a fresh random one (an id() could be reused)
    while time.monotonic() - started < 2.5:
        made.add(a._dealers[b.address].getsockopt(zmq.ROUTING_ID))
        gevent.sleep(0.01)
    assert 2 <= len(made) <= 4, f"{len(made)} DEALERs in 2.5 s"


@pytest.mark.timeout(30)
def test_a_dealer_refused_again_while_its_redial_waits_leaves_the_node_working(make):
    """The watcher's redial waits out REDIAL_EVERY while libzmq keeps reconnecting the
    refused DEALER. Its monitor socket must not close before its monitoring ends: an
    event for a closed monitor blocked the context's I/O thread for good (the refusals
    stopped at 3, and the node heard no one)."""
    cluster = keygen()
    a, _ = make("a", curve=cluster)
    other, _ = make("other", curve=keygen())  # another cluster: it refuses a's key
    a.connect(other.address)
    wait_until(lambda: other.stats.auth_refused >= 3, 10, "the first refusals")
    seen = other.stats.auth_refused
    wait_until(lambda: other.stats.auth_refused >= seen + 5, 10,
               "refusals to go on past the first redial's wait")
    c, inbox_c = make("c", curve=cluster)
    send_until_ok(a, "c", c.address, Verb.HEARTBEAT, {"n": 1})
    inbox_c.wait_for(lambda m: m[2] == {"n": 1})


@pytest.mark.timeout(20)
def test_forget_closes_the_dealer(make):
    a, _ = make("a")
    b, inbox_b = make("b")
    assert a.connect(b.address)
    send_until_ok(a, "b", b.address, Verb.HEARTBEAT, {"n": 1})
    inbox_b.wait_for(lambda m: True)
    a.forget(b.address)
    a.forget(b.address)  # unknown address: no-op
    assert b.address not in a._dealers
    send_until_ok(a, "b", b.address, Verb.HEARTBEAT, {"n": 2})  # a new DEALER
    inbox_b.wait_for(lambda m: m[2] == {"n": 2})


@pytest.mark.timeout(30)
def test_every_frame_is_stamped_with_the_boot_and_a_growing_sequence(make, raw):
    a, _ = make("a", boot=41)
    b, inbox_b = make("b")
    send_until_ok(a, "b", b.address, Verb.HEARTBEAT, {"n": 1})
    a.send("b", b.address, Verb.HEARTBEAT, {"n": 2})
    inbox_b.wait_for(lambda m: m[2] == {"n": 2})
    assert b._fresh.boot(("a", "")) == 41 and b.stats.stale == 0


@pytest.mark.timeout(30)
def test_a_replayed_or_earlier_frame_is_dropped_and_a_restart_is_taken(make, raw):
    target, inbox = make("target")
    peer = raw(b"p")
    peer.connect(target.address)
    hb = lambda n: protocol.encode(Verb.HEARTBEAT, {"n": n})  # noqa: E731
    peer.send_multipart(hb(1), stamp_=(100, 5))
    peer.send_multipart(hb(2), stamp_=(100, 5))  # the same frame again
    peer.send_multipart(hb(3), stamp_=(100, 4))  # an older sequence
    peer.send_multipart(hb(4), stamp_=(99, 50))  # an earlier incarnation
    peer.send_multipart(hb(5), stamp_=(100, 6))
    peer.send_multipart(hb(6), stamp_=(101, 1))  # restarted: a new incarnation
    peer.send_multipart(hb(7), stamp_=(100, 7))  # the old one's frame, late
    peer.send_multipart(hb(8), stamp_=(101, 2))
    inbox.wait_for(lambda m: m[2] == {"n": 8})
    assert [p["n"] for p in inbox.payloads()] == [1, 5, 6, 8]
    assert target.stats.stale == 4
    assert target.stats.messages[("HEARTBEAT", "stale")] == 4


@pytest.mark.timeout(30)
def test_a_replay_is_dropped_before_its_payload_is_decoded(make, raw, monkeypatch):
    target, inbox = make("target")
    peer = raw(b"p")
    peer.connect(target.address)
    decoded = []
    real = protocol.decode
    monkeypatch.setattr(protocol, "decode", lambda f: decoded.append(f) or real(f))
    peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {"n": 1}), stamp_=(7, 3))
    inbox.wait_for(lambda m: m[2] == {"n": 1})
    # replays of that frame, one with a payload that is no JSON at all: none is decoded
    peer.send_multipart([b"HEARTBEAT", b"{not json"], stamp_=(7, 3))
    peer.send_multipart([b"NOSUCHVERB", b"[[[["], stamp_=(7, 2))
    peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {"n": 2}), stamp_=(7, 4))
    inbox.wait_for(lambda m: m[2] == {"n": 2})
    assert len(decoded) == 2 and target.stats.dropped == 0 and target.stats.stale == 2
    # a stale frame's verb is counted under its name only if it is one (labels stay bounded)
    assert target.stats.messages[("HEARTBEAT", "stale")] == 1
    assert target.stats.messages[("invalid", "stale")] == 1


# -- 3. garbage ---------------------------------------------------------------

@pytest.mark.timeout(30)
def test_garbage_never_reaches_on_message(make, raw):
    target, inbox = make("target")
    good, _ = make("good")

    # a zmq peer that sends malformed messages, then one valid sentinel on the
    # same connection: when the sentinel arrives, everything before it was seen
    mallory = raw(b"mallory")
    mallory.connect(target.address)
    garbage = [
        [b"HEARTBEAT"],                                   # 1 frame
        [b"HEARTBEAT", b"{}", b"x"],                      # 4 frames: a bad stamp
        [b"HEARTBEAT", b"{}", b"x", b"y", b"z"],          # 6 frames
        [b"NOT_A_VERB", b"{}"],                           # unknown verb
        [b"HEARTBEAT", b"not json"],                      # non-JSON
        [b"HEARTBEAT", b"[1, 2, 3]"],                     # JSON array
        [b"HEARTBEAT", b'"a string"'],                    # JSON scalar
        [b"HEARTBEAT", b"\xff\xfe\xfd"],                  # invalid utf-8 payload
        [b"HEARTBEAT", b"[" * 10_000],                    # too deep
        [b"HEARTBEAT", b" " * (protocol.MAX_FRAME + 1)],  # over the protocol limit
        [b"", b""],                                       # empty frames
    ]
    for frames in garbage:
        mallory.send_multipart(frames)
    mallory.send_multipart(protocol.encode(Verb.HEARTBEAT, {"sentinel": 1}))
    inbox.wait_for(lambda m: m[2] == {"sentinel": 1})
    assert inbox.messages == [("mallory", Verb.HEARTBEAT, {"sentinel": 1})]
    assert target.stats.dropped == len(garbage)

    # identities that are not node ids: invalid utf-8, and none at all
    for identity in (b"\xff\xfe", None):
        peer = raw(identity)
        peer.connect(target.address)
        peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {"from": repr(identity)}))
    wait_until(lambda: target.stats.dropped == len(garbage) + 2, what="identity drops")

    # raw TCP: random bytes, an HTTP request, a fake ZMTP greeting. libzmq
    # may read some of it as ZMTP/1.0 frames; those reach parse_frames and are
    # dropped there (so not counted exactly here)
    rng = random.Random(20240607)
    host, port = target.address.rsplit("/", 1)[1].rsplit(":", 1)
    for junk in (rng.randbytes(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"\xff" + rng.randbytes(9) + b"\x7f" + rng.randbytes(200)):
        with gsocket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(junk)

    # a frame above MAXMSGSIZE: libzmq disconnects the sender before we see it
    hog = raw(b"hog")
    hog_events = monitor_events(hog)
    hog.connect(target.address)
    hog.send_multipart([b"HEARTBEAT", b" " * (MAX_MESSAGE_SIZE + 1)])
    wait_until(lambda: zmq.EVENT_DISCONNECTED in hog_events(), what="hog disconnected")

    # the transport still works, and nothing else got through
    send_until_ok(good, "target", target.address, Verb.HEARTBEAT, {"after": "garbage"})
    inbox.wait_for(lambda m: m == ("good", Verb.HEARTBEAT, {"after": "garbage"}))
    gevent.sleep(0.2)  # grace period for anything straggling (not the assertion's trigger)
    assert [m[0] for m in inbox.messages] == ["mallory", "good"]
    assert target.stats.handler_errors == 0
    assert target.running


@pytest.mark.timeout(20)
def test_garbage_floods_are_rate_limited_in_the_log(make, raw, caplog):
    target, inbox = make("target")
    mallory = raw(b"mallory")
    mallory.connect(target.address)
    with caplog.at_level(logging.WARNING, logger="miyamoto.wire.transport"):
        for i in range(300):
            mallory.send_multipart([b"NOPE", b"%d" % i])
        mallory.send_multipart(protocol.encode(Verb.HEARTBEAT, {"sentinel": 1}))
        inbox.wait_for(lambda m: m[2] == {"sentinel": 1})
    assert target.stats.dropped == 300
    warnings = [r for r in caplog.records if r.name == "miyamoto.wire.transport"
                and r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 20


# -- 4. on_message raising ----------------------------------------------------

@pytest.mark.timeout(20)
def test_on_message_exception_is_logged_and_loop_survives(make, caplog):
    inbox = Inbox(fail_on=lambda p: p.get("boom"))
    b, _ = make("b", inbox=inbox)
    a, _ = make("a")
    with caplog.at_level(logging.ERROR, logger="miyamoto.wire.transport"):
        send_until_ok(a, "b", b.address, Verb.STORE, {"boom": True})
        for i in range(3):
            assert a.send("b", b.address, Verb.STORE, {"boom": True, "i": i})
        assert a.send("b", b.address, Verb.STORE, {"ok": 1})
        inbox.wait_for(lambda m: m[2] == {"ok": 1})
    assert len(inbox.messages) == 5
    assert b.stats.handler_errors == 4 and b.stats.received == 5
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and all(r.exc_info and r.exc_info[0] is RuntimeError for r in errors)


# -- 5. CurveZMQ ----------------------------------------------------------------

def proven(name: bytes, cluster: CurveKeys, own: CurveKeys) -> bytes:
    """A routing id as a node of ``cluster`` with the key pair ``own`` makes it."""
    return name + b"\x00" + b"t" * 8 + join_proof(cluster, z85.decode(own.public.encode()))


@pytest.mark.timeout(30)
def test_curve_admits_the_cluster_and_refuses_everyone_else(make, raw, caplog):
    keys = keygen()
    a, inbox_a = make("a", curve=keys)
    b, inbox_b = make("b", curve=keys)
    assert a.node_key != b.node_key != keys  # each node its own pair

    send_until_ok(a, "b", b.address, Verb.HEARTBEAT, {"to": "b", "é": "✓"})
    inbox_b.wait_for(lambda m: m == ("a", Verb.HEARTBEAT, {"to": "b", "é": "✓"}))
    send_until_ok(b, "a", a.address, Verb.HEARTBEAT_ACK, {"to": "a"})
    inbox_a.wait_for(lambda m: m == ("b", Verb.HEARTBEAT_ACK, {"to": "a"}))
    # each message comes with the key its connection authenticated with
    assert inbox_b.keys == {"a": {a.node_key.public}}
    assert inbox_a.keys == {"b": {b.node_key.public}}

    server = keys.public.encode()
    other, eve = keygen(), keygen()
    eve_curve = (eve.public.encode(), eve.secret.encode(), server)
    unproven = {
        # knows the server key, holds its own pair, no join proof: ZAP admits the key,
        # the transport drops what it says
        "no-proof": raw(b"eve", curve=eve_curve),
        # a's proof, copied: it is for a's key, not eve's
        "copied-proof": raw(b"eve1\x00" + b"t" * 8 + a._proof, curve=eve_curve),
        # a proof made under another cluster's secret
        "other-secret": raw(proven(b"eve4", other, eve), curve=eve_curve),
    }
    refused = {
        # claims the cluster's public key without its secret: CURVE handshake fails
        "stolen-public": raw(b"eve2", curve=(server, other.secret.encode(), server)),
        # no CURVE at all: mechanism mismatch
        "plain": raw(b"eve3"),
    }
    events = {}
    for name, sock in {**unproven, **refused}.items():
        events[name] = monitor_events(sock)
        sock.connect(a.address)
        for i in range(5):
            sock.send_multipart(protocol.encode(Verb.HEARTBEAT, {"intruder": name, "i": i}))

    # a node of another cluster (it uses its own cluster key as the server key,
    # so the CURVE handshake fails before ZAP): its DEALER never gets connected
    stranger, _ = make("stranger", curve=other)
    assert stranger.connect(a.address)

    failed = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
              zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED}
    for name in refused:
        wait_until(lambda: failed & set(events[name]()), what=f"{name} refused")
    wait_until(lambda: a.stats.messages.get(("unproven", "dropped"), 0) == 15,
               what="every message of the unproven keys dropped")
    stranger_sent = []
    for _ in range(10):  # across several reconnect-and-handshake attempts
        stranger_sent.append(stranger.send("a", a.address, Verb.JOIN, {"intruder": "stranger"}))
        gevent.sleep(0.05)
    for name in refused:
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in set(events[name]())
    # every refusal counts once per connection, the handshakes that never reach ZAP too
    # (another key pair), and is logged with the peer's address
    wait_until(lambda: a.stats.auth_refused >= len(unproven) + 2,
               what="the unproven keys and failed CURVE handshakes counted as refused")
    refusals = [r.getMessage() for r in caplog.records if "refused CURVE client" in r.getMessage()]
    assert any("from 127.0.0.1:" in m for m in refusals), refusals
    assert any("'eve1'" in m and "not the cluster key" in m for m in refusals), refusals

    # a control: a raw peer with its own key and the proof for it gets in the same way
    friend = raw(proven(b"friend", keys, eve), curve=eve_curve)
    friend.connect(a.address)
    friend.send_multipart(protocol.encode(Verb.HEARTBEAT, {"friend": True}))
    inbox_a.wait_for(lambda m: m == ("friend", Verb.HEARTBEAT, {"friend": True}))
    assert inbox_a.keys["friend"] == {eve.public}

    # the keyed peer keeps working; no intruder message ever arrived
    send_until_ok(b, "a", a.address, Verb.HEARTBEAT, {"still": "here"})
    inbox_a.wait_for(lambda m: m[2] == {"still": "here"})
    gevent.sleep(0.2)  # grace period for stragglers (not the assertion's trigger)
    assert not any("intruder" in p for p in inbox_a.payloads())
    assert {m[0] for m in inbox_a.messages} == {"b", "friend"}
    assert not any(stranger_sent)
    assert a.stats.dropped == 0


@pytest.mark.timeout(20)
def test_curve_fails_closed_without_the_zap_handler(make, raw):
    keys = keygen()
    a, inbox_a = make("a", curve=keys)
    # simulate the ZAP handler dying: even a keyed client must then be refused
    a._zap_greenlet.kill()
    a._zap.close(linger=0)
    server = keys.public.encode()
    friend = raw(proven(b"friend", keys, keys), curve=(server, keys.secret.encode(), server))
    drain = monitor_events(friend)
    friend.connect(a.address)
    friend.send_multipart(protocol.encode(Verb.HEARTBEAT, {"x": 1}))
    # with no ZAP handler the server may sit on the handshake until HANDSHAKE_IVL (5 s)
    wait_until(lambda: zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL in drain()
               or zmq.EVENT_DISCONNECTED in drain(), timeout=15.0, what="refusal")
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in drain()
    assert inbox_a.messages == []


@pytest.mark.timeout(10)
def test_curve_and_plain_nodes_do_not_talk(make):
    a, inbox_a = make("a", curve=keygen())
    b, _ = make("b")
    results = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        results.append(b.send("a", a.address, Verb.HEARTBEAT, {}))
        gevent.sleep(0.02)
    assert not any(results) and inbox_a.messages == []


# -- 6. stop --------------------------------------------------------------------

@pytest.mark.timeout(20)
def test_stop_is_idempotent_and_frees_the_port(make):
    keys = keygen()
    a, _ = make("a", curve=keys)
    b, _ = make("b", curve=keys)
    address = a.address
    send_until_ok(b, "a", address, Verb.HEARTBEAT, {})
    groups = list(a._group)
    a.stop()
    a.stop()
    assert not a.running and all(g.dead for g in groups)
    assert a.send("b", b.address, Verb.HEARTBEAT, {}) is False

    a2, inbox_a2 = make("a", bind=address, curve=keygen())  # same port, and a new ZAP handler
    assert a2.address == address
    c, _ = make("c", curve=a2.curve)
    send_until_ok(c, "a", address, Verb.HEARTBEAT, {"again": 1})
    inbox_a2.wait_for(lambda m: m == ("c", Verb.HEARTBEAT, {"again": 1}))

    never_started = Transport("z", LOOPBACK, Inbox())
    never_started.stop()
    never_started.stop()
    # a cluster of one never starts its transport: sends are refused, not raised
    assert never_started.send(None, address, Verb.HEARTBEAT, {}) is False


@pytest.mark.timeout(20)
def test_stop_from_inside_on_message(make):
    holder = {}

    def on_message(sender, verb, payload, key):
        holder["t"].stop()

    b, _ = make("b", inbox=on_message)
    holder["t"] = b
    a, _ = make("a")
    groups = list(b._group)
    send_until_ok(a, "b", b.address, Verb.LEAVE, {})
    wait_until(lambda: all(g.dead for g in groups), what="b's greenlets to end")
    assert not b.running


@pytest.mark.timeout(10)
def test_bind_failure_raises_and_cleans_up(make):
    a, _ = make("a")
    t = Transport("dup", a.address, Inbox())
    with pytest.raises(zmq.ZMQError):
        t.start()
    assert not t.running
    t.stop()


# -- 7. the receive loop: drain until EAGAIN, yield, wait on the FD ----------------

class Gate:
    """An on_message that holds the receive loop on its first message until released,
    so that what is sent meanwhile queues up at the ROUTER and is drained in batches.
    Records each delivery with the value of a ticker greenlet's counter at that moment."""

    def __init__(self):
        self.release = Event()
        self.ticks = [0]
        self.seen: list[tuple[Verb, dict, int]] = []

    def __call__(self, sender, verb, payload, key):
        if not self.seen:
            self.release.wait(10)
        self.seen.append((verb, payload, self.ticks[0]))

    def tick_forever(self):
        while True:
            self.ticks[0] += 1
            gevent.sleep(0)


@pytest.fixture
def no_safety_net(monkeypatch):
    """FD waits without their timeout: a missed edge (a wait before EAGAIN) then hangs
    the loop, and the test fails, instead of being hidden by the retry."""
    monkeypatch.setattr(zmqio, "FD_WAIT_TIMEOUT", 60.0)


@pytest.mark.timeout(30)
def test_a_burst_past_yield_every_arrives_whole_in_order_and_yields(no_safety_net, make, raw):
    gate = Gate()
    target, _ = make("target", inbox=gate)
    ticker = gevent.spawn(gate.tick_forever)
    try:
        peer = raw(b"peer")
        peer.connect(target.address)
        peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {"gate": 1}))
        wait_until(lambda: target.stats.received == 1, what="the gate message")
        n = 10 * YIELD_EVERY + 3
        for i in range(n):
            peer.send_multipart(protocol.encode(Verb.STORE, {"i": i}))
        gate.release.set()
        wait_until(lambda: len(gate.seen) == n + 1, timeout=20, what="the burst")
    finally:
        ticker.kill()
    assert [p["i"] for _, p, _ in gate.seen[1:]] == list(range(n))
    assert target.stats.received == n + 1 and target.stats.dropped == 0
    # fairness: other greenlets ran at least every YIELD_EVERY messages
    runs: dict[int, int] = {}
    for _, _, tick in gate.seen[1:]:
        runs[tick] = runs.get(tick, 0) + 1
    assert max(runs.values()) <= YIELD_EVERY
    assert len(runs) >= n // YIELD_EVERY


@pytest.mark.timeout(30)
def test_a_malformed_message_among_good_ones_is_dropped_alone(no_safety_net, make, raw):
    gate = Gate()
    target, _ = make("target", inbox=gate)
    peer = raw(b"peer")
    peer.connect(target.address)
    peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {"gate": 1}))
    wait_until(lambda: target.stats.received == 1, what="the gate message")
    bad_kinds = [
        [b"HEARTBEAT"],                          # too few frames
        [b"HEARTBEAT", b"{}", b"x", b"y"],       # frames past the third
        [b"NOPE", b"{}"],                        # unknown verb
        [b"STORE", b"\xff{"],                    # not JSON
    ]
    expected, bad = [], 0
    for i in range(3 * YIELD_EVERY):
        if i % 7 == 3:
            peer.send_multipart(bad_kinds[bad % len(bad_kinds)])
            bad += 1
        else:
            peer.send_multipart(protocol.encode(Verb.STORE, {"i": i}))
            expected.append(i)
    peer.send_multipart(protocol.encode(Verb.STORE, {"last": True}))
    gate.release.set()
    wait_until(lambda: gate.seen and gate.seen[-1][1] == {"last": True}, timeout=20,
               what="the last good message")
    assert [p["i"] for _, p, _ in gate.seen[1:-1]] == expected
    assert target.stats.dropped == bad and target.stats.handler_errors == 0
    assert target.stats.received == len(expected) + 2


@pytest.mark.timeout(30)
def test_an_idle_loop_sleeps_and_wakes_promptly(make):
    a, _ = make("a")
    b, inbox_b = make("b")
    send_until_ok(a, "b", b.address, Verb.HEARTBEAT, {"n": -1})
    inbox_b.wait_for(lambda m: True)
    # idle for longer than the FD wait's timeout: the loop must sleep, not spin
    cpu = time.process_time()
    gevent.sleep(1.2)  # the idle period under test, not a wait for a condition
    assert time.process_time() - cpu < 0.3
    latencies = []
    for n in range(7):
        gevent.sleep(0.05 if n % 2 else 0.6)  # idle: the loop waits on the FD again
        sent = time.monotonic()
        assert a.send("b", b.address, Verb.HEARTBEAT, {"n": n})
        inbox_b.wait_for(lambda m: m[2] == {"n": n})
        latencies.append(time.monotonic() - sent)
    # a loop that only polled on its timeout would take 0.25 s on average
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies


def drains_of(t: Transport, monkeypatch) -> list[int]:
    """How many frames each of ``t``'s drains took from now on."""
    taken: list[int] = []
    drain = t._drain

    def counted(sock):
        n = drain(sock)
        taken.append(n)
        return n

    monkeypatch.setattr(t, "_drain", counted)
    return taken


def connected_and_counted(make, raw, monkeypatch):
    """A target with a peer connected (its first frame through), and its drains counted
    from then on: (inbox, peer, the frames each drain took)."""
    target, inbox = make("target")
    peer = raw(b"peer")
    peer.connect(target.address)
    peer.send_multipart(protocol.encode(Verb.HEARTBEAT, {}))
    inbox.wait_for(lambda m: True)
    return inbox, peer, drains_of(target, monkeypatch)


def paced_sends(peer, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        peer.send_multipart(protocol.encode(Verb.STORE, {"i": i}))
        gevent.sleep(0.0001)  # about a millisecond: gevent's shortest timer


@pytest.mark.timeout(30)
def test_under_load_the_receive_loop_lets_frames_pile_up_for_one_drain(no_safety_net, make,
                                                                        raw, monkeypatch):
    """A busy peer's frames come a millisecond apart: once drains follow each other that
    closely, the loop waits RX_LINGER between them and takes several frames a drain."""
    inbox, peer, taken = connected_and_counted(make, raw, monkeypatch)
    paced_sends(peer, 200)
    wait_until(lambda: len(inbox.messages) == 201, timeout=20, what="the paced frames")
    productive = [n for n in taken if n]
    assert sum(productive) == 200
    # one frame a drain without the linger, two of every three with a linger of one
    # step only; about two each with it
    assert len(productive) <= 120, (len(productive), productive[:40])


@pytest.mark.timeout(30)
def test_an_idle_loop_does_not_linger_after_a_lone_frame(no_safety_net, make, raw,
                                                          monkeypatch):
    """Frames far apart are each taken by one drain and the loop goes back to waiting on
    its socket at once: no drain that finds nothing, no RX_LINGER added to a reply."""
    inbox, peer, taken = connected_and_counted(make, raw, monkeypatch)
    for i in range(5):
        gevent.sleep(0.03)  # idle between frames: the pacing under test, not a wait
        peer.send_multipart(protocol.encode(Verb.STORE, {"i": i}))
        inbox.wait_for(lambda m, i=i: m[2] == {"i": i})
    gevent.sleep(0.03)  # a lingering loop's next drain would come within this
    assert taken == [1] * 5, taken


@pytest.mark.timeout(20)
def test_stop_inside_on_message_ends_a_burst_there(no_safety_net, make, raw):
    holder: dict = {"seen": []}

    def on_message(sender, verb, payload, key):
        holder["seen"].append(payload["i"])
        if payload["i"] == 5:
            holder["t"].stop()

    b, _ = make("b", inbox=on_message)
    holder["t"] = b
    peer = raw(b"peer")
    peer.connect(b.address)
    for i in range(3 * YIELD_EVERY):
        peer.send_multipart(protocol.encode(Verb.STORE, {"i": i}))
    groups = list(b._group)
    wait_until(lambda: all(g.dead for g in groups), what="b's greenlets to end")
    assert holder["seen"] == list(range(6)) and not b.running


@pytest.mark.timeout(10)
def test_readable_times_out_again_and_again():
    """Each wait on an FD with no input ends after its timeout: not at once (a gevent
    Timeout restarted after it expired fires immediately, which made the loop spin)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(LOOPBACK)
        with pytest.raises(zmq.Again):
            sock.recv(zmq.NOBLOCK)
        readable = Readable(sock, timeout=0.05)
        for _ in range(4):
            started = time.monotonic()
            readable.wait()
            assert 0.04 <= time.monotonic() - started < 0.4
        readable.close()
        # by default a missed edge stalls a socket half a second at most
        readable = Readable(sock)
        started = time.monotonic()
        readable.wait()
        assert 0.45 <= time.monotonic() - started < 0.95
        readable.close()
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)


def test_every_socket_gets_the_options_the_design_states(make):
    """DESIGN §2 and the module's constants, spelled out: linger 0 (a stop never waits),
    the HWM handed in, 8 MiB frames at most (a garbage peer cannot make libzmq allocate
    more), reconnects from 100 ms backing off to 1 s, a 5 s handshake, ZMTP heartbeats
    every 1 s cutting a silent peer after 3 s; a DEALER with IMMEDIATE (a send to a peer
    not connected fails at once) and a routing id of the node id, NUL, 8 random bytes."""
    a, _ = make("a", hwm=77)
    b, _ = make("b")
    assert b._router.getsockopt(zmq.SNDHWM) == 10_000  # the default HWM
    assert a.connect(b.address)
    dealer = a._dealers[b.address]
    for sock in (a._router, dealer):
        assert sock.getsockopt(zmq.LINGER) == 0
        assert sock.getsockopt(zmq.SNDHWM) == 77 and sock.getsockopt(zmq.RCVHWM) == 77
        assert sock.getsockopt(zmq.MAXMSGSIZE) == 8 * 1024 * 1024
        assert sock.getsockopt(zmq.RECONNECT_IVL) == 100
        assert sock.getsockopt(zmq.RECONNECT_IVL_MAX) == 1000
        assert sock.getsockopt(zmq.HANDSHAKE_IVL) == 5000
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 1000
        assert sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) == 3000
    assert dealer.getsockopt(zmq.IMMEDIATE) == 1
    rid = dealer.getsockopt(zmq.ROUTING_ID)
    assert rid[:2] == b"a\x00" and len(rid) == 2 + 8
    assert a._dealers[b.address] is dealer and a.connect(b.address)  # made once
    other = Transport("a", LOOPBACK, Inbox())
    other.start()
    try:
        assert other.connect(b.address)
        assert other._dealers[b.address].getsockopt(zmq.ROUTING_ID) != rid  # never shared
    finally:
        other.stop()


def test_lifecycle_misuse_is_refused(make):
    with pytest.raises(ValueError, match="hwm must be at least 1"):
        Transport("a", LOOPBACK, Inbox(), hwm=0)
    Transport("a", LOOPBACK, Inbox(), hwm=1)  # the least allowed
    t = Transport("a", LOOPBACK, Inbox())
    with pytest.raises(RuntimeError, match="not started"):
        t.address
    assert not t.running and not t.connect("tcp://127.0.0.1:9")
    assert t.send("b", "tcp://127.0.0.1:9", Verb.ASK, {}) is False  # a cluster of one
    with t:
        assert t.running and t.address.startswith("tcp://127.0.0.1:")
        with pytest.raises(RuntimeError, match="called twice"):
            t.start()
    assert not t.running and not t.connect("tcp://127.0.0.1:9")
    assert t.send("b", "tcp://127.0.0.1:9", Verb.ASK, {}) is False


def test_a_bad_address_is_a_failed_send_counted_as_dropped(make, caplog):
    t, _ = make("a")
    assert t.connect("not an address") is False
    assert t.send("b", "nope://x", Verb.ASK, {}) is False
    assert t.stats.send_failed == 1 and t.stats.messages[("ASK", "dropped")] == 1
    assert "cannot connect to 'nope://x'" in caplog.text


def test_sends_are_counted_and_a_socket_error_is_a_failed_send(make):
    a, _ = make("a")
    b, inbox = make("b")
    send_until_ok(a, "b", b.address, Verb.ASK, {"i": 0})
    sent = a.stats.sent
    for i in range(1, 4):
        assert a.send("b", b.address, Verb.ASK, {"i": i}) is True
    assert a.stats.sent == sent + 3 and a.stats.messages[("ASK", "sent")] == sent + 3
    inbox.wait_for(lambda m: m[2] == {"i": 3})
    assert b.stats.received == 4 and b.stats.messages[("ASK", "received")] == 4
    a._dealers[b.address].close(linger=0)  # the socket gone under the transport
    failed = a.stats.send_failed
    assert a.send("b", b.address, Verb.ASK, {"i": 9}) is False
    assert a.stats.send_failed == failed + 1
    a.forget(b.address)
    a.forget(b.address)  # forgetting twice is harmless


def test_the_default_throttle_logs_ten_warnings_per_ten_seconds(caplog):
    now = [100.0]
    throttle = _Throttle(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="miyamoto.wire.transport"):
        for _ in range(25):
            throttle.warning("garbage")
        assert [r.getMessage() for r in caplog.records] == ["garbage"] * 10
        now[0] = 109.9
        throttle.warning("garbage")
        assert len(caplog.records) == 10
        now[0] = 110.0  # the window ends at its own instant
        throttle.warning("garbage")
    assert caplog.records[10].getMessage().startswith("16 more such warnings suppressed")
    assert caplog.records[11].getMessage() == "garbage"


def test_zap_requests_at_their_shortest():
    reply, ok = zap_reply([b"1.0"])  # no request id: answered with an empty one
    assert not ok and reply == [b"1.0", b"", b"500", b"Malformed ZAP request", b"", b""]
    reply, ok = zap_reply([b"1.0", b"r", b"d", b"a", b"", b"NULL"])  # no credentials
    assert not ok and reply[2] == b"400"  # well formed, just not a CURVE key
    reply, ok = zap_reply([b"1.0", b"r", b"d", b"a", b""])  # no mechanism
    assert not ok and reply[2] == b"500"


def test_curve_keys_of_the_wrong_length_or_type_say_so():
    keys = keygen()
    for bad in ("short", keys.public + "0" * 5, keys.public[:35], keys.public.encode(), None):
        with pytest.raises(ValueError, match="must be 40 Z85 characters"):
            CurveKeys(bad, keys.secret)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="must be 40 Z85 characters"):
            CurveKeys(keys.public, bad)  # type: ignore[arg-type]


def test_a_fresh_transport_has_counted_nothing():
    from miyamoto.wire.transport import TransportStats
    s = TransportStats()
    assert (s.received, s.dropped, s.handler_errors, s.sent, s.send_failed, s.zap_denied,
            s.messages) == (0, 0, 0, 0, 0, 0, {})


def test_a_foreign_timeout_around_a_wait_still_fires():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(LOOPBACK)
        with pytest.raises(zmq.Again):  # drained: the FD's edge is used up
            sock.recv(zmq.NOBLOCK)
        readable = Readable(sock, timeout=5.0)
        started = time.monotonic()
        with pytest.raises(gevent.Timeout):
            with gevent.Timeout(0.05):
                readable.wait()
        assert time.monotonic() - started < 2.0
        readable.close()
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)
