"""Retry timing: Cloud Tasks' backoff formula, jitter, and Retry-After."""

from __future__ import annotations

import email.utils
from typing import Protocol

from miyamoto.config.settings import QueueConfig


class Rng(Protocol):
    """What jitter needs of an rng: ``random.Random``, or a fixed one in a test."""

    def random(self) -> float: ...


def backoff(attempt: int, q: QueueConfig) -> float:
    """Delay before retry after the ``attempt``-th failed attempt (1-based), no jitter.

    It doubles from min_backoff max_doublings times, then grows linearly by
    min_backoff * 2**max_doublings per attempt, always capped at max_backoff.
    """
    n = max(1, attempt)
    if n <= q.max_doublings + 1:
        delay = q.min_backoff * (2.0 ** (n - 1))
    else:
        step = q.min_backoff * (2.0 ** q.max_doublings)
        delay = step + step * (n - 1 - q.max_doublings)
    return min(q.max_backoff, delay)


def jittered(delay: float, rng: Rng) -> float:
    """delay +/- 10%. The rng is the caller's (no global random), so a test can fix it."""
    return max(0.0, delay * (0.9 + 0.2 * rng.random()))


def retry_after(value: str | None, now: float, cap: float) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return min(cap, max(0.0, seconds))
