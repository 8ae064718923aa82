"""A queue's way out (``miyamoto.delivery.egress``) as the delivery client takes it, on
real sockets in one process: a local TLS server that requires a client certificate
(made with openssl, under a private CA that only the queue's bundle trusts), and a tiny
CONNECT proxy (tests/proxykit.py) that records what it is asked for. The guard
checks the proxy's address and the CONNECT target; the pool never mixes two queues'
ways out; the proxy's password shows in no error."""

from __future__ import annotations

import base64
import shutil
import socket
import time
from dataclasses import dataclass, field

import gevent
import gevent.server
import gevent.socket
import gevent.ssl
import pytest

from miyamoto.config import settings
from miyamoto.config.settings import ConfigError
from miyamoto.delivery.egress import Egress, Proxy, egress_of, open_tunnel, proxy_of
from miyamoto.delivery.httpclient import DeliveryError, HTTPClient, TargetRefused
from miyamoto.delivery.targets import TargetGuard
from proxykit import ConnectProxy
from tlscerts import Pair, make_ca, make_cert

pytestmark = pytest.mark.timeout(60)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    d = tmp_path_factory.mktemp("egress")
    ca = make_ca(d, "private-ca")
    return {"ca": ca, "server": make_cert(d, ca, "target"),
            "client": make_cert(d, ca, "queue-client", client=True)}


@dataclass
class Target:
    """An HTTP(S) target: answers OK to each request, recording the client
    certificate's CN (None: no certificate) and its connections."""

    server: gevent.server.StreamServer
    peers: list = field(default_factory=list)
    connections: int = 0

    @property
    def port(self) -> int:
        return self.server.server_port


def _read_head(sock) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


def _target(tls: gevent.ssl.SSLContext | None) -> Target:
    target = Target(None)  # type: ignore[arg-type]

    def handle(sock, _addr) -> None:
        target.connections += 1
        try:
            if tls is not None:
                sock = tls.wrap_socket(sock, server_side=True)
                cert = sock.getpeercert()
                subject = dict(x[0] for x in cert["subject"]) if cert else {}
                target.peers.append(subject.get("commonName"))
            while _read_head(sock):
                sock.sendall(OK)
        except OSError:
            pass
        finally:
            sock.close()

    target.server = gevent.server.StreamServer(("127.0.0.1", 0), handle)
    target.server.start()
    return target


@pytest.fixture
def servers():
    made: list = []

    def make(kind: str, tls: gevent.ssl.SSLContext | None = None):
        made.append(ConnectProxy() if kind == "proxy" else _target(tls))
        return made[-1]

    yield make
    for s in made:
        if isinstance(s, ConnectProxy):
            s.close()
        else:
            s.server.stop(timeout=1)


def _mtls(pki) -> gevent.ssl.SSLContext:
    ctx = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server"].cert, pki["server"].key)
    ctx.load_verify_locations(cafile=pki["ca"].cert)
    ctx.verify_mode = gevent.ssl.CERT_REQUIRED
    return ctx


def _post(client: HTTPClient, url: str, egress: Egress | None = None):
    return client.request("POST", url, body=b"a=1", headers={}, timeout=5, egress=egress)


def test_a_queues_certificate_opens_a_target_that_requires_one(pki, servers):
    target = servers("target", _mtls(pki))
    url = f"https://127.0.0.1:{target.port}/hook"
    c = HTTPClient(guard=TargetGuard())
    mtls = Egress(pki["client"].cert, pki["client"].key, pki["ca"].cert)
    for _ in range(2):
        assert _post(c, url, mtls).status == 200
    assert target.peers == ["queue-client"] and target.connections == 1  # kept alive
    with pytest.raises(DeliveryError, match="(?i)certificate"):  # the system's CAs: unknown
        _post(c, url)
    with pytest.raises(DeliveryError):  # the CA trusted, but no certificate shown
        _post(c, url, Egress(ca_bundle=pki["ca"].cert))
    assert target.peers == ["queue-client"]
    assert target.connections == 3  # each way out its own connection, never the pooled one
    c.close()


