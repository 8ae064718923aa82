"""miyamoto.config.tls and its check at start: a context from good files (the server's, and a
queue's delivery context); every bad file
(unreadable, not a certificate, a key of another certificate, an encrypted key, a bad
client CA) an error naming its option, which ``settings.load`` turns into the exit-2
ConfigError; certificate and key only together."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from miyamoto.config import settings
from miyamoto.config.settings import ConfigError
from miyamoto.config.tls import TLSFileError, client_context, server_context
from tlscerts import Pair, make_ca, make_cert

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    return {"ca": ca, "node": make_cert(d, ca, "node"), "other": make_cert(d, ca, "other")}


def _option(cert: str, key: str, ca: str = "") -> str:
    with pytest.raises(TLSFileError) as info:
        server_context(cert, key, ca)
    return info.value.option


def test_good_files_make_a_tls12_server_context(files):
    ctx = server_context(files["node"].cert, files["node"].key)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    mtls = server_context(files["node"].cert, files["node"].key, files["ca"].cert)
    assert mtls.verify_mode == ssl.CERT_REQUIRED


def test_each_bad_file_names_its_option(files, tmp_path):
    node, other = files["node"], files["other"]
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert _option(str(tmp_path / "missing.pem"), node.key) == "tls_cert"
    assert _option(node.cert, str(tmp_path / "missing.key")) == "tls_key"
    assert _option(str(junk), node.key) == "tls_cert"
    assert _option(node.cert, str(junk)) == "tls_key"
    assert _option(node.cert, other.key) == "tls_key"  # the key of another certificate
    assert _option(node.cert, node.key, str(junk)) == "tls_client_ca"
    assert _option(node.cert, node.key, str(tmp_path / "none.pem")) == "tls_client_ca"
    with pytest.raises(TLSFileError, match="is not the key of"):
        server_context(node.cert, other.key)


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(files, tmp_path):
    locked = tmp_path / "locked.key"
    subprocess.run(["openssl", "pkey", "-in", files["node"].key, "-out", str(locked),
                    "-aes256", "-passout", "pass:secret"], check=True, capture_output=True)
    with pytest.raises(TLSFileError, match="encrypted") as info:
        server_context(files["node"].cert, str(locked))
    assert info.value.option == "tls_key"


def test_load_checks_the_files_and_names_the_option(files):
    node, other = files["node"], files["other"]
    c = settings.load(env={}, flags={"tls_cert": node.cert, "tls_key": node.key,
                                     "tls_client_ca": files["ca"].cert})
    assert (c.tls_cert, c.tls_key, c.tls_client_ca) == (node.cert, node.key, files["ca"].cert)
    assert settings.load(env={}).tls_cert == ""
    cases = [({"tls_cert": node.cert}, "tls_key: tls_cert and tls_key go together"),
             ({"tls_key": node.key}, "tls_cert: tls_cert and tls_key go together"),
             ({"tls_client_ca": files["ca"].cert}, "tls_client_ca: mutual TLS needs"),
             ({"tls_cert": node.cert, "tls_key": other.key}, "tls_key: ")]
    for flags, start in cases:
        with pytest.raises(ConfigError) as info:
            settings.load(env={}, flags=flags)
        assert str(info.value).startswith(start), (flags, str(info.value))
    with pytest.raises(ConfigError, match="^tls_cert: cannot read"):
        settings.load(env={"MIYAMOTO_TLS_CERT": str(Path(node.cert).with_name("gone.pem")),
                           "MIYAMOTO_TLS_KEY": node.key})


def test_a_queues_client_context_verifies_and_names_each_bad_file(files, tmp_path):
    node, ca = files["node"], files["ca"]
    ctx = client_context(node.cert, node.key, ca.cert)
    assert (ctx.verify_mode, ctx.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for args, option in [((node.cert, ""), "tls_client_key"), (("", node.key), "tls_client_cert"),
                         ((str(junk), node.key), "tls_client_cert"),
                         ((node.cert, files["other"].key), "tls_client_key"),
                         (("", "", str(junk)), "tls_ca_bundle"),
                         (("", "", str(tmp_path / "gone.pem")), "tls_ca_bundle")]:
        with pytest.raises(TLSFileError) as info:
            client_context(*args)
        assert info.value.option == option, args


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[ssl.SSLObject,
                                                                        ssl.SSLObject]:
    """A TLS handshake in memory between the two contexts (no socket)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    done = {id(srv): False, id(cli): False}
    for _ in range(20):
        for obj in (cli, srv):
            if not done[id(obj)]:
                try:
                    obj.do_handshake()
                    done[id(obj)] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return srv, cli
    raise AssertionError("no handshake")


def test_the_server_speaks_http_1_1_to_a_client_that_offers_h2_first(files):
    server = server_context(files["node"].cert, files["node"].key)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cafile=files["ca"].cert)
    client.set_alpn_protocols(["h2", "http/1.1"])
    _, cli = _handshake(server, client)
    assert cli.selected_alpn_protocol() == "http/1.1"


def test_without_a_ca_bundle_a_queue_trusts_the_systems_store():
    if not ssl.get_default_verify_paths().cafile:
        pytest.skip("this system has no default CA file")
    ctx = client_context()
    assert ctx.cert_store_stats()["x509_ca"] > 0
    assert (ctx.verify_mode, ctx.check_hostname) == (ssl.CERT_REQUIRED, True)
