"""A repeat of a held name (tasks/repeat.py): its fields checked, and what it does to the
held task: kept, replaced, its eta pushed back (bounded by debounce_max), revisions
ordered."""

from __future__ import annotations

import pytest

from miyamoto.tasks import repeat
from miyamoto.tasks.checks import ValidationError

pytestmark = pytest.mark.timeout(10)

DAY = 86400.0
NEW = {"params": {"a": "2"}, "body": None, "content_type": None, "eta": 105.0}


def test_no_repeat_fields_reject_as_before() -> None:
    assert repeat.parse({}, named=False, max_delay=DAY) is repeat.REJECT
    assert repeat.parse({"on_duplicate": None}, named=True, max_delay=DAY) is repeat.REJECT


@pytest.mark.parametrize("fields,named,field", [
    ({"on_duplicate": "keep"}, False, "on_duplicate"),  # a name is needed
    ({"debounce": 5}, False, "debounce"),
    ({"on_duplicate": "merge"}, True, "on_duplicate"),
    ({"debounce": 0}, True, "debounce"),
    ({"debounce": "soon"}, True, "debounce"),
    ({"debounce": 2 * DAY}, True, "debounce"),
    ({"debounce_max": 5}, True, "debounce_max"),  # without debounce
    ({"debounce": 5, "debounce_max": 2}, True, "debounce_max"),
    ({"debounce": 5, "on_duplicate": "reject"}, True, "on_duplicate"),
])
def test_bad_repeat_fields_name_the_field(fields, named, field) -> None:
    with pytest.raises(ValidationError) as e:
        repeat.parse(fields, named=named, max_delay=DAY)
    assert e.value.field == field


def test_parse_defaults() -> None:
    assert repeat.parse({"on_duplicate": "replace"}, True, DAY) == repeat.Repeat("replace")
    # debounce keeps by default, up to 10 debounces; a form's strings are numbers
    assert repeat.parse({"debounce": "5"}, True, DAY) == repeat.Repeat("keep", 5.0, 50.0)
    assert repeat.parse({"debounce": 5, "debounce_max": 7, "on_duplicate": "replace"}, True,
                        DAY) == repeat.Repeat("replace", 5.0, 7.0)


def test_keep_changes_nothing() -> None:
    d = repeat.decide(repeat.Repeat("keep"), {"eta": 100.0, "created": 90.0}, NEW, 95.0)
    assert d.keep and d.changes == {}


def test_replace_takes_the_repeats_params_body_and_eta() -> None:
    d = repeat.decide(repeat.Repeat("replace"), {"eta": 100.0, "created": 90.0}, NEW, 95.0)
    assert not d.keep
    assert d.changes == {"params": {"a": "2"}, "body": None, "content_type": None}
    assert d.delay == pytest.approx(10.0)  # eta 105, now 95


def test_debounce_pushes_the_eta_back_up_to_debounce_max() -> None:
    r = repeat.Repeat("keep", 5.0, 12.0)
    held = {"eta": 95.0, "created": 90.0}
    d = repeat.decide(r, held, NEW, 93.0)  # now + 5 = 98
    assert not d.keep and d.changes == {} and d.delay == pytest.approx(5.0)
    d = repeat.decide(r, {"eta": 98.0, "created": 90.0}, NEW, 100.0)  # 105, capped at 102
    assert d.delay == pytest.approx(2.0)
    # at the cap already: kept as it is
    assert repeat.decide(r, {"eta": 102.0, "created": 90.0}, NEW, 101.0).keep
    # an eta later than now + debounce is not pulled forward
    assert repeat.decide(r, {"eta": 101.0, "created": 90.0}, NEW, 91.0).keep


def test_debounce_with_replace_moves_the_new_eta_too() -> None:
    r = repeat.Repeat("replace", 5.0, 50.0)
    d = repeat.decide(r, {"eta": 95.0, "created": 90.0}, dict(NEW, eta=96.0), 96.0)
    assert d.changes["params"] == {"a": "2"} and d.delay == pytest.approx(5.0)


def test_revisions_order_by_time_then_id() -> None:
    a, b = repeat.stamp(5, "b-id"), repeat.stamp(10, "a-id")
    assert "" < a < b and repeat.stamp(10, "a-id") < repeat.stamp(10, "b-id")
    assert repeat.stamp(2**63, "x") > repeat.stamp(10**18, "x")


def test_a_debounce_may_be_under_a_second_but_not_zero() -> None:
    got = repeat.parse({"debounce": 0.5}, named=True, max_delay=100)
    assert (got.debounce, got.debounce_max) == (0.5, 5.0)
    assert repeat.parse({"debounce": 1, "debounce_max": 0.9 + 0.1}, named=True,
                        max_delay=100).debounce_max == 1.0
    assert repeat.parse({"debounce": 100}, named=True, max_delay=100).debounce == 100
    for bad in (0, -1, 100.5):
        with pytest.raises(ValidationError, match=r"must be in \(0, 100\] seconds"):
            repeat.parse({"debounce": bad}, named=True, max_delay=100)
