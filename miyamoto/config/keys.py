"""The keys that let a target tell who calls it: their text forms, parsed and checked.

``oidc_signing_key`` is a PEM private key that signs the OIDC tokens sent as
``Authorization: Bearer``: RSA (2048 bits or more, RS256: what most verifiers expect,
Google's own tokens included) or EC P-256 (ES256). ``oidc_previous_public_key`` holds
PEM public keys, kept in the JWKS while tokens signed with a retired key may still be
live. ``ed25519_signing_key`` signs Standard Webhooks' asymmetric ``v1a,`` signatures:
``whsk_`` and base64 (the 32-byte seed, or libsodium's 64 bytes: seed then public key)
or a PEM private key. Checked at start (``settings.load``, exit 2 naming the option)
and parsed again by the delivery side; an error never quotes a key.
"""

from __future__ import annotations

import base64
import binascii
import re

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

MIN_RSA_BITS = 2048
OidcPrivate = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
OidcPublic = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z ]+)-----(.+?)-----END \1-----", re.S)


def _pem_blocks(text: str) -> list[bytes]:
    """Each PEM block of ``text``, its lines stripped (an INI value's continuation lines
    keep no indent, an environment variable may carry spaces for newlines)."""
    blocks = []
    for kind, body in _PEM_BLOCK.findall(text):
        b64 = "".join(body.split())
        lines = [b64[i:i + 64] for i in range(0, len(b64), 64)]
        blocks.append("\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----", ""])
                      .encode())
    return blocks


def _one_pem(text: str) -> bytes:
    blocks = _pem_blocks(text)
    if len(blocks) != 1:
        raise ValueError("must be one PEM block (-----BEGIN ...-----), "
                         f"not {len(blocks)}")
    return blocks[0]


def algorithm(key: OidcPrivate | OidcPublic) -> str:
    """The JWS algorithm a key signs with: RS256 for RSA, ES256 for P-256."""
    return "RS256" if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)) else "ES256"


def _check_oidc_kind(key: object) -> None:
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"an RSA key must have at least {MIN_RSA_BITS} bits, "
                             f"not {key.key_size}")
    elif isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ValueError(f"an EC key must be on P-256 (ES256), not {key.curve.name}")
    else:
        raise ValueError("must be an RSA (RS256) or EC P-256 (ES256) key")


def oidc_private_key(text: str) -> OidcPrivate:
    """The unencrypted PEM private key (PKCS#8 or traditional) that signs OIDC tokens."""
    pem = _one_pem(text)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise ValueError("is an encrypted PEM key: give it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ValueError("is not a readable PEM private key") from None
    _check_oidc_kind(key)
    return key  # type: ignore[return-value]


def oidc_public_keys(text: str) -> list[OidcPublic]:
    """One or more PEM public keys (one block after another): the retired signing keys."""
    blocks = _pem_blocks(text)
    if not blocks:
        raise ValueError("must hold PEM public keys (-----BEGIN PUBLIC KEY-----)")
    keys = []
    for i, pem in enumerate(blocks):
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, UnsupportedAlgorithm):
            raise ValueError(f"block {i + 1} is not a readable PEM public key") from None
        try:
            _check_oidc_kind(key)
        except ValueError as e:
            raise ValueError(f"block {i + 1}: {e}") from None
        keys.append(key)
    return keys  # type: ignore[return-value]


def ed25519_private_key(text: str) -> ed25519.Ed25519PrivateKey:
    """Standard Webhooks' ``whsk_<base64>`` (a 32-byte seed, or seed and public key in
    64 bytes), or a PEM Ed25519 private key."""
    text = text.strip()
    if text.startswith("whsk_"):
        try:
            raw = base64.b64decode(text[len("whsk_"):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("is not whsk_ followed by base64") from None
        if len(raw) not in (32, 64):
            raise ValueError(f"whsk_ must decode to 32 or 64 bytes, not {len(raw)}")
        key = ed25519.Ed25519PrivateKey.from_private_bytes(raw[:32])
        if len(raw) == 64 and raw[32:] != public_raw(key.public_key()):
            raise ValueError("whsk_'s last 32 bytes are not the public key of its first 32")
        return key
    if "-----BEGIN" not in text:
        raise ValueError("must be whsk_<base64> or a PEM Ed25519 private key")
    try:
        key = serialization.load_pem_private_key(_one_pem(text), password=None)
    except TypeError:
        raise ValueError("is an encrypted PEM key: give it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ValueError(str(e) if "PEM block" in str(e) else
                         "is not a readable PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError("must be an Ed25519 key (whsk_<base64> or PEM)")
    return key


def public_raw(key: ed25519.Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def whpk(key: ed25519.Ed25519PublicKey) -> str:
    """Standard Webhooks' public key form: ``whpk_`` and the base64 of its 32 bytes."""
    return "whpk_" + base64.b64encode(public_raw(key)).decode()


def public_pem(key: ed25519.Ed25519PublicKey | OidcPublic) -> str:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()
