"""A token bucket with an injected clock."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; rate 0 means unlimited."""

    def __init__(self, rate: float, burst: int, now: float):
        self.rate = rate
        self.burst = max(1, burst)
        self.tokens = float(self.burst)
        self.stamp = now

    def configure(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.tokens = min(self.tokens, float(self.burst))

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def take(self, now: float) -> bool:
        """Take one token if there is one."""
        if self.rate <= 0:
            return True
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def refund(self) -> None:
        """Give back a token taken for a dispatch that did not deliver (a held copy)."""
        if self.rate > 0:
            self.tokens = min(float(self.burst), self.tokens + 1.0)

    def wait_time(self, now: float) -> float:
        """Seconds until a token will be there (0 if there is one now)."""
        if self.rate <= 0:
            return 0.0
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate
