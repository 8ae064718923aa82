"""``miyamoto.node.Node`` as it composes its parts, built in process and never started (no
socket bound): one ``Identity`` is shared by the engine (what deliveries send) and the
API (what it publishes and whether it takes an ``oidc_audience``)."""

from __future__ import annotations

import io

import pytest
import ujson

from keymaker import rsa_pem
from miyamoto.config.settings import load
from miyamoto.node import Node

pytestmark = pytest.mark.timeout(30)


def _enqueue(node: Node, task: dict) -> tuple[int, dict]:
    body = ujson.dumps(task).encode()
    seen: dict = {}
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/queue", "QUERY_STRING": "",
               "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json"}
    out = b"".join(node.api(environ, lambda status, headers: seen.update(status=status)))
    return int(seen["status"].split()[0]), ujson.loads(out)


def test_a_keyless_node_refuses_an_oidc_audience_naming_it() -> None:
    node = Node(load(env={"MIYAMOTO_DATA_DIR": ":memory:"}))
    assert node.engine.identity is node.identity is node.api.identity
    status, body = _enqueue(node, {"url": "http://127.0.0.1:9/w", "oidc_audience": "https://w"})
    assert status == 400 and body["field"] == "oidc_audience", body
    assert "oidc_signing_key" in body["error"]


def test_a_node_with_a_key_shares_it_with_its_engine_and_api() -> None:
    node = Node(load(env={"MIYAMOTO_DATA_DIR": ":memory:", "MIYAMOTO_OIDC_ISSUER": "https://t",
                          "MIYAMOTO_OIDC_SIGNING_KEY": rsa_pem()}))
    assert node.identity.mints and node.api.limits.oidc
    assert node.engine.identity is node.identity is node.api.identity
