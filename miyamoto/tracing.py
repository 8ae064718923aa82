"""Traces, with OpenTelemetry as an optional extra (``pip install miyamoto[otel]``).

A task carries a W3C ``traceparent`` (given at enqueue: the ``traceparent`` header of
POST /queue, or the task field); it is stored with every copy, travels in STOREs and
is sent to the target on every attempt, so a worker's trace continues the producer's
whether or not tracing is on here. With tracing on, the node adds its spans, all with
the task's id (``miyamoto.task.id``): ``miyamoto enqueue`` (a child of the producer's
span; the task keeps the enqueue span's traceparent from then on), ``miyamoto store``
on each node that commits a copy, and ``miyamoto attempt`` for each attempt (the
target gets the attempt span's traceparent, so its span is the attempt's child).

On when ``tracing = true``, or when the standard OTLP variables name an endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``; the exporter is OTLP over
HTTP, configured by the OTEL_* variables as every OpenTelemetry SDK is. Off (the
default) costs one attribute check per enqueue, commit and attempt: ``traces.on``; the
opentelemetry packages are not even imported (their imports, ~40 ms, are deferred to
``start``, which is why this module may defer them). One ``Traces`` per process, as
OpenTelemetry's provider is: ``traces``.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from miyamoto.tasks.task import Task

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(enabled: bool, env: Mapping[str, str] = os.environ) -> bool:
    """Whether tracing is asked for: by the ``tracing`` setting or an OTLP endpoint."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return enabled or any(env.get(v) for v in ENDPOINT_VARIABLES)


def _traceparent(span: Any) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


class Traces:
    def __init__(self) -> None:
        self.on = False
        self._api: Any = None  # opentelemetry.trace, once started
        self._tracer: Any = None
        self._own: Any = None  # the provider start() made (stop() flushes it)

    def start(self, node_id: str, provider: Any = None) -> bool:
        """Trace from now on, into ``provider`` (default: a new SDK provider exporting
        OTLP over HTTP); False (logged) if the opentelemetry packages are missing."""
        try:
            from opentelemetry import trace  # deferred: the optional extra, ~30 ms
            if provider is None:
                provider = self._otlp_provider(node_id)
                self._own = provider
        except ImportError as e:
            log.warning("tracing: off, the opentelemetry packages are missing (pip install "
                        "'miyamoto[otel]'): %s", e)
            return False
        self._api = trace
        self._tracer = provider.get_tracer("miyamoto")
        self.on = True
        return True

    @staticmethod
    def _otlp_provider(node_id: str) -> Any:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.instance.id": node_id}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "miyamoto"
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return provider

    def stop(self) -> None:
        """Stop tracing; the provider start() made sends what it holds, then shuts down."""
        self.on = False
        own, self._own = self._own, None
        if own is not None:
            own.shutdown()

    # ------------------------------------------------------------ spans
    def _parent(self, traceparent: str | None) -> Any:
        """The context of a stored traceparent (None: a new trace)."""
        if traceparent is None:
            return None
        api = self._api
        _, trace_id, span_id, flags = traceparent.split("-")
        ctx = api.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                              trace_flags=api.TraceFlags(int(flags, 16)))
        return api.set_span_in_context(api.NonRecordingSpan(ctx))

    def _start(self, name: str, task: Task, kind: str, start_time: int | None = None,
               **attributes: Any) -> Any:
        attributes["miyamoto.task.id"] = task.id
        attributes["miyamoto.queue"] = task.queue
        return self._tracer.start_span(name, context=self._parent(task.traceparent),
                                       kind=getattr(self._api.SpanKind, kind),
                                       attributes=attributes, start_time=start_time)

    @contextmanager
    def enqueue(self, tasks: list[Task]) -> Iterator[list[Task]]:
        """One ``miyamoto enqueue`` span per task, around storing them; yields the tasks
        holding their span's traceparent."""
        spans = [self._start("miyamoto enqueue", t, "SERVER") for t in tasks]
        try:
            yield [t.evolve(traceparent=_traceparent(s)) for t, s in zip(tasks, spans)]
        except Exception as e:
            for span in spans:
                span.set_status(self._api.Status(self._api.StatusCode.ERROR, str(e)))
            raise
        finally:
            for span in spans:
                span.end()

    def stored(self, tasks: list[Task], node: str, start_ns: int) -> None:
        """A ``miyamoto store`` span per copy committed here since ``start_ns``."""
        end = time.time_ns()
        for t in tasks:
            self._start("miyamoto store", t, "INTERNAL", start_ns, **{
                "miyamoto.node": node, "miyamoto.replica": t.replica}).end(end_time=end)

    def attempt(self, task: Task, method: str, node: str) -> tuple[Any, str]:
        """An attempt's span (ended by ``attempted``) and the traceparent to send."""
        scheme, _, rest = task.url.partition("://")
        span = self._start("miyamoto attempt", task, "CLIENT", **{
            "http.request.method": method, "url.scheme": scheme,
            "server.address": rest.split("/", 1)[0].rpartition("@")[2],
            "miyamoto.attempt": task.attempts, "miyamoto.node": node})
        return span, _traceparent(span)

    def attempted(self, span: Any, status: int | None, error: str | None) -> None:
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None or status is None or not 200 <= status < 300:
            span.set_status(self._api.Status(self._api.StatusCode.ERROR,
                                             error or f"HTTP {status}"))
        span.end()


traces = Traces()

__all__ = ["ENDPOINT_VARIABLES", "Traces", "traces", "wanted"]
