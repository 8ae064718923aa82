"""Log output for ``miyamoto serve``: text or JSON lines, and the optional access log.

JSON lines (``log_format = json``) are for collectors that parse each line: one object
a line with ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, and
``exception`` when a traceback goes with it, so a multi-line traceback never breaks
a line apart. gevent's hub reports a greenlet that died through logging too, instead
of printing the traceback to stderr.

The access log (``access_log = true``) wraps the WSGI app, one line per request:
method, path, status, duration in ms, response bytes, client address. The path has no
query string (a token or a secret may ride in it) and no header is logged, the
Authorization header least of all. It is off by default: a line per request costs more
than a small request does (see ``server._QuietHandler``).
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import ujson

access_log = logging.getLogger("miyamoto.access")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_PATH = 512  # longer paths are cut in the log line


class JsonFormatter(logging.Formatter):
    """One JSON object a line; an access record adds its fields under ``http``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
                            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        http = getattr(record, "http", None)
        if http is not None:
            out["http"] = http
        return ujson.dumps(out, ensure_ascii=False, escape_forward_slashes=False)


def _hub_exception(context: Any, kind: Any, value: Any, tb: Any) -> None:
    """gevent's hub reports a greenlet that died: one record with its traceback."""
    logging.getLogger("gevent").error("greenlet %r died", context,
                                      exc_info=(kind, value, tb) if value is not None else None)


def configure(level: str, fmt: str = "text") -> None:
    """Root logging for the serve path: stderr, in ``fmt`` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    if fmt == "json":
        import gevent

        gevent.get_hub().print_exception = _hub_exception


def _printable(s: str) -> str:
    """A path as one safe line: control characters escaped, length capped."""
    if len(s) > MAX_PATH:
        s = s[:MAX_PATH] + "..."
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


class AccessLog:
    """WSGI middleware: one ``miyamoto.access`` line per request, after it is answered."""

    def __init__(self, app: Callable[[dict, Callable], Iterable[bytes]],
                 clock: Callable[[], float] = time.perf_counter):
        self.app = app
        self.clock = clock

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        started = self.clock()
        seen: dict[str, Any] = {}

        def recording(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            seen["status"] = status.split(" ", 1)[0]
            seen["length"] = next((v for k, v in headers if k.lower() == "content-length"),
                                  None)
            return start_response(status, headers, *exc)

        body = self.app(environ, recording)
        if isinstance(body, list):
            size = sum(len(chunk) for chunk in body)
        else:
            length = seen.get("length")
            size = int(length) if length and length.isdigit() else 0
        self._log(environ, seen.get("status", "-"), (self.clock() - started) * 1000, size)
        return body

    @staticmethod
    def _log(environ: dict, status: str, ms: float, size: int) -> None:
        fields = {
            "method": _printable(str(environ.get("REQUEST_METHOD", "-"))),
            "path": _printable(str(environ.get("PATH_INFO") or "/")),  # never QUERY_STRING
            "status": int(status) if status.isdigit() else status,
            "duration_ms": round(ms, 3),
            "bytes": size,
            "client": str(environ.get("REMOTE_ADDR") or "-"),
        }
        access_log.info("%s %s %s %.1fms %dB %s", fields["method"], fields["path"], status,
                        ms, size, fields["client"], extra={"http": fields})
