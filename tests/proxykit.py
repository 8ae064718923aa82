"""A CONNECT proxy for the egress tests: a ``ThreadingTCPServer`` in a daemon thread of
the test process (so it serves blocking tests and gevent ones alike), on an OS-given
port of 127.0.0.1, that records each CONNECT's target and Proxy-Authorization and
answers ``status`` (200: then it pipes both ways)."""

from __future__ import annotations

import socket
import socketserver
import threading


class ConnectProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.auth: list[str] = []
        self.status = 200
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self._thread = threading.Thread(target=self.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


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
        if proxy.status != 200:
            self.request.sendall(f"HTTP/1.1 {proxy.status} No\r\nContent-Length: 0\r\n\r\n".encode())
            return
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        back.start()
        _pipe(self.request, upstream)
        back.join(10)
