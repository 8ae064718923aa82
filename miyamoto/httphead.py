"""Reading one HTTP/1.x request head (request line, header fields, body framing), strictly.

Pure: it reads from a buffered binary file and raises; no socket, clock or logging, so a
fuzzer can drive it with ``io.BytesIO``. The server (``miyamoto.server``) turns a
``BadRequest`` into a JSON error answer and closes the connection, and a ``ClientGone``
into a quiet close.

Strict where leniency lets two parsers disagree about where a request ends (request
smuggling, RFC 9112 §6.3 and §11.2): a Content-Length that is not plain digits, two
different Content-Lengths, Transfer-Encoding together with Content-Length, a
Transfer-Encoding other than ``chunked``, whitespace before a field's colon and obsolete
line folding are all 400. The header block (every field line, CRLFs included) is capped at
``max_bytes`` and answered 431 beyond it, and a line is never read past the cap, so a
client cannot make the node hold more than that.
"""

from __future__ import annotations

import re
from typing import Any, BinaryIO, Iterator

MAX_REQUEST_LINE = 8192  # as gevent.pywsgi; the API's URLs are far shorter (414 beyond)
MAX_FIELDS = 100
MAX_BLANK_LINES = 4  # RFC 9112 §2.2: ignore at least one empty line before a request-line
MAX_CONTENT_LENGTH = 1 << 50  # a syntactically valid length beyond this is 413

_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_REQUEST_LINE = re.compile(rb"(" + _TCHAR + rb"+) ([\x21-\x7e\x80-\xff]+) HTTP/1\.([01])\r?\n")
_FIELD = re.compile(rb"(" + _TCHAR + rb"+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r?\n")
_DIGITS = re.compile(r"[0-9]{1,20}")


class BadRequest(Exception):
    """The request cannot be read: answer ``status`` with ``message`` and close."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client closed the connection in the middle of a request head: close quietly."""


class Head:
    """A request's header fields: the part of pywsgi's header object (an email.message
    subclass) that the server uses, parsed by hand (the email parser was ~9% of a node's
    CPU under load), plus the body framing read from them."""

    __slots__ = ("items", "_map", "content_length", "chunked")

    def __init__(self, items: list[tuple[str, str]]):
        self.items = items
        self._map: dict[str, str] = {}
        for k, v in items:
            low = k.lower()
            if low in self._map:
                self._map[low] += "," + v
            else:
                self._map[low] = v
        self.content_length: int | None = None
        self.chunked = False

    def get(self, name: str, default: Any = None) -> Any:
        """The field's value (repeated fields joined by commas, RFC 9110 §5.3)."""
        return self._map.get(name.lower(), default)

    getheader = get

    @property
    def headers(self) -> Iterator[str]:
        for k, v in self.items:
            yield f"{k}: {v}\r\n"

    @property
    def typeheader(self) -> str | None:
        return self._map.get("content-type")


class RequestLine:
    __slots__ = ("method", "target", "version")

    def __init__(self, method: str, target: str, version: str):
        self.method = method
        self.target = target
        self.version = version


def read_request_line(rfile: BinaryIO) -> RequestLine | None:
    """The request line; None when the client closed (or sent only blank lines) first."""
    for _ in range(MAX_BLANK_LINES + 1):
        line = rfile.readline(MAX_REQUEST_LINE + 1)
        if not line:
            return None
        if line not in (b"\r\n", b"\n"):
            break
    else:
        raise BadRequest(400, "expected a request line, got blank lines")
    m = _REQUEST_LINE.fullmatch(line)
    if m is None:
        if not line.endswith(b"\n"):
            if len(line) > MAX_REQUEST_LINE:
                raise BadRequest(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
            raise ClientGone()
        raise BadRequest(400, "malformed request line (expected METHOD TARGET HTTP/1.x)")
    method, target, minor = m.groups()
    return RequestLine(method.decode("ascii"), target.decode("latin-1"),
                       "HTTP/1.1" if minor == b"1" else "HTTP/1.0")


def read_head(rfile: BinaryIO, max_bytes: int, version: str = "HTTP/1.1") -> Head:
    """The header fields up to the blank line, with the body framing checked."""
    items: list[tuple[str, str]] = []
    left = max_bytes
    while True:
        line = rfile.readline(left + 1)
        if line == b"\r\n" or line == b"\n":
            break
        if not line.endswith(b"\n"):
            if len(line) > left:
                raise BadRequest(431, f"request header fields larger than {max_bytes} bytes")
            raise ClientGone()
        left -= len(line)
        if left < 0:
            raise BadRequest(431, f"request header fields larger than {max_bytes} bytes")
        m = _FIELD.fullmatch(line)
        if m is None:
            if line[:1] in (b" ", b"\t"):
                raise BadRequest(400, "obsolete line folding in request header fields")
            raise BadRequest(400, "malformed request header field")
        if len(items) >= MAX_FIELDS:
            raise BadRequest(431, f"more than {MAX_FIELDS} request header fields")
        items.append((m.group(1).decode("ascii"), m.group(2).decode("latin-1")))
    head = Head(items)
    _framing(head, version)
    return head


def _framing(head: Head, version: str) -> None:
    """Set ``content_length`` / ``chunked``; refuse any framing two parsers could read
    differently (RFC 9112 §6.1, §6.3)."""
    te = head.get("transfer-encoding")
    cl = head.get("content-length")
    if te is not None:
        if cl is not None:
            raise BadRequest(400, "both Transfer-Encoding and Content-Length")
        if te.strip().lower() != "chunked" or version != "HTTP/1.1":
            raise BadRequest(400, f"unsupported Transfer-Encoding {te[:40]!r} "
                                  "(only chunked, over HTTP/1.1)")
        head.chunked = True
        return
    if cl is None:
        return
    values = {v.strip() for v in cl.split(",")}
    if len(values) != 1:
        raise BadRequest(400, "conflicting Content-Length values")
    value = values.pop()
    if not _DIGITS.fullmatch(value):
        raise BadRequest(400, f"bad Content-Length {value[:40]!r}")
    n = int(value)
    if n > MAX_CONTENT_LENGTH:
        raise BadRequest(413, f"Content-Length {n} is too large")
    head.content_length = n


def keep_alive(head: Head, version: str) -> bool:
    """Whether the connection stays open after this request (RFC 9112 §9.3)."""
    value = head.get("connection")
    if value is None:
        return version == "HTTP/1.1"
    tokens = {t.strip() for t in value.lower().split(",")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens and "close" not in tokens
