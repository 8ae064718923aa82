"""The HTTP API over https with mutual TLS on a real node: the Python client (``ca``,
``cert``), the CLI (``--cacert``, ``--cert``, ``--key``) and the dashboard's page; a
client without a certificate, or one that does not know the node's CA, refused in one
line; a renewed certificate taken on SIGHUP without a restart (and a bad one refused,
the old kept); a key that does not match its certificate exits 2 naming it."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
from pathlib import Path

import pytest

from conftest import write_node_config
from helpers import NodeProcess, run_cli, wait_until
from miyamoto import Client
from tlscerts import make_ca, make_cert

pytestmark = pytest.mark.timeout(60)


def _served_name(port: int, ca: str, client: tuple[str, str]) -> str:
    """The common name of the certificate a new connection is served."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return dict(x[0] for x in tls.getpeercert()["subject"])["commonName"]


def test_https_client_cli_dashboard_and_a_reload_on_sighup(tmp_path, proc_registry, sink):
    ca = make_ca(tmp_path)
    one, two = make_cert(tmp_path, ca, "one"), make_cert(tmp_path, ca, "two")
    me = make_cert(tmp_path, ca, "me", client=True)
    mine = (me.cert, me.key)
    served = tmp_path / "served"
    served.mkdir()
    cert, key = served / "node.pem", served / "node.key"
    shutil.copy(one.cert, cert)
    shutil.copy(one.key, key)
    ini = write_node_config(tmp_path / "tls.ini", {"tls_cert": cert, "tls_key": key,
                                                   "tls_client_ca": ca.cert})
    node = NodeProcess(tmp_path, "tls", config=ini, registry=proc_registry, tls_ca=ca.cert,
                       tls_client=mine)
    node.start().wait_ready()
    assert node.url.startswith("https://")

    with Client(node.url, ca=ca.cert, cert=mine) as client:
        task = client.enqueue(sink.url_for("/tls"), {"a": "1"})
    assert sink.wait_for(count=1, path="/tls")[0].task_id == task["id"]
    page = node.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]

    cp = run_cli("status", "--server", node.url, "--cacert", ca.cert, "--cert", me.cert,
                 "--key", me.key)
    assert cp.returncode == 0, cp.stderr
    for args in ([], ["--cacert", ca.cert]):  # the system's CAs do not know ours; no cert
        cp = run_cli("status", "--server", node.url, *args)
        assert cp.returncode == 1 and "Traceback" not in cp.stderr, cp.stderr
        assert cp.stderr.startswith("miyamoto: ") and len(cp.stderr.splitlines()) == 1

    assert _served_name(node.http_port, ca.cert, mine) == "one"
    shutil.copy(two.cert, cert)
    shutil.copy(two.key, key)
    node.signal(signal.SIGHUP)
    wait_until(lambda: _served_name(node.http_port, ca.cert, mine) == "two", 10,
               what="the renewed certificate")
    key.write_text(Path(one.key).read_text())  # a key of another certificate: refused
    node.signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in node.log_text(), 10, what="the refused reload")
    assert _served_name(node.http_port, ca.cert, mine) == "two" and node.running
    assert node.starts == 1


def test_a_key_that_does_not_match_exits_2_naming_it(tmp_path):
    ca = make_ca(tmp_path)
    one, two = make_cert(tmp_path, ca, "one"), make_cert(tmp_path, ca, "two")
    cp = run_cli("serve", "--http", "127.0.0.1:0", "--data-dir", ":memory:",
                 "--tls-cert", one.cert, "--tls-key", two.key)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.startswith("miyamoto: bad option tls_key: ") and "Traceback" not in cp.stderr
