"""`kbflow bench chunk`: token counting and split+chunk throughput on ~100 MB of real converted text.

The corpus is converted once; its Markdown is repeated until the target size is reached (repetition does not
change what a tokenizer or the chunker costs per byte). Both token counters are measured: the model's own
tokenizer (batched ``encode_batch``) and the CJK-aware estimate used for remote models.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from kbflow.bench.ingest import _corpus_dir, _peak_rss_mb
from kbflow.bench.results import save
from kbflow.chunk.chunker import chunk_document
from kbflow.config import load_config
from kbflow.convert.converters import convert_batch
from kbflow.embed import get_embedder
from kbflow.engine.rows import resolve_chunk_tokens
from kbflow.convert.scan import scan
from kbflow.chunk.split import split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter


def _markdown_of(corpus: Path, work: Path, options) -> list[str]:
    source = _corpus_dir(corpus, work / "corpus")
    sources = scan([source], "bench", options.include, options.exclude)
    documents = convert_batch(sources, options)
    return [text for text in documents.column("markdown").to_pylist() if text]


def bench_chunk(corpus: Path, out_file: Path, target_mb: float = 100.0, config=None) -> dict:
    cfg = load_config(config)
    embedder = get_embedder(cfg.embedder)
    counter = embedder.token_counter()
    chunk_tokens = resolve_chunk_tokens(cfg.chunking, embedder.max_tokens, embedder.model_id)
    with tempfile.TemporaryDirectory(prefix="kbflow-bench-chunk-") as work:
        started = time.perf_counter()
        originals = _markdown_of(corpus, Path(work), cfg.convert)
        convert_s = time.perf_counter() - started
    original_bytes = sum(len(text.encode("utf-8")) for text in originals)
    copies = max(1, round(target_mb * 1e6 / original_bytes))
    documents = originals * copies
    total_mb = original_bytes * copies / 1e6

    started, cpu = time.perf_counter(), time.process_time()
    blocks = [split_markdown(text) for text in documents]
    split_s, split_cpu = time.perf_counter() - started, time.process_time() - cpu
    block_texts = [text[b.char_start:b.char_end] for text, doc_blocks in zip(documents, blocks) for b in doc_blocks]

    counters = {}
    for name, each in (("model_tokenizer", counter), ("cjk_estimate", EstimateTokenCounter(embedder.max_tokens))):
        started, cpu = time.perf_counter(), time.process_time()
        tokens = sum(each.count(block_texts))
        seconds = time.perf_counter() - started
        counters[name] = {"name": each.name, "seconds": round(seconds, 2), "tokens": tokens,
                          "cpu_seconds": round(time.process_time() - cpu, 2),
                          "mb_per_s": round(total_mb / seconds, 2), "tokens_per_s": round(tokens / seconds)}
    del block_texts

    started, cpu = time.perf_counter(), time.process_time()
    n_chunks = 0
    for index, (text, doc_blocks) in enumerate(zip(documents, blocks)):
        n_chunks += len(chunk_document(f"doc{index}", text, doc_blocks, counter, chunk_tokens,
                                       cfg.chunking.overlap_tokens, cfg.chunking.heading_prefix))
    chunk_s, chunk_cpu = time.perf_counter() - started, time.process_time() - cpu
    result = {
        "corpus": str(corpus), "documents": len(documents), "copies": copies, "megabytes": round(total_mb, 1),
        "convert_once_s": round(convert_s, 1), "chunk_tokens": chunk_tokens, "tokenizer": counter.name,
        "note": "seconds are wall time; cpu_seconds count both cores, so wall < cpu when the tokenizer runs parallel",
        "split": {"seconds": round(split_s, 2), "cpu_seconds": round(split_cpu, 2), "mb_per_s": round(total_mb / split_s, 2)},
        "count": counters,
        "chunk": {"seconds": round(chunk_s, 2), "cpu_seconds": round(chunk_cpu, 2), "mb_per_s": round(total_mb / chunk_s, 2),
                  "chunks": n_chunks},
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
    return save(result, out_file, _plot)


def _plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["split", "count: model tokenizer", "count: CJK estimate", "chunk (split excluded)"]
    values = [result["split"]["mb_per_s"], result["count"]["model_tokenizer"]["mb_per_s"],
              result["count"]["cjk_estimate"]["mb_per_s"], result["chunk"]["mb_per_s"]]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    bars = axis.barh(names, values)
    axis.bar_label(bars, fmt="%.1f MB/s", fontsize=8)
    axis.set_xlabel("MB of Markdown per second (2 cores)")
    axis.set_title(f"split, token counting and chunking on {result['megabytes']:.0f} MB")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
