"""metrics.py's queue labels: the per-queue series are capped, and the scrape says how many
queues it left out. (Named apart from tests/nodes/test_metrics.py: pytest needs distinct
basenames.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from miyamoto.config import settings
from miyamoto.engine.queues import Queues
from miyamoto.metrics import MAX_QUEUES, OTHER, Metrics, NodeCollector

pytestmark = pytest.mark.timeout(10)


def test_queues_beyond_the_label_cap_are_summed_and_counted() -> None:
    held = Queues(["default"], max_queues=1000, auto_create=True, idle_expiry=0)
    for i in range(MAX_QUEUES + 49):  # with default: 50 beyond the cap
        held.note(f"q{i:04d}", 0.0)
    depth = {(f"q{i:04d}", "scheduled"): 1 for i in range(MAX_QUEUES + 49)}
    engine = SimpleNamespace(queues=held, live_depth=lambda: depth,
                             dispatcher=SimpleNamespace(queues={}), oldest_due=dict)
    node = SimpleNamespace(engine=engine, config=settings.load(env={}))
    fams = {f.name: f for f in NodeCollector(node, Metrics())._queues()}  # type: ignore[arg-type]
    assert fams["miyamoto_queues"].samples[0].value == MAX_QUEUES + 50
    assert fams["miyamoto_queues_unlabelled"].samples[0].value == 50
    tasks = fams["miyamoto_queue_tasks"].samples
    labels = {s.labels["queue"] for s in tasks}
    assert len(labels) == MAX_QUEUES + 1 and OTHER in labels  # 200 queues and the rest
    other = [s.value for s in tasks if s.labels == {"queue": OTHER, "state": "scheduled"}]
    assert other == [50 - 1]  # default holds nothing: the 49 others' copies
