"""miyamoto.wire.checks: the bounds every decoded payload field is held to."""

from __future__ import annotations

import pytest

from miyamoto.replicas import messages as m
from miyamoto.wire import checks
from miyamoto.wire.verbs import DecodeError


def test_payload_integer_and_name_bounds():
    assert checks.MAX_INT == 2**53 - 1 and checks.MAX_NAME == 512
    assert checks.integer({"k": 2**53 - 1}, "k") == 2**53 - 1
    with pytest.raises(DecodeError):
        checks.integer({"k": 2**53}, "k")
    assert checks.string({"k": "x" * 512}, "k") == "x" * 512
    with pytest.raises(DecodeError):
        checks.string({"k": "x" * 513}, "k")


def test_payload_string_lists():
    assert checks.str_list({"k": ["a", "x" * 512]}, "k") == ("a", "x" * 512)
    for bad in ("ab", ["a", ""], ["x" * 513], [1], None, ["a"] * (checks.MAX_MEMBERS + 1)):
        with pytest.raises(DecodeError):
            checks.str_list({"k": bad}, "k")


def test_history_entries_are_checked_and_bounded():
    entry = {"start": 1.5, "duration": 0.25, "node": "a", "status": 500, "error": None}
    # a peer's extra keys are not kept; a long error, a bad status or node are refused
    assert checks.opt_attempt({"a": dict(entry, junk="x" * 10_000)}, "a") == entry
    for bad in ({"error": "e" * 201}, {"status": "500"}, {"status": 1000}, {"node": 5},
                {"duration": -1.0}, {"start": float("nan")}):
        with pytest.raises(DecodeError):
            checks.opt_attempt({"a": dict(entry, **bad)}, "a")
    msg = m.Retry.from_payload(m.Retry("t", 1, 0.5, 2, None, entry).payload())
    assert msg.attempt == entry
    assert m.Failed.from_payload({"id": "t", "attempts": 1}).attempt is None
    with pytest.raises(DecodeError):
        m.Done.from_payload({"id": "t", "attempts": 1, "attempt": dict(entry, status=True)})
