"""miyamoto.membership.messages alone: each message's wire form (optional fields left out
when unsaid, so older peers still decode it), the defaults of what is left out, and what
does not decode (an absurd term, a roster that does not match its sender)."""

from __future__ import annotations

import pytest

from miyamoto.membership import messages as mm
from miyamoto.membership.roster import Member, Roster
from miyamoto.wire import messages as msgs
from miyamoto.wire import verbs as protocol
from miyamoto.wire.verbs import DecodeError

A = Member("a", "tcp://a:1", "a:2")
B = Member("b", "tcp://b:1", "b:2", zone="z")
ROSTER = Roster(3, 2, "a", (A, B), ("ia", "ib"))
ENV = {"term": 2, "inc": "ia", "sender": A}
BASE = {"term": 2, "inc": "ia", "from": {"id": "a", "cluster": "tcp://a:1", "http": "a:2"}}


def wire(m):
    """Through the wire's own encoding and back."""
    verb, payload = protocol.decode(protocol.encode(m.verb, m.payload()))
    return msgs.decode(protocol.Verb(verb), payload)


@pytest.mark.parametrize("m, extra", [
    (mm.Join(**ENV, boot=("tcp://a:1",), fresh=False), {"boot": ["tcp://a:1"], "fresh": False}),
    (mm.Redirect(**ENV, leader=None, address=None), {"leader": None, "address": None}),
    (mm.Redirect(**ENV, leader="b", address="tcp://b:1", leader_inc="ib"),
     {"leader": "b", "address": "tcp://b:1", "leader_inc": "ib"}),
    (mm.Heartbeat(**ENV, roster=ROSTER), {"roster": ROSTER.to_payload()}),
    (mm.RosterUpdate(**ENV, roster=ROSTER, elect="b", round=0, heard=("a",), echo=0),
     {"roster": ROSTER.to_payload(), "elect": "b", "round": 0, "heard": ["a"], "echo": 0}),
    (mm.HeartbeatAck(**ENV, ok=False, rterm=2, version=3),
     {"ok": False, "rterm": 2, "version": 3}),
    (mm.HeartbeatAck(**ENV, ok=True, rterm=2, version=3, round=0, seq=0),
     {"ok": True, "rterm": 2, "version": 3, "round": 0, "seq": 0}),
    (mm.VoteRequest(**ENV, rterm=1, version=4), {"rterm": 1, "version": 4}),
    (mm.VoteRequest(**ENV, rterm=1, version=4, pre=True, transfer=True, boot=(), fresh=True,
                    to_inc="ib"),
     {"rterm": 1, "version": 4, "pre": True, "transfer": True, "boot": [], "fresh": True,
      "to_inc": "ib"}),
    (mm.VoteRequest(**ENV, rterm=1, version=4, boot=("tcp://a:1",)),
     {"rterm": 1, "version": 4, "boot": ["tcp://a:1"], "fresh": False}),
    (mm.Vote(**ENV, granted=False), {"granted": False, "fresh": False}),
    (mm.Vote(**ENV, granted=True, fresh=True, pre=True),
     {"granted": True, "fresh": True, "pre": True}),
    (mm.Leave(**ENV), {}),
])
def test_the_wire_form_says_only_what_is_said_and_round_trips(m, extra):
    assert m.payload() == {**BASE, **extra}
    assert wire(m) == m and type(wire(m)) is type(m)


def test_what_an_older_peer_leaves_out_decodes_as_unsaid():
    vr = msgs.decode(protocol.Verb.VOTE_REQUEST, {**BASE, "rterm": 1, "version": 4})
    assert (vr.pre, vr.transfer, vr.boot, vr.fresh, vr.to_inc) == (False, False, None, False, None)
    v = msgs.decode(protocol.Verb.VOTE, {**BASE, "granted": True})
    assert (v.fresh, v.pre) == (False, False)
    hb = msgs.decode(protocol.Verb.HEARTBEAT, {**BASE, "roster": ROSTER.to_payload(),
                                               "round": None, "heard": None})
    assert (hb.elect, hb.round, hb.heard, hb.echo) == (None, None, None, None)
    ack = msgs.decode(protocol.Verb.HEARTBEAT_ACK, {**BASE, "ok": True, "rterm": 2,
                                                    "version": 3})
    assert (ack.round, ack.seq) == (None, None)
    r = msgs.decode(protocol.Verb.REDIRECT, {**BASE, "leader": "b", "address": "tcp://b:1"})
    assert r.leader_inc is None


def test_keys_and_voters():
    ack = mm.HeartbeatAck(**ENV, ok=True, rterm=5, version=7)
    assert ack.key == (5, 7) and ack.voter == ("a", "ia")
    assert mm.VoteRequest(**ENV, rterm=4, version=9).key == (4, 9)


def test_a_term_up_to_the_cap_decodes_and_beyond_it_does_not():
    assert msgs.decode(protocol.Verb.LEAVE, {**BASE, "term": 2**52}).term == 2**52
    with pytest.raises(DecodeError):
        msgs.decode(protocol.Verb.LEAVE, {**BASE, "term": 2**52 + 1})


@pytest.mark.parametrize("leader, rterm, ok", [
    ("a", 2, True), (None, 2, True), ("a", 1, True), ("b", 2, False), ("a", 3, False)])
def test_a_leaders_roster_must_be_its_own_and_no_newer_than_its_term(leader, rterm, ok):
    r = Roster(3, rterm, leader, (A, B), ("ia", "ib"))
    d = {**BASE, "roster": r.to_payload()}
    for verb in (protocol.Verb.HEARTBEAT, protocol.Verb.ROSTER):
        if ok:
            assert msgs.decode(verb, d).roster == r
        else:
            with pytest.raises(DecodeError):
                msgs.decode(verb, d)
