"""OIDC tokens for targets and the published keys: claims, expiry, the cache, the JWKS's
shape and the rotation listing, each checked with PyJWT as a target would."""

from __future__ import annotations

import dataclasses
import time

import jwt
import pytest

from keymaker import ec_key, ed_key, rsa_key
from miyamoto.config import keys
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.identity import (TOKEN_LIFETIME, TOKEN_REUSE, Identity, public_jwk)
from miyamoto.delivery.types import DeliveryError
from miyamoto.tasks.task import Task

ISSUER = "https://tasks.example.com"
AUD = "https://worker.example.com/hook"


def _now() -> float:
    """This second: PyJWT checks exp and iat against its own clock, so a test's tokens are
    minted at its own run (a module-wide time taken at collection is minutes old by the
    time a long suite reaches these tests)."""
    return float(int(time.time()))



def identity(key=None, previous=(), **kw) -> Identity:
    return Identity(ISSUER, key or rsa_key(), tuple(previous), **kw)


def verify(token: str, ident: Identity, aud: str = AUD) -> dict:
    """As a target does: the key by the token's kid from the JWKS, then every claim."""
    kid = jwt.get_unverified_header(token)["kid"]
    jwk = next(k for k in ident.jwks()["keys"] if k["kid"] == kid)
    key = jwt.PyJWK(jwk)
    return jwt.decode(token, key.key, algorithms=[jwk["alg"]], audience=aud, issuer=ISSUER,
                      options={"require": ["exp", "iat", "iss", "aud", "sub"]})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("key,alg", [(rsa_key, "RS256"), (ec_key, "ES256")])
def test_a_token_names_issuer_audience_and_queue_and_lives_five_minutes(key, alg):
    now = _now()
    ident = identity(key())
    token = ident.token(AUD, "emails", now)
    assert jwt.get_unverified_header(token)["alg"] == alg
    claims = jwt.decode(token, key().public_key(), algorithms=[alg], audience=AUD,
                        issuer=ISSUER)
    assert claims == {"iss": ISSUER, "sub": "emails", "aud": AUD, "iat": int(now),
                      "exp": int(now) + TOKEN_LIFETIME}
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(token, key().public_key(), algorithms=[alg], audience="https://other")


@pytest.mark.timeout(30)
def test_a_token_is_reused_until_a_minute_before_it_expires_then_minted_anew():
    now = _now()
    ident = identity()
    first = ident.token(AUD, "q", now)
    assert ident.token(AUD, "q", now + TOKEN_REUSE - 1) is first
    assert ident.token(AUD, "other-queue", now) != first  # sub differs
    assert ident.token("https://other", "q", now) != first
    again = ident.token(AUD, "q", now + TOKEN_REUSE)
    assert again != first
    exp = jwt.decode(again, options={"verify_signature": False})["exp"]
    assert exp == int(now + TOKEN_REUSE) + TOKEN_LIFETIME
    # whatever a target's clock, a sent token has at least a minute of life left
    assert exp - (now + TOKEN_REUSE + TOKEN_REUSE - 1) >= TOKEN_LIFETIME - TOKEN_REUSE
    assert ident.token(AUD, "q", now - 10) != again  # a clock stepped back: minted anew


@pytest.mark.timeout(30)
def test_an_expired_token_is_refused_by_pyjwt():
    now = _now()
    ident = identity()
    verify(ident.token(AUD, "q", now), ident)
    old = ident.token(AUD, "q", now - TOKEN_LIFETIME - 1)
    with pytest.raises(jwt.ExpiredSignatureError):
        verify(old, ident)


@pytest.mark.timeout(30)
def test_the_jwks_lists_the_current_key_first_then_the_retired_ones_once():
    now = _now()
    old_rsa, old_ec = rsa_key(1), ec_key()
    ident = identity(previous=[old_rsa.public_key(), old_ec.public_key(),
                               old_rsa.public_key(), rsa_key().public_key()])
    listed = ident.jwks()["keys"]
    assert [k["kid"] for k in listed] == [public_jwk(k)["kid"] for k in (
        rsa_key().public_key(), old_rsa.public_key(), old_ec.public_key())]
    assert [(k["kty"], k["alg"], k["use"]) for k in listed] == [
        ("RSA", "RS256", "sig"), ("RSA", "RS256", "sig"), ("EC", "ES256", "sig")]
    assert set(listed[0]) == {"kty", "n", "e", "kid", "alg", "use"}  # no private member
    assert set(listed[2]) == {"kty", "crv", "x", "y", "kid", "alg", "use"}
    # a token of the retired key (made before the rotation) still verifies
    before = Identity(ISSUER, old_rsa).token(AUD, "q", now)
    assert verify(before, ident)["sub"] == "q"
    doc = ident.discovery()
    assert doc["issuer"] == ISSUER and doc["jwks_uri"] == ISSUER + "/.well-known/jwks.json"
    assert doc["id_token_signing_alg_values_supported"] == ["ES256", "RS256"]


