"""Reusable test fixtures: real node processes, a real HTTP sink, deadline waits.

They live in the one harness the scripts use too (``scripts/harness``: see its
docstring for why there); this module puts it on ``sys.path`` and keeps the names the
tests import from ``helpers``. Nothing here monkey-patches. The sink is a
``ThreadingHTTPServer`` in a daemon thread of the test process; nodes are
``python -m miyamoto serve`` subprocesses whose output goes to a log file in the test's
tmp dir (and into the failure report, through ``conftest.py``). Every wait is a
condition with a deadline.

For cluster tests::

    a = NodeProcess(tmp_path, "a", registry=reg).start().wait_ready()
    b = NodeProcess(tmp_path, "b", seeds=[a.cluster_addr], registry=reg).start().wait_ready()
    b.kill(); b.restart().wait_ready()
    sink = Sink().start()
    sink.reply("/w", 500, 500, 200)          # a script; the last reply repeats
    reqs = sink.wait_for(count=3, path="/w")
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from miyamoto.wire.freshness import stamp as make_stamp  # noqa: E402
from miyamoto.wire.transport import CurveKeys, join_proof  # noqa: E402
from harness import (CLUSTER_KEYS, REPO, HarnessError, NodeDied, NodeProcess, ProcessRegistry,  # noqa: E402
                     Reply, Request, Sink, cluster_view, free_port, free_ports, member_ids,
                     metrics, plan_cluster, port_refuses, probe_view, run_cli, stop_all,
                     wait_converged, wait_until, write_ini)

__all__ = [
    "CLUSTER_CURVE", "CLUSTER_KEYS", "REPO", "SCRIPTS", "HarnessError", "NodeDied", "NodeProcess",
    "LocalServer", "NotifySocket", "ProcessRegistry", "Reply", "Request", "Sink", "as_member",
    "cluster_view", "copy_sources", "dealer", "definition_write", "free_port", "free_ports",
    "loaded", "member_ids", "metrics",
    "proven_id",
    "plan_cluster", "port_refuses", "probe_view", "run_cli", "stop_all", "wait_converged",
    "wait_until", "write_ini",
]


class LocalServer:
    """A ``ThreadingHTTPServer`` of ``handler`` on an OS-given port of 127.0.0.1, serving in
    a daemon thread of the test process until ``close``: a stand-in for a node or a proxy
    whose answers a test scripts in the handler (for a worker endpoint use ``Sink``)."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# (public, secret, server key) of the test cluster's key pair, as a raw DEALER sets them
CLUSTER_CURVE = (CLUSTER_KEYS[0].encode(), CLUSTER_KEYS[1].encode(), CLUSTER_KEYS[0].encode())


def copy_sources(dest: Path, names: list[str]) -> Path:
    """Copy the checkout's ``names`` (files and folders, no __pycache__) into ``dest``: a
    clean source tree to build a wheel, an sdist or an image from."""
    for name in names:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, dest / name)
    return dest


