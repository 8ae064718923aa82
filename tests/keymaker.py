"""Keys for the tests of the deliveries' identity (OIDC tokens, v1a signatures), made once
per process: an RSA key takes ~50 ms to make."""

from __future__ import annotations

import base64
import functools

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


def _pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def public_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@functools.lru_cache(maxsize=None)
def _rsa(n: int, bits: int) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def rsa_key(n: int = 0, bits: int = 2048) -> rsa.RSAPrivateKey:
    """Key number ``n`` (the same object each call)."""
    return _rsa(n, bits)


@functools.lru_cache(maxsize=None)
def _ec(curve: str) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1() if curve == "p256" else ec.SECP384R1())


def ec_key(curve: str = "p256") -> ec.EllipticCurvePrivateKey:
    return _ec(curve)


def rsa_pem(n: int = 0, bits: int = 2048) -> str:
    return _pem(rsa_key(n, bits))


def ec_pem(curve: str = "p256") -> str:
    return _pem(ec_key(curve))


ED_SEED = bytes(range(32))


def ed_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.from_private_bytes(ED_SEED)


def whsk(seed: bytes = ED_SEED, with_public: bool = False) -> str:
    raw = seed
    if with_public:
        raw += ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "whsk_" + base64.b64encode(raw).decode()


def ed_pem() -> str:
    return _pem(ed_key())
