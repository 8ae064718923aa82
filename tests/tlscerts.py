"""Certificates made in the test, with Debian's ``openssl``: a CA, and leaf certificates it
signs for 127.0.0.1 and localhost (P-256 keys: each file takes a few milliseconds)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str = "ca") -> Pair:
    pair = Pair(str(directory / f"{name}.pem"), str(directory / f"{name}.key"))
    _run("req", "-x509", *_EC, "-keyout", pair.key, "-out", pair.cert, "-days", "2",
         "-subj", f"/CN=miyamoto test {name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return pair


def make_cert(directory: Path, ca: Pair, name: str, *, client: bool = False) -> Pair:
    """A leaf ``name`` signed by ``ca``: a server's for 127.0.0.1 and localhost, or (with
    ``client``) a client's."""
    pair = Pair(str(directory / f"{name}.pem"), str(directory / f"{name}.key"))
    csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    usage = "clientAuth" if client else "serverAuth"
    ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
    _run("req", *_EC, "-keyout", pair.key, "-out", str(csr), "-subj", f"/CN={name}")
    _run("x509", "-req", "-in", str(csr), "-CA", ca.cert, "-CAkey", ca.key,
         "-CAcreateserial", "-out", pair.cert, "-days", "2", "-extfile", str(ext))
    return pair
