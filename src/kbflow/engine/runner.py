"""How the engine runs a stage: the one seam between kbflow's ingest and an orchestrator.

The engine asks a runner to ``submit`` a stage (a future: convert runs ahead of the batch being embedded, several
embed calls are in flight) or to ``run`` it (and wait). A runner decides where and how: ``DirectRunner`` calls the
stage in this process, on a small thread pool, retried by the stage's ``RetryPolicy``; ``kbflow.tasks.PrefectRunner``
submits the same stage functions as Prefect tasks (task runs in the UI, cache keys, Prefect's retries under the
same policy), inside a flow run. ``label`` names the work ("docs 0-99"); ``cache_key`` is what a caching runner may
key the result by (content hashes + stage version); a runner without a result cache ignores it.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from kbflow.engine.stages import STAGES
from kbflow.retry import RetryPolicy, call_with_retries


class StageRunner(Protocol):
    def submit(self, stage: str, *args: Any, label: str, cache_key: str | None = None) -> Future: ...

    def run(self, stage: str, *args: Any, label: str, cache_key: str | None = None) -> Any: ...

    def close(self) -> None: ...


class DirectRunner:
    """Stages as plain calls in this process: no server, no per-task bookkeeping. ``max_workers`` bounds what runs
    at once (the engine keeps one conversion and ``flow.max_workers`` embed calls in flight)."""

    def __init__(self, policies: dict[str, RetryPolicy], max_workers: int):
        self.policies = policies
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kbflow-stage")

    def _call(self, stage: str, args: tuple):
        function = STAGES[stage]
        return call_with_retries(lambda: function(*args), self.policies[stage])

    def submit(self, stage: str, *args: Any, label: str, cache_key: str | None = None) -> Future:
        # in the submitting run's context: its progress listener and conversion workers (kbflow.engine.context)
        return self._pool.submit(contextvars.copy_context().run, self._call, stage, args)

    def run(self, stage: str, *args: Any, label: str, cache_key: str | None = None) -> Any:
        return self._call(stage, args)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
