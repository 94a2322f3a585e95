"""One retry policy for everything kbflow retries: provider requests, and whole stages.

An error is retried only when its class says it is transient (``kbflow.core.errors.is_transient``); a permanent one
fails at once. Delays grow exponentially from ``backoff_s`` with jitter (a delay is drawn between
``(1 - jitter)`` and 1 times the backoff, so concurrent clients spread out). When the service says when to come
back (``Retry-After``, capped at ``max_retry_after_s``), that is the wait, plus up to a tenth more so that
clients told the same moment do not all return at once: a throttling provider asking for 0.2 s is not made to
wait the backoff's seconds. Retrying stops after ``attempts`` tries or once the next
try would start more than ``budget_s`` seconds after the first, whichever comes first: a provider that throttles
one request in four is ridden out, a provider that is down ends the wait in bounded time.

The same policy drives both executors: ``call_with_retries`` in the library, and Prefect's task retries inside a
flow run (``kbflow.tasks.stages`` turns a policy into task options), so a stage retries the same way wherever it
runs.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from kbflow.core.errors import is_transient

T = TypeVar("T")
RETRY_AFTER_SPREAD = 0.1  # a Retry-After wait is stretched by up to this share, at random


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # tries in all (1: no retry)
    backoff_s: float = 1.0  # delay before the second try; doubled for each later one
    max_backoff_s: float = 60.0
    jitter: float = 0.5  # share of a delay that is random
    budget_s: float | None = None  # no try starts later than this after the first
    max_retry_after_s: float = 300.0  # a Retry-After longer than this is cut to it

    def backoff(self, attempt: int) -> float:
        """The un-jittered delay after failed try number ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))

    def delay(self, attempt: int, error: BaseException | None = None, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed try ``attempt``: the service's Retry-After (up to a tenth more) when it sent
        one, else the jittered backoff."""
        retry_after = retry_after_of(error)
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s) * (1 + RETRY_AFTER_SPREAD * draw())
        return self.backoff(attempt) * (1 - self.jitter * draw())

    def should_retry(self, error: BaseException, attempt: int, elapsed_s: float, delay_s: float) -> bool:
        """Whether a try that failed with ``error`` gets another one, ``delay_s`` from now."""
        if not is_transient(error) or attempt >= self.attempts:
            return False
        return self.budget_s is None or elapsed_s + delay_s <= self.budget_s


def retry_after_of(error: BaseException | None) -> float | None:
    """The Retry-After a transient error carries (its own or the one of the error it wraps)."""
    while error is not None:
        value = getattr(error, "retry_after", None)
        if value is not None:
            return float(value)
        error = error.__cause__
    return None


def call_with_retries(call: Callable[[], T], policy: RetryPolicy,
                      on_retry: Callable[[BaseException, int, float], None] | None = None,
                      sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried per ``policy``. The error that ends the retries is raised with ``attempts`` set on it
    (how many tries this loop made; a loop around this one overwrites it with its own count), which failure rows
    record."""
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as error:
            delay = policy.delay(attempt, error)
            if not policy.should_retry(error, attempt, clock() - started, delay):
                setattr(error, "attempts", attempt)  # on any exception type: read with getattr(..., 1)
                raise
            if on_retry is not None:
                on_retry(error, attempt, delay)
            sleep(delay)