def test_the_kid_is_the_rfc7638_thumbprint():
    """RFC 7638 section 3.1's example key and its thumbprint."""
    n = ("0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6"
         "tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5"
         "v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08"
         "qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8a"
         "wapJzKnqDKgw")
    key = jwt.PyJWK({"kty": "RSA", "n": n, "e": "AQAB"}).key
    assert public_jwk(key)["kid"] == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


def test_a_node_without_a_key_mints_nothing_and_publishes_nothing():
    now = _now()
    ident = Identity()
    assert not ident.mints and ident.webhook_public_key() is None
    with pytest.raises(DeliveryError, match="oidc_signing_key"):
        ident.token(AUD, "q", now)
    task = Task(id="t", queue="q", url=AUD)
    assert ident.bearer(task, QueueConfig(), now) == ""  # nobody asked: no token, no error


@pytest.mark.timeout(30)
def test_the_tasks_audience_wins_over_the_queues():
    now = _now()
    ident = identity()
    q = dataclasses.replace(QueueConfig(), oidc_audience="https://queue-aud")
    aud = lambda t: jwt.decode(ident.bearer(t, q, now), options={"verify_signature": False})["aud"]
    assert aud(Task(id="t", queue="q", url=AUD)) == "https://queue-aud"
    assert aud(Task(id="t", queue="q", url=AUD, oidc_audience="https://mine")) == "https://mine"


def test_a_queues_signature_picks_the_schemes():
    ed = ed_key()
    ident = Identity(hmac_secrets=("whsec_x",), ed25519_key=ed)
    pick = lambda s: ident.signing(dataclasses.replace(QueueConfig(), signature=s))
    assert pick("auto") == (("whsec_x",), ed)
    assert pick("hmac") == (("whsec_x",), None)
    assert pick("ed25519") == ((), ed)
    assert pick("both") == (("whsec_x",), ed)
    assert pick("none") == ((), None)
    assert Identity().signing(QueueConfig()) == ((), None)
    doc = ident.webhook_public_key()
    assert doc["public_key"] == keys.whpk(ed.public_key()) and doc["scheme"] == "v1a"
    assert doc["pem"].startswith("-----BEGIN PUBLIC KEY-----")


@pytest.mark.timeout(30)
def test_a_token_lives_exactly_five_minutes_as_documented():
    now = _now()
    claims = jwt.decode(identity(ec_key()).token(AUD, "q", now),
                        options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 300


@pytest.mark.timeout(30)
def test_a_node_with_a_signing_key_mints():
    assert identity(ec_key()).mints


@pytest.mark.timeout(30)
def test_the_token_cache_keeps_many_pairs_and_starts_over_past_its_bound(monkeypatch):
    from miyamoto.delivery import identity as identity_mod
    monkeypatch.setattr(identity_mod, "MAX_CACHED", 3)
    now = _now()
    ident = identity(ec_key())
    iat = lambda tok: jwt.decode(tok, options={"verify_signature": False})["iat"]
    first = ident.token(AUD, "a", now)
    ident.token(AUD, "b", now + 1)
    ident.token(AUD, "c", now + 2)  # three pairs: all kept
    assert iat(ident.token(AUD, "a", now + 3)) == int(now)
    assert iat(ident.token(AUD, "b", now + 3)) == int(now) + 1
    ident.token(AUD, "d", now + 4)  # a fourth: the cache starts over with it alone
    assert iat(ident.token(AUD, "d", now + 5)) == int(now) + 4
    assert iat(ident.token(AUD, "a", now + 5)) == int(now) + 5  # minted anew
    assert first != ident.token(AUD, "a", now + 6)
