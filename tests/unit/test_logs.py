"""Log output in process (``miyamoto.logs``): JSON lines a collector can parse, the
root set up once for the serve path, and the access log's one safe line per request
(no query string, control characters escaped, long paths cut). A real node's:
tests/nodes/test_metrics_node.py."""

from __future__ import annotations

import logging
import sys
from typing import Any, Iterable

import gevent
import pytest
import ujson

from miyamoto import logs

pytestmark = pytest.mark.timeout(10)


def record(msg: str = "hello %s", args: tuple = ("world",), **kw: Any) -> logging.LogRecord:
    r = logging.LogRecord("miyamoto.x", logging.WARNING, __file__, 1, msg, args, None)
    r.created = 1700000000.5
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_a_json_line_holds_time_level_logger_and_message() -> None:
    line = logs.JsonFormatter().format(record())
    assert "\n" not in line
    assert ujson.loads(line) == {"time": "2023-11-14T22:13:20.500Z", "level": "WARNING",
                                 "logger": "miyamoto.x", "message": "hello world"}
    assert "http://a/b" in logs.JsonFormatter().format(record("%s", ("http://a/b é",)))
    assert "é" in logs.JsonFormatter().format(record("%s", ("é",)))


def test_a_traceback_stays_on_its_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc = sys.exc_info()
    line = logs.JsonFormatter().format(record(exc_info=exc))
    doc = ujson.loads(line)
    assert "\n" not in line and "ValueError: boom" in doc["exception"]
    doc = ujson.loads(logs.JsonFormatter().format(record(exc_text="earlier text")))
    assert doc["exception"] == "earlier text"
    doc = ujson.loads(logs.JsonFormatter().format(record(stack_info="Stack (most recent)")))
    assert doc["stack"] == "Stack (most recent)" and "exception" not in doc
    doc = ujson.loads(logs.JsonFormatter().format(record(http={"status": 200})))
    assert doc["http"] == {"status": 200}


@pytest.fixture
def root_kept():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hub = gevent.get_hub()
    printer = hub.print_exception
    yield root
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    hub.print_exception = printer
    logging.captureWarnings(False)


def test_configure_replaces_the_roots_handlers(root_kept: logging.Logger) -> None:
    root_kept.addHandler(logging.NullHandler())
    logs.configure("INFO", "text")
    assert len(root_kept.handlers) == 1 and root_kept.level == logging.INFO
    h = root_kept.handlers[0]
    assert isinstance(h, logging.StreamHandler) and h.stream is sys.stderr
    assert not isinstance(h.formatter, logs.JsonFormatter)
    assert h.formatter._fmt == logs.TEXT_FORMAT
    printer = gevent.get_hub().print_exception
    logs.configure("DEBUG", "json")
    assert len(root_kept.handlers) == 1 and root_kept.level == logging.DEBUG
    assert isinstance(root_kept.handlers[0].formatter, logs.JsonFormatter)
    assert gevent.get_hub().print_exception is logs._hub_exception
    assert printer is not logs._hub_exception


def test_a_dead_greenlet_is_one_record(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise KeyError("gone")
    except KeyError:
        kind, value, tb = sys.exc_info()
    with caplog.at_level(logging.ERROR, logger="gevent"):
        logs._hub_exception("ctx", kind, value, tb)
        logs._hub_exception("ctx2", None, None, None)
    first, second = caplog.records
    assert first.name == "gevent" and first.getMessage() == "greenlet 'ctx' died"
    assert first.exc_info[1] is value and second.exc_info is None


def test_printable_escapes_and_cuts() -> None:
    assert logs._printable("/a/b") == "/a/b"
    assert logs._printable("/a\nb\x1b[31m") == "/a\\nb\\x1b[31m"
    cut = logs._printable("/" + "x" * 600)
    assert cut == "/" + "x" * (logs.MAX_PATH - 1) + "..."
    assert logs._printable("x" * logs.MAX_PATH) == "x" * logs.MAX_PATH
    # the documented cut: 512 characters of a path, then "..."
    assert logs._printable("y" * 512) == "y" * 512
    assert logs._printable("y" * 513) == "y" * 512 + "..."


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        self.t += 0.0125
        return self.t


def serve(app: Any, environ: dict) -> tuple[list, Any]:
    seen: list = []
    wrapped = logs.AccessLog(app, clock=Clock())
    return seen, wrapped(environ, lambda status, headers, *exc: seen.append((status, headers)))


def test_one_access_line_per_request_without_the_query(caplog: pytest.LogCaptureFixture) -> None:
    def app(environ: dict, start_response: Any) -> Iterable[bytes]:
        start_response("404 Not Found", [("Content-Type", "x"), ("Content-Length", "7")])
        return [b"abc", b"defg"]
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/a\nb", "QUERY_STRING": "token=s3cret",
               "REMOTE_ADDR": "127.0.0.9"}
    with caplog.at_level(logging.INFO, logger="miyamoto.access"):
        seen, body = serve(app, environ)
    assert body == [b"abc", b"defg"] and seen[0][0] == "404 Not Found"
    (r,) = caplog.records
    assert r.http == {"method": "GET", "path": "/a\\nb", "status": 404, "duration_ms": 12.5,
                      "bytes": 7, "client": "127.0.0.9"}
    assert r.getMessage() == "GET /a\\nb 404 12.5ms 7B 127.0.0.9"
    assert "s3cret" not in caplog.text


def test_a_streamed_body_counts_its_content_length(caplog: pytest.LogCaptureFixture) -> None:
    def streamed(environ: dict, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("content-length", "99")])
        return iter([b"x"])

    def unknown(environ: dict, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Length", "n/a")])
        return iter([b"x"])

    def silent(environ: dict, start_response: Any) -> Iterable[bytes]:
        return iter([])
    with caplog.at_level(logging.INFO, logger="miyamoto.access"):
        serve(streamed, {})
        serve(unknown, {})
        serve(silent, {"PATH_INFO": ""})
    a, b, c = (r.http for r in caplog.records)
    assert a["bytes"] == 99 and b["bytes"] == 0
    assert c == {"method": "-", "path": "/", "status": "-", "duration_ms": 12.5, "bytes": 0,
                 "client": "-"}


def test_an_access_lines_duration_is_in_ms_to_the_microsecond(caplog) -> None:
    def app(environ: dict, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Length", "0")])
        return []
    times = iter([10.0, 10.00123456])
    wrapped = logs.AccessLog(app, clock=lambda: next(times))
    with caplog.at_level(logging.INFO, logger="miyamoto.access"):
        list(wrapped({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, lambda *a: None))
    (r,) = caplog.records
    assert r.http["duration_ms"] == 1.235
