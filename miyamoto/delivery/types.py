"""The delivery client's vocabulary: what ``HTTPClient.request`` answers and raises.

Kept apart from ``miyamoto.delivery.httpclient`` so that code which only handles a delivery's
outcome (the engine, tests, a stand-in client given as ``Engine(client=...)``) names
these without importing the client itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_RESPONSE", "DeliveryError", "Response", "TargetRefused"]

MAX_RESPONSE = 1024 * 1024  # bytes read from a target's answer before giving up on it


@dataclass(frozen=True)
class Response:
    """A whole HTTP answer: its status, headers (as sent) and body (at most MAX_RESPONSE)."""

    status: int
    headers: dict[str, str]
    body: bytes


class DeliveryError(Exception):
    """The request got no HTTP response (connect error, timeout, protocol error)."""


class TargetRefused(DeliveryError):
    """An address the target's host resolved to is denied by a target rule."""