def test_a_queues_tls_context_is_built_once_and_kept_beside_the_others(pki, servers,
                                                                      tmp_path):
    cert, key = tmp_path / "a.pem", tmp_path / "a.key"
    shutil.copy(pki["client"].cert, cert)
    shutil.copy(pki["client"].key, key)
    one, two = servers("target", _mtls(pki)), servers("target", _mtls(pki))
    c = HTTPClient(guard=TargetGuard())
    a = Egress(str(cert), str(key), pki["ca"].cert)
    b = Egress(pki["client"].cert, pki["client"].key, pki["ca"].cert)
    assert _post(c, f"https://127.0.0.1:{one.port}/hook", a).status == 200
    assert _post(c, f"https://127.0.0.1:{one.port}/hook", b).status == 200
    cert.unlink()
    key.unlink()  # queue a's files are gone: its context, built already, still serves
    assert _post(c, f"https://127.0.0.1:{two.port}/hook", a).status == 200
    assert two.peers == ["queue-client"]
    c.close()


def _tunnel_answered(*pieces: bytes, timeout: float = 5.0) -> bytes:
    """open_tunnel over a real socket pair whose proxy end has sent ``pieces`` (each
    its own segment); returns what the proxy was asked."""
    ours, theirs = socket.socketpair()
    try:
        def answer() -> None:
            for piece in pieces:
                gevent.sleep(0.01)
                theirs.sendall(piece)

        g = gevent.spawn(answer)
        open_tunnel(gevent.socket.socket(fileno=ours.detach()), "10.0.0.5", 443,
                    Proxy("proxy.example", 3128), timeout)
        g.join()
        return theirs.recv(65536)
    finally:
        theirs.close()


def test_a_connect_answer_is_any_2xx_status_line_read_in_pieces():
    asked = _tunnel_answered(b"HTTP/1.1 200 Connection established\r\n\r\n")
    assert asked.startswith(b"CONNECT 10.0.0.5:443 HTTP/1.1\r\nHost: 10.0.0.5:443\r\n")
    _tunnel_answered(b"HTTP/1.0 204\r\n\r\n")  # no reason phrase: still an answer
    _tunnel_answered(b"HTTP/1.1 2", b"00 OK\r\nVia: p\r", b"\n\r\n")
    _tunnel_answered(b"HTTP/1.1 200 OK\r\n\r\n", timeout=0.8)  # a short deadline met


