"""A queue's settings as a definition (``miyamoto.definitions.queues``): what a PUT may
say, how it merges, what is checked again from a peer, and where each value comes from."""

from __future__ import annotations

import pytest

from miyamoto.config.settings import QUEUE_FIELDS, QueueConfig, load
from miyamoto.definitions import queues as q
from miyamoto.tasks.checks import ValidationError

pytestmark = pytest.mark.timeout(30)


def _refused(data: object) -> str:
    with pytest.raises(ValidationError) as e:
        q.parse_put(data)
    assert e.value.status == 400
    return e.value.field


def test_every_field_is_checked_and_named() -> None:
    assert q.parse_put({"rate": 5, "burst": 10.0, "paused": True, "timeout": 0.5}) == \
        {"rate": 5.0, "burst": 10, "paused": True, "timeout": 0.5}
    assert isinstance(q.parse_put({"rate": 5})["rate"], float)
    for data, field in [({"rate": -1}, "rate"), ({"rate": "5"}, "rate"),
                        ({"rate": True}, "rate"), ({"rate": float("inf")}, "rate"),
                        ({"burst": 0}, "burst"), ({"burst": 2.5}, "burst"),
                        ({"max_attempts": 0}, "max_attempts"),
                        ({"max_doublings": 65}, "max_doublings"),
                        ({"timeout": 0}, "timeout"), ({"timeout": 1801}, "timeout"),
                        ({"paused": 1}, "paused"), ({"paused": "yes"}, "paused"),
                        ({"max_concurrent": -1}, "max_concurrent"),
                        ({"rat": 5}, "rat"), ({"name": "x"}, "name"),
                        ([], "body"), ("rate=5", "body")]:
        assert _refused(data) == field, data


DAY = 86400
# each setting's range as a client may PUT it: (lowest, highest, a step beyond either end)
RANGES = {"rate": (0.0, 1e6, 0.001), "burst": (1, 1_000_000, 1),
          "max_concurrent": (0, 1_000_000, 1), "max_attempts": (1, q.MAX_ATTEMPTS, 1),
          "min_backoff": (0.0, 30 * DAY, 0.001), "max_backoff": (0.0, 30 * DAY, 0.001),
          "max_doublings": (0, 64, 1), "max_retry_duration": (0.0, 365 * DAY, 0.001),
          "timeout": (0.01, q.MAX_TIMEOUT, 0.001)}


@pytest.mark.parametrize("field", sorted(RANGES))
def test_each_setting_takes_its_range_ends_and_nothing_beyond(field: str) -> None:
    lo, hi, step = RANGES[field]
    assert q.parse_put({field: lo}) == {field: lo} and q.parse_put({field: hi}) == {field: hi}
    assert _refused({field: lo - step}) == field and _refused({field: hi + step}) == field


def test_an_out_of_range_value_is_told_the_range_as_the_setting_counts() -> None:
    """A whole-number setting's range is shown in whole numbers, a fractional one's as it
    is: a timeout of 0 is told 0.01, not 0."""
    for data, said in [({"timeout": 0}, "must be between 0.01 and 1800"),
                       ({"burst": 0}, "must be between 1 and 1e+06"),
                       ({"rate": -1}, "must be between 0 and 1e+06")]:
        with pytest.raises(ValidationError) as e:
            q.parse_put(data)
        assert said in str(e.value), (data, str(e.value))


def test_a_null_drops_a_value_and_a_merge_keeps_the_rest() -> None:
    changes = q.parse_put({"rate": None, "burst": 3})
    assert changes == {"rate": None, "burst": 3}
    assert q.merged({"rate": 5.0, "paused": True}, changes) == {"burst": 3, "paused": True}
    assert q.merged(None, {"rate": None}) == {}


def test_a_peers_value_is_checked_again_and_holds_no_null() -> None:
    assert q.stored({"rate": 2}) == {"rate": 2.0}
    for bad in ({"rate": None}, {"rate": -2}, {"evil": 1}, ["rate"]):
        with pytest.raises(ValidationError):
            q.stored(bad)


def test_backoffs_that_contradict_the_configs_are_refused_naming_the_field() -> None:
    base = QueueConfig(min_backoff=10.0, max_backoff=60.0)
    q.check(base, {"max_backoff": 10.0})
    with pytest.raises(ValidationError) as e:
        q.check(base, {"max_backoff": 5.0})
    assert e.value.field == "max_backoff"
    with pytest.raises(ValidationError) as e:
        q.check(base, {"min_backoff": 61.0})
    assert e.value.field == "min_backoff"


def test_the_api_overrides_the_config_which_overrides_the_default(tmp_path) -> None:
    ini = tmp_path / "m.ini"
    ini.write_text("[queue:default]\nmax_attempts = 7\n[queue:mail]\nrate = 3\n")
    cfg = load(str(ini), env={}, flags={"data_dir": str(tmp_path / "d")})
    mail = cfg.queue("mail")
    api = {"rate": 9.0, "paused": True}
    got = q.resolve(mail, api)
    assert (got.rate, got.paused, got.max_attempts, got.burst) == (9.0, True, 7, 100)
    assert q.resolve(mail, None) is mail and q.resolve(mail, {}) is mail
    sources = q.sources(mail, api)
    assert set(sources) == set(q.FIELDS) and set(sources.values()) <= set(q.SOURCES)
    assert (sources["rate"], sources["paused"], sources["max_attempts"], sources["burst"]) == \
        ("api", "api", "config", "default")
    # a queue the INI does not name takes [queue:default]'s options: those are the config's
    other = q.sources(cfg.queue("other"), None)
    assert (other["max_attempts"], other["rate"]) == ("config", "default")
    assert q.sources(QueueConfig(), None) == {k: "default" for k in q.FIELDS}


def test_every_setting_is_a_queue_option_of_the_ini() -> None:
    assert set(q.FIELDS) == set(QUEUE_FIELDS)


def test_a_refusal_says_what_the_field_takes() -> None:
    for data, words in [({"rate": "5"}, "must be a number"), ({"burst": "5"}, "must be an integer"),
                        ({"rate": float("inf")}, "must be a finite number"),
                        ({"max_backoff": float("nan")}, "must be a finite number")]:
        with pytest.raises(ValidationError) as e:
            q.parse_put(data)
        assert words in str(e.value), data
