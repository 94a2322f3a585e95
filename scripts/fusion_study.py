"""How to fuse vector and BM25 so the defaults hold on questions nobody tuned for (issue 16).

Step 1 (``collect``): for each labelled set (BEIR layout) and each embedding backend, ingest the set through the
real pipeline (``kbflow eval``'s ingest, kept in a work folder) and save, per query, the top ``--depth`` chunks of
the vector list and of the BM25 list with their scores and documents. Slow (an ingest per set and model), done once.
Step 2 (``study``): every fusion variant on those saved lists, chunk-level fusion then documents ranked by their
best chunk (as `kbflow search` and `kbflow eval` do), nDCG@10 per set; then leave-one-set-out: the variant (and its
parameter) chosen on the other sets, scored on the held-out one; and the rule "the default hybrid is never more than
1 point below the better of its own two inputs" checked on every set. Fast, rerun freely.

    python scripts/fusion_study.py collect --beir ../shared/eval/semanlink --beir docs/eval/python-faq-en \\
        --backend usem3 --backend local --work /tmp/fusion
    python scripts/fusion_study.py study --work /tmp/fusion --out docs/bench/fusion-study.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def collect(sets: list[Path], backends: list[str], work: Path, depth: int, max_queries: int | None) -> None:
    import os

    import yaml

    from kbflow.config import load_config
    from kbflow.evaluate import eval_beir, load_beir
    from kbflow.search.searcher import Searcher, candidate_lists, embed_query
    from kbflow.search.tokens import words

    for backend in backends:
        os.environ["KBFLOW__EMBEDDER__BACKEND"] = backend
        for folder in sets:
            name = f"{folder.name}--{backend}"
            target = work / f"{name}.json"
            if target.exists():
                print(f"{name}: already collected", flush=True)
                continue
            data_dir = work / "data" / name
            config_file = work / f"{name}.yaml"
            config_file.write_text(yaml.safe_dump({"embedder": {"backend": backend}}), encoding="utf-8")
            result = eval_beir(folder, str(config_file), data_dir, max_queries=max_queries, modes=["vector"])
            namespace = result["namespace"]
            corpus, queries, qrels = load_beir(folder)
            searcher = Searcher(load_config(config_file, data_dir=data_dir), namespace)
            runs = {}
            for query_id in sorted(qrels)[:max_queries] if max_queries else sorted(qrels):
                text = queries[query_id]
                lists = candidate_lists(searcher.store, lambda: embed_query(searcher.embedder, text), words(text),
                                        depth)
                runs[query_id] = {kind: [[hit.chunk_id, hit.doc_id, float(hit.score)] for hit in hits]
                                  for kind, hits in lists.items()}
            doc_ids = _doc_ids_of(searcher, corpus)
            target.write_text(json.dumps({"set": folder.name, "backend": backend, "model_id": searcher.embedder.model_id,
                                          "queries": runs, "qrels": {q: qrels[q] for q in runs}, "doc_ids": doc_ids,
                                          "eval_vector": result["metrics"]}), encoding="utf-8")
            print(f"{name}: {len(runs)} queries, vector nDCG@10 {result['metrics']['ndcg@10']:.4f}", flush=True)


def _doc_ids_of(searcher, corpus: dict) -> dict[str, str]:
    """Store doc ids -> the set's own document ids (kbflow eval writes corpus document i as corpus/doc-<i>.md, and a
    row naming a source file as corpus/<file>)."""
    paths = {f"corpus/{row['file']}" if row.get("file") else f"corpus/doc-{index:06d}.md": doc_id
             for index, (doc_id, row) in enumerate(corpus.items())}
    table = searcher.store.rows(["chunk_id", "doc_id", "source_path"])
    return {doc: paths[path] for doc, path in zip(table.column("doc_id").to_pylist(),
                                                  table.column("source_path").to_pylist()) if path in paths}


# --- fusion variants --------------------------------------------------------------------------------------------
def _min_max(scores: list[float]) -> list[float]:
    if not scores:
        return []
    low, high = min(scores), max(scores)
    return [1.0 if high == low else (s - low) / (high - low) for s in scores]


def _z(scores: list[float]) -> list[float]:
    if len(scores) < 2:
        return [0.0] * len(scores)
    mean, spread = statistics.fmean(scores), statistics.pstdev(scores) or 1.0
    return [(s - mean) / spread for s in scores]


def fuse(lists: dict[str, list], variant: str, param: float, depth: int) -> list[str]:
    """Chunk ids in fused order."""
    vector, bm25 = lists["vector"][:depth], lists["bm25"][:depth]
    if variant == "vector":
        return [c for c, _d, _s in vector]
    if variant == "bm25":
        return [c for c, _d, _s in bm25]
    scores: dict[str, float] = {}
    if variant == "rrf":
        for hits, weight in ((vector, 1.0), (bm25, 1.0)):
            for rank, (chunk, _d, _s) in enumerate(hits, 1):
                scores[chunk] = scores.get(chunk, 0.0) + weight / (param + rank)
    elif variant in ("minmax", "zscore"):
        scale = _min_max if variant == "minmax" else _z
        floor = 0.0 if variant == "minmax" else None
        for hits, weight in ((vector, param), (bm25, 1 - param)):
            scaled = scale([s for _c, _d, s in hits])
            low = min(scaled) if scaled else 0.0
            for (chunk, _d, _s), value in zip(hits, scaled):
                scores[chunk] = scores.get(chunk, 0.0) + weight * (value - (low if floor is None else 0.0))
    elif variant == "adaptive":  # min-max, each list's weight scaled per query by how far its top hit stands out
        weights = {}
        for name, hits, base in (("vector", vector, param), ("bm25", bm25, 1 - param)):
            raw = [s for _c, _d, s in hits]
            spread = statistics.pstdev(raw) if len(raw) > 1 else 0.0
            weights[name] = base * (max(0.0, (raw[0] - statistics.fmean(raw)) / spread) if spread else 1.0)
        total = sum(weights.values()) or 1.0
        for name, hits in (("vector", vector), ("bm25", bm25)):
            for (chunk, _d, _s), value in zip(hits, _min_max([s for _c, _d, s in hits])):
                scores[chunk] = scores.get(chunk, 0.0) + weights[name] / total * value
    elif variant == "wrrf":  # weighted RRF, k = 60: the vector list counts `param`, BM25 1 - param
        for hits, weight in ((vector, param), (bm25, 1 - param)):
            for rank, (chunk, _d, _s) in enumerate(hits, 1):
                scores[chunk] = scores.get(chunk, 0.0) + weight / (60 + rank)
    else:
        raise ValueError(variant)
    return sorted(scores, key=lambda chunk: -scores[chunk])


def ndcg10(ranked_docs: list[str], relevant: dict[str, int]) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked_docs[:10]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:10]
    idcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def score(collected: dict, variant: str, param: float, depth: int) -> float:
    chunk_doc = {}
    for lists in collected["queries"].values():
        for hits in lists.values():
            chunk_doc.update({chunk: doc for chunk, doc, _s in hits})
    values = []
    for query_id, lists in collected["queries"].items():
        docs, seen = [], set()
        for chunk in fuse(lists, variant, param, depth):
            doc = collected["doc_ids"].get(chunk_doc[chunk], chunk_doc[chunk])
            if doc not in seen:
                seen.add(doc)
                docs.append(doc)
        values.append(ndcg10(docs, collected["qrels"][query_id]))
    return statistics.fmean(values) if values else 0.0


VARIANTS = [("vector", 0.0), ("bm25", 0.0)] + [("rrf", k) for k in (10, 30, 60, 100)] + \
    [("minmax", w / 10) for w in range(1, 10)] + [("zscore", w / 10) for w in range(1, 10)] + \
    [("wrrf", w / 10) for w in range(1, 10)] + [("adaptive", w / 10) for w in range(1, 10)]


def study(work: Path, out: Path, depth: int, previous: Path | None = None) -> dict:
    collected = {path.stem: json.loads(path.read_text()) for path in sorted(work.glob("*--*.json"))}
    table = {name: {f"{v}:{p:g}": round(score(data, v, p, depth), 4) for v, p in VARIANTS}
             for name, data in collected.items()}
    if previous:  # sets scored by an earlier study (same variants, same depth) and not collected again here
        earlier = json.loads(previous.read_text())
        if earlier["depth"] != depth:
            raise SystemExit(f"{previous} was scored at depth {earlier['depth']}, this study at {depth}")
        variants = {f"{v}:{p:g}" for v, p in VARIANTS}
        if any(set(scores) != variants for scores in earlier["ndcg@10"].values()):
            raise SystemExit(f"{previous} scored other variants than this study's VARIANTS: collect its sets again")
        table = {**{n: t for n, t in earlier["ndcg@10"].items() if n not in table}, **table}
    names = sorted(table)
    fused = [key for key in next(iter(table.values())) if not key.startswith(("vector", "bm25"))]

    def margin(name: str, key: str) -> float:  # fused minus the better of its two inputs
        return table[name][key] - max(table[name]["vector:0"], table[name]["bm25:0"])

    loso = {}
    for held in names:
        others = [n for n in names if n != held and n.split("--")[0] != held.split("--")[0]]
        # choose on the others: the best worst-case margin to the better input, ties by mean nDCG
        chosen = max(fused, key=lambda key: (min(margin(n, key) for n in others),
                                             statistics.fmean(table[n][key] for n in others)))
        loso[held] = {"chosen": chosen, "ndcg@10": table[held][chosen], "margin_to_better_input": round(margin(held, chosen), 4),
                      "vector": table[held]["vector:0"], "bm25": table[held]["bm25:0"]}
    overall = max(fused, key=lambda key: (min(margin(n, key) for n in names), statistics.fmean(table[n][key] for n in names)))
    result = {"depth": depth, "sets": names, "ndcg@10": table, "leave_one_set_out": loso,
              "chosen_on_all": overall, "margins_of_chosen": {n: round(margin(n, overall), 4) for n in names}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--beir", action="append", type=Path, required=True)
    c.add_argument("--backend", action="append", required=True)
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--depth", type=int, default=100)
    c.add_argument("--max-queries", type=int)
    s = sub.add_parser("study")
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--depth", type=int, default=50)
    s.add_argument("--previous", type=Path, help="an earlier study's JSON: its sets join this one's table")
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.beir, args.backend, args.work, args.depth, args.max_queries)
    else:
        result = study(args.work, args.out, args.depth, args.previous)
        print(json.dumps({k: result[k] for k in ("leave_one_set_out", "chosen_on_all", "margins_of_chosen")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
