"""Which addresses a task may target: the guard against server-side request forgery.

A task's URL is chosen by whoever may enqueue, and the node POSTs to it from inside
the network, so without a guard a task can read a cloud metadata service, or drive
this cluster's own API (``/queues/x/purge``) with the node's standing. Loopback and
the private ranges stay allowed by default, because self-hosted workers live there;
``target_deny`` adds blocks, ``target_allow`` re-opens any (allow wins over every deny,
built-in or configured).

Denied by default (the rule names appear in errors):

- ``link-local`` 169.254.0.0/16, fe80::/10; ``this-network`` 0.0.0.0/8 and ``unspecified``
  :: (Linux connects both to the local host); ``multicast`` 224.0.0.0/4, ff00::/8;
  ``broadcast`` 255.255.255.255.
- ``cloud-metadata``: 169.254.169.254 (AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle),
  169.254.170.2 (AWS ECS task credentials), 169.254.170.23 and fd00:ec2::23 (EKS pod
  identity), fd00:ec2::254 (AWS IMDS over IPv6), 100.100.100.200 (Alibaba Cloud),
  192.0.0.192 (Oracle Cloud Classic); and by name metadata.google.internal,
  metadata.goog, metadata, instance-data and instance-data.ec2.internal.
- ``cluster-endpoint``: the HTTP and cluster (address, port) of this node and of every
  member. An endpoint bound to 0.0.0.0 or :: listens on every local address, so its
  port is denied on loopback and on every address of this host.

Every spelling of an IPv4 address is read the way inet_aton, libc's getaddrinfo and
browsers (WHATWG URL) read it before any rule is applied: ``2852039166``, ``0xa9fea9fe``,
``0251.0376.0251.0376``, ``169.254.43518``, a trailing dot; IPv6 in brackets or not, with
a zone id, and the IPv4 an IPv6 address carries (mapped ``::ffff:a.b.c.d``, compatible
``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) is checked as well.

Two checks: ``check_literal`` at enqueue (a URL host that is an address or a known bad
name; other names are not resolved then), and ``check_address`` when the delivery
client connects, on every address a name resolved to (DNS rebinding). No I/O here
except ``is_local_address``, which the guard calls only for a wildcard endpoint's port.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[str, int]

BUILTIN_DENY: tuple[tuple[str, str], ...] = (  # (rule, block); the first match names the rule
    ("cloud-metadata", "169.254.169.254/32"),
    ("cloud-metadata", "169.254.170.2/32"),
    ("cloud-metadata", "169.254.170.23/32"),
    ("cloud-metadata", "fd00:ec2::254/128"),
    ("cloud-metadata", "fd00:ec2::23/128"),
    ("cloud-metadata", "100.100.100.200/32"),
    ("cloud-metadata", "192.0.0.192/32"),
    ("link-local", "169.254.0.0/16"),
    ("link-local", "fe80::/10"),
    ("this-network", "0.0.0.0/8"),
    ("unspecified", "::/128"),
    ("multicast", "224.0.0.0/4"),
    ("multicast", "ff00::/8"),
    ("broadcast", "255.255.255.255/32"),
)
METADATA_NAMES = frozenset({
    "metadata.google.internal", "metadata.goog", "metadata", "instance-data",
    "instance-data.ec2.internal",
})
LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
LITERAL_CACHE = 4096  # (host, port) answers kept; the whole cache is dropped when full
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})
_DIGITS = {8: frozenset("01234567"), 10: frozenset("0123456789"),
           16: frozenset("0123456789abcdefABCDEF")}


# ---------------------------------------------------------------- parsing

def _ipv4_part(s: str) -> int | None:
    """One dotted part as inet_aton reads it: 0x.. hex, 0.. octal, else decimal."""
    if s[:2] in ("0x", "0X"):
        digits, base = s[2:], 16
        if not digits:
            return 0  # WHATWG: "0x" alone is zero
    elif len(s) > 1 and s[0] == "0":
        digits, base = s[1:], 8
    else:
        digits, base = s, 10
    if not digits or not all(c in _DIGITS[base] for c in digits):
        return None
    return int(digits, base)


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as an IPv4 address in any inet_aton spelling (1 to 4 parts, the last
    filling the remaining bytes; one trailing dot allowed), else None."""
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    values = [_ipv4_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    *head, last = values  # type: ignore[misc]
    if any(v > 255 for v in head) or last >= 1 << (8 * (5 - len(values))):
        return None
    n = 0
    for v in head:
        n = n << 8 | v
    return ipaddress.IPv4Address(n << (8 * (5 - len(values))) | last)


def parse_address(host: str) -> Address | None:
    """A URL or socket host as an address: brackets, a zone id and a trailing dot are
    dropped, IPv4 is read in every spelling; None for a name."""
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h:
        try:
            return ipaddress.IPv6Address(h.partition("%")[0])
        except ValueError:
            return None
    return parse_ipv4(h)


def embedded(addr: Address) -> list[Address]:
    """``addr`` and every IPv4 address it carries (mapped, compatible, NAT64, 6to4,
    Teredo): a connection to one may end at the other."""
    out: list[Address] = [addr]
    if isinstance(addr, ipaddress.IPv6Address):
        n = int(addr)
        if addr.ipv4_mapped is not None:
            out.append(addr.ipv4_mapped)
        elif n >> 32 == 0 and n > 1:  # ::a.b.c.d (not :: or ::1)
            out.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
        elif addr in _NAT64:
            out.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
        if addr.sixtofour is not None:
            out.append(addr.sixtofour)
        if addr.teredo is not None:
            out.extend(addr.teredo)
    return out


def normal_name(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def is_local_address(addr: Address) -> bool:
    """Whether ``addr`` is an address of this host: binding a UDP socket to it succeeds
    only then (no packet is sent)."""
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(addr), 0))
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- the guard

