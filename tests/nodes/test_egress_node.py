"""A queue's ``proxy_url`` on a real node: its deliveries reach the sink through a
CONNECT proxy (a thread of the test process that records what it is asked), with the
proxy's credentials, while another queue's go direct. The client's units (mutual TLS,
the guard on the proxy and the tunnel's target) are in tests/unit/delivery/test_egress.py."""

from __future__ import annotations

import base64

import pytest

from proxykit import ConnectProxy


@pytest.fixture
def proxy():
    server = ConnectProxy()
    yield server
    server.close()


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
