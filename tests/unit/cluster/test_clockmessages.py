"""CLOCK and its echo (cluster/clockmessages.py): a peer's times are untrusted input,
so only a plausible unix time decodes; the rest is a DecodeError (a counted drop)."""

from __future__ import annotations

import pytest

from miyamoto.cluster.clockmessages import Clock, ClockEcho
from miyamoto.wire import messages
from miyamoto.wire.verbs import DecodeError, Verb

pytestmark = pytest.mark.timeout(30)


def test_a_probe_and_its_echo_round_trip():
    probe = Clock(1_790_000_000.25)
    assert messages.decode(Verb.CLOCK, probe.payload()) == probe
    echo = ClockEcho(1_790_000_000.25, 1_790_000_030.5)
    assert messages.decode(Verb.CLOCK_ECHO, echo.payload()) == echo
    assert echo.payload() == {"t1": 1_790_000_000.25, "t": 1_790_000_030.5}


@pytest.mark.parametrize("bad", [0, -1.0, 1e11, 2e11, "1790000000", None,
                                 float("nan"), True])
def test_a_time_that_is_no_unix_time_is_refused(bad):
    with pytest.raises(DecodeError, match="t1"):
        messages.decode(Verb.CLOCK, {"t1": bad})
    with pytest.raises(DecodeError, match="t1"):
        messages.decode(Verb.CLOCK_ECHO, {"t1": bad, "t": 1_790_000_000.0})
    with pytest.raises(DecodeError, match="^t "):
        messages.decode(Verb.CLOCK_ECHO, {"t1": 1_790_000_000.0, "t": bad})


def test_the_edges_of_the_range():
    assert messages.decode(Verb.CLOCK, {"t1": 0.001}).t1 == 0.001
    assert messages.decode(Verb.CLOCK, {"t1": 1e11 - 1}).t1 == 1e11 - 1  # year 5138
