"""The target guard in real node processes: SSRF spellings refused at enqueue, the allow
and deny options, the node's own API refused, and names that resolve to denied addresses
refused when the delivery connects.

Names resolve through a DNS responder the test runs (``dnsstub.DnsStub``) that the node
reaches through gevent's c-ares resolver (``GEVENT_RESOLVER=ares``, nameserver 127.0.0.1,
``GEVENTARES_UDP_PORT``): gevent's own setting, so the node needs no test-only hook and
the name goes through the same getaddrinfo a production node calls. Only 127.0.0.1 is
contacted: a name that resolves to 169.254.169.254 must fail its attempt on the rule,
which comes before any connect (and a name resolving to the sink and to the metadata
address together must not reach the sink either).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import write_node_config
from dnsstub import DnsStub
from helpers import NodeProcess, ProcessRegistry, Sink

SSRF_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/",
    "http://2852039166/",
    "http://0xa9fea9fe/",
    "http://0251.0376.0251.0376/",
    "http://169.254.43518/",
    "http://169.254.169.254./",
    "http://[::ffff:a9fe:a9fe]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fe80::1%25eth0]/",
    "http://0.0.0.0:80/",
    "http://100.100.100.200/latest/meta-data/",
]


@pytest.fixture
def dns(request: pytest.FixtureRequest) -> Callable[[dict[str, list[str]]], DnsStub]:
    stubs: list[DnsStub] = []

    def make(records: dict[str, list[str]]) -> DnsStub:
        stub = DnsStub(records).start()
        stubs.append(stub)
        return stub

    yield make
    for s in stubs:
        s.stop()


def start_node(tmp_path: Path, reg: ProcessRegistry, node_id: str, *, stub: DnsStub | None = None,
               options: dict[str, Any] | None = None) -> NodeProcess:
    config = write_node_config(tmp_path / f"{node_id}.ini", options)
    proc = NodeProcess(tmp_path, node_id, config=config, registry=reg,
                       raw_env=stub.env() if stub else None)
    return proc.start().wait_ready(15)


def refused(node: NodeProcess, url: str, field: str = "url", **fields: Any) -> str:
    r = node.post("/queue", json={"url": url, **fields})
    assert r.status_code == 400, (url, r.status_code, r.text)
    body = r.json()
    assert body["field"] == field, (url, body)
    return body["error"]


def failed_error(node: NodeProcess, url: str) -> str:
    """Enqueue ``url`` for one attempt; the error the failed attempt recorded."""
    tid = node.enqueue(url=url, max_attempts=1)["id"]
    t = node.wait_task_state(tid, "failed", timeout=10)
    assert t["attempts"] == 1, t
    return t["last_response"]["error"] or ""


@pytest.mark.timeout(30)
def test_ssrf_spellings_are_refused_at_enqueue(node):
    for url in SSRF_URLS:
        error = refused(node, url)
        assert "denied address" in error, (url, error)
    assert "cloud-metadata" in refused(node, "http://2852039166/")
    assert "link-local" in refused(node, "http://[fe80::1%25eth0]/")
    # the form, the callbacks and the batch are checked the same way
    r = node.post("/queue", data="task.url=http://0xa9fea9fe/&a=1",
                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and r.json()["field"] == "url", r.text
    refused(node, "http://127.0.0.1:9/w", field="callback", callback="http://169.254.169.254/")
    r = node.post("/queue/default/batch", json=[{"url": "http://127.0.0.1:9/"},
                                                {"url": "http://[::ffff:169.254.169.254]/"}])
    assert r.status_code == 400 and r.json()["field"] == "tasks[1].url", r.text
    assert sum(node.counts().values()) == 0  # nothing was stored


@pytest.mark.timeout(30)
def test_target_allow_lets_a_denied_block_through(tmp_path, proc_registry):
    node = start_node(tmp_path, proc_registry, "allow", options={"target_allow": "169.254.0.0/16"})
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/",
                "http://2852039166/"):
        r = node.post("/queue", json={"url": url, "countdown": 3600})  # never due in the test
        assert r.status_code == 200, (url, r.text)
    assert "multicast" in refused(node, "http://224.0.0.1/")  # only what was allowed


@pytest.mark.timeout(30)
def test_target_deny_loopback_fails_a_loopback_task(tmp_path, proc_registry, sink: Sink, dns):
    stub = dns({"sink.test": ["127.0.0.1"]})
    node = start_node(tmp_path, proc_registry, "deny", stub=stub,
                      options={"target_deny": "127.0.0.0/8"})
    assert "target_deny 127.0.0.0/8" in refused(node, f"{sink.url}/w")
    error = failed_error(node, f"http://sink.test:{sink.port}/w")
    assert "target_deny 127.0.0.0/8" in error and "127.0.0.1" in error, error
    assert ("sink.test", 1) in stub.questions
    assert sink.count() == 0


@pytest.mark.timeout(40)
def test_names_resolving_to_denied_addresses(tmp_path, proc_registry, sink: Sink, dns):
    stub = dns({"evil.test": ["169.254.169.254"], "two.test": ["127.0.0.1", "169.254.169.254"],
                "good.test": ["127.0.0.1"], "self.test": ["127.0.0.1"]})
    node = start_node(tmp_path, proc_registry, "dns", stub=stub)

    # the resolver works: an allowed name is delivered
    tid = node.enqueue(url=f"http://good.test:{sink.port}/good")["id"]
    node.wait_task_state(tid, "succeeded")
    assert sink.count("/good") == 1

    # a name of the metadata address: the attempt fails on the rule, before any connect
    error = failed_error(node, "http://evil.test/latest/meta-data/")
    assert "cloud-metadata" in error and "169.254.169.254" in error, error
    assert ("evil.test", 1) in stub.questions

    # one allowed and one denied address: refused, the allowed one is not tried either
    error = failed_error(node, f"http://two.test:{sink.port}/two")
    assert "cloud-metadata" in error, error
    assert sink.count("/two") == 0


@pytest.mark.timeout(40)
def test_the_nodes_own_api_cannot_be_targeted(tmp_path, proc_registry, dns):
    stub = dns({"self.test": ["127.0.0.1"]})
    node = start_node(tmp_path, proc_registry, "self", stub=stub)
    kept = node.enqueue("victim", url="http://127.0.0.1:9/never", countdown=3600)["id"]
    purge = "/queues/victim/purge"
    for url in (f"http://127.0.0.1:{node.http_port}{purge}",
                f"http://localhost:{node.http_port}{purge}",
                f"http://2130706433:{node.http_port}{purge}",
                f"http://[::ffff:127.0.0.1]:{node.http_port}{purge}",
                f"http://127.0.0.1:{node.cluster_port}/"):
        assert "cluster-endpoint" in refused(node, url), url
    # a name for it passes the enqueue check and is refused when the delivery connects
    error = failed_error(node, f"http://self.test:{node.http_port}{purge}")
    assert "cluster-endpoint" in error, error
    assert node.task(kept)["state"] == "scheduled"
    assert node.counts("victim")["scheduled"] == 1
