"""The engine's store span (tracing on, the OpenTelemetry SDK's in-memory exporter): one
``miyamoto store`` span per copy committed, timed from before its commit to after it.
The whole trace on a real node is tests/unit/test_tracing.py."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from enginekit import memory_engine
from miyamoto.tasks.task import Task
from miyamoto.tracing import traces

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    assert traces.start("n1", provider)
    yield spans
    traces.stop()


def test_a_store_span_covers_the_copys_commit(exporter) -> None:
    with memory_engine(NOW) as (engine, _clock):
        before = time.time_ns()
        engine.add(Task(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30,
                        created=NOW, fire_at=NOW + 30, replicas=("x", "y"), replica=1))
        after = time.time_ns()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "miyamoto store"]
    assert before <= span.start_time <= span.end_time <= after
    assert span.attributes["miyamoto.task.id"] == "t1"
    assert span.attributes["miyamoto.replica"] == 1
