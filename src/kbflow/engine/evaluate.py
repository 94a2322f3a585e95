"""Retrieval quality on a labelled set in BEIR layout: nDCG@10, Recall@10, Recall@100, MRR@10.

The corpus goes through the real pipeline (written out as Markdown files, ingested into a namespace of its own by
the ingest the caller hands in: ``kbflow.api.ingest`` from the CLI, ``kbflow.orchestrate.ingest_sources`` from a
reembed's quality check); each query is searched like a user's, chunk hits collapse to their best-ranked document.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Callable

from kbflow.config import KbConfig
from kbflow.engine.store_check import stored_ids
from kbflow.core.errors import ConfigError
from kbflow.config.resolve import resolve_config
from kbflow.search.searcher import MODES, Searcher
from kbflow.state.manifest import NamespaceState

# (sources, namespace, config) -> the run summary: how the corpus is ingested (kbflow.api.ingest fits)
IngestCorpus = Callable[[list[str], str, KbConfig], dict]

SEARCH_DEPTH = 200  # chunks retrieved per query, enough for Recall@100 over documents


def load_beir(folder: Path, split: str = "test") -> tuple[dict[str, dict], dict[str, str], dict[str, dict[str, int]]]:
    folder = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / name).is_file():
            raise ConfigError(f"{folder} is not a BEIR folder: {name} is missing")
    with open(folder / "corpus.jsonl", encoding="utf-8") as handle:
        corpus = {row["_id"]: row for row in map(json.loads, handle)}
    with open(folder / "queries.jsonl", encoding="utf-8") as handle:
        queries = {row["_id"]: row["text"] for row in map(json.loads, handle)}
    qrels: dict[str, dict[str, int]] = {}
    with open(folder / "qrels" / f"{split}.tsv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return corpus, queries, qrels


def ndcg_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    """Linear gain (as trec_eval's ndcg_cut): sum rel / log2(rank + 1), over the ideal ordering."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    wanted = {doc for doc, gain in relevant.items() if gain > 0}
    return len(wanted & set(ranked[:k])) / len(wanted) if wanted else 0.0


def mrr_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    for rank, doc in enumerate(ranked[:k]):
        if relevant.get(doc, 0) > 0:
            return 1.0 / (rank + 1)
    return 0.0


def score_run(rankings: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """Mean of each metric over the queries that have labels."""
    queries = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    if not queries:
        raise ConfigError("the qrels hold no positive label; nothing to evaluate")
    metrics = {
        "ndcg@10": lambda r, rel: ndcg_at(r, rel, 10),
        "recall@10": lambda r, rel: recall_at(r, rel, 10),
        "recall@100": lambda r, rel: recall_at(r, rel, 100),
        "mrr@10": lambda r, rel: mrr_at(r, rel, 10),
    }
    return {name: round(sum(fn(rankings.get(q, []), qrels[q]) for q in queries) / len(queries), 4)
            for name, fn in metrics.items()}


def _write_corpus(corpus: dict[str, dict], folder: Path, beir: Path) -> dict[str, str]:
    """One file per corpus document; returns source_path -> corpus id. A row with ``file`` (a path inside the BEIR
    folder) is that source file, copied under its own relative path, so the links between such files resolve as
    in the collection they came from (the graph stage follows them); any other row becomes a Markdown file of its
    title and text."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    for index, (doc_id, row) in enumerate(corpus.items()):
        if row.get("file"):
            relative = PurePosixPath(row["file"])
            source = beir / relative
            if relative.is_absolute() or ".." in relative.parts or not source.is_file():
                raise ConfigError(f"corpus row {doc_id!r}: file {row['file']!r} is not a file inside {beir}")
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, folder / relative)
            paths[f"{folder.name}/{relative}"] = doc_id
            continue
        name = f"doc-{index:06d}.md"
        title = (row.get("title") or "").strip()
        body = (row.get("text") or "").strip()
        (folder / name).write_text(f"# {title}\n\n{body}\n" if title else f"{body}\n", encoding="utf-8")
        paths[f"{folder.name}/{name}"] = doc_id
    return paths


def eval_beir(folder: Path, config=None, data_dir: str | Path | None = None, namespace: str | None = None,
              max_queries: int | None = None, modes: list[str] | None = None, *, ingest: IngestCorpus | None) -> dict:
    """Ingest with ``ingest`` (incrementally: a kept data dir makes a repeat cheap), then score every mode over that
    one ingest.

    ``ingest=None`` scores what an earlier (possibly interrupted) ingest into ``data_dir`` stored: the corpus is
    cut to the stored documents and the queries to those with a relevant stored document (``subset`` in the result).
    """
    corpus, queries, qrels = load_beir(folder)
    if ingest is None and data_dir is None:
        raise ConfigError("evaluating without ingesting needs --data-dir: the folder of the earlier ingest")
    for mode in modes or ["vector"]:
        if mode not in MODES:
            raise ConfigError(f"eval mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="kbflow-eval-") as work:  # corpus files, and the data dir unless given
        return _eval(corpus, queries, qrels, Path(folder), Path(work), config, data_dir, namespace, max_queries,
                     modes or ["vector"], ingest)


def _stored_subset(corpus, qrels, paths: dict[str, str], data_dir: str | Path, namespace: str):
    stored = {paths[p] for p in NamespaceState(data_dir, namespace).read_manifest().column("source_path").to_pylist()
              if p in paths}
    if not stored:
        raise ConfigError(f"namespace {namespace!r} in {data_dir} holds none of the corpus; run the eval with ingest first")
    qrels = {q: {d: g for d, g in rel.items() if d in stored} for q, rel in qrels.items()}
    return {d: row for d, row in corpus.items() if d in stored}, {q: rel for q, rel in qrels.items()
                                                                   if any(g > 0 for g in rel.values())}


def _eval(corpus, queries, qrels, folder: Path, work: Path, config, data_dir, namespace, max_queries, modes,
          ingest: IngestCorpus | None) -> dict:
    data_dir = data_dir or work / "data"  # a URL stays a string
    namespace = namespace or "eval-" + "".join(c if c.isalnum() else "-" for c in folder.name)[:40]
    paths = _write_corpus(corpus, work / "corpus", Path(folder))
    started = time.perf_counter()
    subset = None
    chunks = None
    if ingest is not None:
        summary = ingest([str(work / "corpus")], namespace, resolve_config(config, data_dir))
        chunks = summary["store"]["count"]
    else:
        full = len(corpus)
        corpus, qrels = _stored_subset(corpus, qrels, paths, data_dir, namespace)
        subset = {"documents": len(corpus), "of_documents": full}
    ingest_s = time.perf_counter() - started
    labelled = [q for q in queries if q in qrels][: max_queries or None]
    searcher = Searcher(resolve_config(config, data_dir), namespace)  # opened once for every query and mode
    if chunks is None:  # the rows' ids, not the table's recorded count (as ``kbflow stats`` counts them)
        chunks = stored_ids(searcher.store, namespace).num_rows if searcher.store is not None else 0
    runs = [_run_mode(searcher, mode, queries, labelled, qrels, paths) for mode in modes]
    settings = searcher.config
    return {"dataset": str(folder), "namespace": namespace, "documents": len(corpus), "queries": len(labelled),
            "chunks": chunks, "subset": subset, "model_id": searcher.embedder.model_id,
            "chunking": settings.chunking.model_dump(),
            "fusion": settings.search.model_dump(include={"fusion", "rrf_k", "vector_weight"}),
            "mode": runs[0]["mode"], "metrics": runs[0]["metrics"],
            "ingest_s": round(ingest_s, 2), "search_ms_per_query": runs[0]["search_ms_per_query"], "runs": runs}


def _run_mode(searcher: Searcher, mode: str, queries, labelled: list[str], qrels, paths: dict[str, str]) -> dict:
    """Chunk hits collapse to their best-ranked document; deeper lists for hybrid so Recall@100 is meaningful."""
    settings = searcher.config.search
    if mode in ("hybrid", "rerank"):  # fusion reads as many candidates from each input as the list is deep
        searcher.config = searcher.config.model_copy(update={"search": settings.model_copy(
            update={"candidates": max(settings.candidates, SEARCH_DEPTH)})})
    rankings: dict[str, list[str]] = {}
    started = time.perf_counter()
    try:
        for query_id in labelled:
            hits = searcher.search(queries[query_id], mode=mode, limit=SEARCH_DEPTH, min_score=-1e9)
            ranked: list[str] = []
            for hit in hits:
                doc = paths.get(hit.source_path)
                if doc is not None and doc not in ranked:
                    ranked.append(doc)
            rankings[query_id] = ranked
    finally:
        searcher.config = searcher.config.model_copy(update={"search": settings})
    search_s = time.perf_counter() - started
    return {"mode": mode, "metrics": score_run(rankings, {q: qrels[q] for q in labelled}),
            "search_ms_per_query": round(1000 * search_s / max(len(labelled), 1), 2)}
