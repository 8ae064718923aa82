"""Fan-out topics, in-process: a topic's stored value and the tasks an enqueue naming
it becomes. The routes and real deliveries are tests/nodes/test_topics_node.py's."""

from __future__ import annotations

import hashlib

import pytest

from miyamoto.definitions import topics
from miyamoto.tasks.validate import Limits, ValidationError

pytestmark = pytest.mark.timeout(30)

URLS = ["http://a/1", "http://b/2"]


def suffixed(name: str, url: str) -> str:
    return f"{name}:{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def expand(fields: dict, key: str | None = None, queue: str | None = None) -> list:
    return topics.expand(fields, URLS, path_queue=queue, idempotency_key=key,
                         limits=Limits(), now=1.0)


def test_parse_topic_checks_each_url() -> None:
    deny = Limits(targets=lambda host, port: "metadata" if host == "169.254.169.254" else None)
    assert topics.parse_topic({"urls": URLS}, deny) == {"urls": URLS}
    for body, field in [({"urls": []}, "urls"), ({"urls": ["http://a/", "ftp://b"]}, "urls[1]"),
                        ({"urls": ["http://169.254.169.254/x"]}, "urls[0]"),
                        ({"urls": ["http://a/"] * 2}, "urls"),
                        ({"urls": ["http://a/%d" % i for i in range(101)]}, "urls"),
                        ({"urls": "http://a/"}, "urls"), ({}, "urls"),
                        ({"urls": ["http://a/"], "x": 1, "w": 2}, "w"),
                        (["http://a/"], "body")]:
        with pytest.raises(ValidationError) as e:
            topics.parse_topic(body, deny)
        assert e.value.field == field, body


def test_a_topic_holds_one_to_max_urls() -> None:
    one, most = ["http://a/0"], [f"http://a/{i}" for i in range(topics.MAX_URLS)]
    assert topics.parse_topic({"urls": one}, Limits())["urls"] == one
    assert topics.parse_topic({"urls": most}, Limits())["urls"] == most


def test_expand_suffixes_the_name_per_url() -> None:
    tasks = expand({"topic": "t", "name": "n", "params": {"k": "v"}}, queue="q")
    assert [t.url for t in tasks] == URLS
    assert [t.name for t in tasks] == [suffixed("n", u) for u in URLS]
    assert len({t.id for t in tasks}) == 2 and all(t.params == {"k": "v"} for t in tasks)
    assert {t.queue for t in tasks} == {"q"}
    with pytest.raises(ValidationError) as e:
        expand({"topic": "t", "url": "http://a/"})
    assert e.value.field == "topic"


def test_the_idempotency_key_names_a_fan_out_as_a_name_would() -> None:
    """A client that retries with an Idempotency-Key must get the same names again, so
    the second fan-out is refused URL by URL instead of delivered twice."""
    tasks = expand({"topic": "t"}, key="k-9")
    assert [t.name for t in tasks] == [suffixed("k-9", u) for u in URLS]
    # a name in the body wins over the header, as on a plain enqueue
    assert [t.name for t in expand({"topic": "t", "name": "n"}, key="k-9")] == [
        suffixed("n", u) for u in URLS]
    assert [t.name for t in expand({"topic": "t"})] == [None, None]


def test_a_name_that_is_not_text_is_refused() -> None:
    with pytest.raises(ValidationError) as e:
        expand({"topic": "t", "name": 7})
    assert e.value.field == "name"


def test_topic_name_is_checked_like_a_schedule_name() -> None:
    assert topics.topic_name({"topic": "orders-1"}) == "orders-1"
    for bad in ({"topic": "a/b"}, {"topic": ""}, {}):
        with pytest.raises(ValidationError) as e:
            topics.topic_name(bad)
        assert e.value.field == "topic"


def test_an_eta_is_on_the_clusters_clock_and_without_an_offset_on_ours() -> None:
    """An eta names the cluster's clock: with no offset given (ours is the cluster's)
    each task is due at the eta itself; with one, at eta - offset on ours."""
    assert [t.eta for t in expand({"topic": "t", "eta": 50.0})] == [50.0, 50.0]
    shifted = topics.expand({"topic": "t", "eta": 50.0}, URLS, path_queue=None,
                            idempotency_key=None, limits=Limits(), now=1.0, offset=10.0)
    assert [t.eta for t in shifted] == [40.0, 40.0]
