"""The delivery HTTP client: keep-alive HTTP/1.1 on gevent sockets, answers parsed by
``httptools`` (llhttp, in C), connections pooled per (scheme, host, port, timeout).

Why not geventhttpclient (the engine's client before this one): under
``scripts/bench.py`` its Python layers (header objects, a ``select`` per checkout to see
whether a pooled socket is alive, a ``gevent.Timeout`` per request, the response object)
were about half of the delivery path's CPU. Here a request is one ``sendall`` of bytes
built in one pass, the answer is fed to llhttp as it arrives, the deadline is the
socket's own timeout, and the liveness check of a pooled connection is one non-blocking
``MSG_PEEK`` on the raw socket.

Every new connection resolves its host itself and checks every address against the
``TargetGuard`` before connecting to any: one refused address refuses the whole name (it
could be the one tried next), and only checked addresses are connected to, so a
rebinding DNS answer cannot slip in between the check and the connect. A pooled
connection was checked when it was opened. An address literal skips the resolver (which
under gevent runs in a thread pool and has been seen to stall). Origins are kept in a
bounded LRU; any failure other than a complete answer closes that connection, so a
connection left half-used is never handed to the next request. No redirect is followed
(a 3xx is the attempt's answer). https goes through ``ssl`` with certificate and host
name verification. A queue's way out (``delivery/egress.py``: a client certificate, a
CA bundle, a CONNECT proxy) is part of the pool's key, so two queues never share a
connection that shows another certificate or took another path; through a proxy the
guard checks the proxy's addresses and the target's, and the tunnel names the checked
address. The answer and the errors are ``miyamoto.delivery.types``.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket as stdsocket
import time
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
import gevent.ssl
import httptools

from miyamoto.config.tls import TLSFileError, client_context
from miyamoto.delivery.egress import Egress, Proxy, open_tunnel
from miyamoto.delivery.targets import TargetGuard, parse_address
from miyamoto.delivery.types import MAX_RESPONSE, DeliveryError, Response, TargetRefused
from miyamoto.sockets import send_all

log = logging.getLogger(__name__)

__all__ = ["HTTPClient", "DeliveryError", "Response", "TargetRefused"]

MAX_IDLE = 128  # idle keep-alive connections kept per origin
MAX_URLS, MAX_URL_KEPT = 1024, 512  # URLs kept split (a task's target repeats), <= 0.5 MB
MAX_CONTEXTS = 256  # queues' TLS contexts kept (one per distinct certificate and bundle)
_RECV = 65536
_PEEK = stdsocket.MSG_PEEK | stdsocket.MSG_DONTWAIT
_BODYLESS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})


class _Answer:
    """httptools' callbacks: the answer's headers and body as they are parsed."""

    __slots__ = ("headers", "chunks", "size", "done", "headers_done", "framed", "parser",
                 "interim", "keep")

    def __init__(self) -> None:
        self._reset()
        self.done = False
        self.parser: Any = httptools.HttpResponseParser(self)

    def _reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.headers_done = False
        self.framed = False  # Content-Length or chunked: the end is in the bytes, not the EOF
        self.interim = False
        self.keep = False

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1")
        self.headers[key] = value.decode("latin-1")
        low = key.lower()
        if low == "content-length" or low == "transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()  # llhttp forgets it once the message ends
        self.interim = 100 <= status < 200 and status != 101

    def on_message_complete(self) -> None:
        if self.interim:  # 1xx: the answer is the message after it (same parser)
            self._reset()
        else:
            self.done = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_RESPONSE:
            self.chunks.append(body)


class _Origin:
    """One origin's idle connections, and how to open a new one (directly, or through
    the queue's proxy)."""

    __slots__ = ("scheme", "host", "port", "timeout", "guard", "ssl", "idle", "host_header",
                 "proxy")

    def __init__(self, scheme: str, host: str, port: int, timeout: float, guard: TargetGuard,
                 ssl_context: Any, proxy: Proxy | None = None):
        self.scheme, self.host, self.port, self.timeout = scheme, host, port, timeout
        self.guard = guard
        self.ssl = ssl_context if scheme == "https" else None
        self.proxy = proxy
        self.idle: list[Any] = []
        default = 443 if scheme == "https" else 80
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if port == default else f"{name}:{port}"

    def resolve(self) -> list[tuple]:
        """Every address of the host, each checked by the guard (see the module doc)."""
        return _resolve(self.guard, self.host, self.port)

    def connect(self) -> Any:
        """A new connection to the first checked address that accepts one (through the
        proxy: a tunnel to it), TLS on it for https."""
        error: Exception | None = None
        targets = self.resolve()
        proxies = None if self.proxy is None else _resolve(self.guard, self.proxy.host,
                                                            self.proxy.port)
        for info in targets:
            sock = None
            try:
                if proxies is None:
                    sock = _open(info, self.timeout)
                else:
                    sock = _tunnel(proxies, self.proxy, info[4][0], self.port, self.timeout)
                if self.ssl is not None:
                    sock = self.ssl.wrap_socket(sock, server_hostname=self.host)
                sock.settimeout(self.timeout)
                return sock
            except (OSError, ValueError, DeliveryError) as e:
                if sock is not None:
                    sock.close()
                error = e
        via = f" through {self.proxy}" if self.proxy is not None else ""
        raise DeliveryError(f"cannot connect to {self.host}:{self.port}{via}: "
                            f"{type(error).__name__}: {error}")

    def checkout(self) -> tuple[Any, bool]:
        """A live idle connection (True: reused), else a new one."""
        idle = self.idle
        while idle:
            sock = idle.pop()
            if _alive(sock):
                return sock, True
            sock.close()
        return self.connect(), False

    def checkin(self, sock: Any) -> None:
        if len(self.idle) < MAX_IDLE:
            self.idle.append(sock)
        else:
            sock.close()

    def close(self) -> None:
        for sock in self.idle:
            sock.close()
        self.idle.clear()


