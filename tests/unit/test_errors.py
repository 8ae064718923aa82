"""The errors the HTTP API turns into answers (``miyamoto.errors``)."""

from __future__ import annotations

import pytest

from miyamoto.errors import Conflict, Duplicate, Unavailable

pytestmark = pytest.mark.timeout(10)


def test_a_duplicate_names_the_task_holding_the_name() -> None:
    e = Duplicate("t-1")
    assert e.original_id == "t-1" and str(e) == "t-1" and e.args == ("t-1",)
    assert str(Conflict("succeeded")) == "succeeded" and str(Unavailable("stopping")) == "stopping"
