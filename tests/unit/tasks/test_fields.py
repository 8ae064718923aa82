"""A task's dispatch fields (``miyamoto.tasks.fields``): priority and the flow-control key
with its rate and parallelism, checked alike on an enqueue (ValidationError, a 400
naming the field) and on a stored or replicated copy (DecodeError), so a copy one node
took is never refused by its sibling. Their effect on delivery: tests/unit/delivery/
test_priorities.py and test_flow.py."""

from __future__ import annotations

from typing import Any

import pytest

from miyamoto.tasks import fields as f
from miyamoto.tasks.validate import ValidationError
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(10)

# the README's limits, spelled out: priority 0-9, a key of at most 200 characters; a rate
# above 1e6 tasks/s or more than 100,000 in flight means nothing and is refused

EDGES_OK = [{"priority": 0}, {"priority": 9}, {"flow_key": "k" * 200},
            {"flow_key": "k", "flow_rate": 1_000_000.0},
            {"flow_key": "k", "flow_rate": 1e-9},
            {"flow_key": "k", "flow_parallelism": 1},
            {"flow_key": "k", "flow_parallelism": 100_000},
            {"flow_key": "é ü"}, {"ordering_key": "o" * 200}, {"ordering_key": "acct 42/é"}]
EDGES_BAD = [({"priority": 10}, "priority"), ({"priority": -1}, "priority"),
             ({"flow_key": ""}, "flow_key"), ({"flow_key": "k" * (200 + 1)}, "flow_key"),
             ({"flow_key": "a\x1fb"}, "flow_key"), ({"flow_key": "a\x7fb"}, "flow_key"),
             ({"flow_key": "k", "flow_rate": 0}, "flow_rate"),
             ({"flow_key": "k", "flow_rate": 1_000_000.5}, "flow_rate"),
             ({"flow_key": "k", "flow_parallelism": 0}, "flow_parallelism"),
             ({"flow_key": "k", "flow_parallelism": 100_000 + 1},
              "flow_parallelism"),
             ({"flow_rate": 1.0}, "flow_rate"), ({"flow_parallelism": 2}, "flow_parallelism"),
             ({"ordering_key": ""}, "ordering_key"),
             ({"ordering_key": "o" * 201}, "ordering_key"),
             ({"ordering_key": "a\nb"}, "ordering_key"),
             ({"ordering_key": "a\x85b"}, "ordering_key")]


@pytest.mark.parametrize("given", EDGES_OK)
def test_the_edges_are_taken_on_both_sides(given: dict[str, Any]) -> None:
    assert f.parse(given) == given
    f.check_decoded(dict(given))


@pytest.mark.parametrize("given,field", EDGES_BAD)
def test_past_the_edges_both_sides_refuse(given: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        f.parse(given)
    assert e.value.field == field and e.value.status == 400
    with pytest.raises(DecodeError):
        f.check_decoded(dict(given))


def test_only_the_fields_given_and_form_strings_read_as_numbers() -> None:
    assert f.parse({}) == {} and f.parse({"priority": None, "flow_key": None}) == {}
    assert f.parse({"priority": "3", "flow_key": "k", "flow_rate": "2.5",
                    "flow_parallelism": "4"}) == {"priority": 3, "flow_key": "k",
                                                  "flow_rate": 2.5, "flow_parallelism": 4}
    f.check_decoded({})  # the default priority is in range
    with pytest.raises(ValidationError) as e:
        f.parse({"flow_key": 7})
    assert e.value.field == "flow_key"
    assert "1-200 characters" in e.value.message
    with pytest.raises(ValidationError) as e:
        f.parse({"flow_key": "k", "flow_rate": -1})
    assert e.value.message == "must be in (0, 1e+06] tasks/s"
    with pytest.raises(ValidationError) as e:
        f.parse({"flow_rate": 2})
    assert e.value.message == "goes with flow_key"


def test_the_default_priority_is_the_tasks() -> None:
    """README: priority 5 unless given; the checks and the OpenAPI default read it here."""
    from miyamoto.tasks.task import Task
    assert f.PRIORITY_DEFAULT == 5 == Task(id="i", queue="q", url="u").priority
