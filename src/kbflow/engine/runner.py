"""How the engine runs a stage: the one seam between kbflow's ingest and an orchestrator.

The engine binds a stage function of ``kbflow.engine.stages`` to its arguments with ``call`` (checked against the
function's signature by the type checker, its result type carried through) and asks a runner to ``submit`` it (a
future: convert runs ahead of the batch being embedded, several embed calls are in flight) or to ``run`` it (and
wait). A runner decides where and how: ``DirectRunner`` calls the stage in this process, on a small thread pool,
retried by the stage's ``RetryPolicy``; ``kbflow.tasks.PrefectRunner`` maps each stage function to its Prefect task
(task runs in the UI, cache keys, Prefect's retries under the same policy), inside a flow run. ``label`` names the
work ("docs 0-99"); ``cache_key`` is what a caching runner may key the result by (content hashes + stage version);
a runner without a result cache ignores it. A stage function with an ``attempt`` parameter is told which try of the
call this is (1 the first; ``stages.embed`` reads the vector cache again only on a retry).
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from kbflow.core.retry import RetryPolicy, call_with_retries

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True)
class StageCall(Generic[R]):
    """A stage function with its arguments, not yet run (made by ``call``)."""

    stage: Callable[..., R]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.stage.__name__

    def __call__(self, attempt: int = 1) -> R:
        """Run the stage; ``attempt``: which try of this call it is, passed on to a stage that takes it."""
        if takes_attempt(self.stage):
            return self.stage(*self.args, **{**self.kwargs, "attempt": attempt})
        return self.stage(*self.args, **self.kwargs)


@lru_cache(maxsize=None)
def takes_attempt(stage: Callable[..., Any]) -> bool:
    """Whether ``stage`` has an ``attempt`` parameter (the runner then tells it which try it runs)."""
    return "attempt" in inspect.signature(stage).parameters


def call(stage: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> StageCall[R]:
    """``stage`` bound to its arguments, for a runner to run: ``runner.run(call(stages.split, documents), ...)``."""
    return StageCall(stage, args, kwargs)


class Pending(Protocol[R_co]):
    """What ``submit`` returns: a ``concurrent.futures.Future`` or a Prefect future."""

    def result(self) -> R_co: ...


class StageRunner(Protocol):
    def submit(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> Pending[R]: ...

    def run(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> R: ...

    def close(self) -> None: ...


class DirectRunner:
    """Stages as plain calls in this process: no server, no per-task bookkeeping. ``max_workers`` bounds what runs
    at once (the engine keeps one conversion and ``flow.max_workers`` embed calls in flight)."""

    def __init__(self, policies: Mapping[Callable[..., Any], RetryPolicy], max_workers: int):
        self.policies = policies
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kbflow-stage")

    def _call(self, work: StageCall[R]) -> R:
        attempts = iter(range(1, 1_000_000))
        return call_with_retries(lambda: work(next(attempts)), self.policies[work.stage])

    def submit(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> Pending[R]:
        # in the submitting run's context: its progress listener (kbflow.runtime.progress) and conversion workers
        # (kbflow.convert.converters.run_conversion_pool) are context variables
        return self._pool.submit(contextvars.copy_context().run, self._call, work)

    def run(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> R:
        return self._call(work)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
