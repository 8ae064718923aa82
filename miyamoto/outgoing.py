"""The outgoing delivery HTTP client on geventhttpclient (not the Python API client, which
is ``client.py``): pooled keep-alive connections per (scheme, host, port). The errors and
``Response`` here are the delivery clients' shared vocabulary.

The engine now delivers with ``miyamoto.httpclient`` (the same rules at about half the
CPU per request); this client stays as a drop-in alternative (``Engine(client=...)``)
with its own tests (tests/test_targets.py), and as the reference the new one was
measured against.

geventhttpclient is several times faster than requests under gevent (DESIGN, measured
facts). Clients are kept in a bounded LRU, one per origin and timeout. Any failure
other than a complete HTTP response discards that origin's client, so a connection
left half-used by a timeout is never handed to the next request.

Every new connection resolves its host itself and checks every address against the
``TargetGuard`` before connecting to any (``_Checked._resolve``): geventhttpclient then
connects only to those checked addresses, so a rebinding DNS answer cannot slip in
between the check and the connect. One refused address refuses the whole name (it
could be the one tried next). A pooled keep-alive connection was checked when it was
opened, so the guard costs nothing per request. An address literal skips the resolver
(which under gevent runs in a thread pool and has been seen to stall).
"""

from __future__ import annotations

import collections
import logging
from urllib.parse import urlsplit

import gevent
import gevent.socket
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool

from miyamoto.deliverytypes import MAX_RESPONSE, DeliveryError, Response, TargetRefused
from miyamoto.targets import TargetGuard, parse_address

log = logging.getLogger(__name__)

class _Checked:
    """geventhttpclient's pool, resolving through the guard: see the module docstring."""

    _connection_host: str
    _connection_port: int

    def __init__(self, *args, guard: TargetGuard, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)  # type: ignore[call-arg]
        self.guard = guard

    def _resolve(self):  # type: ignore[no-untyped-def]
        host, port = self._connection_host, self._connection_port
        addr = parse_address(host)
        if addr is not None and str(addr) == host.strip("[]"):  # a plain literal
            family = gevent.socket.AF_INET6 if addr.version == 6 else gevent.socket.AF_INET
            sockaddr = (str(addr), port, 0, 0) if addr.version == 6 else (str(addr), port)
            infos = [(family, gevent.socket.SOCK_STREAM, gevent.socket.IPPROTO_TCP, "", sockaddr)]
        else:
            infos = super()._resolve()  # type: ignore[misc]
        for info in infos:
            ip = info[4][0]
            rule = self.guard.check_address(ip, port, "" if addr is not None else host)
            if rule:
                raise TargetRefused(f"target refused: {host} resolves to {ip}, denied by {rule}")
        return infos


class _CheckedPool(_Checked, ConnectionPool):
    pass


class _CheckedSSLPool(_Checked, SSLConnectionPool):
    pass


def _checked_client(guard: TargetGuard, host: str, port: int, ssl: bool,
                    **kw) -> HTTPClient:  # type: ignore[no-untyped-def]
    """An HTTPClient whose pool is the checked one, built with the same arguments
    HTTPClient gives its own (which is replaced before any connection is made)."""
    client = HTTPClient(host, port=port, ssl=ssl, **kw)
    pool_class = _CheckedSSLPool if ssl else _CheckedPool
    pool_kw = dict(size=kw["concurrency"], connection_timeout=kw["connection_timeout"],
                   network_timeout=kw["network_timeout"])
    if ssl:
        old = client._connection_pool
        pool_kw["ssl_options"] = old.ssl_options  # type: ignore[attr-defined]
        pool_kw["ssl_context_factory"] = lambda **_: old.ssl_context  # type: ignore[attr-defined]
    client._connection_pool.close()
    client._connection_pool = pool_class(host, port, host, port, guard=guard, **pool_kw)
    return client


class ClientPool:
    def __init__(self, *, max_origins: int = 256, concurrency: int = 128,
                 guard: TargetGuard | None = None):
        self._clients: collections.OrderedDict[tuple, HTTPClient] = collections.OrderedDict()
        self._max = max_origins
        self._concurrency = concurrency
        self.guard = guard or TargetGuard()

    def _client(self, scheme: str, host: str, port: int, timeout: float) -> HTTPClient:
        key = (scheme, host, port, timeout)
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        client = _checked_client(self.guard, host, port, scheme == "https",
                                 concurrency=self._concurrency,
                                 connection_timeout=min(timeout, 10.0), network_timeout=timeout,
                                 headers={"User-Agent": ""})
        self._clients[key] = client
        while len(self._clients) > self._max:
            _, old = self._clients.popitem(last=False)
            old.close()
        return client

    def _discard(self, key: tuple, client: HTTPClient) -> None:
        if self._clients.get(key) is client:
            del self._clients[key]
        try:
            client.close()
        except Exception:  # closing a broken pool must not hide the delivery error
            log.debug("client: close failed", exc_info=True)

    def request(self, method: str, url: str, *, body: bytes, headers: dict[str, str],
                timeout: float) -> Response:
        parts = urlsplit(url)
        scheme = parts.scheme
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        key = (scheme, host, port, timeout)
        client = self._client(scheme, host, port, timeout)
        try:
            with gevent.Timeout(timeout, DeliveryError(f"no answer within {timeout:g} s")):
                resp = client.request(method, target, body=body, headers=headers)
                try:
                    data = resp.read(MAX_RESPONSE + 1)
                    if len(data) > MAX_RESPONSE:
                        raise DeliveryError("response body larger than 1 MiB")
                    resp_headers = {k: v for k, v in resp.items()}
                    return Response(resp.status_code, resp_headers, data)
                finally:
                    resp.release()
        except DeliveryError:
            self._discard(key, client)
            raise
        except Exception as e:  # OSError, parse errors, a closed pool: no HTTP answer
            self._discard(key, client)
            raise DeliveryError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
