"""The HTTP API's TLS context, from the files ``tls_cert``, ``tls_key`` and (for mutual
TLS) ``tls_client_ca`` name; and a queue's delivery context, from its ``tls_client_cert``,
``tls_client_key`` and ``tls_ca_bundle``.

One function builds it, so the check at start (``settings.load``: a file that cannot be
read, a certificate that is not one, a key that does not match the certificate exits 2
naming the option) and the reload on SIGHUP (``Node.reload_tls``: a bad file there keeps
the old context) cannot disagree. ``factory`` is the context class: the server passes
gevent's, whose sockets wait cooperatively; stdlib ssl has no gevent in it, so this
module imports none. An encrypted key is refused rather than asking for a passphrase on
a terminal the node does not have.
"""

from __future__ import annotations

import ssl
from typing import Callable


class TLSFileError(ValueError):
    """A TLS file that cannot serve; ``option`` names the setting that gave it."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


def _readable(files: tuple[tuple[str, str], ...]) -> None:
    """Each (option, path) given names a file we can open, else TLSFileError naming it."""
    for option, path in files:
        if path:
            try:
                open(path, "rb").close()
            except OSError as e:
                raise TLSFileError(option, f"cannot read {path}: {e.strerror}") from None


def _load_pair(ctx: ssl.SSLContext, cert: str, key: str, cert_option: str,
               key_option: str) -> None:
    """``cert`` (a PEM chain, the leaf first) and its unencrypted ``key`` into ``ctx``;
    a file that is not one, or a key that is not the certificate's, names its option."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=cert)
    except ssl.SSLError:
        raise TLSFileError(cert_option, f"{cert} holds no PEM certificate") from None

    def no_passphrase() -> bytes:  # asked only for an encrypted key: refused, not prompted
        raise TLSFileError(key_option, "the key is encrypted; give it unencrypted (mode 0600)")
    try:
        ctx.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise TLSFileError(key_option, f"{key} is not the key of {cert}") from None
        raise TLSFileError(key_option, f"{key} holds no usable PEM private key "
                                       f"({e.reason or e})") from None


def server_context(cert: str, key: str, client_ca: str = "",
                   factory: Callable[[int], ssl.SSLContext] = ssl.SSLContext) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving ``cert`` (PEM, the chain after the leaf) with
    ``key``; with ``client_ca`` every client must show a certificate it signed."""
    _readable((("tls_cert", cert), ("tls_key", key), ("tls_client_ca", client_ca)))
    ctx = factory(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    _load_pair(ctx, cert, key, "tls_cert", "tls_key")
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except ssl.SSLError:
            raise TLSFileError("tls_client_ca", f"{client_ca} holds no PEM certificate") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cert: str = "", key: str = "", ca_bundle: str = "",
                   factory: Callable[[int], ssl.SSLContext] = ssl.SSLContext) -> ssl.SSLContext:
    """A delivery's TLS 1.2+ client context for one queue: certificates and host names
    verified against ``ca_bundle`` (PEM; instead of the system's trust store, so a queue
    for targets under a private CA trusts that CA alone) or the system's, and with
    ``cert`` and ``key`` the client certificate a target that asks for one is shown.
    Errors are ``TLSFileError`` naming ``tls_client_cert``, ``tls_client_key`` or
    ``tls_ca_bundle``."""
    _readable((("tls_client_cert", cert), ("tls_client_key", key), ("tls_ca_bundle", ca_bundle)))
    ctx = factory(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates and host names
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if ca_bundle:
            ctx.load_verify_locations(cafile=ca_bundle)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except ssl.SSLError:
        raise TLSFileError("tls_ca_bundle", f"{ca_bundle} holds no PEM certificate") from None
    if cert or key:
        _client_pair(ctx, cert, key)
    return ctx


def _client_pair(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    if not cert or not key:
        raise TLSFileError("tls_client_key" if cert else "tls_client_cert",
                           "tls_client_cert and tls_client_key go together")
    _load_pair(ctx, cert, key, "tls_client_cert", "tls_client_key")


__all__ = ["TLSFileError", "client_context", "server_context"]
