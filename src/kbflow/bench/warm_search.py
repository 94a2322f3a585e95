"""`kbflow bench search --sample DIR`: what one warm search costs as a user of ``KnowledgeBase`` pays it, query
embedding included, and where that time goes.

The sample folder is ingested once into ``--work-dir`` (kept: a repeat reuses it), one ``KnowledgeBase`` is opened
and warmed (model weights, table, full-text index), then each mode is timed over the same questions, one at a
time, and so are the parts of a hybrid search on their own: the query's embedding, its BM25 words, the vector and
BM25 candidate searches and the fusion. The parts overlap in a real hybrid search (BM25 runs on a second thread
while the query is embedded and the vectors searched), so they do not add up to the whole.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from kbflow.bench.common import machine
from kbflow.bench.search import percentiles

QUESTIONS = [
    "how do I restore a backup", "what does MVCC mean", "create an index without locking writes",
    "which index types does PostgreSQL have", "what happens when a transaction is rolled back",
    "why would I use a savepoint", "who wrote the crazy ones", "what is kbflow for", "GIN index for full text",
    "how are rows locked by an update", "事务隔离级别", "Debian 的社会契约是什么", "软件包的版权归谁",
    "B-tree index on an expression", "read committed isolation", "what is a partial index",
]


def _timed(run, queries: list[str]) -> dict:
    samples = []
    for query in queries:
        started = time.perf_counter()
        run(query)
        samples.append(1000 * (time.perf_counter() - started))
    return percentiles(samples)


def bench_warm(sample: Path, out_file: Path, work_dir: Path | None = None, config=None, rounds: int = 4) -> dict:
    from kbflow import KnowledgeBase
    from kbflow.search.searcher import candidate_lists, embed_query, fuse

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-warm-"))
    kb = KnowledgeBase(namespace="sample", config=config, data_dir=work / "data")
    started = time.perf_counter()
    ingest = kb.add_document(sample)
    ingest_s = time.perf_counter() - started
    started = time.perf_counter()
    for query in QUESTIONS[:3]:  # warm: weights, table, full-text index
        kb.search(query)
    warm_up_s = time.perf_counter() - started
    queries = QUESTIONS * rounds
    searcher = kb.searcher
    store, settings = searcher.store, searcher.config.search
    depth = settings.candidates
    vector = embed_query(searcher.embedder, QUESTIONS[0])
    lists = candidate_lists(store, lambda: vector, searcher.terms(QUESTIONS[0]), depth)
    parts = {
        "query_embedding": _timed(lambda q: embed_query(searcher.embedder, q), queries),
        "bm25_terms": _timed(searcher.terms, queries),
        "vector_candidates": _timed(lambda q: store.search_vector(vector, depth), queries),
        "bm25_candidates": _timed(lambda q: store.search_text(searcher.terms(q), depth), queries),
        "fusion": _timed(lambda q: fuse(lists, settings), queries),
    }
    modes = {mode: _timed(lambda q, m=mode: kb.search(q, mode=m), queries) for mode in ("vector", "bm25", "hybrid")}
    result = {"sample": str(sample), "namespace_chunks": store.count(), "model_id": searcher.embedder.model_id,
              "fusion": settings.fusion, "candidates_per_input": depth, "questions": len(QUESTIONS),
              "rounds": rounds, "ingest_s": round(ingest_s, 2), "warm_up_s": round(warm_up_s, 2),
              "documents": ingest.get("documents"), "cpu_count": os.cpu_count(),
              "load_avg_1m": round(os.getloadavg()[0], 2), "machine": machine(), "modes": modes, "hybrid_parts": parts}
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(result, indent=2, default=lambda value: np.asarray(value).tolist()),
                              encoding="utf-8")
    return result