def definition_write(node: NodeProcess, method: str, path: str, **kw: Any) -> Any:
    """A definition write (a queue's settings, a topic, a schedule), again while the answer
    is 503: a cluster just formed or just re-led takes no write until its leader holds a
    majority's set (``definitions``). The last answer once 20 s are gone."""
    deadline = time.monotonic() + 20
    while True:
        r = node.request(method, path, timeout=15, **kw)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def loaded(seconds: float, most: float = 4.0) -> float:
    """A deadline of ``seconds`` on an idle box, stretched by the load per core on a busy
    one (at most ``most`` times): a scenario's readiness waits held 30 s on a quiet box
    and ran out at a load of 9 on two cores, where starting a node takes several times
    as long. It only moves the deadline; the wait still ends when its condition holds."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * min(most, max(1.0, per_core))


def metric(node: NodeProcess, name: str) -> float:
    """One sample of the node's GET /metrics: the unlabelled line of ``name``, else its
    first labelled one; AssertionError if it has neither."""
    r = node.get("/metrics", timeout=5)
    assert r.status_code == 200, r.text
    lines = r.text.splitlines()
    for prefix in (name + " ", name + "{"):
        for line in lines:
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name} in {r.text[:500]}")


class Peer:
    """A raw pyzmq DEALER that stamps every message it sends as a node does (its own
    incarnation and a growing sequence, ``miyamoto.wire.freshness``), unless told
    ``stamp=None``; a given ``stamp`` (boot, seq) is sent as it is (a replay)."""

    def __init__(self, sock: Any, boot: int | None = None) -> None:
        self.sock = sock
        self.boot = int(time.time() * 1000) if boot is None else boot
        self.seq = 0

    def send_multipart(self, frames: list[bytes], stamp: Any = True) -> None:
        if stamp is True:
            self.seq += 1
            frames = [*frames, make_stamp(self.boot, self.seq)]
        elif stamp is not None:
            frames = [*frames, make_stamp(*stamp)]
        self.sock.send_multipart(frames)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def proven_id(identity: bytes, public: bytes, cluster: tuple[str, str] = CLUSTER_KEYS) -> bytes:
    """``identity`` as a node of ``cluster`` (the test cluster's pair) with the public key
    ``public`` (Z85) makes its routing id: a NUL and a tag (unless it has them), then
    the join proof."""
    from zmq.utils import z85

    if b"\x00" not in identity:
        identity += b"\x00" + os.urandom(8)
    return identity + join_proof(CurveKeys(*cluster), z85.decode(public))


def as_member(node: NodeProcess, server: bytes = CLUSTER_CURVE[0]) -> dict[str, Any]:
    """``dealer`` arguments to speak as ``node`` itself (the strongest insider): its own
    key pair, read from its data dir, aimed at the cluster's server key, and its current
    incarnation (a later one would shut the real node's frames out, as a restart does)."""
    with open(os.path.join(node.data_dir, "node.key")) as f:
        keys = json.load(f)
    with open(os.path.join(node.data_dir, "boot")) as f:
        boot = int(f.read())
    return {"curve": (keys["public"].encode(), keys["secret"].encode(), server), "boot": boot}


def dealer(address: str, identity: bytes | None,
           curve: tuple[bytes, bytes, bytes] | None = CLUSTER_CURVE, *,
           prove: bool = True, cluster: tuple[str, str] = CLUSTER_KEYS,
           boot: int | None = None) -> Peer:
    """A raw (blocking) pyzmq DEALER, in the test process, connected to ``address``; by
    default it holds the test cluster's key pair and proves it knows the cluster's secret
    (an insider), ``curve=None`` for none; ``prove=False``: no join proof."""
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 2000)  # close() waits until what we sent went out
    if identity is not None and curve is not None and prove \
            and len(identity) + 9 + 16 <= 255:  # (a longer one is refused anyway)
        identity = proven_id(identity, curve[0], cluster)
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    if curve is not None:
        public, secret, server = curve
        s.setsockopt(zmq.CURVE_PUBLICKEY, public)
        s.setsockopt(zmq.CURVE_SECRETKEY, secret)
        s.setsockopt(zmq.CURVE_SERVERKEY, server)
    s.connect(address)
    return Peer(s, boot)


class NotifySocket:
    """systemd's side of sd_notify for a test: an abstract Unix datagram socket whose
    ``name`` goes in the node's NOTIFY_SOCKET, and the (sender pid, text) of each message
    (SO_PASSCRED: the kernel vouches for the pid)."""

    def __init__(self) -> None:
        self.name = f"@miyamoto-notify-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.05)
        self.messages: list[tuple[int, str]] = []

    def poll(self) -> list[tuple[int, str]]:
        """Take what has arrived; every message so far."""
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except (BlockingIOError, TimeoutError):
                return self.messages
            pid = next((struct.unpack("iII", d[:12])[0] for level, kind, d in ancillary
                        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), 0)
            self.messages.append((pid, data.decode()))

    def close(self) -> None:
        self.sock.close()
