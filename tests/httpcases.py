"""Requests that a strict HTTP/1.x server must refuse, shared by the parser's tests
(tests/unit/http/test_head.py) and the real node's (tests/nodes/test_http_hardening.py):
each with the statuses allowed (None: a quiet close)."""

from __future__ import annotations

BODY = b'{"url": "http://127.0.0.1:9/hook", "countdown": 3600, "params": {"a": "b"}}'
HEAD = (b"POST /queue HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"User-Agent: hardening-test\r\n")
VALID = HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def chunked(body: bytes) -> bytes:
    return b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


MALFORMED: list[tuple[str, bytes, set[int | None]]] = [
    ("two different Content-Lengths",
     HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(BODY), len(BODY) + len(SMUGGLED))
     + BODY + SMUGGLED, {400}),
    ("Content-Length list that disagrees",
     HEAD + b"Content-Length: %d, 7\r\n\r\n" % len(BODY) + BODY, {400}),
    ("chunked and Content-Length",
     HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + chunked(BODY), {400}),
    ("Content-Length and then chunked",
     HEAD + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(BODY) + BODY, {400}),
    ("unknown Transfer-Encoding", HEAD + b"Transfer-Encoding: xchunked\r\n\r\n" + chunked(BODY),
     {400}),
    ("Content-Length larger than the body, then close",
     HEAD + b"Content-Length: %d\r\n\r\n" % (len(BODY) + 100) + BODY, {400, None}),
    ("bad chunk size", HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n",
     {400, None}),
    ("chunk longer than its size", HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\n" + BODY
     + b"\r\n0\r\n\r\n", {400, None}),
    ("chunked body cut short", HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(BODY)
     + BODY[:10], {400, None}),
    ("negative Content-Length", HEAD + b"Content-Length: -5\r\n\r\n" + BODY, {400}),
    ("non-numeric Content-Length", HEAD + b"Content-Length: abc\r\n\r\n" + BODY, {400}),
    ("Content-Length with a sign", HEAD + b"Content-Length: +%d\r\n\r\n" % len(BODY) + BODY, {400}),
    ("Content-Length with an underscore", HEAD + b"Content-Length: 7_5\r\n\r\n" + BODY, {400}),
    ("huge Content-Length", HEAD + b"Content-Length: 99999999999999999999\r\n\r\n", {413}),
    ("body over max_body, declared", HEAD + b"Content-Length: %d\r\n\r\n" % (2 << 20), {413}),
    ("space before a field's colon", HEAD + b"Content-Length : %d\r\n\r\n" % len(BODY) + BODY,
     {400}),
    ("obsolete line folding", HEAD + b"X-Folded: a\r\n b\r\nContent-Length: %d\r\n\r\n" % len(BODY)
     + BODY, {400}),
    ("NUL in a field value", HEAD + b"X-Nul: a\x00b\r\nContent-Length: 0\r\n\r\n", {400}),
    ("request line too long", b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n", {414}),
    ("HTTP/0.9 request", b"GET /healthz\r\n\r\n", {400}),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400}),
    ("bare LF junk", b"\n\n\n\nfoo\nbar\n\n", {400, None}),
    ("blank lines only", b"\r\n" * 20, {400, None}),
    ("non-HTTP bytes", bytes(range(256)) * 8, {400, None}),
    ("TLS client hello", bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64, {400, None}),
    ("request line only, then close", b"GET /healthz HTTP/1.1\r\n", {None}),
    ("close mid-headers", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1", {None}),
]


def mutate(data: bytes, edits: list[tuple[str, int, int, bytes]]) -> bytes:
    buf = bytearray(data)
    for op, at, n, chunk in edits:
        at = min(at, len(buf))
        if op == "delete":
            del buf[at:at + n]
        elif op == "insert":
            buf[at:at] = chunk
        elif op == "replace":
            buf[at:at + len(chunk)] = chunk
        elif op == "repeat":  # e.g. a field line twice
            buf[at:at] = buf[at:at + n]
        else:
            del buf[at:]
    return bytes(buf)