@pytest.mark.parametrize("answer, why", [
    (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "refused: HTTP/1.1 407"),
    (b"HTTP/1.1 199 Odd\r\n\r\n", "refused"),
    (b"HTTP/1.1 300 Multiple\r\n\r\n", "refused"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP answer"),
    (b"ICY 200 OK\r\n\r\n", "not an HTTP answer"),
    (b"HTTP/1.1 2xx OK\r\n\r\n", "not an HTTP answer"),
    (b"HTTP/1.1 200 OK\r\n\r\nearly", "bytes after its answer"),
    (b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 9000, "longer than 8192 bytes"),
])
def test_a_connect_answer_that_is_no_2xx_fails_the_attempt_naming_why(answer, why):
    with pytest.raises(DeliveryError, match=why):
        _tunnel_answered(answer)


def test_a_proxy_that_does_not_answer_connect_fails_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(OSError):  # the socket's timeout (the client's connect names it)
        _tunnel_answered(timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5.0
    t0 = time.monotonic()  # one that trickles its answer runs out of the same deadline
    with pytest.raises((DeliveryError, OSError)):
        _tunnel_answered(*[b"H"] * 100, timeout=0.3)
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(DeliveryError, match="closed the connection"):
        ours, theirs = socket.socketpair()
        theirs.shutdown(socket.SHUT_WR)  # the proxy hangs up without a word
        try:
            open_tunnel(gevent.socket.socket(fileno=ours.detach()), "10.0.0.5", 443,
                        Proxy("proxy.example", 3128), 5.0)
        finally:
            theirs.close()


def test_a_queue_goes_through_its_connect_proxy_with_its_credentials(pki, servers):
    proxy, plain = servers("proxy"), servers("target")
    mtls = servers("target", _mtls(pki))
    c = HTTPClient(guard=TargetGuard())
    via = egress_of(settings.QueueConfig(proxy_url=f"http://ops:s%40cret@127.0.0.1:{proxy.port}"))
    assert via is not None and via.proxy is not None
    assert "cret" not in repr(via) and "cret" not in str(via.proxy)
    for _ in range(2):
        assert _post(c, f"http://localhost:{plain.port}/hook", via).status == 200
    # plain http is a tunnel too, naming the address the guard checked, kept alive
    assert proxy.asked == [f"CONNECT 127.0.0.1:{plain.port}"]
    assert proxy.auth == ["Basic " + base64.b64encode(b"ops:s@cret").decode()]
    both = Egress(pki["client"].cert, pki["client"].key, pki["ca"].cert, via.proxy)
    assert _post(c, f"https://localhost:{mtls.port}/hook", both).status == 200
    assert proxy.asked[-1] == f"CONNECT 127.0.0.1:{mtls.port}"
    assert mtls.peers == ["queue-client"]  # TLS inside the tunnel, the target's name checked
    assert plain.connections == 1 and mtls.connections == 1
    c.close()


def test_the_guard_checks_the_connect_target_and_the_proxy(servers):
    proxy, target = servers("proxy"), servers("target")
    member_api = target.port  # as a member's own API port: the guard forbids it
    via = Egress(proxy=proxy_of(proxy.url))
    c = HTTPClient(guard=TargetGuard(endpoints=lambda: [("127.0.0.1", member_api)]))
    with pytest.raises(TargetRefused, match="cluster-endpoint"):
        _post(c, f"http://127.0.0.1:{member_api}/queues/x/purge", via)
    with pytest.raises(TargetRefused, match="cluster-endpoint"):  # by name, resolved
        _post(c, f"http://localhost:{member_api}/queues/x/purge", via)
    assert proxy.asked == [] and target.connections == 0
    c.close()
    c = HTTPClient(guard=TargetGuard(endpoints=lambda: [("127.0.0.1", proxy.port)]))
    with pytest.raises(TargetRefused, match="cluster-endpoint"):  # the proxy's own address
        _post(c, f"http://127.0.0.1:{target.port}/hook", via)
    assert proxy.asked == [] and target.connections == 0
    c.close()


def test_a_proxy_that_refuses_fails_the_attempt_without_its_password(servers):
    proxy, target = servers("proxy"), servers("target")
    proxy.status = 407
    via = Egress(proxy=proxy_of(f"http://ops:hunter2@127.0.0.1:{proxy.port}"))
    c = HTTPClient(guard=TargetGuard())
    with pytest.raises(DeliveryError) as info:
        _post(c, f"http://127.0.0.1:{target.port}/hook", via)
    message = str(info.value)
    assert f"proxy 127.0.0.1:{proxy.port}" in message and "407" in message
    assert "hunter2" not in message and "ops" not in message
    assert target.connections == 0
    c.close()


def _ini(tmp_path, body: str):
    path = tmp_path / "m.ini"
    path.write_text(body)
    return settings.load(str(path), env={})


def test_the_queue_options_are_checked_at_start_naming_the_option(pki, tmp_path):
    client, ca = pki["client"], pki["ca"]
    c = _ini(tmp_path, f"[queue:default]\ntls_ca_bundle = {ca.cert}\n"
                       f"[queue:mtls]\ntls_client_cert = {client.cert}\n"
                       f"tls_client_key = {client.key}\nproxy_url = http://u:pw@127.0.0.1:3128\n")
    q = c.queue("mtls")
    assert (q.tls_client_cert, q.tls_client_key, q.tls_ca_bundle) == (
        client.cert, client.key, ca.cert)  # the bundle from [queue:default]
    assert egress_of(q).proxy.port == 3128 and egress_of(c.queue("default")).proxy is None
    assert "pw" not in repr(q) and "pw" not in repr(egress_of(q))  # the password: never shown
    assert egress_of(settings.QueueConfig()) is None
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [(f"tls_client_cert = {client.cert}\n", "queue:q.tls_client_key: "),
             (f"tls_client_key = {client.key}\n", "queue:q.tls_client_cert: "),
             (f"tls_client_cert = {tmp_path / 'gone.pem'}\ntls_client_key = {client.key}\n",
              "queue:q.tls_client_cert: cannot read"),
             (f"tls_client_cert = {client.cert}\ntls_client_key = {ca.key}\n",
              "queue:q.tls_client_key: "),
             (f"tls_ca_bundle = {junk}\n", "queue:q.tls_ca_bundle: "),
             ("proxy_url = https://u:pw@proxy:3128\n", "queue:q.proxy_url: "),
             ("proxy_url = http://u:pw@proxy\n", "queue:q.proxy_url: "),
             ("proxy_url = http://u:pw@proxy:3128/path\n", "queue:q.proxy_url: ")]
    for option, start in cases:
        with pytest.raises(ConfigError) as info:
            _ini(tmp_path, f"[queue:q]\n{option}")
        assert str(info.value).startswith(start), (option, str(info.value))
        assert "pw" not in str(info.value)
