"""Miyamoto: a clustered webhook task queue server."""

from miyamoto.version import __version__

__all__ = ["__version__"]
