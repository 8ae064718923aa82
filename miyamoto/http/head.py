"""Reading one HTTP/1.x request head (request line, header fields, body framing), strictly.

Pure: it reads from a buffered binary file and raises; no socket, clock or logging, so a
fuzzer can drive it with ``io.BytesIO``. The server (``miyamoto.http.server``) turns a
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

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e\x80-\xff]+")
_VERSIONS = {b"HTTP/1.1\r\n": "HTTP/1.1", b"HTTP/1.1\n": "HTTP/1.1",
             b"HTTP/1.0\r\n": "HTTP/1.0", b"HTTP/1.0\n": "HTTP/1.0"}
_NAMES: dict[bytes, "Name"] = {}  # field names seen valid
_MAX_NAMES = 512  # a client sending random names fills it once, then they are checked each time
_METHODS: dict[bytes, str] = {}  # likewise for methods
_MAX_METHODS = 32

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

    __slots__ = ("fields", "_map", "content_length", "chunked")

    def __init__(self, fields: list[tuple[Name, str]]):
        """``fields``: (the field's ``Name``, value) in the order received."""
        self.fields = fields
        m: dict[str, str] = {}
        for name, value in fields:
            low = name.lower
            if low in m:
                m[low] += "," + value
            else:
                m[low] = value
        self._map = m
        self.content_length: int | None = None
        self.chunked = False

    def get(self, name: str, default: Any = None) -> Any:
        """The field's value (repeated fields joined by commas, RFC 9110 §5.3)."""
        return self._map.get(name.lower(), default)

    getheader = get

    @property
    def items(self) -> list[tuple[str, str]]:
        return [(name.name, value) for name, value in self.fields]

    @property
    def headers(self) -> Iterator[str]:
        for name, value in self.fields:
            yield f"{name.name}: {value}\r\n"

    @property
    def typeheader(self) -> str | None:
        return self._map.get("content-type")


class Name:
    """A field name as received, lower-cased, and as its WSGI environ key (None where
    pywsgi drops it: names with ``_``, which would pass for ``-``, and the two fields
    the environ carries as CONTENT_TYPE / CONTENT_LENGTH). Cached per distinct name."""

    __slots__ = ("name", "lower", "environ")

    def __init__(self, name: str):
        self.name = name
        self.lower = name.lower()
        key = "HTTP_" + name.replace("-", "_").upper()
        skip = "_" in name or key in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH")
        self.environ = None if skip else key


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
        if line != b"\r\n" and line != b"\n":
            break
    else:
        raise BadRequest(400, "expected a request line, got blank lines")
    parts = line.split(b" ")
    if len(parts) == 3:
        method, target, version = parts
        name = _METHODS.get(method) or _method(method)
        v = _VERSIONS.get(version)
        if name and v and _TARGET.fullmatch(target):
            return RequestLine(name, target.decode("latin-1"), v)
    if not line.endswith(b"\n"):
        if len(line) > MAX_REQUEST_LINE:
            raise BadRequest(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
        raise ClientGone()
    raise BadRequest(400, "malformed request line (expected METHOD TARGET HTTP/1.x)")


def _method(method: bytes) -> str | None:
    if not _TOKEN.fullmatch(method):
        return None
    name = method.decode("ascii")
    if len(_METHODS) < _MAX_METHODS:
        _METHODS[method] = name
    return name


def read_head(rfile: BinaryIO, max_bytes: int, version: str = "HTTP/1.1") -> Head:
    """The header fields up to the blank line, with the body framing checked."""
    fields: list[tuple[Name, str]] = []
    left = max_bytes
    readline = rfile.readline
    while True:
        line = readline(left + 1)
        if line == b"\r\n" or line == b"\n":
            break
        left -= len(line)
        if left < 0:
            raise BadRequest(431, f"request header fields larger than {max_bytes} bytes")
        if not line or line[-1] != 10:  # b"\n"
            raise ClientGone()
        raw, sep, value = line.partition(b":")
        name = _NAMES.get(raw) or _field_name(raw)
        if not sep or name is None:
            if line[0] in (32, 9):  # SP, HTAB
                raise BadRequest(400, "obsolete line folding in request header fields")
            raise BadRequest(400, "malformed request header field")
        value = value.strip()
        if 13 in value or 0 in value:  # a bare CR ends a line for some parsers; (int: 10x faster)
            raise BadRequest(400, "CR or NUL in a request header field")
        if len(fields) >= MAX_FIELDS:
            raise BadRequest(431, f"more than {MAX_FIELDS} request header fields")
        fields.append((name, value.decode("latin-1")))
    head = Head(fields)
    _framing(head, version)
    return head


def _field_name(raw: bytes) -> Name | None:
    """A field name, or None if it is not a token (whitespace before the colon included:
    RFC 9112 §5.1 requires a 400 for it)."""
    if not _TOKEN.fullmatch(raw):
        return None
    name = Name(raw.decode("ascii"))
    if len(_NAMES) < _MAX_NAMES:
        _NAMES[raw] = name
    return name


def _framing(head: Head, version: str) -> None:
    """Set ``content_length`` / ``chunked``; refuse any framing two parsers could read
    differently (RFC 9112 §6.1, §6.3)."""
    get = head._map.get
    te = get("transfer-encoding")
    cl = get("content-length")
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
    if "," in cl:
        values = {v.strip() for v in cl.split(",")}
        if len(values) != 1:
            raise BadRequest(400, "conflicting Content-Length values")
        cl = values.pop()
    if not (cl.isascii() and cl.isdigit() and len(cl) <= 20):
        raise BadRequest(400, f"bad Content-Length {cl[:40]!r}")
    n = int(cl)
    if n > MAX_CONTENT_LENGTH:
        raise BadRequest(413, f"Content-Length {n} is too large")
    head.content_length = n


def keep_alive(head: Head, version: str) -> bool:
    """Whether the connection stays open after this request (RFC 9112 §9.3)."""
    value = head._map.get("connection")
    if value is None:
        return version == "HTTP/1.1"
    value = value.lower()
    if value == "keep-alive" or value == "close":
        tokens = {value}
    else:
        tokens = {t.strip() for t in value.split(",")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens and "close" not in tokens
