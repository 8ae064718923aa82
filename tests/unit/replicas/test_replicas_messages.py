"""The sibling protocol's messages (miyamoto.replicas.messages) at their bounds, through
the real encoding and the typed decoder, as a peer reads them."""

from __future__ import annotations

import pytest

from miyamoto.replicas import messages as m
from miyamoto.wire import messages as wm
from miyamoto.wire import verbs as protocol
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(30)


def wire(msg: object) -> object:
    verb, payload = protocol.decode(protocol.encode(msg.verb, msg.payload()))
    return wm.decode(verb, payload)


def test_a_handoff_names_at_most_ten_thousand_copies() -> None:
    """A stopping node hands its copies over in chunks; a HANDOFF naming more than
    10,000 is refused whole (a peer's bytes), one of 10,000 is read."""
    full = m.Handoff(tuple((f"t{i}", 1.5) for i in range(10_000)))
    assert wire(full) == full
    with pytest.raises(DecodeError):
        wire(m.Handoff(full.tasks + (("one-more", 1.0),)))


def test_a_lease_of_up_to_thirty_days_is_read_and_a_longer_one_refused() -> None:
    claim = m.Claim("t1", 2, 30 * 86400.0)
    assert wire(claim) == claim
    for bad in (30 * 86400.0 + 1, -1.0):
        with pytest.raises(DecodeError):
            wire(m.Claim("t1", 2, bad))


def test_answers_round_trip_with_and_without_their_optional_fields() -> None:
    for answer in (m.Answer("t1", m.GO), m.Answer("t1", m.GO, lease=2.5, n=3),
                   m.Answer("t1", m.ENDED, state="failed", attempts=4, last={"status": 500}),
                   m.Answer("t1", m.ENDED, state="succeeded"),
                   m.Answer("t1", m.REHOMED, replicas=("a", "c"))):
        assert wire(answer) == answer, answer
    with pytest.raises(DecodeError):
        wire(m.Answer("t1", m.ENDED))  # an ended answer names its end state


def test_a_store_names_its_reply_address_and_maybe_a_folded_ask() -> None:
    task = {"id": "t1"}
    for store in (m.Store("r1", "tcp://10.0.0.1:6000", task),
                  m.Store("r1", "tcp://10.0.0.1:6000", task, ask=2, lease=40.0),
                  m.Store("r1", "tcp://" + "h" * 294, task)):  # 300 characters: the most
        assert wire(store) == store, store
    for address in ("tcp://" + "h" * 295, "http://10.0.0.1:6000", "10.0.0.1:6000"):
        with pytest.raises(DecodeError):
            wire(m.Store("r1", address, task))


def raw(verb: protocol.Verb, payload: dict) -> object:
    """A peer's payload as it arrives: its bytes, then the typed decoder."""
    return wm.decode(*protocol.decode(protocol.encode(verb, payload)))


def test_a_handoff_item_that_is_not_an_id_and_delay_pair_refuses_the_handoff() -> None:
    """Each item is [id, delay]: a number, a string, an object or a list of another
    length refuses the HANDOFF (DecodeError, never a crash or a pair read from a
    longer list)."""
    ok = {"tasks": [["t1", 1.5]]}
    assert raw(protocol.Verb.HANDOFF, ok) == m.Handoff((("t1", 1.5),))
    for item in (5, "ab", {"id": "t1", "delay": 1.5}, ["t1"], ["t1", 1.5, "x"]):
        with pytest.raises(DecodeError):
            raw(protocol.Verb.HANDOFF, {"tasks": [["t0", 1.0], item]})


def test_a_replicas_message_round_trips_and_an_empty_set_is_refused() -> None:
    msg = m.Replicas("t1", ("d", "b", "c"))
    assert wire(msg) == msg
    assert wire(m.Replicas("t1", ("a",))) == m.Replicas("t1", ("a",))
    with pytest.raises(DecodeError):
        raw(protocol.Verb.REPLICAS, {"id": "t1", "replicas": []})


def test_an_ask_round_trips_with_each_optional_field_alone() -> None:
    """Each optional field is sent only when set, and read back as sent (a probe
    that arrived as a plain ASK would be answered as a delivery)."""
    for ask in (m.Ask("t1", 1), m.Ask("t1", 1, probe=True), m.Ask("t1", 2, n=4),
                m.Ask("t1", 0, reruns=2), m.Ask("t1", 0, lease=62.5),
                m.Ask("t1", 0, order=("q", "k", 7)), m.Ask("t1", 0, revision="r2"),
                m.Ask("t1", 2, True, 4, 2, 62.5, ("q", "k", 7), "r2")):
        assert wire(ask) == ask, ask
    assert m.Ask("t1", 1).payload() == {"id": "t1", "replica": 1}


def test_a_stored_round_trips_with_and_without_its_optional_fields() -> None:
    """STORED's seq, duplicate, error and answer are read back as sent; left out they
    read as 0 / None (a seq of 0: the copy has no place in a line yet)."""
    go = m.Answer("t1", m.GO, lease=2.5, n=3)
    for stored in (m.Stored("r1", "t1", True), m.Stored("r1", "t1", True, seq=9),
                   m.Stored("r1", "t1", False, duplicate="t0"),
                   m.Stored("r1", "t1", False, error="queue is full"),
                   m.Stored("r1", "t1", True, answer=go),
                   m.Stored("r1", "t1", True, None, None, go, 9)):
        assert wire(stored) == stored, stored
    assert m.Stored("r1", "t1", True).payload() == {"req": "r1", "id": "t1", "ok": True}
    decoded = raw(protocol.Verb.STORED, {"req": "r1", "id": "t1", "ok": True})
    assert decoded.seq == 0 and decoded.answer is None and decoded.error is None


def test_a_stored_whose_answer_is_about_another_task_is_refused() -> None:
    other = m.Answer("t2", m.GO).payload()
    with pytest.raises(DecodeError):
        raw(protocol.Verb.STORED, {"req": "r1", "id": "t1", "ok": True, "answer": other})
