"""The stages of an ingest, each one call over one batch: what ``kbflow.tasks`` wraps as Prefect tasks, and what the
direct runner calls. Both run them under the same retry policies (``policies``).

convert → split → chunk are pure (files in, Arrow tables out); graph reads the chunks' structure and, with an LLM
extractor, asks the chat model (its facts cached per text); embed writes each provider request's vectors to the
vector cache as soon as they arrive; upsert, delete and index write the store. Store and file-system failures are
classified here (``kbflow.stores.errors``), so only passing ones are retried.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from kbflow.chunk.chunker import CHUNK_VERSION
from kbflow.chunk.plans import PlanCache
from kbflow.chunk.split import SPLIT_VERSION
from kbflow.chunk.tokens import TokenCounter
from kbflow.config import ChunkConfig, ConvertConfig, KbConfig
from kbflow.convert.cache import ConversionCache
from kbflow.convert.converters import convert_batch
from kbflow.convert.scan import SourceFile
from kbflow.embed.base import Embedder
from kbflow.runtime import progress
from kbflow.graph.extract import extract_edges
from kbflow.engine import rows
from kbflow.engine.summary import Failure
from kbflow.core.retry import RetryPolicy
from kbflow.stores.errors import store_errors
from kbflow.stores.vector_cache import VectorCache

NO_RETRY = RetryPolicy(attempts=1)


@dataclass(frozen=True)
class TextFailure:
    """A chunk text the graph stage's LLM extractor could not read (the run maps it to the chunks holding it)."""

    text_sha256: str
    failure: Failure


def policies(config: KbConfig) -> dict[Callable[..., Any], RetryPolicy]:
    """How often each stage is tried, and how far apart. split and chunk are pure functions of their input: nothing
    transient can happen in them, so they are not retried."""
    store = RetryPolicy(attempts=3, backoff_s=1.0, max_backoff_s=10.0)
    embedder = config.embedder
    return {
        convert: RetryPolicy(attempts=3, backoff_s=1.0, max_backoff_s=10.0),  # reading sources (a network share)
        split: NO_RETRY,
        chunk: NO_RETRY,
        graph: NO_RETRY,
        # the whole embed stage again, after one of its provider requests used up its own retries (a remote
        # embedder retries each request under embedder.connection.retries / retry_budget_s); it resumes from the vector
        # cache, so requests that finished are not sent again
        embed: RetryPolicy(attempts=1 + embedder.task_retries, backoff_s=max(1.0, embedder.retry_backoff_s * 8),
                             max_retry_after_s=embedder.max_retry_after_s),
        upsert: store, delete: store, index: store,
    }


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def batch_key(documents: pa.Table) -> str:
    """What split and chunk depend on: the converted documents themselves (a document that failed and now converts
    changes the key, so a batch's sections are never reused from a run where it had failed)."""
    return digest([(doc_id, status, converter, rows.markdown_sha256(markdown or ""))
                   for doc_id, status, converter, markdown in zip(*(documents.column(c).to_pylist() for c in
                                                                    ("doc_id", "status", "converter", "markdown")))])


def split_cache_key(batch: str) -> str:
    return "split-" + digest(SPLIT_VERSION, batch)


CHUNK_STAGE_VERSION = "2"  # what the chunk stage returns: 2 = its chunks carry their BM25 words (text_tokens)


def chunk_cache_key(batch: str, chunker: str) -> str:
    return "chunk-" + digest(CHUNK_VERSION, CHUNK_STAGE_VERSION, batch, chunker)


def convert(sources: list[SourceFile], options: ConvertConfig, cache_dir: str | None, done_before: int = 0,
            total: int = 0) -> pa.Table:
    """One row per source: its Markdown, or status 'failed' with the reason (a bad file never raises). Each file
    converted is a progress event (``done_before`` + files so far, of the run's ``total``) where a listener runs in
    this process. ``total`` also decides ``convert.workers: auto`` (the run's size, not the batch's)."""
    return convert_batch(sources, options, ConversionCache(cache_dir) if cache_dir else None,
                         on_file=lambda done: progress.report("convert", done_before + done, total),
                         job_files=total or None)


def split(documents: pa.Table) -> pa.Table:
    return rows.split_documents(documents)


