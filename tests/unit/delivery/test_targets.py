"""The target guard in-process: every spelling of a denied address, allow over deny, the
cluster's endpoints, the enqueue-time URL check, and the delivery client's
(``miyamoto.delivery.httpclient``) connect-time check over http and https against a real socket
on 127.0.0.1 (a resolver stub stands in for DNS)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest

from miyamoto.delivery import httpclient
from miyamoto.delivery.types import DeliveryError, TargetRefused
from miyamoto.delivery.httpclient import HTTPClient
from miyamoto.delivery.targets import TargetGuard, parse_address, parse_ipv4
from miyamoto.tasks.validate import Limits, ValidationError, check_url

pytestmark = pytest.mark.timeout(30)

METADATA_SPELLINGS = [
    "169.254.169.254", "169.254.169.254.", "2852039166", "0xa9fea9fe", "0XA9FEA9FE",
    "0251.0376.0251.0376", "0xa9.0xfe.0xa9.0xfe", "169.254.43518", "169.16689662",
    "0xa9.16689662", "025177524776", "[::ffff:169.254.169.254]", "::ffff:a9fe:a9fe",
    "[::ffff:a9fe:a9fe]", "::169.254.169.254", "[64:ff9b::169.254.169.254]",
    "2002:a9fe:a9fe::1", "[0:0:0:0:0:ffff:169.254.169.254]",
]


@pytest.mark.parametrize("host", METADATA_SPELLINGS)
def test_every_spelling_of_the_metadata_address_is_refused(host):
    rule = TargetGuard().check_literal(host, 80)
    assert rule is not None and rule.startswith("cloud-metadata"), (host, rule)


@pytest.mark.parametrize("text, expected", [
    ("1.2.3.4", "1.2.3.4"), ("0x7f.1", "127.0.0.1"), ("127.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0", "0.0.0.0"),
    ("0x", "0.0.0.0"), ("010.0x10.4", "8.16.0.4"), ("1.2.3.4.", "1.2.3.4"),
])
def test_ipv4_is_read_like_inet_aton(text, expected):
    assert parse_ipv4(text) == ipaddress.IPv4Address(expected)
    if text != "0x":  # WHATWG reads a bare 0x as 0; inet_aton refuses it (denied either way)
        assert socket.inet_ntoa(socket.inet_aton(text.rstrip("."))) == expected


@pytest.mark.parametrize("text", ["1.2.3.256", "256.1.1.1", "1.2.3.4.5", "08", "1..2",
                                  "0x1g", "example.com", "1.2.3.4x", "4294967296", "", "."])
def test_names_and_overflows_are_not_addresses(text):
    assert parse_ipv4(text) is None


def test_ipv6_brackets_and_zone_ids():
    assert parse_address("[fe80::1%25eth0]") == ipaddress.IPv6Address("fe80::1")
    assert parse_address("fe80::1%eth0") == ipaddress.IPv6Address("fe80::1")
    assert parse_address("[::1]") == ipaddress.IPv6Address("::1")
    assert parse_address("[::1") is None


@pytest.mark.parametrize("host, rule", [
    ("169.254.1.2", "link-local"), ("[fe80::1%25eth0]", "link-local"),
    ("0.0.0.0", "this-network"), ("0", "this-network"), ("0.1.2.3", "this-network"),
    ("[::]", "unspecified"), ("224.0.0.251", "multicast"), ("[ff02::1]", "multicast"),
    ("255.255.255.255", "broadcast"), ("[fd00:ec2::254]", "cloud-metadata"),
    ("100.100.100.200", "cloud-metadata"), ("169.254.170.2", "cloud-metadata"),
    ("metadata.google.internal", "cloud-metadata"), ("METADATA.Google.Internal.", "cloud-metadata"),
    ("metadata", "cloud-metadata"), ("[::ffff:169.254.1.1]", "link-local"),
])
def test_builtin_deny(host, rule):
    got = TargetGuard().check_literal(host, 80)
    assert got is not None and got.startswith(rule), (host, got)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "[::1]", "localhost", "10.0.0.1",
                                  "172.16.5.4", "192.168.1.1", "[fd12::1]", "100.64.0.1",
                                  "example.com", "worker.internal", "8.8.8.8"])
def test_loopback_private_and_names_stay_allowed(host):
    assert TargetGuard().check_literal(host, 80) is None


def test_configured_deny_names_the_option_and_covers_every_spelling():
    g = TargetGuard(deny=["127.0.0.0/8"])
    for host in ("127.0.0.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]", "localhost"):
        rule = g.check_literal(host, 80)
        assert rule and "target_deny 127.0.0.0/8" in rule, (host, rule)
    assert g.check_literal("10.0.0.1", 80) is None


def test_allow_wins_over_builtin_and_configured_deny():
    g = TargetGuard(deny=["10.0.0.0/8"], allow=["169.254.0.0/16", "10.1.0.0/16"])
    assert g.check_literal("169.254.169.254", 80) is None
    assert g.check_literal("[::ffff:169.254.169.254]", 80) is None
    assert g.check_literal("10.1.2.3", 80) is None
    assert "target_deny" in (g.check_literal("10.2.0.1", 80) or "")
    assert g.check_literal("[fe80::1]", 80)  # only what was allowed


def test_endpoints_exact_and_wildcard():
    own = [("127.0.0.1", 8088), ("0.0.0.0", 6000)]
    g = TargetGuard(endpoints=lambda: own, is_local=lambda a: a.is_loopback or str(a) == "10.9.9.9")
    assert "cluster-endpoint" in g.check_literal("127.0.0.1", 8088)
    assert "cluster-endpoint" in g.check_literal("localhost", 8088)
    assert "cluster-endpoint" in g.check_literal("0x7f000001", 8088)
    assert "cluster-endpoint" in g.check_literal("[::ffff:127.0.0.1]", 8088)
    assert g.check_literal("127.0.0.2", 8088) is None  # not the address it is bound to
    assert g.check_literal("127.0.0.1", 8089) is None
    # bound on 0.0.0.0: the port on every local address, and only there
    for host in ("127.0.0.1", "127.3.4.5", "10.9.9.9", "[::1]"):
        assert "cluster-endpoint" in (g.check_literal(host, 6000) or ""), host
    assert g.check_literal("10.9.9.8", 6000) is None


def test_every_localhost_name_is_loopback_when_checking_the_clusters_own_endpoints():
    # RFC 6761: localhost and every name under it resolve to loopback, whatever a
    # resolver says, so each is this node's own port, checked before any lookup
    g = TargetGuard(endpoints=lambda: [("127.0.0.1", 8088), ("[::1]", 6000)])
    for host in ("localhost", "LOCALHOST.", "app.localhost", "a.b.localhost."):
        assert "cluster-endpoint" in (g.check_literal(host, 8088) or ""), host
        assert "cluster-endpoint" in (g.check_literal(host, 6000) or ""), host
        assert g.check_literal(host, 8089) is None, host
    # a name that only looks like it is an ordinary name, checked at connect
    for host in ("localhost.example.com", "notlocalhost", "localhostx"):
        assert g.check_literal(host, 8088) is None, host
    # and a configured deny of loopback covers them the same way
    d = TargetGuard(deny=["127.0.0.0/8", "::1/128"])
    assert "target_deny" in (d.check_literal("svc.localhost", 80) or "")


def test_only_the_ipv4_compatible_range_carries_an_ipv4_address():
    g = TargetGuard()
    assert "cloud-metadata" in (g.check_literal("[::a9fe:a9fe]", 80) or "")  # ::169.254.169.254
    # one bit above ::/96 it is an IPv6 address of its own, no IPv4 inside
    assert g.check_literal("[::1:a9fe:a9fe]", 80) is None


def test_a_wildcard_bound_port_is_refused_only_on_this_hosts_addresses():
    g = TargetGuard(endpoints=lambda: [("0.0.0.0", 6000)])  # the real is_local check
    assert "cluster-endpoint" in (g.check_literal("127.0.0.1", 6000) or "")
    assert g.check_literal("203.0.113.7", 6000) is None  # TEST-NET-3: never this host's
    assert g.check_address("203.0.113.7", 6000) is None


def test_a_deny_block_with_host_bits_set_covers_its_network():
    g = TargetGuard(deny=["10.1.2.3/16"])
    assert "target_deny" in (g.check_literal("10.1.200.9", 80) or "")
    assert g.check_literal("10.2.0.1", 80) is None


def test_member_endpoints_and_endpoints_read_on_each_check():
    own: list[tuple[str, int]] = []
    g = TargetGuard(endpoints=lambda: own)
    assert g.check_literal("10.0.0.5", 8088) is None
    g.set_member_endpoints([("10.0.0.5", 8088), ("node-b.example", 6000)])
    assert "cluster-endpoint" in g.check_literal("10.0.0.5", 8088)
    assert "cluster-endpoint" in g.check_literal("NODE-B.example.", 6000)
    assert "cluster-endpoint" in g.check_address("10.0.0.7", 6000, "node-b.example")
    assert g.check_literal("127.0.0.1", 9000) is None  # (cached: the change below clears it)
    own.append(("127.0.0.1", 9000))  # the node's port is known late (bound to port 0)
    assert "cluster-endpoint" in g.check_literal("127.0.0.1", 9000)
    g.set_member_endpoints([])
    assert g.check_literal("10.0.0.5", 8088) is None


def test_own_endpoints_given_as_one_tuple_follow_the_members_and_free_their_port():
    # Node._own_endpoints answers the same tuple while they stay the same (the guard then
    # skips the rebuild): the members' changes are still seen, and when the own ones go
    # away (an empty tuple, as the members' are) the port they held is no longer refused
    own: list[tuple] = [(("127.0.0.1", 9000),)]
    g = TargetGuard(endpoints=lambda: own[0])
    assert "cluster-endpoint" in (g.check_address("127.0.0.1", 9000) or "")
    assert "cluster-endpoint" in (g.check_address("127.0.0.1", 9000) or "")  # the fast path
    g.set_member_endpoints([("10.0.0.5", 8088)])  # the same own tuple, new members
    assert "cluster-endpoint" in (g.check_address("10.0.0.5", 8088) or "")
    g.set_member_endpoints([])
    assert g.check_address("10.0.0.5", 8088) is None
    own[0] = ()
    assert g.check_address("127.0.0.1", 9000) is None
    assert g.check_literal("127.0.0.1", 9000) is None


def test_check_url_refuses_with_400_naming_the_field():
    limits = Limits(targets=TargetGuard().check_literal)
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/",
                "http://2852039166/", "http://0xa9fea9fe/", "https://metadata.google.internal/x"):
        with pytest.raises(ValidationError) as info:
            check_url("url", url, limits)
        assert info.value.field == "url" and info.value.status == 400
        assert "cloud-metadata" in info.value.message
    assert check_url("url", "http://127.0.0.1:9/w", limits) == "http://127.0.0.1:9/w"
    assert check_url("url", "http://worker.example/w", limits)
    limits = Limits(targets=TargetGuard(endpoints=lambda: [("127.0.0.1", 443)]).check_literal)
    with pytest.raises(ValidationError):
        check_url("callback", "https://127.0.0.1/x", limits)  # the scheme's default port


# ---------------------------------------------------------------- the client, on real sockets
# The client's own behaviour (and the guard over http: a denied literal, every resolved
# address, the node's own port by name, no redirects) is in tests/unit/delivery/test_httpclient.py.

@pytest.fixture
def listener():
    """A socket on 127.0.0.1 that accepts, counts and closes each connection: enough to
    see whether the client connected at all (over http or https alike)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)
    state = {"connections": 0, "stop": False}

    def serve() -> None:
        while not state["stop"]:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            state["connections"] += 1  # before the close the client waits for
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield sock.getsockname()[1], state
    state["stop"] = True
    t.join(2)
    sock.close()


