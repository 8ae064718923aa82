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


def test_payload_numbers_strings_booleans_and_objects():
    assert checks.integer({"k": 0}, "k") == 0 and checks.integer({"k": 5}, "k", 5, 5) == 5
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(DecodeError, match="k must be an integer"):
            checks.integer({"k": bad}, "k")
    with pytest.raises(DecodeError):
        checks.integer({"k": 6}, "k", 5, 5)
    assert checks.number({"k": 2}, "k") == 2.0 and isinstance(checks.number({"k": 2}, "k"), float)
    for bad in (float("inf"), float("nan"), True, "1", None):
        with pytest.raises(DecodeError, match="k must be a finite number"):
            checks.number({"k": bad}, "k")
    for bad in ("", 5, None):
        with pytest.raises(DecodeError):
            checks.string({"k": bad}, "k")
    assert checks.string({"k": "abc"}, "k", max_len=3) == "abc"
    with pytest.raises(DecodeError):
        checks.string({"k": "abcd"}, "k", max_len=3)
    assert checks.opt_string({}, "k") is None and checks.opt_string({"k": "a"}, "k") == "a"
    assert checks.boolean({"k": False}, "k") is False
    assert checks.boolean({}, "k", default=True) is True
    for bad in ({"k": 1}, {"k": None}, {}):
        with pytest.raises(DecodeError, match="k must be a boolean"):
            checks.boolean(bad, "k")
    assert checks.obj({"k": {"a": 1}}, "k") == {"a": 1}
    for bad in ([], "x", None):
        with pytest.raises(DecodeError, match="k must be an object"):
            checks.obj({"k": bad}, "k")
    assert checks.opt_obj({}, "k") is None and checks.opt_obj({"k": {}}, "k") == {}
    assert checks.payload_list({"k": [1, "a"]}, "k", 2) == [1, "a"]
    for bad in ([1, 2, 3], {}, None):
        with pytest.raises(DecodeError):
            checks.payload_list({"k": bad}, "k", 2)


def test_an_attempt_at_its_bounds():
    entry = {"start": 1.0, "duration": 0.0, "node": "n" * checks.MAX_NAME, "status": 999,
             "error": "e" * checks.MAX_ERROR}
    assert checks.opt_attempt({"a": entry}, "a") == entry
    assert checks.opt_attempt({"a": dict(entry, status=0, error=None)}, "a")["status"] == 0
    assert checks.opt_attempt({"a": dict(entry, status=None)}, "a")["status"] is None
    assert checks.opt_attempt({}, "a") is None
    for bad in ({"status": -1}, {"node": "n" * (checks.MAX_NAME + 1)}, {"error": 5},
                {"duration": -0.001}, {"start": None}):
        with pytest.raises(DecodeError):
            checks.opt_attempt({"a": dict(entry, **bad)}, "a")


def test_a_history_keeps_its_last_well_formed_entries():
    good = [{"start": float(i), "duration": 0.1, "node": "a", "status": 200, "error": None}
            for i in range(5)]
    assert checks.attempt_list(good, 3) == tuple(good[-3:])
    assert checks.attempt_list([good[0], {"start": "x"}, None, 7, good[1]], 10) == (
        good[0], good[1])
    assert checks.attempt_list([], 3) == ()
    for bad in ({}, "x", None):
        with pytest.raises(DecodeError, match="history is not a list"):
            checks.attempt_list(bad, 3)


def test_lists_at_their_bounds():
    # a roster (or a task's replicas) of 1024 members is the most a peer may send
    assert len(checks.str_list({"k": ["m"] * 1024}, "k")) == 1024
    with pytest.raises(DecodeError):
        checks.str_list({"k": ["m"] * 1025}, "k")
    assert checks.str_list({"k": ["a", "b"]}, "k", max_items=2) == ("a", "b")
    with pytest.raises(DecodeError):
        checks.str_list({"k": ["a", "b", "c"]}, "k", max_items=2)
