"""A tiny authoritative DNS responder on a UDP port, for the tests that need a name a
node resolves to an address the test chooses (the SSRF guard's DNS-rebinding case).

A node process is pointed at it with gevent's c-ares resolver: ``GEVENT_RESOLVER=ares``,
``GEVENT_RESOLVER_NAMESERVERS=127.0.0.1`` and ``GEVENTARES_UDP_PORT=<port>`` (c-ares
takes the port as a channel option; see ``env()``). It answers A and AAAA questions
for the names it was given (every other name: NXDOMAIN), records every question, and
runs in a daemon thread of the test process, like the sink.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from typing import Iterable, Mapping

A, AAAA = 1, 28


def _qname(packet: bytes, at: int) -> tuple[str, int]:
    labels = []
    while True:
        n = packet[at]
        at += 1
        if n == 0:
            return ".".join(labels).lower(), at
        labels.append(packet[at:at + n].decode("ascii", "replace"))
        at += n


class DnsStub:
    def __init__(self, records: Mapping[str, Iterable[str]]):
        self.records = {k.lower().rstrip("."): [ipaddress.ip_address(a) for a in v]
                        for k, v in records.items()}
        self.questions: list[tuple[str, int]] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="dnsstub")

    def env(self) -> dict[str, str]:
        """The environment that points a node's gevent resolver at this responder."""
        return {"GEVENT_RESOLVER": "ares", "GEVENT_RESOLVER_NAMESERVERS": "127.0.0.1",
                "GEVENTARES_UDP_PORT": str(self.port), "GEVENTARES_TCP_PORT": str(self.port),
                "GEVENT_RESOLVER_TIMEOUT": "2"}

    def start(self) -> "DnsStub":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self._sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                answer = self._answer(packet)
            except (IndexError, struct.error):
                continue  # not a question we can parse: drop it
            self._sock.sendto(answer, peer)

    def _answer(self, packet: bytes) -> bytes:
        qid, _flags, qdcount = struct.unpack("!HHH", packet[:6])
        name, end = _qname(packet, 12)
        qtype, _qclass = struct.unpack("!HH", packet[end:end + 4])
        question = packet[12:end + 4]
        self.questions.append((name, qtype))
        addrs = self.records.get(name)
        if addrs is None:
            return struct.pack("!HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
        want = 4 if qtype == A else 6 if qtype == AAAA else 0
        rrs = [a for a in addrs if a.version == want]
        out = struct.pack("!HHHHHH", qid, 0x8580, 1, len(rrs), 0, 0) + question
        for a in rrs:
            out += struct.pack("!HHHIH", 0xC00C, qtype, 1, 1, len(a.packed)) + a.packed
        return out