def _resolving_to(monkeypatch, addresses):
    """The client's resolver answers ``addresses`` for any name (stands in for DNS)."""
    def fake(host, port, *args):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]
    monkeypatch.setattr(httpclient.gevent.socket, "getaddrinfo", fake)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_client_checks_its_guard_before_connecting(listener, monkeypatch, scheme):
    """The guard the client was given is checked at connect under both schemes, on a
    literal and on every address a name resolves to; nothing refused is connected to."""
    port, state = listener
    client = HTTPClient(guard=TargetGuard(deny=["127.0.0.0/8"]))
    with pytest.raises(TargetRefused, match="target_deny 127.0.0.0/8"):
        client.request("POST", f"{scheme}://127.0.0.1:{port}/w", body=b"", headers={},
                       timeout=5)
    client.close()
    client = HTTPClient(guard=TargetGuard())
    _resolving_to(monkeypatch, ["127.0.0.1", "169.254.169.254"])
    with pytest.raises(TargetRefused, match="169.254.169.254.*cloud-metadata"):
        client.request("POST", f"{scheme}://rebind.example:{port}/w", body=b"", headers={},
                       timeout=5)
    # the control: allowed, the same URL connects (and fails on the closed connection,
    # which the accept loop counts before closing it, in order after any earlier connect)
    _resolving_to(monkeypatch, ["127.0.0.1"])
    with pytest.raises(DeliveryError) as info:
        client.request("POST", f"{scheme}://rebind.example:{port}/w", body=b"", headers={},
                       timeout=5)
    assert not isinstance(info.value, TargetRefused), info.value
    assert state["connections"] == 1  # the refused requests made none
    client.close()
