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