def chunk(documents: pa.Table, sections: pa.Table, counter: TokenCounter, chunk_tokens: int, config: ChunkConfig,
          chunker: str, plan_dir: str | None = None) -> pa.Table:
    """Chunks of a batch; with ``plan_dir`` (the namespace's chunk plans) unchanged sections are not re-chunked."""
    return rows.chunk_documents(documents, sections, counter, chunk_tokens, config, chunker,
                                PlanCache(plan_dir) if plan_dir else None)


def embed(keys: list[str], texts: list[str], embedder: Embedder, cache: VectorCache, known_missing: bool = False,
          attempt: int = 1) -> tuple[list[str], np.ndarray]:
    """Vectors for ``keys``, one model call or provider request (``embedder.max_batch`` texts; a remote embedder
    retries each request on its own) at a time, each one's vectors written to the vector cache as soon as they
    arrive, so a retry of the stage (or the next run) finds them there and sends only what is left.

    ``known_missing``: the caller has just found none of ``keys`` in the cache, so a first try (``attempt`` 1, as
    the runner counts) does not read it again; a retry always does.

    Returns (keys, one row per key) rather than a dict: Prefect links each direct member of a task's result to the
    task run for the whole flow run (a tuple and a weak reference per vector)."""
    done = {} if known_missing and attempt == 1 else cache.lookup(keys)
    todo = [(key, text) for key, text in zip(keys, texts) if key not in done]
    step = max(1, embedder.max_batch)
    for start in range(0, len(todo), step):
        part = todo[start:start + step]
        vectors = embedder.embed_documents([text for _, text in part])
        with store_errors("writing vectors to the vector cache"):
            cache.add([key for key, _ in part], vectors)
        done.update(zip((key for key, _ in part), vectors))
        progress.advance(len(part))  # the run's embed bar moves per model call, not per stage call
    return keys, np.stack([done[key] for key in keys]) if keys else np.empty((0, 0), np.float32)


def graph(chunks: pa.Table, source_paths: dict[str, str], extractor=None) -> tuple[pa.Table, list[TextFailure], int]:
    """The graph stage: the edges out of a batch's chunks (``kbflow.graph.extract``); with an LLM ``extractor``
    (``kbflow.graph.llm_extract``) their entities and relations too. Returns (edges, one failure row per chunk text
    whose extraction failed, chat calls made); each chat request is retried by its client, a failed text is not
    cached, and its documents are written with the edges that were extracted and marked incomplete (the next run
    retries the text)."""
    if extractor is None:
        return extract_edges(chunks, source_paths), [], 0
    facts, failed, calls = extractor.facts(chunks)
    failures = [TextFailure(key, Failure.of("graph", error, f"entity extraction: {error}")) for key, error in failed.items()]
    return extract_edges(chunks, source_paths, facts, extractor.cache.extractor), failures, calls


def upsert(store, doc_ids: list[str], table: pa.Table, graph_store=None, edges: pa.Table | None = None) -> int:
    """Replace whole documents in one store operation: it happens whole or not at all; then, with a graph, their
    edges (a retry repeats both: each replace is idempotent). Returns the chunk rows written (a chunk identical to
    its stored row is not rewritten)."""
    with store_errors(f"writing {len(doc_ids)} documents to store table {store.namespace!r}"):
        written = store.replace_documents(doc_ids, table)
    if graph_store is not None:
        with store_errors(f"writing the graph edges of {len(doc_ids)} documents to {graph_store.table_name!r}"):
            graph_store.replace_documents(doc_ids, edges)
    return written


def delete(store, doc_ids: list[str], graph_store=None) -> int:
    with store_errors(f"deleting {len(doc_ids)} removed documents from store table {store.namespace!r}"):
        deleted = store.delete_documents(doc_ids)
    if graph_store is not None:
        with store_errors(f"deleting the graph edges of {len(doc_ids)} removed documents"):
            graph_store.delete_documents(doc_ids)
    return deleted


def index(store) -> dict:
    """After an ingest's last batch: build the vector index if the table has grown to need one, update stale ones."""
    with store_errors(f"refreshing the indexes of store table {store.namespace!r}"):
        return store.refresh_indexes()


STAGES: tuple[Callable[..., Any], ...] = (convert, split, chunk, graph, embed, upsert, delete, index)
