"""The value parsers of ``miyamoto.config.settings``'s settings: each turns one option's
text into its value or raises ValueError saying what is wrong (the loader adds the
option's name and raises ConfigError). Pure functions of a string, so each is tested
alone; the settings table names one per option."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import urllib.parse
from typing import Callable

from miyamoto.tasks.checks import MAX_AUDIENCE, is_audience


def shows(metavar: str) -> Callable[[Callable], Callable]:
    """Name the form a parser takes, as `miyamoto serve --help` shows it (``--http HOST:PORT``)."""
    def mark(parse: Callable) -> Callable:
        parse.metavar = metavar  # type: ignore[attr-defined]
        return parse
    return mark


def _given(v: object) -> str:
    """The text a person gave, quoted and cut short, for a number's error message (never
    used for secrets, whose parsers have their own messages)."""
    text = repr(str(v).strip())
    return text if len(text) <= 40 else text[:37] + "..."


def float_ge(lo: float) -> Callable[[str], float]:
    @shows("SECONDS")
    def parse(v: str) -> float:
        try:
            x = float(str(v).strip())
        except ValueError:
            x = float("nan")
        if not x >= lo or x == float("inf"):
            raise ValueError(f"must be a number >= {lo:g}, not {_given(v)}")
        return x
    return parse


def int_ge(lo: int) -> Callable[[str], int]:
    @shows("N")
    def parse(v: str) -> int:
        try:
            x = int(str(v).strip())
        except ValueError:
            raise ValueError(f"must be a whole number >= {lo}, not {_given(v)}") from None
        if x < lo:
            raise ValueError(f"must be a whole number >= {lo}, not {x}")
        return x
    return parse


@shows("BOOL")
def boolean(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false (or 1/0, yes/no, on/off), not {_given(v)}")


@shows("HOST:PORT")
def hostport(v: str) -> str:
    host, sep, port = str(v).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:8088, not {_given(v)}")
    return f"{host}:{int(port)}"


@shows("tcp://HOST:PORT")
def zmq_endpoint(v: str) -> str:
    s = str(v).strip()
    try:
        if not s.startswith("tcp://"):
            raise ValueError(s)
        hostport(s[len("tcp://"):])
    except ValueError:
        raise ValueError(f"must be tcp://HOST:PORT, e.g. tcp://127.0.0.1:6000, not {_given(v)}"
                         ) from None
    return s


@shows("tcp://HOST:PORT,...")
def seeds(v: str) -> tuple[str, ...]:
    return tuple(zmq_endpoint(s) for s in str(v).split(",") if s.strip())


@shows("LEVEL")
def level(v: str) -> str:
    s = str(v).strip().upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"must be debug, info, warning, error or critical, not {_given(v)}")
    return s


def one_of(v: str, choices: tuple[str, ...]) -> str:
    s = str(v).strip().lower()
    if s not in choices:
        raise ValueError(f"must be {' or '.join(choices)}, not {_given(v)}")
    return s


@shows("text|json")
def log_format(v: str) -> str:
    s = str(v).strip().lower()
    if s not in ("text", "json"):
        raise ValueError(f"must be text or json, not {_given(v)}")
    return s




@shows("URL")
def issuer_url(v: str) -> str:
    """An OIDC issuer: an http(s) URL with a host and no query or fragment (the
    discovery document is at ISSUER/.well-known/openid-configuration); one trailing /
    dropped."""
    s = str(v).strip()
    if not s:
        return s
    parts = urllib.parse.urlsplit(s)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or not s.isascii() or not s.isprintable() or " " in s:
        raise ValueError(f"must be an http(s) URL with a host and no query, not {_given(v)}")
    return s.rstrip("/")


def audience(v: str) -> str:
    """An OIDC token's audience (aud): 1-2083 printable ASCII characters without spaces,
    usually the target's URL."""
    s = str(v).strip()
    if s and not is_audience(s):  # the task field's rule (empty: none)
        raise ValueError(f"must be 1-{MAX_AUDIENCE} printable ASCII characters without spaces")
    return s


