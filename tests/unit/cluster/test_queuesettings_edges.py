"""Which queues the definitions pause or resume (cluster/queuesettings.py), told as the
node's ``control`` sees it: every queue with a new pause edge in one change, however
many queues without one come before it, and none that is so already (a resume of a
running queue would restagger its copies for nothing). The pause rules themselves:
test_queuesettings_pure.py."""

from __future__ import annotations

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


def test_every_queue_with_a_new_edge_is_told_past_ones_without(parts) -> None:
    engine, qs, told = parts
    qs.apply([("a", {"rate": 1.0}), ("b", {"rate": 1.0}), ("c", {"rate": 1.0})])
    for name in "abc":
        engine.pause(name, False)  # each running, as a queue in use is
    assert told == []
    # all three change; b's pause is as it was, a's and c's have a new edge
    assert qs.apply([("a", {"rate": 2.0, "paused": True}), ("b", {"rate": 2.0}),
                     ("c", {"rate": 2.0, "paused": True})]) == ["a", "b", "c"]
    assert told == [("a", "pause"), ("c", "pause")]
    assert paused(engine, "a") and not paused(engine, "b") and paused(engine, "c")


def test_a_queue_already_so_is_not_told_again(parts) -> None:
    engine, qs, told = parts
    engine.pause("mail", True)  # POST /queues/mail/pause before the definition says so
    assert qs.apply([("mail", {"paused": True})]) == ["mail"]
    assert told == [] and paused(engine, "mail")
    # a definition of running for a queue that runs: an edge, but nothing to do
    assert qs.apply([("sms", {"paused": False})]) == ["mail", "sms"]
    assert told == [("mail", "resume")]  # mail's definition went: back to the config's
    assert not paused(engine, "sms") and not paused(engine, "mail")
