"""The value parsers of ``miyamoto.config.settings``'s settings: each turns one option's
text into its value or raises ValueError saying what is wrong (the loader adds the
option's name and raises ConfigError). Pure functions of a string, so each is tested
alone; the settings table names one per option."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from typing import Callable


def float_ge(lo: float) -> Callable[[str], float]:
    def parse(v: str) -> float:
        x = float(v)
        if not x >= lo or x != x or x == float("inf"):
            raise ValueError(f"must be a number >= {lo}")
        return x
    return parse


def int_ge(lo: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        x = int(str(v).strip())
        if x < lo:
            raise ValueError(f"must be an integer >= {lo}")
        return x
    return parse


def boolean(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def hostport(v: str) -> str:
    host, sep, port = str(v).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("must be HOST:PORT")
    return f"{host}:{int(port)}"


def zmq_endpoint(v: str) -> str:
    s = str(v).strip()
    if not s.startswith("tcp://"):
        raise ValueError("must be tcp://HOST:PORT")
    hostport(s[len("tcp://"):])
    return s


def seeds(v: str) -> tuple[str, ...]:
    return tuple(zmq_endpoint(s) for s in str(v).split(",") if s.strip())


def level(v: str) -> str:
    s = str(v).strip().upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("must be debug, info, warning, error or critical")
    return s


def one_of(v: str, choices: tuple[str, ...]) -> str:
    s = str(v).strip().lower()
    if s not in choices:
        raise ValueError(f"must be {' or '.join(choices)}")
    return s


def log_format(v: str) -> str:
    s = str(v).strip().lower()
    if s not in ("text", "json"):
        raise ValueError("must be text or json")
    return s


def stripped(v: str) -> str:
    return str(v).strip()


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


def z85_key(v: str) -> str:
    s = str(v).strip()
    if s and len(s) != 40:
        raise ValueError("must be a 40-character Z85 CurveZMQ key (miyamoto keygen)")
    return s


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