def _resolve(guard: TargetGuard, host: str, port: int) -> list[tuple]:
    """Every address of ``host``, each checked by the guard (see the module doc)."""
    addr = parse_address(host)
    if addr is not None and str(addr) == host.strip("[]"):  # a plain literal
        family = stdsocket.AF_INET6 if addr.version == 6 else stdsocket.AF_INET
        sockaddr = (str(addr), port, 0, 0) if addr.version == 6 else (str(addr), port)
        infos = [(family, stdsocket.SOCK_STREAM, stdsocket.IPPROTO_TCP, "", sockaddr)]
    else:
        try:
            infos = gevent.socket.getaddrinfo(host, port, 0, stdsocket.SOCK_STREAM,
                                              stdsocket.IPPROTO_TCP)
        except OSError as e:
            raise DeliveryError(f"cannot resolve {host}: {e}") from e
    for info in infos:
        ip = info[4][0]
        rule = guard.check_address(ip, port, "" if addr is not None else host)
        if rule:
            raise TargetRefused(f"target refused: {host} resolves to {ip}, denied by {rule}")
    return infos


def _open(info: tuple, timeout: float) -> Any:
    """A TCP connection to one checked address (getaddrinfo's tuple)."""
    family, kind, proto, _, sockaddr = info
    sock = gevent.socket.socket(family, kind, proto)
    try:
        sock.settimeout(min(timeout, 10.0))
        sock.connect(sockaddr)
        sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _tunnel(proxies: list[tuple], proxy: Proxy, ip: str, port: int, timeout: float) -> Any:
    """A tunnel to ``ip``:``port`` through the first of the proxy's checked addresses
    that connects."""
    error: Exception | None = None
    for info in proxies:
        try:
            sock = _open(info, timeout)
        except OSError as e:
            error = e
            continue
        try:
            open_tunnel(sock, ip, port, proxy, min(timeout, 10.0))
        except BaseException:
            sock.close()
            raise
        return sock
    raise DeliveryError(f"cannot connect to {proxy}: {type(error).__name__}: {error}")


