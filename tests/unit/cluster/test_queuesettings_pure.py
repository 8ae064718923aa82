"""Queue definitions carried into the engine (cluster/queuesettings.py) without a node:
a real engine on an in-memory journal; ``control`` is the node's pause or resume, here
applied to that engine. A pause follows its definition's edge only, so a POST pause or
resume in between is not undone by another setting's change. The HTTP side on a real
node is test_queuesettings.py."""

from __future__ import annotations

import logging

import pytest

from enginekit import memory_engine
from miyamoto.cluster.queuesettings import QueueSettings

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def parts():
    with memory_engine(1_000_000.0) as (engine, _clock):
        told: list[tuple[str, str]] = []

        def control(name: str, action: str) -> None:
            told.append((name, action))
            engine.pause(name, action == "pause")

        yield engine, QueueSettings(engine, control), told


def paused(engine, name: str) -> bool:
    return engine.dispatcher.summary(name)[1]


def test_a_definitions_pause_is_applied_on_its_edge_only(parts) -> None:
    engine, qs, told = parts
    assert qs.apply([("mail", {"paused": True})]) == ["mail"]
    assert paused(engine, "mail")
    engine.pause("mail", False)  # POST /queues/mail/resume meanwhile
    assert qs.apply([("mail", {"paused": True, "rate": 2.0})]) == ["mail"]
    assert not paused(engine, "mail")  # no new edge: the resume stands
    assert qs.apply([("mail", {"paused": False, "rate": 2.0})]) == ["mail"]
    assert not paused(engine, "mail")
    assert qs.apply([("mail", {"paused": True, "rate": 2.0})]) == ["mail"]
    assert paused(engine, "mail")  # a new edge


def test_a_pause_that_leaves_the_definition_goes_back_to_the_configs(parts) -> None:
    engine, qs, told = parts
    qs.apply([("mail", {"paused": True})])
    assert paused(engine, "mail")
    assert qs.apply([("mail", {"rate": 2.0})]) == ["mail"]  # paused no longer defined
    assert not paused(engine, "mail")


def test_a_change_elsewhere_touches_no_other_queue(parts) -> None:
    engine, qs, told = parts
    qs.apply([("mail", {"paused": True}), ("sms", {"rate": 1.0})])
    assert paused(engine, "mail") and not paused(engine, "sms")
    engine.pause("mail", False)
    assert qs.apply([("mail", {"paused": True}), ("sms", {"rate": 3.0})]) == ["sms"]
    assert not paused(engine, "mail")
    assert engine.dispatcher.summary("sms")[0].rate == 3.0
    assert qs.apply([("mail", {"paused": True}), ("sms", {"rate": 3.0})]) == []


def test_a_definition_that_does_not_fit_is_left_out(parts, caplog) -> None:
    engine, qs, told = parts
    caplog.set_level(logging.WARNING, logger="miyamoto.cluster.queuesettings")
    assert qs.apply([("mail", {"rate": "fast"}), ("sms", {"paused": True})]) == ["sms"]
    assert paused(engine, "sms") and not paused(engine, "mail")
    assert any("mail" in r.getMessage() for r in caplog.records)
