"""Request and answer over one-way messages (cluster/requests.py): each request its own
id, answers matched by id only, a stand-in for a member that cannot be reached, and a
wait bounded by its timeout. A fake send stands in for the cluster layer's."""

from __future__ import annotations

import time

import gevent
import pytest

from miyamoto.cluster.requests import Requests
from miyamoto.replicas import messages as m

pytestmark = pytest.mark.timeout(30)


class Wire:
    """The cluster layer's send: records what was sent; members in ``no_address``
    have none (send answers False); ``fail`` keeps each message's on_fail."""

    def __init__(self, no_address: tuple[str, ...] = ()):
        self.sent: list[tuple[str, object]] = []
        self.no_address = no_address
        self.fails: dict[str, object] = {}

    def __call__(self, member_id, msg, *, on_fail):
        if member_id in self.no_address:
            return False
        self.sent.append((member_id, msg))
        self.fails[member_id] = on_fail
        return True

    def req_of(self, member: str) -> str:
        return next(msg.req for to, msg in self.sent if to == member)


def test_answers_are_matched_by_id_and_collect_returns_once_all_came():
    wire = Wire()
    r = Requests(wire, reply_to="tcp://127.0.0.1:6000")
    asks = {i: (mem, lambda req, to: m.Request(req, to, "count", {})) for i, mem in
            enumerate(("b", "c"))}
    call = r.send(asks)
    assert len(call.reqs) == 2 and sorted(call.reqs.values()) == [0, 1]
    assert all(msg.reply_to == "tcp://127.0.0.1:6000" for _, msg in wire.sent)
    assert len({msg.req for _, msg in wire.sent}) == 2  # a fresh id each
    r.answer(m.Reply(wire.req_of("c"), True, 7))
    r.answer(m.Reply(wire.req_of("b"), True, 3))
    t0 = time.monotonic()
    got = r.collect(call, timeout=20.0)
    assert time.monotonic() - t0 < 10.0  # it did not wait out the timeout
    assert {k: a.result for k, a in got.items()} == {0: 3, 1: 7}


def test_ids_stay_unique_across_requests_and_askers():
    wire = Wire()
    a, b = Requests(wire, "x"), Requests(wire, "y")
    for _ in range(3):
        a.send({"k": ("b", lambda req, to: m.Request(req, to, "op", {}))})
        b.send({"k": ("b", lambda req, to: m.Request(req, to, "op", {}))})
    assert len({msg.req for _, msg in wire.sent}) == 6


def test_a_member_without_an_address_or_whose_send_failed_answers_unreachable():
    wire = Wire(no_address=("c",))
    r = Requests(wire, "me")
    call = r.send({"b": ("b", lambda req, to: m.Request(req, to, "op", {})),
                   "c": ("c", lambda req, to: m.Request(req, to, "op", {}))})
    wire.fails["b"]()  # the transport could not deliver it
    got = r.collect(call, timeout=20.0)
    assert got["b"] == m.Reply(got["b"].req, False, "unreachable")
    assert got["c"].ok is False and got["c"].result == "unreachable"


def test_collect_waits_no_longer_than_its_timeout_and_keeps_what_came():
    wire = Wire()
    r = Requests(wire, "me")
    call = r.send({mem: (mem, lambda req, to: m.Request(req, to, "op", {}))
                   for mem in ("b", "c")})
    r.answer(m.Reply(wire.req_of("b"), True, "yes"))
    t0 = time.monotonic()
    got = r.collect(call, timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 10.0
    assert list(got) == ["b"]


def test_an_answer_to_a_forgotten_or_unknown_request_is_dropped():
    wire = Wire()
    r = Requests(wire, "me")
    call = r.send({"b": ("b", lambda req, to: m.Request(req, to, "op", {}))})
    late = wire.req_of("b")
    assert r.collect(call, timeout=0.05) == {}
    r.answer(m.Reply(late, True, "late"))  # after the asker gave up
    r.answer(m.Reply("forged", True, "x"))  # never asked
    assert call.answers == {}
    # the next request of the same member is not answered by the late one
    call2 = r.send({"b": ("b", lambda req, to: m.Request(req, to, "op", {}))})
    r.answer(m.Reply(late, True, "late"))
    assert r.collect(call2, timeout=0.05) == {}


def test_a_stored_answer_arrives_like_a_reply():
    wire = Wire()
    r = Requests(wire, "me")
    call = r.send({0: ("b", lambda req, to: m.Request(req, to, "store", {}))})
    r.answer(m.Stored(wire.req_of("b"), "task-1", True))
    got = r.collect(call, timeout=20.0)
    assert got[0].id == "task-1" and got[0].ok


def test_nothing_asked_returns_at_once():
    r = Requests(Wire(), "me")
    call = r.send({})
    t0 = time.monotonic()
    assert r.collect(call, timeout=20.0) == {}
    assert time.monotonic() - t0 < 5.0


def test_ask_all_keeps_the_results_of_the_members_that_answered_ok():
    wire = Wire(no_address=("d",))
    r = Requests(wire, "me")

    def answer_them():
        gevent.sleep(0)
        r.answer(m.Reply(wire.req_of("b"), True, {"n": 1}))
        r.answer(m.Reply(wire.req_of("c"), False, "no such op"))

    g = gevent.spawn(answer_them)
    got = r.ask_all(["b", "c", "d"], "count", {"queue": "q"}, timeout=20.0)
    g.join()
    assert got == {"b": {"n": 1}}
    assert all(msg.op == "count" and msg.args == {"queue": "q"} for _, msg in wire.sent)


def test_the_asker_is_woken_by_the_last_answer_not_the_timeout():
    wire = Wire()
    r = Requests(wire, "me")
    call = r.send({mem: (mem, lambda req, to: m.Request(req, to, "op", {}))
                   for mem in ("b", "c")})

    def answer_them():  # runs once the asker waits (it is the first to yield)
        r.answer(m.Reply(wire.req_of("b"), True, 1))
        r.answer(m.Reply(wire.req_of("c"), True, 2))
        r.answer(m.Reply(wire.req_of("c"), True, "after the last"))

    g = gevent.spawn(answer_them)
    t0 = time.monotonic()
    got = r.collect(call, timeout=20.0)
    assert time.monotonic() - t0 < 10.0
    g.join(timeout=10)
    assert {k: a.result for k, a in got.items()} == {"b": 1, "c": 2}


def test_a_stand_in_then_the_real_answer_before_the_last_keeps_the_real_one():
    wire = Wire()
    r = Requests(wire, "me")
    call = r.send({mem: (mem, lambda req, to: m.Request(req, to, "op", {}))
                   for mem in ("b", "c")})
    wire.fails["b"]()  # the transport gave up on b's message...
    r.answer(m.Reply(wire.req_of("b"), True, "yes"))  # ...which got there after all
    r.answer(m.Reply(wire.req_of("c"), True, "yes"))
    got = r.collect(call, timeout=20.0)
    assert got["b"].ok and got["c"].ok
