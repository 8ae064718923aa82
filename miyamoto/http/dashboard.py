"""The dashboard: a static page and its assets, served from the package (GET /, and
GET /dashboard/<file>).

The page holds no data: its script (``static/dashboard.js``) reads the JSON API with the
operator's token, so the page and its assets are open routes (``api._NEEDS``) and the
data routes keep their scopes. Only the files named in ``FILES`` are served, looked up
by exact name, so no path can reach anything else in the package or on disk. Every
answer carries a strict Content-Security-Policy: scripts and styles from this origin
only, no inline script, no eval, nothing framed; a task's last response body (a
stranger's bytes) is shown as text by the script, and even a slip there could not run.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from importlib import resources

log = logging.getLogger(__name__)

PAGE = "dashboard.html"
FILES = {
    PAGE: "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    # small files, and an upgraded node must not run yesterday's script
    ("Cache-Control", "no-cache"),
)


def asset(name: str) -> tuple[bytes, str, tuple[tuple[str, str], ...]] | None:
    """(body, Content-Type, headers) of a known dashboard file, or None."""
    ctype = FILES.get(name)
    if ctype is None:
        return None
    return _read(name), ctype, HEADERS


@lru_cache(maxsize=len(FILES))
def _read(name: str) -> bytes:
    """The file from the installed package (package_data in setup.py); read once."""
    return resources.files("miyamoto.http").joinpath("static", name).read_bytes()
