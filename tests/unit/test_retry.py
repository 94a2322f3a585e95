"""The one retry policy, by hand on small cases: which errors are retried, how long each wait is, when it stops,
and what the final error records. Time is a fake clock that only the waits move."""

from __future__ import annotations

import pytest

from kbflow.core.errors import AuthError, PermanentError, StoreBusy, TransientError
from kbflow.core.retry import RetryPolicy, call_with_retries


class Clock:
    def __init__(self):
        self.now, self.waits = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def failing(errors: list[BaseException], result: str = "done"):
    calls = []

    def call():
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return call, calls


def run(call, policy: RetryPolicy, clock: Clock):
    return call_with_retries(call, policy, sleep=clock.sleep, clock=lambda: clock.now)


def test_transient_errors_are_retried_with_growing_jittered_waits():
    clock = Clock()
    call, calls = failing([TransientError("429"), StoreBusy("busy"), TransientError("503")])
    assert run(call, RetryPolicy(attempts=4, backoff_s=1.0, jitter=0.5), clock) == "done"
    assert len(calls) == 4
    for wait, backoff in zip(clock.waits, (1.0, 2.0, 4.0)):  # each in [(1 - jitter) * backoff, backoff]
        assert 0.5 * backoff <= wait <= backoff
    assert len(set(clock.waits)) == 3


def test_permanent_errors_fail_at_once_with_one_attempt():
    for error in (PermanentError("400"), AuthError("401"), ValueError("a bug")):
        clock = Clock()
        call, calls = failing([error])
        with pytest.raises(type(error)) as caught:
            run(call, RetryPolicy(attempts=5), clock)
        assert len(calls) == 1 and clock.waits == [] and caught.value.attempts == 1


def test_attempts_run_out_and_the_last_error_says_how_many():
    clock = Clock()
    call, calls = failing([TransientError(f"500 #{i}") for i in range(10)])
    with pytest.raises(TransientError, match="500 #2") as caught:
        run(call, RetryPolicy(attempts=3, backoff_s=0.1), clock)
    assert len(calls) == 3 == caught.value.attempts and len(clock.waits) == 2


def test_retry_after_is_the_wait_not_the_backoff_and_is_capped():
    clock = Clock()
    call, _ = failing([TransientError("429", retry_after=0.2), TransientError("429", retry_after=7.0),
                       TransientError("429", retry_after=500.0)])
    run(call, RetryPolicy(attempts=4, backoff_s=30.0, max_retry_after_s=60.0), clock)
    for wait, asked in zip(clock.waits, (0.2, 7.0, 60.0)):  # never sooner than asked, at most a tenth later
        assert asked <= wait <= asked * 1.1
    wrapped = TransientError("outer")
    wrapped.__cause__ = TransientError("inner", retry_after=3.0)
    assert 3.0 <= RetryPolicy(backoff_s=0.01).delay(1, wrapped) <= 3.3


def test_the_time_budget_stops_retries_before_the_attempts_do():
    clock = Clock()
    call, calls = failing([TransientError("500")] * 50)
    with pytest.raises(TransientError) as caught:
        run(call, RetryPolicy(attempts=50, backoff_s=1.0, jitter=0.0, budget_s=10.0), clock)
    # waits 1 + 2 + 4 = 7 s; the next (8 s) would start at 15 s, past the 10 s budget
    assert clock.waits == [1.0, 2.0, 4.0] and len(calls) == 4 == caught.value.attempts


def test_a_retried_stage_counts_its_own_tries_over_its_requests():
    """A stage (outer loop) calling a request (inner loop): the error that ends it records the stage's tries; the
    requests made are (inner tries) x (outer tries)."""
    clock = Clock()
    requests = []

    def request():
        requests.append(1)
        raise TransientError("503")

    stage = lambda: run(request, RetryPolicy(attempts=2, backoff_s=0.0), clock)  # noqa: E731
    with pytest.raises(TransientError) as caught:
        run(stage, RetryPolicy(attempts=3, backoff_s=0.0), clock)
    assert caught.value.attempts == 3 and len(requests) == 6
