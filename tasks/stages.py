"""The engine's stages as Prefect tasks, and the runner that hands them to the engine inside a flow run.

No pipeline logic here: each task calls one function of ``kbflow.engine.stages``. What this module adds is what
Prefect is for: a task run per stage call (named by the batch it works on), results of the pure stages cached by
the engine's content keys (``cache_key``: content hashes + stage version, never Prefect's default policy, which
includes the run id), and retries under the stage's ``RetryPolicy``, the same policy the direct runner applies.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.filesystems import LocalFileSystem, RemoteFileSystem
from prefect.runtime import task_run as current_task_run

from kbflow.config import KbConfig
from kbflow.engine import stages
from kbflow.engine.runner import Pending, StageCall
from kbflow.core.retry import RetryPolicy
from kbflow.state import layout
from kbflow.core.storage import is_remote


R = TypeVar("R")


def _given_key(_context, parameters: dict) -> str | None:
    return parameters.get("cache_key")


def _counted(call):
    """Run a stage; an error that ends the task records how many times the task ran (its attempts), as the direct
    runner's retry loop does, so failure rows mean the same under both runners."""
    try:
        return call()
    except Exception as error:
        error.attempts = max(current_task_run.run_count or 1, 1)
        raise


@task(name="convert", task_run_name="convert {label}", cache_policy=NO_CACHE)
def convert_task(sources, options, cache_dir, done_before: int, total: int, label: str,
                 cache_key: str | None = None) -> pa.Table:
    """Not cached as a batch: the conversion cache holds each document's success on its own, and never a failure,
    so one failed file neither pins a batch nor stays failed after its cause went away."""
    return _counted(lambda: stages.convert(sources, options, cache_dir, done_before, total))


@task(name="split", task_run_name="split {label}", cache_key_fn=_given_key, persist_result=True,
      result_serializer="pickle")
def split_task(documents, label: str, cache_key: str | None = None) -> pa.Table:
    return _counted(lambda: stages.split(documents))


@task(name="chunk", task_run_name="chunk {label}", cache_key_fn=_given_key, persist_result=True,
      result_serializer="pickle")
def chunk_task(documents, sections, counter, chunk_tokens, config, chunker, plan_dir, label: str,
               cache_key: str | None = None) -> pa.Table:
    return _counted(lambda: stages.chunk(documents, sections, counter, chunk_tokens, config, chunker, plan_dir))


@task(name="graph", task_run_name="graph {label}", cache_policy=NO_CACHE)
def graph_task(chunks, source_paths, extractor=None, label: str = "", cache_key: str | None = None):
    """Not Prefect-cached: reading the structure costs less than storing it (30 ms per 1,000 chunks), and the LLM
    extractor's own cache holds each chunk text's facts, never a failure."""
    return _counted(lambda: stages.graph(chunks, source_paths, extractor))


@task(name="embed", task_run_name="embed {label}", cache_policy=NO_CACHE)
def embed_task(keys, texts, embedder, cache, known_missing: bool = False, label: str = "",
               cache_key: str | None = None):
    """Not Prefect-cached: the vector cache, keyed by (text sha256, model id), is its cache. A retry (the task's
    second run or later) reads the cache again, whatever ``known_missing`` says."""
    return _counted(lambda: stages.embed(keys, texts, embedder, cache, known_missing,
                                         attempt=max(current_task_run.run_count or 1, 1)))


@task(name="upsert", task_run_name="upsert {label}", cache_policy=NO_CACHE)
def upsert_task(store, doc_ids, table, graph_store=None, edges=None, label: str = "",
                cache_key: str | None = None) -> int:
    return _counted(lambda: stages.upsert(store, doc_ids, table, graph_store, edges))


@task(name="delete", task_run_name="delete {label}", cache_policy=NO_CACHE)
def delete_task(store, doc_ids, graph_store=None, label: str = "", cache_key: str | None = None) -> int:
    return _counted(lambda: stages.delete(store, doc_ids, graph_store))


@task(name="index", task_run_name="{label}", cache_policy=NO_CACHE)
def index_task(store, label: str, cache_key: str | None = None) -> dict:
    return _counted(lambda: stages.index(store))


# each stage function of the engine and the task that runs it
TASKS: dict[Callable[..., Any], Task] = {
    stages.convert: convert_task, stages.split: split_task, stages.chunk: chunk_task, stages.graph: graph_task,
    stages.embed: embed_task, stages.upsert: upsert_task, stages.delete: delete_task, stages.index: index_task}
CACHED = (stages.split, stages.chunk)  # pure stages whose results are kept under the engine's content keys


def retry_condition(policy: RetryPolicy):
    """Prefect's ``retry_condition_fn`` for ``policy``: whether the failed try gets another, and the wait before it.

    The wait is the policy's own (its jitter, a Retry-After the service sent, its time budget), taken here in the
    task's thread; Prefect then retries at once (no ``retry_delay_seconds`` of its own), so a stage waits exactly
    as long in a flow run as under the direct runner."""

    def should_retry(_task, task_run, state) -> bool:
        try:
            state.result()
        except Exception as error:  # the task's own exception
            attempt = max(task_run.run_count, 1)
            started = task_run.start_time.timestamp() if task_run.start_time else time.time()
            delay = policy.delay(attempt, error)
            if not policy.should_retry(error, attempt, time.time() - started, delay):
                return False
            time.sleep(delay)
            return True
        return False

    return should_retry


def task_options(policy: RetryPolicy) -> dict:
    if policy.attempts <= 1:
        return {"retries": 0}
    return {"retries": policy.attempts - 1, "retry_delay_seconds": 0, "retry_condition_fn": retry_condition(policy)}


def result_storage(data_dir: str | Path):
    """Cached task results under the data dir (pruned by kbflow), as a saved block, which Prefect requires: a local
    folder, or the data dir's object-storage prefix through fsspec (``RemoteFileSystem``)."""
    results = layout.results_dir(data_dir)
    block: LocalFileSystem | RemoteFileSystem
    if is_remote(results):
        basepath = str(results)
        block = RemoteFileSystem(basepath=basepath)
    else:
        basepath = str(results.resolve())
        block = LocalFileSystem(basepath=basepath)
    block.save("kbflow-results-" + hashlib.sha256(basepath.encode()).hexdigest()[:12], overwrite=True)
    return block


class PrefectRunner:
    """The engine's stages as task runs of the current flow run (``kbflow.engine.runner.StageRunner``)."""

    def __init__(self, config: KbConfig, force: bool = False):
        policies = stages.policies(config)
        cached = dict(result_storage=result_storage(config.data_dir), refresh_cache=True if force else None,
                      cache_expiration=timedelta(days=config.flow.cache_days))  # pruned at the same age
        self.tasks: dict[Callable[..., Any], Task] = {}
        for stage, prefect_task in TASKS.items():
            options = task_options(policies[stage])
            if stage in CACHED:
                options.update(cached)
            self.tasks[stage] = prefect_task.with_options(**options)

    def submit(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> Pending[R]:
        return self.tasks[work.stage].submit(*work.args, **work.kwargs, label=label, cache_key=cache_key)

    def run(self, work: StageCall[R], *, label: str, cache_key: str | None = None) -> R:
        return self.tasks[work.stage](*work.args, **work.kwargs, label=label, cache_key=cache_key)

    def close(self) -> None:
        pass