def public_url(v: str) -> str:
    """The base URL workers reach this node's API at: http(s)://host[:port][/path],
    kept without a trailing /."""
    s = str(v).strip()
    if not s:
        return s
    parts = urllib.parse.urlsplit(s)
    try:
        parts.port
    except ValueError:
        raise ValueError("must be http(s)://host[:port][/path] (its port is not a port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or not s.isascii() or not s.isprintable() or " " in s:
        raise ValueError("must be http(s)://host[:port][/path], no query or fragment")
    return s.rstrip("/")


def proxy_url(v: str) -> str:
    """An HTTP CONNECT proxy: http://[user:password@]host:port, nothing after the port
    but an optional /. A refusal never repeats the value (it may hold a password)."""
    s = str(v).strip()
    if not s:
        return s
    parts = urllib.parse.urlsplit(s)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None \
            or parts.path not in ("", "/") or parts.query or parts.fragment \
            or not s.isascii() or not s.isprintable() or " " in s:
        raise ValueError("must be http://[user:password@]host:port (an HTTP CONNECT proxy; "
                         "the value is not repeated here, it may hold a password)")
    return s


def stripped(v: str) -> str:
    return str(v).strip()


@shows("ID")
def node_id(v: str) -> str:
    s = str(v).strip()
    if len(s.encode()) > 200 or not s.isprintable() or any(c in s for c in " ,/"):
        raise ValueError("must be at most 200 printable characters, no spaces, commas or /")
    return s


WEBHOOK_KEY_BYTES = (24, 64)  # what Standard Webhooks recommends for a signing key


def secret(v: str) -> tuple[str, ...]:
    """``whsec_<base64>`` secrets, comma- or space-separated (several for rotation:
    every delivery is signed with each). Checked here, not at the first delivery,
    where a bad one would fail every attempt. The error never quotes a secret."""
    lo, hi = WEBHOOK_KEY_BYTES
    out = []
    for i, part in enumerate(str(v).replace(",", " ").split()):
        if not part.startswith("whsec_"):
            raise ValueError(f"entry {i + 1} must start with whsec_ (Standard Webhooks secret)")
        try:
            key = base64.b64decode(part[len("whsec_"):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"entry {i + 1} is not whsec_ followed by base64") from None
        if not lo <= len(key) <= hi:
            raise ValueError(f"entry {i + 1} must decode to {lo}-{hi} bytes, not {len(key)}")
        out.append(part)
    return tuple(out)


def signing_key(v: str) -> str:
    """A QStash signing key (``sig_...`` in Upstash's console): 16 to 200 printable
    characters without spaces; the HMAC key of the Upstash-Signature JWTs. The error
    never quotes it."""
    s = str(v).strip()
    if s and not (16 <= len(s) <= 200 and s.isascii() and s.isprintable() and " " not in s):
        raise ValueError("must be 16-200 printable ASCII characters without spaces")
    return s


def z85_key(v: str) -> str:
    """A 40-character Z85 key; one pair of quotes around it is dropped (no Z85 key holds a
    quote), as `docker run --env-file` passes a quoted value on with its quotes."""
    s = str(v).strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        s = s[1:-1]
    if s and len(s) != 40:
        raise ValueError("must be a 40-character Z85 CurveZMQ key (miyamoto keygen)")
    return s


@shows("CIDR,...")
def cidrs(v: str) -> tuple[str, ...]:
    """Comma-separated CIDR blocks (or single addresses), normalised: 10.0.0.0/8,fd00::/8."""
    out = []
    for part in str(v).split(","):
        part = part.strip()
        if part:
            try:
                out.append(str(ipaddress.ip_network(part, strict=False)))
            except ValueError:
                raise ValueError(f"{part!r} is not an address or CIDR block") from None
    return tuple(out)


# the API tokens' scopes, widest first (``miyamoto.http.auth`` says what each may do)
TOKEN_SCOPES = ("admin", "enqueue", "read")


def parse_tokens(v: str) -> tuple[tuple[str, str], ...]:
    """The ``api_tokens`` option, ``SCOPE:TOKEN,...``; a token is 16-512 printable characters without spaces or commas.
    The error never quotes a token."""
    out = []
    for i, part in enumerate(p.strip() for p in str(v).split(",")):
        if not part:
            continue
        scope, sep, token = part.partition(":")
        if not sep or scope not in TOKEN_SCOPES:
            raise ValueError(f"entry {i + 1} must be SCOPE:TOKEN with SCOPE one of "
                             + ", ".join(TOKEN_SCOPES))
        if not 16 <= len(token) <= 512 or not token.isprintable() or " " in token:
            raise ValueError(f"entry {i + 1}: a token is 16-512 printable characters, no spaces")
        out.append((scope, token))
    return tuple(out)