def _networks(blocks: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(b, strict=False) for b in blocks]


class TargetGuard:
    """The target rules of one node: built-in and configured deny, configured allow,
    and the cluster's endpoints (this node's from ``endpoints``, the members' from
    ``set_member_endpoints``). Thread- and greenlet-safe: state is replaced, never
    mutated in place."""

    def __init__(self, deny: Iterable[str] = (), allow: Iterable[str] = (), *,
                 endpoints: Callable[[], Iterable[Endpoint]] = lambda: (),
                 is_local: Callable[[Address], bool] = is_local_address):
        self._deny = ([(rule, net) for rule, net in zip(
            (r for r, _ in BUILTIN_DENY), _networks(b for _, b in BUILTIN_DENY))]
            + [(f"target_deny {net}", net) for net in _networks(deny)])
        self._allow = _networks(allow)
        self._endpoints = endpoints
        self._is_local = is_local
        self._members: tuple[Endpoint, ...] = ()
        self._index: tuple[tuple[Endpoint, ...], _EndpointIndex] = ((), _EndpointIndex(()))
        self._seen: tuple[Any, Any] = (None, None)  # (own, members) the index was built from
        self._literals: dict[tuple[str, int], str | None] = {}  # check_literal's answers

    @classmethod
    def from_config(cls, config, **kw) -> "TargetGuard":  # config: miyamoto.config.settings.Config
        return cls(config.target_deny, config.target_allow, **kw)

    def set_member_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """The members' HTTP and cluster endpoints (host, port), from the roster."""
        self._members = tuple((str(h), int(p)) for h, p in endpoints)

    # ------------------------------------------------------------ checks
    def check_literal(self, host: str, port: int) -> str | None:
        """At enqueue: the rule that refuses a URL's host, if it is an address (in any
        spelling) or a known bad name; None for any other name (checked at connect).

        Answers are cached per (host, port) until the endpoints change: a full check
        costs ~18 us, a cached one under 1 us, and most enqueues name a few workers."""
        self._endpoints_index()  # clears the cache when the endpoints changed
        key = (host, port)
        try:
            return self._literals[key]
        except KeyError:
            pass
        rule = self._check_literal(host, port)
        if len(self._literals) >= LITERAL_CACHE:
            self._literals.clear()
        self._literals[key] = rule
        return rule

    def _check_literal(self, host: str, port: int) -> str | None:
        name = normal_name(host)
        if name in METADATA_NAMES:
            return f"cloud-metadata name {name}"
        addr = parse_address(host)
        if addr is not None:
            return self.check_address(addr, port)
        if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
            for lo in LOOPBACK:
                rule = self.check_address(lo, port)
                if rule:
                    return rule
        return self._endpoints_index().by_name(name, port)

    def check_address(self, ip: str | Address, port: int, name: str = "") -> str | None:
        """At connect: the rule that refuses (ip, port), else None. ``name`` is the host
        name it was resolved from, which an endpoint given by name matches."""
        addr = ip if not isinstance(ip, str) else parse_address(ip)
        if addr is None:
            return f"unparsable address {ip!r}"
        if name and normal_name(name) in METADATA_NAMES:
            return f"cloud-metadata name {normal_name(name)}"
        candidates = embedded(addr)
        if any(a.version == net.version and a in net for a in candidates for net in self._allow):
            return None
        for a in candidates:
            for rule, net in self._deny:
                if a.version == net.version and a in net:
                    return f"{rule} ({a} in {net})"
        index = self._endpoints_index()
        for a in candidates:
            rule = index.check(a, port, self._is_local)
            if rule:
                return rule
        return index.by_name(normal_name(name), port) if name else None

    def _endpoints_index(self) -> "_EndpointIndex":
        """Parsed again only when the endpoints change. An ``endpoints`` that answers
        the same tuple while they stay the same (``Node._own_endpoints``) costs one
        identity compare per check; another (a list, say), one tuple compare."""
        own = self._endpoints()
        seen = self._seen
        if own is seen[0] and self._members is seen[1] and isinstance(own, tuple):
            return self._index[1]
        key = tuple(own) + self._members
        if key != self._index[0]:
            self._index = (key, _EndpointIndex(key))
            self._literals = {}
        self._seen = (own, self._members)
        return self._index[1]


class _EndpointIndex:
    """The cluster's endpoints, parsed once: exact (address, port) pairs, the ports
    bound on a wildcard address, and the ones given by name."""

    def __init__(self, endpoints: Iterable[Endpoint]):
        self.exact: set[tuple[Address, int]] = set()
        self.wild_ports: set[int] = set()
        self.names: set[tuple[str, int]] = set()
        for host, port in endpoints:
            h = normal_name(host)
            addr = parse_address(h)
            if h in _WILDCARDS:
                self.wild_ports.add(port)
            elif addr is not None:
                for a in embedded(addr):
                    self.exact.add((a, port))
            elif h == "localhost":
                self.exact.update((lo, port) for lo in LOOPBACK)
            else:
                self.names.add((h, port))

    def check(self, addr: Address, port: int, is_local: Callable[[Address], bool]) -> str | None:
        if (addr, port) in self.exact:
            return f"cluster-endpoint ({_hostport(addr, port)} is this cluster's)"
        if port in self.wild_ports and is_local(addr):
            return f"cluster-endpoint ({_hostport(addr, port)}: a port this cluster binds on every address)"
        return None

    def by_name(self, name: str, port: int) -> str | None:
        if (name, port) in self.names:
            return f"cluster-endpoint ({name}:{port} is this cluster's)"
        return None


def _hostport(addr: Address, port: int) -> str:
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
