"""Reading one HTTP/1.x request head (``miyamoto.http.head``), in process: the request
line, the fields, the body framing and keep-alive, every refusal with its status, the
caps, and a fuzzer (any bytes: a head, a clean end or a 4xx). The same requests against
a real node: tests/nodes/test_http_hardening.py."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpcases import BODY, MALFORMED, VALID, mutate
from miyamoto.http import head as h
from miyamoto.http.head import BadRequest, ClientGone, keep_alive, read_head, read_request_line

pytestmark = pytest.mark.timeout(60)


def parse(data: bytes, max_bytes: int = 65536) -> Any:
    rfile = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    line = read_request_line(rfile)
    if line is None:
        return None
    return line, read_head(rfile, max_bytes, line.version), rfile.read()


def refused(data: bytes, status: int, why: str = "", max_bytes: int = 65536) -> None:
    with pytest.raises(BadRequest) as e:
        parse(data, max_bytes)
    assert e.value.status == status and why in e.value.message, e.value.message


def test_parser_reads_a_valid_head() -> None:
    line, head, rest = parse(VALID)
    assert (line.method, line.target, line.version) == ("POST", "/queue", "HTTP/1.1")
    assert head.content_length == len(BODY) and not head.chunked and rest == BODY
    assert head.get("content-type") == "application/json" and keep_alive(head, line.version)
    line, head, _ = parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
    assert keep_alive(head, "HTTP/1.0") and head.content_length is None
    _, head, _ = parse(b"\r\nPOST / HTTP/1.1\nTransfer-Encoding: Chunked\n\n")
    assert head.chunked


def test_fields_as_the_server_reads_them() -> None:
    _, head, _ = parse(b"GET /x?a=1 HTTP/1.1\r\nHost: a\r\nX-Many: 1\r\nx-many: 2\r\n"
                       b"Content-Type: text/plain\r\nX_Under: u\r\nContent-Length: 0\r\n\r\n")
    assert head.get("X-MANY") == "1,2" and head.getheader("host") == "a"
    assert head.get("nope", "d") == "d" and head.typeheader == "text/plain"
    assert head.items == [("Host", "a"), ("X-Many", "1"), ("x-many", "2"),
                          ("Content-Type", "text/plain"), ("X_Under", "u"),
                          ("Content-Length", "0")]
    assert list(head.headers) == [f"{k}: {v}\r\n" for k, v in head.items]
    environ = [n.environ for n, _ in head.fields]
    # an underscore would pass for a dash; the type and length go in CONTENT_* instead
    assert environ == ["HTTP_HOST", "HTTP_X_MANY", "HTTP_X_MANY", None, None, None]
    _, head, _ = parse(b"GET / HTTP/1.1\r\nX-Sp:   padded \t\r\n\r\n")
    assert head.get("x-sp") == "padded" and head.typeheader is None


def test_the_request_line() -> None:
    line, _, _ = parse(b"PATCH /t%20x?q HTTP/1.1\r\n\r\n")
    assert (line.method, line.target) == ("PATCH", "/t%20x?q")
    line, _, _ = parse(b"\n\r\n\n\r\nGET / HTTP/1.1\r\n\r\n")  # four blank lines are skipped
    assert line.method == "GET"
    refused(b"\r\n" * (h.MAX_BLANK_LINES + 1) + b"GET / HTTP/1.1\r\n\r\n", 400, "blank lines")
    assert parse(b"") is None and parse(b"\r\n\r\n") is None
    for bad in (b"GET  / HTTP/1.1\r\n", b"G\xc9T / HTTP/1.1\r\n", b"GET / HTTP/1.2\r\n",
                b"GET /a\x7fb HTTP/1.1\r\n", b"GET / http/1.1\r\n", b"GET / HTTP/1.1 \r\n"):
        refused(bad + b"\r\n", 400, "malformed request line")
    line, _, _ = parse(b"GET /\xe9 HTTP/1.1\r\n\r\n")
    assert line.target == "/\xe9"


def test_a_long_request_line_is_414_and_a_cut_one_a_quiet_close() -> None:
    at_cap = b"GET /" + b"a" * (h.MAX_REQUEST_LINE - 16) + b" HTTP/1.1\r\n"
    assert len(at_cap) == h.MAX_REQUEST_LINE
    assert parse(at_cap + b"\r\n")[0].target.startswith("/aaa")
    refused(b"GET /" + b"a" * (h.MAX_REQUEST_LINE - 14) + b" HTTP/1.1\r\n\r\n", 414,
            f"longer than {h.MAX_REQUEST_LINE}")
    with pytest.raises(ClientGone):
        parse(b"GET / HTTP/1.1")
    with pytest.raises(ClientGone):
        parse(b"GET / HTTP/1.1\r\nHost: a")


def test_the_header_block_is_capped_at_max_bytes() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 2000 + b"\r\n\r\n"
    refused(head, 431, "larger than 1024 bytes", max_bytes=1024)
    assert parse(head, max_bytes=2100)[1].get("x") == "a" * 2000
    line = b"X: " + b"a" * 95 + b"\r\n"  # 100 bytes of fields, and the blank line after
    assert parse(b"GET / HTTP/1.1\r\n" + line + b"\r\n", max_bytes=101)[1].get("x")
    refused(b"GET / HTTP/1.1\r\n" + line + b"\r\n", 431, max_bytes=100)


def test_at_most_max_fields() -> None:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(h.MAX_FIELDS))
    assert len(parse(b"GET / HTTP/1.1\r\n" + fields + b"\r\n")[1].items) == h.MAX_FIELDS
    refused(b"GET / HTTP/1.1\r\n" + fields + b"Y: 1\r\n\r\n", 431,
            f"more than {h.MAX_FIELDS} request header fields")


@pytest.mark.parametrize("field,why", [
    (b"X-A : 1", "malformed request header field"), (b" X-A: 1", "obsolete line folding"),
    (b"\tX-A: 1", "obsolete line folding"), (b"X-A 1", "malformed request header field"),
    (b": 1", "malformed request header field"), (b"X-A: a\rb", "CR or NUL"),
    (b"X-A: a\x00b", "CR or NUL"), (b"X\xe9: 1", "malformed request header field")])
def test_a_bad_field_line_is_400(field: bytes, why: str) -> None:
    refused(b"GET / HTTP/1.1\r\n" + field + b"\r\n\r\n", 400, why)


@pytest.mark.parametrize("fields,length,chunk", [
    (b"Content-Length: 0\r\n", 0, False), (b"Content-Length: 17\r\n", 17, False),
    (b"Content-Length: 5, 5\r\n", 5, False), (b"Content-Length: 5\r\nContent-Length: 5\r\n", 5,
                                              False),
    (b"Content-Length: " + b"1" * 15 + b"\r\n", int("1" * 15), False),
    (b"Transfer-Encoding:  chunked \r\n", None, True), (b"", None, False)])
def test_the_body_framing(fields: bytes, length: int | None, chunk: bool) -> None:
    _, head, _ = parse(b"POST / HTTP/1.1\r\n" + fields + b"\r\n")
    assert (head.content_length, head.chunked) == (length, chunk)


@pytest.mark.parametrize("fields,status,why", [
    (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", 400, "both Transfer-Encoding"),
    (b"Transfer-Encoding: gzip, chunked\r\n", 400, "unsupported Transfer-Encoding"),
    (b"Content-Length: 5, 6\r\n", 400, "conflicting Content-Length"),
    (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400, "conflicting Content-Length"),
    (b"Content-Length: \r\n", 400, "bad Content-Length"),
    (b"Content-Length: \xd9\xa3\r\n", 400, "bad Content-Length"),  # a non-ASCII digit
    (b"Content-Length: " + b"1" * 21 + b"\r\n", 400, "bad Content-Length"),
    (b"Content-Length: %d\r\n" % (h.MAX_CONTENT_LENGTH + 1), 413, "too large")])
def test_framing_two_parsers_could_read_apart_is_refused(fields: bytes, status: int,
                                                         why: str) -> None:
    refused(b"POST / HTTP/1.1\r\n" + fields + b"\r\n", status, why)


def test_chunked_is_http_1_1_only_and_the_largest_length_is_taken() -> None:
    refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "over HTTP/1.1")
    _, head, _ = parse(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % h.MAX_CONTENT_LENGTH)
    assert head.content_length == h.MAX_CONTENT_LENGTH
    assert len(str(h.MAX_CONTENT_LENGTH)) <= 20


@pytest.mark.parametrize("version,connection,stays", [
    ("HTTP/1.1", None, True), ("HTTP/1.0", None, False), ("HTTP/1.1", "close", False),
    ("HTTP/1.1", "Close", False), ("HTTP/1.1", "keep-alive", True),
    ("HTTP/1.1", "upgrade, close", False), ("HTTP/1.1", "upgrade", True),
    ("HTTP/1.0", "keep-alive", True), ("HTTP/1.0", "Keep-Alive, Upgrade", True),
    ("HTTP/1.0", "keep-alive, close", False), ("HTTP/1.0", "close", False),
    ("HTTP/1.0", "upgrade", False)])
def test_keep_alive(version: str, connection: str | None, stays: bool) -> None:
    fields = b"" if connection is None else b"Connection: " + connection.encode() + b"\r\n"
    _, head, _ = parse(f"GET / {version}\r\n".encode() + fields + b"\r\n")
    assert keep_alive(head, version) is stays


def test_the_caches_of_names_and_methods_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(h, "_NAMES", {})
    monkeypatch.setattr(h, "_METHODS", {})
    for i in range(h._MAX_NAMES + 20):
        parse(b"GET / HTTP/1.1\r\nX-%d: v\r\n\r\n" % i)
    for i in range(h._MAX_METHODS + 5):
        parse(b"M%d / HTTP/1.1\r\n\r\n" % i)
    assert len(h._NAMES) == h._MAX_NAMES and len(h._METHODS) == h._MAX_METHODS
    # past the cap, names and methods are still read (checked each time)
    _, head, _ = parse(b"M999 / HTTP/1.1\r\nX-new: v\r\n\r\n")
    assert head.get("x-new") == "v"


@pytest.mark.parametrize("what,data,status", [
    (c[0], c[1], next(iter(c[2]))) for c in MALFORMED
    if c[2] <= {400, 413, 414, 431} and c[0] != "body over max_body, declared"])
def test_parser_refuses(what: str, data: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as e:
        parse(data)
    assert e.value.status == status, (what, e.value.message)


@settings(max_examples=500, deadline=None)
@given(data=st.one_of(st.binary(max_size=300),
                      st.lists(st.tuples(st.sampled_from(["delete", "insert", "replace", "repeat",
                                                          "cut"]),
                                         st.integers(0, len(VALID)), st.integers(1, 40),
                                         st.binary(min_size=1, max_size=12)), max_size=5)
                      .map(lambda edits: mutate(VALID, edits))))
def test_parser_fuzz(data: bytes) -> None:
    """Any bytes: a head, a clean end, or BadRequest with a 4xx status; nothing else."""
    try:
        out = parse(data, max_bytes=1024)
    except BadRequest as e:
        assert e.status in (400, 413, 414, 431), e.status
        return
    except ClientGone:
        return
    if out is not None:
        line, head, _ = out
        assert not (head.chunked and head.content_length is not None)
        assert head.content_length is None or head.content_length >= 0
        assert line.version in ("HTTP/1.0", "HTTP/1.1")


def test_the_documented_limits_hold_at_their_edges() -> None:
    """8192 bytes of request line (as pywsgi), four blank lines before it, a Content-Length
    up to 2**50: one past each is refused."""
    line = b"GET /" + b"a" * (8192 - 16) + b" HTTP/1.1\r\n"
    assert len(line) == 8192 and parse(line + b"\r\n")[0].method == "GET"
    refused(b"GET /aa" + line[5:] + b"\r\n", 414, "longer than 8192 bytes")
    assert parse(b"\r\n" * 4 + b"GET / HTTP/1.1\r\n\r\n")[0].method == "GET"
    refused(b"\r\n" * 5 + b"GET / HTTP/1.1\r\n\r\n", 400, "blank lines")
    _, head, _ = parse(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % 2**50)
    assert head.content_length == 2**50
    refused(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (2**50 + 1), 413,
            f"Content-Length {2**50 + 1} is too large")
