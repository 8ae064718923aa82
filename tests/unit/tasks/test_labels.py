"""A task's labels (tasks/labels.py): an enqueue's checked naming the field, a form's
k=v,k2=v2, a peer's checked as untrusted bytes, and GET /tasks?label='s k=v."""

from __future__ import annotations

import pytest

from miyamoto.tasks import labels
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.task import Task
from miyamoto.wire.verbs import DecodeError

pytestmark = pytest.mark.timeout(10)


def test_labels_parse_json_and_form() -> None:
    assert labels.parse({}) == {}
    assert labels.parse({"labels": {"team": "a", "env.x": ""}}) == {"team": "a", "env.x": ""}
    assert labels.parse({"labels": "team=a, env=prod=1"}) == {"team": "a", "env": "prod=1"}


@pytest.mark.parametrize("value,field", [
    ({f"k{i}": "v" for i in range(11)}, "labels"),
    ({"Team": "a"}, "labels.Team"),
    ({"": "a"}, "labels."),
    ({"k" * 65: "a"}, "labels." + "k" * 64),
    ({"team": "x" * 257}, "labels.team"),
    ({"team": 3}, "labels.team"),
    (["team=a"], "labels"),
    ("team", "labels"),
])
def test_bad_labels_name_the_field(value, field) -> None:
    with pytest.raises(ValidationError) as e:
        labels.parse({"labels": value})
    assert e.value.field == field


def test_a_label_filter() -> None:
    assert labels.label_filter("team=a=b") == ("team", "a=b")
    for bad in ("team", "=a", "Team=a"):
        with pytest.raises(ValueError):
            labels.label_filter(bad)


def test_a_peers_labels_are_checked_and_round_trip() -> None:
    t = Task(id="t", queue="q", url="http://w/x", labels={"team": "a"})
    assert Task.decode(t.encode()).labels == {"team": "a"}
    assert "labels" not in Task(id="t", queue="q", url="http://w/x").encode()
    for bad in ({"Team": "a"}, {"k": 1}, {f"k{i}": "" for i in range(11)}, ["x"]):
        with pytest.raises(DecodeError):
            Task.decode(dict(t.encode(), labels=bad))


def test_a_value_of_256_characters_is_taken_everywhere_and_257_nowhere() -> None:
    """README: a value is at most 256 characters, at the enqueue, in a filter and in a
    peer's copy alike."""
    full, over = "v" * 256, "v" * 257
    assert labels.parse({"labels": {"k": full}}) == {"k": full}
    with pytest.raises(ValidationError, match="at most 256 characters"):
        labels.parse({"labels": {"k": over}})
    assert labels.label_filter(f"k={full}") == ("k", full)
    with pytest.raises(ValueError):
        labels.label_filter(f"k={over}")
    labels.check_decoded({"labels": {"k": full}})
    with pytest.raises(DecodeError):
        labels.check_decoded({"labels": {"k": over}})
