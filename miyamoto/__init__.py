"""Miyamoto: a clustered webhook task queue server.

``from miyamoto import Client`` (and its exceptions) is resolved lazily (PEP 562), so
``import miyamoto`` stays light: the server imports this package before it
monkey-patches gevent, and must not have pulled in requests (and ssl) by then.
"""

from __future__ import annotations

from typing import Any

from miyamoto.version import __version__

_CLIENT_NAMES = ("Client", "MiyamotoError", "InvalidTask", "DuplicateTask", "Conflict",
                 "NotFound", "Unauthorized", "Forbidden", "Unavailable")

__all__ = ["__version__", *_CLIENT_NAMES]


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from miyamoto import client

        return getattr(client, name)
    raise AttributeError(f"module 'miyamoto' has no attribute {name!r}")
