"""miyamoto.tracing on a real node in this process, with the OpenTelemetry SDK's in-memory
exporter, a real worker sink and real HTTP: a producer's traceparent given at enqueue
goes on into the node's spans (enqueue, store, each attempt: one trace, linked by the
task id) and to the worker, each attempt under its own span; with tracing off the
producer's traceparent still reaches the worker unchanged, and no span is made. What
turns tracing on (``wanted``) is checked alone."""

from __future__ import annotations

import sys
import time
import types
from typing import Any, Callable, Iterator

import gevent
import gevent.socket
import pytest
import ujson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness.waits import free_ports
from helpers import CLUSTER_KEYS, Sink
from miyamoto.config.settings import load
from miyamoto.node import Node
from miyamoto.tasks.task import Task
from miyamoto.tracing import Traces, traces, wanted

pytestmark = pytest.mark.timeout(60)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Wait on a condition in gevent's time (the node runs in this thread's hub)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        gevent.sleep(0.02)
    raise AssertionError("timed out")


def _post(port: int, body: dict, headers: dict[str, str]) -> dict:
    data = ujson.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = gevent.socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(f"POST /queue HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n{head}\r\n"
                     .encode() + data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    finally:
        sock.close()
    status = answer.split(b" ", 2)[1]
    assert status == b"200", answer
    return ujson.loads(answer.partition(b"\r\n\r\n")[2])


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    n = Node(load(env={}, flags={"data_dir": str(tmp_path), "http": "127.0.0.1:0"}))
    n.start()
    yield n
    n.stop()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink().start()
    yield s
    s.stop()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    assert traces.start("n1", provider)
    yield spans
    traces.stop()


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def test_a_producers_trace_goes_on_through_enqueue_store_and_every_attempt(
        exporter, node, sink):
    sink.reply("/w", 500, 200)  # the first attempt fails: two attempts, two spans
    task = _post(node.http_port, {"url": sink.url_for("/w")}, {"traceparent": PRODUCER})
    _until(lambda: sink.count("/w") >= 2)
    spans = _until(lambda: [s for s in exporter.get_finished_spans()
                            if s.name == "miyamoto attempt"][1:] and exporter.get_finished_spans())
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (enqueue,), (store,), attempts = (by_name["miyamoto enqueue"], by_name["miyamoto store"],
                                      by_name["miyamoto attempt"])
    assert {_hex(s.context.trace_id, 32) for s in spans} == {TRACE_ID}  # one trace
    assert {s.attributes["miyamoto.task.id"] for s in spans} == {task["id"]}
    assert _hex(enqueue.parent.span_id, 16) == "00f067aa0ba902b7"  # the producer's child
    assert store.parent.span_id == enqueue.context.span_id
    assert [a.parent.span_id for a in attempts] == [enqueue.context.span_id] * 2
    assert [a.attributes.get("http.response.status_code") for a in attempts] == [500, 200]
    assert not attempts[0].status.is_ok and attempts[1].status.is_ok
    sent = [r.headers["traceparent"] for r in sink.requests("/w")]  # each under its attempt
    assert sent == [f"00-{TRACE_ID}-{_hex(a.context.span_id, 16)}-01" for a in attempts]


def _pair(tmp_path) -> list[Node]:
    """Two nodes of one cluster in this process (real ZeroMQ, real journals)."""
    ports = free_ports(2)
    seeds = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    nodes = []
    for i, port in enumerate(ports):
        flags = {"data_dir": str(tmp_path / f"n{i}"), "http": "127.0.0.1:0", "node": f"n{i}",
                 "cluster": f"tcp://127.0.0.1:{port}", "seeds": seeds,
                 "curve_public": CLUSTER_KEYS[0], "curve_secret": CLUSTER_KEYS[1],
                 "heartbeat_interval": "0.05", "election_timeout_min": "0.1",
                 "election_timeout_max": "0.2", "replica_offset": "0.5"}
        nodes.append(Node(load(env={}, flags=flags)))
        nodes[-1].start()
    _until(lambda: all(n.ready()[0] and len(n.cluster_info()["members"]) == 2 for n in nodes))
    return nodes


def test_the_store_message_carries_the_trace_to_the_other_replica(exporter, sink, tmp_path):
    nodes = _pair(tmp_path)
    try:
        task = _post(nodes[0].http_port, {"url": sink.url_for("/two")},
                     {"traceparent": PRODUCER})
        stores = _until(lambda: len([s for s in exporter.get_finished_spans()
                                     if s.name == "miyamoto store"]) == 2 and
                        [s for s in exporter.get_finished_spans() if s.name == "miyamoto store"])
        (enqueue,) = [s for s in exporter.get_finished_spans() if s.name == "miyamoto enqueue"]
        assert sorted(s.attributes["miyamoto.node"] for s in stores) == ["n0", "n1"]
        assert {s.parent.span_id for s in stores} == {enqueue.context.span_id}
        assert {_hex(s.context.trace_id, 32) for s in stores} == {TRACE_ID}
        held = [n.engine.get(task["id"]) for n in nodes]
        assert {t.traceparent for t in held} == {
            f"00-{TRACE_ID}-{_hex(enqueue.context.span_id, 16)}-01"}  # in both journals
        _until(lambda: sink.count("/two") >= 1)
    finally:
        for n in nodes:
            n.stop()


def test_with_tracing_off_the_producers_traceparent_reaches_the_worker(node, sink):
    assert not traces.on
    _post(node.http_port, {"url": sink.url_for("/off")}, {"traceparent": PRODUCER})
    _post(node.http_port, {"url": sink.url_for("/off"), "traceparent": PRODUCER.replace(
        "00f067aa0ba902b7", "1111111111111111")}, {})
    _until(lambda: sink.count("/off") >= 2)
    assert sorted(r.headers["traceparent"] for r in sink.requests("/off")) == \
        [PRODUCER, PRODUCER.replace("00f067aa0ba902b7", "1111111111111111")]


def test_what_turns_tracing_on():
    assert not wanted(False, {})
    assert wanted(True, {})
    assert wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert not wanted(True, {"OTEL_TRACES_EXPORTER": "none"})


def test_a_new_traces_is_off_and_stays_off_when_the_packages_are_missing(monkeypatch):
    """Off until start() succeeds: without the opentelemetry packages start() says
    False and the hot paths' ``traces.on`` check still skips every span."""
    own = Traces()
    assert own.on is False
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails: ImportError
    assert own.start("n1", TracerProvider()) is False
    assert own.on is False


def test_started_alone_it_exports_over_otlp_and_stop_flushes(monkeypatch) -> None:
    """Without a provider given, start() makes one that sends OTLP over HTTP to the
    configured endpoint; stop() sends what it holds before it returns."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        reason="the otel extra's OTLP exporter is not installed")
    with Sink() as sink:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", sink.url_for("/v1/traces"))
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        own = Traces()
        assert own.start("node-7") is True and own.on
        with own.enqueue([Task(id="t-otlp", queue="q", url="http://w/x")]):
            pass
        own.stop()
        assert not own.on
        sent = sink.requests("/v1/traces")  # at once: stop() flushed, no batch delay
        assert len(sent) == 1 and sent[0].method == "POST"
        body = sent[0].body
        assert b"miyamoto enqueue" in body and b"t-otlp" in body and b"node-7" in body


def test_started_alone_its_own_provider_exports_and_stop_flushes(monkeypatch) -> None:
    """The provider start() makes, without the OTLP package: its exporter stood in by one
    that keeps the spans (the OTLP wire itself: the test above, where it is installed)."""
    got = InMemorySpanExporter()
    fake = types.ModuleType("trace_exporter")
    fake.OTLPSpanExporter = lambda: got  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        fake)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing")
    own = Traces()
    assert own.start("node-7") is True and own.on
    with own.enqueue([Task(id="t-own", queue="q", url="http://w/x")]):
        pass
    assert got.get_finished_spans() == ()  # batched: sent later, or at stop
    own.stop()
    (span,) = got.get_finished_spans()
    assert span.name == "miyamoto enqueue" and span.attributes["miyamoto.task.id"] == "t-own"
    resource = span.resource.attributes
    assert resource["service.instance.id"] == "node-7" and resource["service.name"] == "billing"


def test_a_failed_enqueue_marks_its_spans_failed_and_goes_on_failing(exporter) -> None:
    tasks = [Task(id=f"t-{i}", queue="q", url="http://w/x") for i in range(2)]
    with pytest.raises(ValueError, match="store refused"):
        with traces.enqueue(tasks):
            raise ValueError("store refused")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["miyamoto enqueue"] * 2
    assert {(s.status.status_code.name, s.status.description) for s in spans} == {
        ("ERROR", "store refused")}


@pytest.mark.parametrize("flags, recorded", [("01", True), ("00", False), ("10", False),
                                             ("11", True)])
def test_a_producers_sampled_flag_decides_whether_spans_are_kept(exporter, flags: str,
                                                                 recorded: bool) -> None:
    task = Task(id="t-f", queue="q", url="http://w/x",
                traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-{flags}")
    with traces.enqueue([task]):
        pass
    assert len(exporter.get_finished_spans()) == (1 if recorded else 0)


@pytest.mark.parametrize("status, error, failed", [
    (200, None, None), (299, None, None), (503, None, "HTTP 503"), (300, None, "HTTP 300"),
    (None, "connection refused", "connection refused"), (200, "body cut", "body cut")])
def test_an_attempts_span_fails_with_its_error_or_its_status(exporter, status, error,
                                                             failed) -> None:
    span, _ = traces.attempt(Task(id="t-a", queue="q", url="http://u:p@w:81/x"), "POST", "n1")
    traces.attempted(span, status, error)
    (done,) = exporter.get_finished_spans()
    assert done.attributes["server.address"] == "w:81"
    assert done.attributes.get("http.response.status_code") == status
    if failed is None:
        assert done.status.status_code.name == "UNSET"
    else:
        assert (done.status.status_code.name, done.status.description) == ("ERROR", failed)
