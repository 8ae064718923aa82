"""A queue's way out: the TLS identity its deliveries show (a client certificate and
key), the CAs they trust (a bundle, for targets under a private CA), and the HTTP
CONNECT proxy they go through (``proxy_url``), from its ``[queue:NAME]`` options.

Through a proxy, every delivery is a tunnel (plain http too: one path, and the proxy
sees no request, so no header or body of a task is left in its logs): the client
resolves the target and checks every address with the ``TargetGuard`` as it does for
a direct connection, connects to the proxy (whose addresses the guard checks as well),
and sends ``CONNECT <checked address>:<port>``. Naming the address the guard passed,
not the host name, leaves the proxy no lookup of its own, so a rebinding DNS answer
cannot send it where the guard would not. TLS then runs inside the tunnel with the
target's name (SNI and the certificate's check). The proxy's credentials go in
``Proxy-Authorization: Basic`` and are never logged: errors name its host and port.
"""

from __future__ import annotations

import base64
import functools
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.types import DeliveryError

MAX_CONNECT_ANSWER = 8192  # bytes of a proxy's answer to CONNECT (its status and headers)


@dataclass(frozen=True)
class Proxy:
    """An HTTP CONNECT proxy; ``authorization`` is never shown (repr, errors)."""

    host: str
    port: int
    authorization: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"proxy {self.host}:{self.port}"


@dataclass(frozen=True)
class Egress:
    """One queue's way out; equal values share connections (the pool's key holds it)."""

    client_cert: str = ""
    client_key: str = ""
    ca_bundle: str = ""
    proxy: Proxy | None = None

    @property
    def tls(self) -> bool:
        """Whether it asks for its own TLS context (else the client's default)."""
        return bool(self.client_cert or self.ca_bundle)


def proxy_of(url: str) -> Proxy:
    """``proxy_url`` (checked by ``config.values.proxy_url``) as a Proxy."""
    parts = urlsplit(url)
    auth = ""
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return Proxy(parts.hostname or "", parts.port or 80, auth)


def egress_of(q: QueueConfig) -> Egress | None:
    """The queue's way out; None for the default one (no certificate, bundle or proxy)."""
    return _egress(q.tls_client_cert, q.tls_client_key, q.tls_ca_bundle, q.proxy_url)


@functools.lru_cache(maxsize=1024)
def _egress(cert: str, key: str, ca: str, proxy_url: str) -> Egress | None:
    if not (cert or key or ca or proxy_url):
        return None
    return Egress(cert, key, ca, proxy_of(proxy_url) if proxy_url else None)


def connect_request(host: str, port: int, proxy: Proxy) -> bytes:
    """The CONNECT request for ``host`` (an address literal) and ``port``."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if proxy.authorization:
        head += f"Proxy-Authorization: {proxy.authorization}\r\n"
    return (head + "\r\n").encode("latin-1")


def open_tunnel(sock: Any, host: str, port: int, proxy: Proxy, timeout: float) -> None:
    """CONNECT through ``sock`` (connected to the proxy) to ``host``:``port``, within
    ``timeout`` s; DeliveryError unless the proxy answers 2xx. Nothing of the tunnel's
    traffic is read: the target speaks only after we do (TLS, HTTP)."""
    deadline = time.monotonic() + timeout
    sock.sendall(connect_request(host, port, proxy))
    data = b""
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeliveryError(f"{proxy}: no answer to CONNECT within {timeout:g} s")
        sock.settimeout(left)
        chunk = sock.recv(MAX_CONNECT_ANSWER - len(data))
        if not chunk:
            raise DeliveryError(f"{proxy}: closed the connection before answering CONNECT")
        data += chunk
        if len(data) >= MAX_CONNECT_ANSWER and b"\r\n\r\n" not in data:
            raise DeliveryError(f"{proxy}: answer to CONNECT longer than "
                                f"{MAX_CONNECT_ANSWER} bytes")
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise DeliveryError(f"{proxy}: not an HTTP answer to CONNECT: {status_line[:100]!r}")
    if not 200 <= int(parts[1]) < 300:
        raise DeliveryError(f"{proxy}: CONNECT to {host}:{port} refused: "
                            f"{status_line[:100]}")
    if rest:
        raise DeliveryError(f"{proxy}: sent bytes after its answer to CONNECT")