def _alive(sock: Any) -> bool:
    """An idle keep-alive connection is usable when it has nothing to read: EOF (the
    server closed it) or stray bytes (out of step) both mean it is not. The peek is on
    the TCP socket (under TLS too: an idle TLS connection has nothing to read either)."""
    raw = getattr(sock, "_sock", None)
    if raw is None:
        return True
    try:
        raw.recv(1, _PEEK)  # b"" (closed) or a byte (out of step)
    except BlockingIOError:
        return True
    except OSError:  # reset
        pass
    return False


def _request_bytes(method: str, target: str, host: str, headers: dict[str, str],
                   body: bytes) -> bytes:
    """The request's head and body, for one send; CR or LF in a header is refused."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name:
            raise DeliveryError(f"header {name[:60]!r} has CR, LF or ':' in it")
        lines.append(f"{name}: {value}\r\n")
    if body or method not in _BODYLESS:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1") + body
    except UnicodeEncodeError as e:
        raise DeliveryError(f"a header or the URL is not latin-1: {e}") from None


class HTTPClient:
    """The engine's delivery client: ``request()`` answers a ``Response`` or raises
    ``DeliveryError`` (``TargetRefused`` when a target rule denies an address)."""

    def __init__(self, *, max_origins: int = 256, concurrency: int = 128,
                 guard: TargetGuard | None = None, ssl_context: Any = None):
        self._origins: collections.OrderedDict[tuple, _Origin] = collections.OrderedDict()
        self._max = max_origins
        self.guard = guard or TargetGuard()
        self._ssl = ssl_context
        self._concurrency = concurrency  # dispatch bounds concurrent deliveries itself
        self._urls: dict[str, tuple[str, str, int, str]] = {}
        self._contexts: dict[tuple[str, str, str], Any] = {}  # queues' TLS contexts

    def _origin(self, scheme: str, host: str, port: int, timeout: float,
                egress: Egress | None = None) -> _Origin:
        key = (scheme, host, port, timeout, egress)
        origin = self._origins.get(key)
        if origin is not None:
            self._origins.move_to_end(key)
            return origin
        if scheme == "https" and self._ssl is None:
            # gevent's context class, not create_default_context's (stdlib's class unless
            # ssl is monkey-patched: its handshake would block the loop)
            self._ssl = client_context(factory=gevent.ssl.SSLContext)
        ssl_context = self._ssl
        if scheme == "https" and egress is not None and egress.tls:
            ssl_context = self._context(egress)
        origin = _Origin(scheme, host, port, timeout, self.guard, ssl_context,
                         egress.proxy if egress is not None else None)
        self._origins[key] = origin
        while len(self._origins) > self._max:
            _, old = self._origins.popitem(last=False)
            old.close()
        return origin

    def _context(self, egress: Egress) -> Any:
        """The TLS context of a queue's certificate and bundle, built once (the files
        were checked at start; one gone since fails the attempt, naming the option)."""
        key = (egress.client_cert, egress.client_key, egress.ca_bundle)
        ctx = self._contexts.get(key)
        if ctx is None:
            try:
                ctx = client_context(*key, factory=gevent.ssl.SSLContext)
            except TLSFileError as e:
                raise DeliveryError(f"the queue's TLS files: {e}") from None
            if len(self._contexts) >= MAX_CONTEXTS:
                self._contexts.clear()
            self._contexts[key] = ctx
        return ctx

    def _split(self, url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, request target); remembered for the URLs that repeat."""
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in ("http", "https"):
            raise DeliveryError(f"unsupported scheme {scheme!r}")
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as e:
            raise DeliveryError(f"bad port in {url[:200]!r}") from e
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        split = (scheme, host, port, target)
        if len(url) <= MAX_URL_KEPT:
            if len(self._urls) >= MAX_URLS:
                self._urls.clear()
            self._urls[url] = split
        return split

    def request(self, method: str, url: str, *, body: bytes, headers: dict[str, str],
                timeout: float, egress: Egress | None = None) -> Response:
        """One request and its whole answer within ``timeout`` s, or DeliveryError;
        ``egress`` is the queue's way out (None: direct, the default TLS context)."""
        scheme, host, port, target = self._urls.get(url) or self._split(url)
        origin = self._origin(scheme, host, port, timeout, egress)
        data = _request_bytes(method, target, origin.host_header, headers, body)
        deadline = time.monotonic() + timeout
        sock, _ = origin.checkout()
        try:
            answer, status, keep = _exchange(sock, data, deadline, timeout, origin.ssl is None)
        except BaseException:
            sock.close()
            raise
        if keep:
            origin.checkin(sock)
        else:
            sock.close()
        return Response(status, answer.headers, b"".join(answer.chunks))

    def close(self) -> None:
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()


