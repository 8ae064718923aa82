"""Who the deliveries say they are: OIDC tokens for targets, and the webhook signing keys.

A queue's ``oidc_audience`` (or a task's, which wins) makes each delivery carry
``Authorization: Bearer <JWT>``, as Cloud Tasks' ``oidcToken`` does: signed with the
cluster's ``oidc_signing_key`` (RS256 for RSA, ES256 for P-256), ``iss`` the configured
issuer, ``aud`` the audience, ``sub`` the queue, five minutes' life. Every node serves
the issuer's discovery document and the JWKS (the current key and the retired ones in
``oidc_previous_public_key``), so a target verifies with any OIDC library. Minting
costs a signature (RSA-2048: about 1 ms), so a token is cached per (audience, queue)
and minted again a minute before it expires: a busy queue mints one every 4 minutes.

``signature`` per queue picks the ``webhook-signature`` schemes: HMAC ``v1,`` with
``signing_secret``, Standard Webhooks' asymmetric ``v1a,`` (Ed25519) with
``ed25519_signing_key``, whose public key is served as ``whpk_`` for receivers.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from miyamoto.config import keys
from miyamoto.config.settings import Config, QueueConfig
from miyamoto.delivery.types import DeliveryError
from miyamoto.tasks.task import Task

TOKEN_LIFETIME = 300  # s: a token's life (exp - iat)
TOKEN_REUSE = 240  # s: a cached token is sent this long after it was minted, then re-minted
MAX_CACHED = 4096  # (audience, queue) pairs cached; past it the cache starts over
JWKS_PATH = "/.well-known/jwks.json"
DISCOVERY_PATH = "/.well-known/openid-configuration"
WEBHOOK_KEY_PATH = "/.well-known/webhook-public-key"
_NO_SIGNING: tuple[tuple[str, ...], None] = ((), None)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(key: keys.OidcPublic) -> dict[str, Any]:
    """The key as a JWK with its RFC 7638 thumbprint as ``kid``: a kid that names the
    key itself, so every node given the same key names it alike, with no option."""
    if isinstance(key, rsa.RSAPublicKey):
        jwk = RSAAlgorithm.to_jwk(key, as_dict=True)
        members = ("e", "kty", "n")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        jwk = ECAlgorithm.to_jwk(key, as_dict=True)
        members = ("crv", "kty", "x", "y")
    else:
        raise TypeError(f"not an OIDC signing key: {type(key).__name__}")
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    out = {m: jwk[m] for m in members}
    out.update(kid=_b64url(hashlib.sha256(canonical.encode()).digest()),
               alg=keys.algorithm(key), use="sig")
    return out


class Identity:
    """The node's signing keys and its cache of minted tokens (one per node; the engine
    asks it per attempt, the HTTP API serves what it publishes)."""

    def __init__(self, issuer: str = "", signing_key: keys.OidcPrivate | None = None,
                 previous: tuple[keys.OidcPublic, ...] = (), hmac_secrets: tuple[str, ...] = (),
                 ed25519_key: ed25519.Ed25519PrivateKey | None = None):
        self.issuer = issuer
        self.hmac_secrets = hmac_secrets
        self.ed25519 = ed25519_key
        self._key = signing_key
        self._jwks: list[dict[str, Any]] = []
        self._kid = self._alg = ""
        if signing_key is not None:
            current = public_jwk(signing_key.public_key())
            self._kid, self._alg = current["kid"], current["alg"]
            seen = {self._kid}
            self._jwks.append(current)
            for old in previous:
                jwk = public_jwk(old)
                if jwk["kid"] not in seen:
                    seen.add(jwk["kid"])
                    self._jwks.append(jwk)
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}

    @classmethod
    def from_config(cls, config: Config) -> "Identity":
        """Built from options ``settings.load`` already checked (so no parse fails here)."""
        key = keys.oidc_private_key(config.oidc_signing_key) if config.oidc_signing_key else None
        previous = (tuple(keys.oidc_public_keys(config.oidc_previous_public_key))
                    if config.oidc_previous_public_key else ())
        ed = (keys.ed25519_private_key(config.ed25519_signing_key)
              if config.ed25519_signing_key else None)
        return cls(config.oidc_issuer, key, previous, config.signing_secret, ed)

    @property
    def mints(self) -> bool:
        return self._key is not None

    # ------------------------------------------------------------ per attempt
    def token(self, audience: str, subject: str, now: float) -> str:
        """A token for ``audience``: the cached one while it is younger than TOKEN_REUSE
        (so it has a minute of life left when a target checks it), else a new one."""
        if self._key is None:
            raise DeliveryError("an oidc_audience needs oidc_signing_key on this node")
        cached = self._tokens.get((audience, subject))
        if cached is not None and 0 <= now - cached[1] < TOKEN_REUSE:
            return cached[0]
        iat = int(now)
        claims = {"iss": self.issuer, "sub": subject, "aud": audience, "iat": iat,
                  "exp": iat + TOKEN_LIFETIME}
        token = jwt.encode(claims, self._key, algorithm=self._alg,
                           headers={"kid": self._kid, "typ": "JWT"})
        if len(self._tokens) >= MAX_CACHED:
            self._tokens.clear()
        self._tokens[(audience, subject)] = (token, now)
        return token

    def signing(self, queue: QueueConfig) -> tuple[tuple[str, ...], ed25519.Ed25519PrivateKey | None]:
        """The HMAC secrets and the Ed25519 key a queue's ``signature`` asks for (auto:
        each that is set; the config refuses a scheme whose key is missing)."""
        scheme = queue.signature
        if scheme == "auto":
            return self.hmac_secrets, self.ed25519
        if scheme == "none":
            return _NO_SIGNING
        return (self.hmac_secrets if scheme in ("hmac", "both") else (),
                self.ed25519 if scheme in ("ed25519", "both") else None)

    def bearer(self, task: Task, queue: QueueConfig, now: float) -> str:
        """The Authorization header's token for this attempt, "" for none."""
        audience = task.oidc_audience or queue.oidc_audience
        return self.token(audience, task.queue, now) if audience else ""

    # ------------------------------------------------------------ published
    def jwks(self) -> dict[str, Any]:
        """The JWKS: the current key first, then each retired one still listed."""
        return {"keys": list(self._jwks)}

    def discovery(self) -> dict[str, Any]:
        """The OpenID Provider metadata a verifier reads to find the JWKS."""
        return {"issuer": self.issuer, "jwks_uri": self.issuer + JWKS_PATH,
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": sorted({k["alg"] for k in self._jwks}),
                "claims_supported": ["iss", "sub", "aud", "iat", "exp"]}

    def webhook_public_key(self) -> dict[str, Any] | None:
        """The Ed25519 key receivers verify ``v1a,`` with: Standard Webhooks' whpk_ form
        and PEM; None without one."""
        if self.ed25519 is None:
            return None
        pub = self.ed25519.public_key()
        return {"scheme": "v1a", "algorithm": "ed25519", "public_key": keys.whpk(pub),
                "pem": keys.public_pem(pub)}
