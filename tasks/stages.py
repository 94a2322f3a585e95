"""Prefect task wrappers around kbflow's pure stages: cache keys, retries, names. No pipeline logic here.

Cache keys are content hashes plus an explicit stage version, never Prefect's default policy (which includes the
run id): the same sources with the same converter/chunker give the same key in any run.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta

import numpy as np
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run as current_task_run

from kbflow import convert, pipeline, split
from kbflow.chunk import CHUNK_VERSION
from kbflow.config import ChunkConfig, ConvertConfig
from kbflow.convert_cache import ConversionCache
from kbflow.embed.base import Embedder
from kbflow.embed.cache import VectorCache
from kbflow.errors import TransientError, is_transient
from kbflow.scan import SourceFile
from kbflow.tokens import TokenCounter


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def split_key(_context, parameters: dict) -> str:
    return "split-" + _digest(split.SPLIT_VERSION, parameters["batch_key"])


def chunk_key(_context, parameters: dict) -> str:
    return "chunk-" + _digest(CHUNK_VERSION, parameters["batch_key"], parameters["chunker"])


def batch_key(documents: pa.Table) -> str:
    """What split and chunk depend on: the converted documents themselves (a document that failed and now
    converts changes the key, so a batch's sections are never reused from a run where it had failed)."""
    return _digest([(doc_id, status, converter, hashlib.sha256((markdown or "").encode()).hexdigest())
                    for doc_id, status, converter, markdown in zip(*(documents.column(c).to_pylist() for c in
                                                                     ("doc_id", "status", "converter", "markdown")))])


def retry_only_transient(_task, _task_run, state) -> bool:
    """Retry timeouts, 429 and 5xx; fail a bad key or bad input at once."""
    try:
        state.result()
    except Exception as exc:  # the task's own exception
        return is_transient(exc)
    return False


JITTER = 0.5  # retry_jitter_factor of the embed task: a delay may come out as low as (1 - JITTER) x the backoff


def _scheduled_delay(task, task_run) -> float:
    delays = task.retry_delay_seconds
    if not delays:
        return 0.0
    if isinstance(delays, (int, float)):
        return float(delays)
    return float(delays[min(max(task_run.run_count - 1, 0), len(delays) - 1)])


def retry_transient_honouring_retry_after(task, task_run, state) -> bool:
    """Retry only transient errors; when the service sent Retry-After, wait here for whatever the backoff delay
    (which may be jittered down to half) would not cover, so the next attempt starts no earlier than it asked.

    Runs in the task's own thread before the retry is scheduled, so other batches go on meanwhile."""
    try:
        state.result()
    except Exception as exc:  # the task's own exception
        if not is_transient(exc):
            return False
        retry_after = getattr(exc, "retry_after", None)
        if retry_after:
            extra = retry_after - (1 - JITTER) * _scheduled_delay(task, task_run)
            if extra > 0:
                time.sleep(extra)
        return True
    return False


# split/chunk are pure: only an error marked transient (none today, e.g. a network filesystem later) retries
CACHED = dict(persist_result=True, cache_expiration=timedelta(days=7), result_serializer="pickle",
              retries=2, retry_delay_seconds=[1, 5], retry_condition_fn=retry_only_transient)


@task(name="convert", cache_policy=NO_CACHE, task_run_name="convert docs {first}-{last}",
      retries=2, retry_delay_seconds=[1, 5], retry_condition_fn=retry_only_transient)
def convert_task(sources: list[SourceFile], options: ConvertConfig, cache_dir: str | None, first: int,
                 last: int) -> pa.Table:
    """Not Prefect-cached as a batch: the conversion cache holds each document's success on its own, and never a
    failure, so one failed file neither pins a batch nor stays failed after its cause went away."""
    return convert.convert_batch(sources, options, ConversionCache(cache_dir) if cache_dir else None)


@task(name="split", cache_key_fn=split_key, task_run_name="split docs {first}-{last}", **CACHED)
def split_task(documents: pa.Table, batch_key: str, first: int, last: int) -> pa.Table:
    return pipeline.split_documents(documents)


@task(name="chunk", cache_key_fn=chunk_key, task_run_name="chunk docs {first}-{last}", **CACHED)
def chunk_task(documents: pa.Table, sections: pa.Table, counter: TokenCounter, chunk_tokens: int,
               config: ChunkConfig, chunker: str, batch_key: str, first: int, last: int) -> pa.Table:
    return pipeline.chunk_documents(documents, sections, counter, chunk_tokens, config, chunker)


@task(name="embed", cache_policy=NO_CACHE, task_run_name="embed texts {first}-{last}",
      retry_condition_fn=retry_transient_honouring_retry_after, retry_jitter_factor=JITTER)
def embed_task(keys: list[str], texts: list[str], embedder: Embedder, cache: VectorCache,
               first: int, last: int, max_retry_after_s: float = 300.0) -> tuple[list[str], np.ndarray]:
    """Embed one batch, writing each provider request's vectors to the vector cache as soon as they arrive: a
    retry (or the next run) finds them there and embeds only what is left, so finished work is never redone.

    Not a Prefect-cached task on purpose: the vector cache, keyed by (text sha256, model id), is its cache.

    Returns (keys, one row per key) rather than a dict of vectors: Prefect links each direct member of a task's
    result to the task run for the whole flow run (a tuple and a weak reference per vector), which pinned small
    long-lived objects among each batch's garbage."""
    done = cache.lookup(keys) if (current_task_run.run_count or 1) > 1 else {}
    todo = [(key, text) for key, text in zip(keys, texts) if key not in done]
    step = max(1, getattr(embedder, "max_batch", len(todo) or 1))
    try:
        for start in range(0, len(todo), step):
            part = todo[start:start + step]
            vectors = embedder.embed_documents([text for _, text in part])
            cache.add([key for key, _ in part], vectors)
            done.update(zip((key for key, _ in part), vectors))
    except TransientError as exc:
        if exc.retry_after is not None:  # a service asking for an hour would stall the run: cap, then retry anyway
            exc.retry_after = min(exc.retry_after, max_retry_after_s)
        raise
    return keys, np.stack([done[key] for key in keys]) if keys else np.empty((0, 0), np.float32)


@task(name="upsert", cache_policy=NO_CACHE, task_run_name="upsert docs {first}-{last}",
      retries=2, retry_delay_seconds=[1, 5], retry_condition_fn=retry_only_transient)
def upsert_task(store, doc_ids: list[str], rows: pa.Table, first: int, last: int) -> int:
    store.replace_documents(doc_ids, rows)
    return rows.num_rows


@task(name="delete", cache_policy=NO_CACHE, task_run_name="delete {count} removed docs")
def delete_task(store, doc_ids: list[str], count: int) -> int:
    return store.delete_documents(doc_ids)


@task(name="index", cache_policy=NO_CACHE, task_run_name="refresh indexes",
      retries=2, retry_delay_seconds=[1, 5], retry_condition_fn=retry_only_transient)
def index_task(store) -> dict:
    """After an ingest's last batch: build the vector index if the table has grown to need one, update stale ones."""
    return store.refresh_indexes()