def _exchange(sock: Any, data: bytes, deadline: float,
              timeout: float, plain: bool) -> tuple[_Answer, int, bool]:
    """Send the request, read one whole answer (1xx skipped); (answer, status, keep-alive)."""
    try:
        if plain:
            send_all(sock, data)
        else:
            sock.sendall(data)
        answer = _Answer()
        parser = answer.parser
        if plain:
            _read_plain(sock, parser, answer, deadline)
        else:
            _read(sock, parser, answer, deadline, timeout)
        keep = answer.done and answer.framed and answer.keep
        return answer, parser.get_status_code(), keep
    except stdsocket.timeout:
        raise DeliveryError(f"no answer within {timeout:g} s") from None
    except httptools.HttpParserError as e:
        raise DeliveryError(f"bad HTTP answer: {type(e).__name__}: {e}") from None
    except OSError as e:
        reason = errno.errorcode.get(e.errno or 0, "") or type(e).__name__
        raise DeliveryError(f"{reason}: {e}") from None


def _read(sock: Any, parser: Any, answer: _Answer, deadline: float, timeout: float) -> None:
    """Feed the parser until the answer is complete, within ``deadline``: the first read
    waits the socket's timeout (``timeout``), each further one only the time left (and
    the socket gets ``timeout`` back after), so a trickling answer cannot outlast it."""
    reads = 0
    try:
        while not answer.done:
            if reads:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise stdsocket.timeout()
                sock.settimeout(left)
            reads += 1
            if _ended(sock.recv(_RECV), parser, answer):
                return
    finally:
        if reads > 1:
            sock.settimeout(timeout)


def _read_plain(sock: Any, parser: Any, answer: _Answer, deadline: float) -> None:
    """``_read`` for a plain TCP connection: the OS socket (non-blocking under gevent's)
    is read directly, and a read that must wait waits on the socket's read watcher
    under a bare loop timer set to the time left, which throws ``socket.timeout`` into
    this greenlet. gevent's own ``recv`` makes a ``Timeout`` object for each wait
    (~1 us of Python, measured ~3 % of a node's CPU under ``scripts/bench.py``)."""
    raw, hub = sock._sock, sock.hub
    while not answer.done:
        try:
            chunk = raw.recv(_RECV)
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise stdsocket.timeout() from None
            timer = hub.loop.timer(left)
            timer.start(gevent.getcurrent().throw, stdsocket.timeout)
            try:
                hub.wait(sock._read_event)
            finally:
                timer.close()
            continue
        if _ended(chunk, parser, answer):
            return


def _ended(chunk: bytes, parser: Any, answer: _Answer) -> bool:
    """Feed one read to the parser; True when the connection's end ends the answer."""
    if not chunk:
        if answer.headers_done and not answer.framed:
            return True  # an answer delimited by the end of the connection (RFC 9112 §6.3)
        raise DeliveryError("connection closed before a whole answer")
    parser.feed_data(chunk)
    if answer.size > MAX_RESPONSE:
        raise DeliveryError("response body larger than 1 MiB")
    return False
