"""Vector search latency of a LanceDB table that `kbflow bench search` left in a bucket (issue 19.4).

    AWS_ENDPOINT_URL=http://127.0.0.1:5055 ... python research/s3_search_latency.py s3://bucket/searchbench/lancedb-100000

Builds the table's vector index with the configured defaults if it has none, then times 100 queries near stored
vectors twice (first pass, warm): p50 and p95 in ms. Credentials and endpoint come from the AWS environment.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from kbflow.config import load_config
from kbflow.stores.lancedb_store import LanceStore


def main(uri: str) -> None:
    s = load_config().search
    store = LanceStore(uri, "bench", 384, vector_index_min_rows=10**12, vector_index_type=s.vector_index_type,
                       ann_nprobes=s.ann_nprobes, ann_ef=s.ann_ef, ann_refine_factor=s.ann_refine_factor)
    print("rows", store.count(), "indexes", [i.name for i in store.table.list_indices()])
    store.refresh_indexes(force_vector=True)
    stored = store.table.search().select(["vector"]).limit(100).to_arrow().column("vector").to_pylist()
    rng = np.random.default_rng(0)
    queries = np.array(stored, dtype=np.float32) + rng.normal(0, 0.02, (len(stored), 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for label in ("first pass", "warm"):
        times = []
        for query in queries:
            started = time.perf_counter()
            store.search_vector(query, 10)
            times.append((time.perf_counter() - started) * 1000)
        print(f"{label}: vector p50 {np.median(times):.1f} ms, p95 {np.percentile(times, 95):.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("s3://"):  # a table elsewhere would be created empty
        raise SystemExit(__doc__)
    main(sys.argv[1])
