"""miyamoto.wire.checks: the bounds every decoded payload field is held to."""

from __future__ import annotations

import pytest

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
