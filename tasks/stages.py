"""Prefect task wrappers around kbflow's pure stages: cache keys, retries, names. No pipeline logic here.

Cache keys are content hashes plus an explicit stage version, never Prefect's default policy (which includes the
run id): the same sources with the same converter/chunker give the same key in any run.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import numpy as np
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from kbflow import convert, pipeline, split
from kbflow.chunk import CHUNK_VERSION
from kbflow.config import ChunkConfig, ConvertConfig
from kbflow.convert_cache import ConversionCache
from kbflow.embed.base import Embedder
from kbflow.embed.cache import VectorCache
from kbflow.errors import is_transient
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
      retry_condition_fn=retry_only_transient, retry_jitter_factor=0.5)
def embed_task(keys: list[str], texts: list[str], embedder: Embedder, cache: VectorCache,
               first: int, last: int) -> dict[str, np.ndarray]:
    """Embed one batch and write it to the vector cache at once: a finished batch is never redone.

    Not a Prefect-cached task on purpose: the vector cache, keyed by (text sha256, model id), is its cache."""
    vectors = embedder.embed_documents(texts)
    cache.add(keys, vectors)
    return dict(zip(keys, vectors))


@task(name="upsert", cache_policy=NO_CACHE, task_run_name="upsert docs {first}-{last}",
      retries=2, retry_delay_seconds=[1, 5], retry_condition_fn=retry_only_transient)
def upsert_task(store, doc_ids: list[str], rows: pa.Table, first: int, last: int) -> int:
    store.replace_documents(doc_ids, rows)
    return rows.num_rows


@task(name="delete", cache_policy=NO_CACHE, task_run_name="delete {count} removed docs")
def delete_task(store, doc_ids: list[str], count: int) -> int:
    return store.delete_documents(doc_ids)
