"""`kbflow bench chunk`: token counting and split+chunk throughput on ~100 MB of real converted text, for a full
pass and for an update.

The corpus is converted once; its Markdown is repeated until the target size is reached (repetition does not
change what a tokenizer or the chunker costs per byte). Both token counters are measured: the model's own
tokenizer (batched ``encode_batch``) and the CJK-aware estimate used for remote models.

Documents are chunked in batches of ``flow.doc_batch``, as the chunk stage gets them. The update (issue 22): the
full pass keeps each document's section plans and token counts (as an ingest does under
``data/state/<ns>/chunk-plans``); then each document's last paragraph and one in ``EDIT_EVERY`` of the others are
edited (a few words appended, so every later block moves; the blocks and sections touched are recorded) and the
edited documents are chunked again with those plans and counts. Its MB/s is over the whole documents' bytes, as an update's
chunk stage sees them. The chunks it gives are compared with a plain chunking of the edited text: they must be
identical.

Every run also reports the chunks' quality on one copy of the corpus (``kbflow.chunk.quality``); ``--quality``
measures that alone, per document, with each document's chunks against its text's tokens / the budget
(``bench_chunk_quality``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from kbflow.bench.common import corpus_dir, peak_rss_mb
from kbflow.bench.results import save
from kbflow.chunk.chunker import ChunkJob, sections_of, chunk_documents, chunker_fingerprint
from kbflow.chunk.plans import chunk_remembering
from kbflow.chunk.quality import quality_report
from kbflow.config import load_config
from kbflow.convert.converters import convert_batch
from kbflow.embed import get_embedder
from kbflow.engine.rows import resolve_chunk_tokens
from kbflow.convert.scan import scan
from kbflow.chunk.split import Block, split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter


EDIT_EVERY = 50  # the update edits one paragraph in 50, and each document's last one (a patch release's stamp)
EDIT = " (revised in the update)"


def edited(text: str, blocks: list[Block]) -> tuple[str, int]:
    """``text`` with EDIT appended to its last paragraph and to every EDIT_EVERY-th one; how many were edited."""
    all_paragraphs = [block for block in blocks if block.kind == "paragraph"]
    chosen = {block.char_start: block for block in all_paragraphs[EDIT_EVERY // 2::EDIT_EVERY] + all_paragraphs[-1:]}
    paragraphs = [chosen[start] for start in sorted(chosen)]
    for block in reversed(paragraphs):  # from the end, so earlier offsets stay valid
        text = text[:block.char_end] + EDIT + text[block.char_end:]
    return text, len(paragraphs)


def _markdown_of(corpus: Path, work: Path, options) -> list[str]:
    source = corpus_dir(corpus, work / "corpus")
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

    fingerprint = chunker_fingerprint(counter, chunk_tokens, cfg.chunking.overlap_tokens, cfg.chunking.heading_prefix)

    def chunk_all(texts, all_blocks, memories=None):
        """Chunks of every document, in batches of ``flow.doc_batch`` as the chunk stage gets them; with
        ``memories`` (one dict per document), through each document's plans and counts as an ingest keeps them."""
        chunks, tokenized = [], 0
        for start in range(0, len(texts), cfg.flow.doc_batch):
            jobs = [ChunkJob(f"doc{i}", texts[i], all_blocks[i])
                    for i in range(start, min(start + cfg.flow.doc_batch, len(texts)))]
            if memories is None:
                chunks += chunk_documents(jobs, counter, chunk_tokens, cfg.chunking.overlap_tokens,
                                          cfg.chunking.heading_prefix, fingerprint)
                continue
            batch, n = chunk_remembering(jobs, memories[start:start + len(jobs)], counter, chunk_tokens,
                                         cfg.chunking.overlap_tokens, cfg.chunking.heading_prefix, fingerprint)
            chunks, tokenized = chunks + batch, tokenized + n
        return chunks, tokenized

    memories: list[dict] = [{} for _ in documents]
    started, cpu = time.perf_counter(), time.process_time()
    full, full_tokenized = chunk_all(documents, blocks, memories)  # keeps plans and counts, as an ingest
    n_chunks = sum(len(chunks) for chunks in full)
    chunk_s, chunk_cpu = time.perf_counter() - started, time.process_time() - cpu
    quality = quality_report(((f"doc{i}", [c.text for c in chunks], [c.n_tokens for c in chunks],
                               [c.heading_path for c in chunks]) for i, chunks in enumerate(full[:len(originals)])),
                             chunk_tokens)
    quality.pop("per_document")
    del full

    pairs = [edited(text, doc_blocks) for text, doc_blocks in zip(documents, blocks)]
    new_texts = [text for text, _ in pairs]
    new_blocks = [split_markdown(text) for text in new_texts]
    keys_before = [set(memory["sections"]) for memory in memories]
    started, cpu = time.perf_counter(), time.process_time()
    updated, update_tokenized = chunk_all(new_texts, new_blocks, memories)
    update_s, update_cpu = time.perf_counter() - started, time.process_time() - cpu
    update_mb = sum(len(text.encode("utf-8")) for text in new_texts) / 1e6
    sample = min(len(new_texts), max(1, len(originals)))  # one copy of the corpus, chunked from scratch
    identical = updated[:sample] == chunk_all(new_texts[:sample], new_blocks[:sample])[0]
    result = {
        "corpus": str(corpus), "documents": len(documents), "copies": copies, "megabytes": round(total_mb, 1),
        "convert_once_s": round(convert_s, 1), "chunk_tokens": chunk_tokens, "tokenizer": counter.name,
        "note": "seconds are wall time; cpu_seconds count both cores, so wall < cpu when the tokenizer runs parallel",
        "split": {"seconds": round(split_s, 2), "cpu_seconds": round(split_cpu, 2), "mb_per_s": round(total_mb / split_s, 2)},
        "count": counters,
        "chunk": {"seconds": round(chunk_s, 2), "cpu_seconds": round(chunk_cpu, 2), "mb_per_s": round(total_mb / chunk_s, 2),
                  "chunks": n_chunks, "texts_tokenized": full_tokenized, "documents_per_batch": cfg.flow.doc_batch},
        "chunk_update": {"seconds": round(update_s, 2), "cpu_seconds": round(update_cpu, 2),
                         "mb_per_s": round(update_mb / update_s, 2), "chunks": sum(len(c) for c in updated),
                         "blocks": sum(len(b) for b in new_blocks), "blocks_edited": sum(n for _, n in pairs),
                         "sections": sum(len(sections_of(b)) for b in new_blocks),
                         "sections_planned_again": sum(len(set(memory["sections"]) - before)
                                                       for memory, before in zip(memories, keys_before)),
                         "texts_tokenized": update_tokenized,
                         "identical_to_a_fresh_chunking": identical, "documents_compared": sample},
        "quality": quality,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    return save(result, out_file, _plot)


def bench_chunk_quality(corpus: Path, out_file: Path, include: list[str] | None = None, config=None) -> dict:
    """Chunk quality of every document of ``corpus`` (files matching ``include``, all by default), converted and
    chunked with the configured model's token counter and budget: per document its chunks, small and
    punctuation-only chunks, repeated texts, and chunks against its text's tokens / the budget (1.0 would be chunks
    filled to the brim with no overlap)."""
    cfg = load_config(config)
    embedder = get_embedder(cfg.embedder)
    counter = embedder.token_counter()
    chunk_tokens = resolve_chunk_tokens(cfg.chunking, embedder.max_tokens, embedder.model_id)
    fingerprint = chunker_fingerprint(counter, chunk_tokens, cfg.chunking.overlap_tokens, cfg.chunking.heading_prefix)
    with tempfile.TemporaryDirectory(prefix="kbflow-bench-chunk-") as work:
        source = corpus_dir(corpus, Path(work) / "corpus")
        started = time.perf_counter()
        converted = convert_batch(scan([source], "bench", include or cfg.convert.include, cfg.convert.exclude),
                                  cfg.convert)
        convert_s = time.perf_counter() - started
    rows = [row for row in converted.select(["source_path", "markdown", "status", "error"]).to_pylist()]
    documents = [(row["source_path"], row["markdown"]) for row in rows if row["markdown"]]
    started = time.perf_counter()
    jobs = [ChunkJob(source, text, split_markdown(text)) for source, text in documents]
    chunked = chunk_documents(jobs, counter, chunk_tokens, cfg.chunking.overlap_tokens, cfg.chunking.heading_prefix,
                              fingerprint)
    chunk_s = time.perf_counter() - started
    report = quality_report(((source, [c.text for c in chunks], [c.n_tokens for c in chunks],
                              [c.heading_path for c in chunks]) for (source, _), chunks in zip(documents, chunked)),
                            chunk_tokens)
    text_tokens = counter.count([text for _, text in documents])
    for (source, _), tokens, chunks in zip(documents, text_tokens, chunked):
        report["per_document"][source].update(text_tokens=tokens,
                                              chunks_per_budget=round(len(chunks) / max(tokens / chunk_tokens, 1), 3))
    result = {"corpus": str(corpus), "include": include or cfg.convert.include, "tokenizer": counter.name,
              "model_id": embedder.model_id, "chunk_tokens": chunk_tokens,
              "overlap_tokens": cfg.chunking.overlap_tokens, "chunker": fingerprint,
              "convert_s": round(convert_s, 1), "chunk_s": round(chunk_s, 1),
              "not_converted": {row["source_path"]: row["error"] for row in rows if not row["markdown"]},
              "note": "small: chunks under a tenth of chunk_tokens, a section's last chunk aside (small_share is of "
                      "those judged); chunks_per_budget: chunks / (the document's text tokens / chunk_tokens)",
              **report}
    return save(result, out_file)


def _plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    update = result["chunk_update"]
    names = ["split", "count: model tokenizer", "count: CJK estimate", "chunk (split excluded)",
             f"chunk an update ({100 * update['blocks_edited'] / update['blocks']:.1f} % of blocks edited)"]
    values = [result["split"]["mb_per_s"], result["count"]["model_tokenizer"]["mb_per_s"],
              result["count"]["cjk_estimate"]["mb_per_s"], result["chunk"]["mb_per_s"], update["mb_per_s"]]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    bars = axis.barh(names, values)
    axis.bar_label(bars, fmt="%.1f MB/s", fontsize=8)
    axis.set_xlabel("MB of Markdown per second (2 cores)")
    axis.set_title(f"split, token counting and chunking on {result['megabytes']:.0f} MB")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
