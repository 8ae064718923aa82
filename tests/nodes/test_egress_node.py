"""A queue's ``proxy_url`` on a real node: its deliveries reach the sink through a
CONNECT proxy (a thread of the test process that records what it is asked), with the
proxy's credentials, while another queue's go direct. The client's units (mutual TLS,
the guard on the proxy and the tunnel's target) are in tests/unit/delivery/test_egress.py."""

from __future__ import annotations

import base64
import socket
import socketserver
import threading

import pytest


class ConnectProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.auth: list[str] = []
        super().__init__(("127.0.0.1", 0), _Tunnel)

    @property
    def port(self) -> int:
        return self.server_address[1]


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    finally:
        b.close()


class _Tunnel(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        proxy: ConnectProxy = self.server  # type: ignore[assignment]
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        verb, target, _ = lines[0].split(" ", 2)
        proxy.asked.append(f"{verb} {target}")
        proxy.auth += [ln.split(": ", 1)[1] for ln in lines[1:]
                       if ln.lower().startswith("proxy-authorization:")]
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        back.start()
        _pipe(self.request, upstream)
        back.join(10)


@pytest.fixture
def proxy():
    server = ConnectProxy()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(60)
def test_a_queues_deliveries_go_through_its_proxy(node_factory, sink, proxy):
    node = node_factory(queues={"outward": {
        "proxy_url": f"http://relay:pa%3Ass@127.0.0.1:{proxy.port}"}})
    node.enqueue("outward", url=sink.url_for("/via"), json={"n": 1})
    node.enqueue(url=sink.url_for("/direct"), json={"n": 2})
    (via,) = sink.wait_for(count=1, path="/via")
    sink.wait_for(count=1, path="/direct")
    assert via.headers.get("X-Task-Queue") == "outward"
    assert proxy.asked == [f"CONNECT 127.0.0.1:{sink.port}"]  # the default queue: direct
    assert proxy.auth == ["Basic " + base64.b64encode(b"relay:pa:ss").decode()]
    assert "pa%3Ass" not in node.log_text() and "pa:ss" not in node.log_text()
