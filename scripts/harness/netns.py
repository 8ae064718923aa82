"""Hosts in network namespaces, on bridges the harness owns, with links it can cut and heal.

Why: on one loopback address no link ever breaks, so partitions could only be faked
(SIGSTOP freezes the whole process, not one link). Here every node runs in a "host", a
network namespace of its own, and the harness cuts that host's wire.

Layout (``Net``, one per run; needs root and ``ip`` from iproute2, nothing else)::

    root ns  --- veth mymPIDrK 10.77.N.1/24 --------------+
                                                          |  hub ns: bridges only,
    host h1: ctl0 10.77.N.11/24 --- veth --- [bridge brh] +  no address, no route
             cl0  10.78.N.11/24 --- veth --- [bridge brc0]   (split side B: brc1)
    host h2: ctl0 10.77.N.12/24 ...          ...

Two links per host, on purpose:

- the **control** link (10.77.N.0/24, bridge ``brh``) carries the node's HTTP API and its
  deliveries to the sink; the test process (root ns, 10.77.N.1) is on it too. It stays
  up unless a cut asks for it (``cut(host, control=True)``).
- the **cluster** link (10.78.N.0/24, bridges ``brc0``/``brc1``) carries the ZeroMQ
  traffic between nodes and nothing else; it exists only inside the run's namespaces.

Faults are bridge membership, so they are silent, as a real partition is: the host's
carrier stays up and its packets go nowhere (no RST, no "network unreachable").
``cut`` detaches a host's hub port from its bridge; ``split(a, b)`` moves side B's ports
onto a second bridge, so each side still talks among itself; ``heal`` puts ports back.
No ``tc``, ``nft`` or ``iptables`` is needed (this box's kernel has no ``netem``); delay
or loss, if ever wanted, would be a ``tc netem`` qdisc on a hub port.

Names: every namespace is ``mymt-PID-...`` and the one root-ns link ``mymPIDrK``, PID
being the owner's process id; ``sweep_stale()`` (run by every ``Net``) deletes those of
owners that are gone (``python -m harness.netns sweep`` from ``scripts/`` too). The address block 10.77.N / 10.78.N uses the lowest N (1..250) no
live run holds (chosen under a lock file). The root namespace gets one link and its
connected /24 route, nothing else: no forwarding, no firewall rule. ``close()`` (also run
at exit) kills what still runs in the run's namespaces and deletes them, which takes
their veths with them.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

from .nodes import PROGRAM, NodeProcess
from .waits import LOCAL_HOSTS, HarnessError

CONTROL_NET = "10.77"  # 10.77.N.0/24: HTTP + sink, the root ns is .1
CLUSTER_NET = "10.78"  # 10.78.N.0/24: ZeroMQ between nodes only
HOST_BASE = 10  # host i (1-based) is .10+i
NS_PREFIX = "mymt-"
LOCK_PATH = "/tmp/miyamoto-netns.lock"
_NS_RE = re.compile(r"^mymt-(\d+)-")
_LINK_RE = re.compile(r"^mym(\d+)r\d*(@\S+)?$")
_COUNTER = iter(range(100))

_OPEN: "weakref.WeakSet[Net]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # a safety net; owners close their Net themselves
    for net in list(_OPEN):
        net.close()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; a failure raises HarnessError with ip's own message."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def unavailable() -> str | None:
    """Why this process cannot build a Net (None: it can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns` is unavailable: {e}"
    if r.returncode != 0:
        return f"`ip netns` is unavailable: {r.stderr.strip()}"
    probe = f"{NS_PREFIX}{os.getpid()}-probe"
    try:  # what a Net needs: a namespace, a bridge and a veth pair in it
        for args in (("netns", "add", probe), ("-n", probe, "link", "add", "b0", "type", "bridge"),
                     ("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")):
            r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
            if r.returncode != 0:
                return f"`ip {' '.join(args)}` failed: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(ns: str) -> None:
    """SIGKILL what still runs in ``ns`` (a run's own nodes, orphaned if it died), so
    deleting the name does not leave a namespace alive behind its processes."""
    for pid in ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def sweep_stale() -> list[str]:
    """Delete the namespaces (and what runs in them) and root links of runs whose process
    is gone; returns their names."""
    gone = []
    for ns in _namespaces():
        m = _NS_RE.match(ns)
        if m and not _alive(int(m.group(1))):
            _kill_inside(ns)
            ip("netns", "del", ns, check=False)
            gone.append(ns)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip() if len(parts) > 1 else ""
        m = _LINK_RE.match(name)
        if m and not _alive(int(m.group(1))):
            ip("link", "del", name.split("@")[0], check=False)
            gone.append(name)
    return gone


def _taken_blocks() -> set[int]:
    """The 10.77.N blocks the root ns already has an address or a route in."""
    out = ip("-o", "-4", "addr", "show", check=False).stdout + ip("-4", "route", check=False).stdout
    return {int(m.group(1)) for m in re.finditer(rf"\b{re.escape(CONTROL_NET)}\.(\d+)\.", out)}


@dataclass
class Host:
    """One namespace with a control and a cluster address; ``exec`` runs a program in it."""

    name: str  # the caller's name, e.g. "a"
    index: int
    ns: str
    control_ip: str
    cluster_ip: str

    @property
    def exec(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]


class Net:
    """The bridges, the hosts and the faults of one run (see the module docstring)."""

    def __init__(self) -> None:
        why = unavailable()
        if why:
            raise HarnessError(why)
        sweep_stale()
        self.pid = os.getpid()
        self.prefix = f"{NS_PREFIX}{self.pid}-{id(self) & 0xffff:x}"
        self.hub = f"{self.prefix}-hub"
        self.root_link = f"mym{self.pid}r{next(_COUNTER)}"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        self.closed = False
        _OPEN.add(self)
        with open(LOCK_PATH, "a") as lock:  # two runs must not pick the same block
            fcntl.flock(lock, fcntl.LOCK_EX)
            free = [n for n in range(1, 251) if n not in _taken_blocks()]
            if not free:
                raise HarnessError(f"no free {CONTROL_NET}.N.0/24 block left")
            self.block = free[0]
            try:
                self._build_hub()
            except BaseException:
                self.close()
                raise
        self.root_ip = f"{CONTROL_NET}.{self.block}.1"
        LOCAL_HOSTS.add(self.root_ip)

    # ------------------------------------------------------------ building
    def _add_ns(self, ns: str) -> None:
        ip("netns", "add", ns)
        self._made.append(ns)
        ip("-n", ns, "link", "set", "lo", "up")

    def _build_hub(self) -> None:
        self._add_ns(self.hub)
        for br in ("brh", "brc0", "brc1"):
            ip("-n", self.hub, "link", "add", br, "type", "bridge")
            ip("-n", self.hub, "link", "set", br, "up")
        ip("link", "add", self.root_link, "type", "veth", "peer", "name", "root", "netns", self.hub)
        ip("-n", self.hub, "link", "set", "root", "master", "brh", "up")
        ip("addr", "add", f"{CONTROL_NET}.{self.block}.1/24", "dev", self.root_link)
        ip("link", "set", self.root_link, "up")

    def add_host(self, name: str) -> Host:
        """A new namespace with its two links, both on the main bridges."""
        if self.closed:
            raise HarnessError("this Net is closed")
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        i = len(self.hosts) + 1
        if i > 200:
            raise ValueError("at most 200 hosts")
        host = Host(name, i, f"{self.prefix}-h{i}", f"{CONTROL_NET}.{self.block}.{HOST_BASE + i}",
                    f"{CLUSTER_NET}.{self.block}.{HOST_BASE + i}")
        self._add_ns(host.ns)
        for hub_end, end, addr, br in ((f"h{i}", "ctl0", host.control_ip, "brh"),
                                       (f"c{i}", "cl0", host.cluster_ip, "brc0")):
            ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", end,
               "netns", host.ns)
            ip("-n", self.hub, "link", "set", hub_end, "master", br, "up")
            ip("-n", host.ns, "addr", "add", f"{addr}/24", "dev", end)
            ip("-n", host.ns, "link", "set", end, "up")
        self.hosts[name] = host
        LOCAL_HOSTS.add(host.control_ip)
        return host

    def node(self, host: Host | str, base_dir: os.PathLike | str, node_id: str | None = None,
             **kw: Any) -> NodeProcess:
        """A NodeProcess run in ``host``: HTTP on its control address, ZeroMQ on its
        cluster address (ports as NodeProcess picks them; each namespace has its own)."""
        h = self.hosts[host] if isinstance(host, str) else host
        return NodeProcess(base_dir, node_id or h.name, http_host=h.control_ip,
                           cluster_host=h.cluster_ip, program=[*h.exec, *PROGRAM], **kw)

    # ------------------------------------------------------------ faults
    def _host(self, host: Host | str) -> Host:
        return self.hosts[host] if isinstance(host, str) else host

    def _port(self, port: str, bridge: str | None) -> None:
        if bridge is None:
            ip("-n", self.hub, "link", "set", port, "nomaster")
        else:
            ip("-n", self.hub, "link", "set", port, "master", bridge)

    def cut(self, host: Host | str, control: bool = False) -> None:
        """Cut ``host``'s cluster link (and, with ``control``, its HTTP/sink link too)."""
        h = self._host(host)
        self._port(f"c{h.index}", None)
        if control:
            self._port(f"h{h.index}", None)

    def heal(self, host: Host | str | None = None) -> None:
        """Put ``host``'s links (every host's, for None) back on the main bridges."""
        for h in ([self._host(host)] if host is not None else self.hosts.values()):
            self._port(f"c{h.index}", "brc0")
            self._port(f"h{h.index}", "brh")

    def split(self, side_a: Iterable[Host | str], side_b: Iterable[Host | str]) -> None:
        """A partition: side B's cluster links move to a bridge of their own, so each side
        talks among itself and not across; hosts in neither list stay with side A. Both
        sides keep their control links (HTTP and sink)."""
        a = {self._host(h).name for h in side_a}
        b = [self._host(h) for h in side_b]
        if a & {h.name for h in b}:
            raise ValueError(f"{sorted(a & {h.name for h in b})} on both sides")
        for h in b:
            self._port(f"c{h.index}", "brc1")

    def flap(self, host: Host | str, down: float, up: float, times: int,
             control: bool = False, on_cut: Any = None) -> None:
        """Cut ``host`` for ``down`` s and heal it for ``up`` s, ``times`` times (blocks);
        ``on_cut()`` runs right before each cut."""
        for _ in range(times):
            if on_cut is not None:
                on_cut()
            self.cut(host, control)
            time.sleep(down)
            self.heal(host)
            time.sleep(up)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Delete every namespace this run made (their veths go with them); idempotent."""
        if self.closed:
            return
        self.closed = True
        for ns in reversed(self._made):
            _kill_inside(ns)  # a safety net: the owner stops its nodes first
            ip("netns", "del", ns, check=False)
        ip("link", "del", self.root_link, check=False)  # gone with the hub; to be sure
        LOCAL_HOSTS.discard(getattr(self, "root_ip", ""))
        for h in self.hosts.values():
            LOCAL_HOSTS.discard(h.control_ip)
        _OPEN.discard(self)

    def __enter__(self) -> "Net":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def leftovers() -> list[str]:
    """This process's namespaces still present (a test checks teardown with it)."""
    return [ns for ns in _namespaces() if ns.startswith(f"{NS_PREFIX}{os.getpid()}-")]


if __name__ == "__main__":  # python -m harness.netns sweep: delete dead runs' leftovers
    if sys.argv[1:] == ["sweep"]:
        print("\n".join(sweep_stale()) or "nothing stale")
