"""A real node tells its targets who calls: a delivery carries an OIDC token that PyJWT
verifies against the JWKS fetched from the node (as a target's middleware does: the
discovery document, then the key by its kid), and a webhook-signature with an HMAC v1
entry (checked by the standardwebhooks reference package) beside an Ed25519 v1a entry
(checked against the public key the node publishes)."""

from __future__ import annotations

import base64
import time

import jwt
import pytest
import standardwebhooks
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from keymaker import rsa_pem, whsk

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def _v1a_verifies(public: str, headers: dict, body: bytes) -> bool:
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public[len("whpk_"):]))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    for entry in headers["webhook-signature"].split(" "):
        version, _, sig = entry.partition(",")
        if version == "v1a":
            key.verify(base64.b64decode(sig), signed)  # raises InvalidSignature
            return True
    return False


@pytest.mark.timeout(60)
def test_a_delivery_carries_a_token_the_nodes_jwks_verifies_and_both_signatures(
        node_factory, sink, tmp_path):
    pem = tmp_path / "oidc.pem"
    pem.write_text(rsa_pem())
    node = node_factory(options={"signing_secret": SECRET},
                        queues={"calls": {"oidc_audience": f"{sink.url}/calls"}},
                        env={"oidc_signing_key_file": str(pem), "ed25519_signing_key": whsk()},
                        start=False)
    node.extra_args += ["--oidc-issuer", node.url]  # the node's own address: its port is known now
    node.start().wait_ready()
    queued = node.enqueue("calls", url=f"{sink.url}/calls", json={"n": 1})
    own = node.enqueue(url=f"{sink.url}/own", oidc_audience="https://own.example", json={"n": 2})
    (calls,) = sink.wait_for(count=1, path="/calls")
    (mine,) = sink.wait_for(count=1, path="/own")

    discovery = node.get("/.well-known/openid-configuration").json()
    assert discovery["issuer"] == node.url
    jwks = jwt.PyJWKClient(discovery["jwks_uri"], cache_keys=False)
    for req, aud, queue in ((calls, f"{sink.url}/calls", "calls"),
                            (mine, "https://own.example", "default")):
        scheme, _, token = req.headers["Authorization"].partition(" ")
        assert scheme == "Bearer"
        key = jwks.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=aud,
                            issuer=node.url, options={"require": ["exp", "iat", "sub"]})
        assert claims["sub"] == queue and 0 < claims["exp"] - time.time() <= 300
        with pytest.raises(jwt.InvalidAudienceError):
            jwt.decode(token, key.key, algorithms=["RS256"], audience="https://elsewhere")

    public = node.get("/.well-known/webhook-public-key").json()["public_key"]
    for req, answer in ((calls, queued), (mine, own)):
        assert req.headers["webhook-id"] == answer["id"]
        assert standardwebhooks.Webhook(SECRET).verify(req.body.decode(), req.headers)
        assert _v1a_verifies(public, req.headers, req.body)
    log = node.log_text()
    assert "PRIVATE KEY" not in log and whsk()[5:] not in log
