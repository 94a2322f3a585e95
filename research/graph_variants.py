"""Ways to fuse graph search's list with hybrid search, scored on a labelled set (issue 21.2): every variant tried,
over one ingest and the same candidate lists per query.

    python research/graph_variants.py --beir /tmp/relset --data-dir /tmp/releval/data --config cfg.yaml --out F.json

The corpus must have been ingested by `kbflow eval --data-dir` with ``graph.enabled: true``. Variants: hybrid
alone (the reference); RRF of vector, BM25 and graph lists (search --mode graph); RRF of the hybrid list and the
graph list; hybrid with only the graph's anchor-named chunks added; graph list weights 0.25 / 0.5 in the RRF;
the best chunks a hop reached (or those and the query-named entity seeds) inserted after hybrid's first n chunks
(kbflow.graph.expand.insert: search --mode graph since issue 21's second stop).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from kbflow.config import load_config
from kbflow.engine.evaluate import SEARCH_DEPTH, load_beir, score_run
from kbflow.graph.expand import insert
from kbflow.search import fusion
from kbflow.search.searcher import Searcher, candidate_lists, embed_query, fuse
from kbflow.search.tokens import words


def weighted_rrf(lists: dict, weights: dict, k: int) -> list:
    merged: dict = {}
    for name, hits in lists.items():
        for rank, hit in enumerate(hits, 1):
            kept = merged.setdefault(hit.chunk_id, replace(hit, score=0.0))
            kept.score += weights.get(name, 1.0) / (k + rank)
    return sorted(merged.values(), key=lambda hit: -hit.score)


def insert_after(hybrid: list, graph: list, after: int, slots: int) -> list:
    """As ``kbflow.graph.expand.insert`` (search --mode graph), but the query-named entity seeds may be inserted
    too, not only the chunks a hop reached."""
    top = hybrid[:after]
    taken = {hit.chunk_id for hit in top}
    extra = [hit for hit in graph if hit.chunk_id not in taken][:slots]
    taken |= {hit.chunk_id for hit in extra}
    return top + extra + [hit for hit in hybrid[after:] if hit.chunk_id not in taken]


def documents(hits, by_path: dict[str, str]) -> list[str]:
    ranked: list[str] = []
    for hit in hits:
        doc = by_path.get(hit.source_path, hit.source_path)
        if doc not in ranked:
            ranked.append(doc)
    return ranked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    corpus, queries, qrels = load_beir(args.beir)
    by_path = {f"corpus/{row['file']}": doc_id for doc_id, row in corpus.items() if row.get("file")}
    config = load_config(args.config, data_dir=args.data_dir)
    namespace = "eval-" + "".join(c if c.isalnum() else "-" for c in args.beir.name)[:40]
    searcher = Searcher(config, namespace)
    settings, k = config.search, config.search.rrf_k
    variants: dict[str, dict[str, list[str]]] = {}

    def put(name: str, query_id: str, hits) -> None:
        variants.setdefault(name, {})[query_id] = documents(hits, by_path)

    for query_id in [q for q in queries if q in qrels]:
        query = queries[query_id]
        vector = embed_query(searcher.embedder, query)
        lists = candidate_lists(searcher.store, lambda: vector, words(query), SEARCH_DEPTH)
        hybrid = fuse(lists, settings)
        graph = searcher.expander.expand(query, vector, hybrid, None)
        named = [hit for hit in graph if "which names" in hit.extra["path"][-1]
                 or hit.extra["path"][-1].startswith(("defines", "is the section"))]
        put("hybrid", query_id, hybrid)
        put("rrf(vector, bm25, graph) (--mode graph until issue 21's second stop)", query_id, fusion.rrf({**lists, "graph": graph}, k))
        put("rrf(hybrid, graph)", query_id, fusion.rrf({"hybrid": hybrid, "graph": graph}, k))
        put("rrf(hybrid, graph anchor-named only)", query_id, fusion.rrf({"hybrid": hybrid, "graph": named}, k))
        for weight in (0.25, 0.5):
            put(f"rrf(vector, bm25, {weight} x graph)", query_id,
                weighted_rrf({**lists, "graph": graph}, {"graph": weight}, k))
            put(f"rrf(hybrid, {weight} x graph)", query_id, weighted_rrf({"hybrid": hybrid, "graph": graph},
                                                                       {"graph": weight}, k))
        put("graph list alone", query_id, graph)
        for after, slots in ((3, 1), (5, 1), (5, 2), (8, 2), (10, 2), (10, 5)):
            put(f"insert {slots} after {after}, entity seeds too", query_id, insert_after(hybrid, graph, after, slots))
            put(f"insert {slots} after {after}" + (" = --mode graph" if (after, slots) == (3, 1) else ""), query_id,
                insert(hybrid, graph, after, slots))
    result = {name: score_run(rankings, qrels) for name, rankings in variants.items()}
    args.out.write_text(json.dumps({"dataset": str(args.beir), "queries": len(variants["hybrid"]),
                                    "model_id": searcher.embedder.model_id, "fusion": settings.fusion,
                                    "graph": config.graph.model_dump(), "variants": result}, indent=1))
    for name, metrics in result.items():
        print(f"{metrics['ndcg@10']:.4f} {metrics['recall@10']:.4f} {metrics['mrr@10']:.4f}  {name}")


if __name__ == "__main__":
    main()
