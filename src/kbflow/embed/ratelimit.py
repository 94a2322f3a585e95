"""A client-side rate limit (requests and tokens per minute) shared by every thread of a process.

Token buckets refilled continuously; each holds about one second of its budget (at least one request, at least
the tokens of the request at hand), so a backfill is spread evenly instead of bursting into the provider's quota.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class _Bucket:
    def __init__(self, per_minute: float, now: float):
        self.rate = per_minute / 60.0  # units per second
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self.updated = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are available (0 when they are)."""
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now
        needed = min(amount, self.capacity)  # a request larger than the bucket waits for a full one, then goes negative
        return max(0.0, (needed - self.level) / self.rate)

    def take(self, amount: float) -> None:
        self.level -= amount


class RateLimiter:
    """``acquire(tokens)`` blocks until one more request of ``tokens`` tokens fits both budgets."""

    def __init__(self, requests_per_minute: float | None, tokens_per_minute: float | None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.clock, self.sleep = clock, sleep
        now = clock()
        self.requests = _Bucket(requests_per_minute, now) if requests_per_minute else None
        self.tokens = _Bucket(tokens_per_minute, now) if tokens_per_minute else None
        self.waited_s = 0.0
        self._lock = threading.Lock()

    def acquire(self, tokens: int) -> float:
        """Wait as needed, then take one request and ``tokens`` tokens; returns the seconds waited."""
        waited = 0.0
        with self._lock:  # threads queue here in arrival order
            while True:
                now = self.clock()
                delay = max(self.requests.wait_for(1, now) if self.requests else 0.0,
                            self.tokens.wait_for(tokens, now) if self.tokens else 0.0)
                if delay <= 1e-9:
                    break
                self.sleep(delay)
                waited += delay
            if self.requests:
                self.requests.take(1)
            if self.tokens:
                self.tokens.take(tokens)
            self.waited_s += waited
        return waited


_limiters: dict[tuple, RateLimiter] = {}
_limiters_lock = threading.Lock()


def shared_limiter(key: tuple, requests_per_minute: float | None, tokens_per_minute: float | None) -> RateLimiter | None:
    """One limiter per (provider, model, endpoint, limits) in this process; None when no limit is configured."""
    if not requests_per_minute and not tokens_per_minute:
        return None
    full_key = key + (requests_per_minute, tokens_per_minute)
    with _limiters_lock:
        if full_key not in _limiters:
            _limiters[full_key] = RateLimiter(requests_per_minute, tokens_per_minute)
        return _limiters[full_key]
