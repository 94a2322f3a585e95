"""ANN index variants at 1M rows, outside `kbflow bench search` (which measures only the configured type, with
its query-time sweep): how the default vector index type and partition count were chosen (issue 22.6).

The rows are bench search's own: 2,000 real vectors of Python-manual chunks by the configured model (read from
kbflow's vector cache, embedded otherwise) and 998,000 drawn around them, 100 queries drawn the same way, the
exact top 10 by numpy. Each variant is a LanceDB index on an (id, vector) table; one line of JSON per query
setting: recall@10, vector p50/p95 ms (one query at a time), build seconds.

    python research/ann_variants.py --corpus ../shared/corpora/python-3.11-html.tar.xz --work /tmp/ann \
        --out docs/bench/ann-1m-variants.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from kbflow.bench.search import corpus_chunks, real_vectors, synthetic_around
from kbflow.config import load_config

VARIANTS = {  # label: (index build arguments, query settings tried)
    "IVF_FLAT, 1000 partitions": ({"index_type": "IVF_FLAT", "num_partitions": 1000},
                                  [{"nprobes": p} for p in (5, 10, 20, 40, 80)]),
    "IVF_HNSW_SQ, 64 partitions": ({"index_type": "IVF_HNSW_SQ", "num_partitions": 64},
                                   [{"nprobes": p, "ef": ef, "refine": r} for p in (4, 8, 16) for ef in (64, 128, 256)
                                    for r in (None, 4)]),
    "IVF_PQ, 1000 partitions, 48 sub-vectors": ({"index_type": "IVF_PQ", "num_partitions": 1000, "num_sub_vectors": 48},
                                                [{"nprobes": p, "refine": r} for p in (10, 20, 40) for r in (5, 10, 20)]),
}


def rows_and_truth(corpus: Path, work: Path, size: int, n_real: int, n_queries: int):
    config = load_config(None)
    chunks = corpus_chunks(corpus, work, config)
    real, _ = real_vectors(chunks, n_real, config)
    queries = synthetic_around(real, n_queries, np.random.default_rng(0))  # as bench search draws them
    vectors = np.vstack([real, synthetic_around(real, size - n_real, np.random.default_rng(size))])
    truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    return vectors, queries, truth


def measure(table, queries, truth, label, build, settings) -> list[dict]:
    started = time.perf_counter()
    table.create_index(metric="cosine", vector_column_name="vector", replace=True, **build)
    build_s = round(time.perf_counter() - started, 1)
    lines = []
    for setting in settings:
        def search(vector):
            query = table.search(vector, vector_column_name="vector").distance_type("cosine").limit(10).select(["id"])
            query = query.nprobes(setting["nprobes"])
            if "ef" in setting:
                query = query.ef(setting["ef"])
            if setting.get("refine"):
                query = query.refine_factor(setting["refine"])
            return query.to_arrow().column("id").to_pylist()

        for vector in queries[:3]:
            search(vector)
        latencies, recalls = [], []
        for vector, gold in zip(queries, truth):
            begun = time.perf_counter()
            found = search(vector)
            latencies.append(1000 * (time.perf_counter() - begun))
            recalls.append(len(set(found) & set(gold.tolist())) / 10)
        lines.append({"variant": label, **build, **setting, "build_s": build_s,
                      "recall@10": round(float(np.mean(recalls)), 4),
                      "p50_ms": round(float(np.percentile(latencies, 50)), 2),
                      "p95_ms": round(float(np.percentile(latencies, 95)), 2)})
        print(json.dumps(lines[-1]), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", type=int, default=1_000_000)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    vectors, queries, truth = rows_and_truth(args.corpus, args.work, args.size, 2000, 100)
    db = lancedb.connect(str(args.work / "ann-db"))
    dim, table = vectors.shape[1], None
    for start in range(0, len(vectors), 100_000):
        part = vectors[start:start + 100_000]
        batch = pa.table({"id": pa.array(np.arange(start, start + len(part)), pa.int64()),
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), dim)})
        if table is None:
            table = db.create_table("t", batch, mode="overwrite")
        else:
            table.add(batch)
    lines = [line for label, (build, settings) in VARIANTS.items()
             for line in measure(table, queries, truth, label, build, settings)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": args.size, "queries": len(queries), "variants": lines}, indent=2) + "\n")


if __name__ == "__main__":
    main()
