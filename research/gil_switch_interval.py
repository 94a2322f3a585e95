"""How long the ingest's embedding thread waits for the GIL while another thread chunks, at Python's default
thread switch interval (5 ms) and at the one an ingest runs with (``kbflow.environment.INGEST_SWITCH_INTERVAL_S``).

The embedding thread hands the model's operations to torch one by one from Python; torch releases the GIL while an
operation runs, so between two operations the thread needs the GIL back, and a thread running Python (the
chunker) gives it up only when its switch interval ends. Per interval: the model alone
embeds 352 chunks of the PostgreSQL 15.20 manual (batches of 32), then the same again while the main thread
splits and chunks 540 of its pages; the ratio of the two model times is what chunking beside it cost the model.
All in one process, each round measuring the model alone again and then both intervals (in alternating order),
since this machine's speed drifts from minute to minute; the chunker's memos are cleared before every pass.

Reproduce (a few minutes on 2 cores, nothing else running):

    .venv/bin/python research/gil_switch_interval.py --corpus postgresql-15.20-html.tar.xz \\
        --out docs/bench/gil-switch-interval.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from kbflow.bench.common import corpus_dir, machine

INTERVALS_S = (0.005, 0.0005)
TEXTS, MODEL_BATCH, PAGES = 352, 32, 540


def measure(corpus: Path, rounds: int) -> list[dict]:
    from kbflow.chunk.chunker import chunker_fingerprint
    from kbflow.config import load_config
    from kbflow.convert.converters import convert_batch
    from kbflow.convert.scan import scan
    from kbflow.embed import get_embedder
    from kbflow.engine import stages
    from kbflow.engine.rows import resolve_chunk_tokens
    from kbflow.search import tokens as bm25

    config = load_config()
    embedder = get_embedder(config.embedder)
    files = [f for f in scan([corpus], "gil", config.convert.include, config.convert.exclude)
             if f.source_path.endswith(".html")][:60 + PAGES]
    docs = convert_batch(files, config.convert.model_copy(update={"workers": 1}))
    tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    counter = embedder.token_counter()
    chunker = chunker_fingerprint(counter, tokens, config.chunking.overlap_tokens, config.chunking.heading_prefix)

    def chunked(table):
        return stages.chunk(table, stages.split(table), counter, tokens, config.chunking, chunker)

    def chunk_pages() -> float:
        bm25._block_words.cache_clear()  # every pass does the same work: nothing remembered from the last one
        bm25._stem.cache_clear()
        bm25._block_terms.cache_clear()
        embedder.tokenizer()._word_counts = {}
        started = time.perf_counter()
        for first in range(60, 60 + PAGES, 64):
            chunked(docs.slice(first, 64))
        return time.perf_counter() - started

    texts = chunked(docs.slice(0, 60)).column("text").to_pylist()[:TEXTS]
    embedder.embed_documents(texts[:8])  # warm

    def model() -> float:
        started = time.perf_counter()
        for start in range(0, len(texts), MODEL_BATCH):
            embedder.embed_documents(texts[start:start + MODEL_BATCH])
        return time.perf_counter() - started

    def beside(interval: float) -> dict:
        before = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(model=model()))
        thread.start()
        result["chunk"] = chunk_pages()
        thread.join()
        sys.setswitchinterval(before)
        return result

    runs = []
    for round_number in range(rounds):
        alone = model()
        chunking_alone = chunk_pages()
        order = INTERVALS_S if round_number % 2 == 0 else INTERVALS_S[::-1]
        for interval in order:
            result = beside(interval)
            runs.append({"round": round_number, "interval_ms": interval * 1000, "model_alone_s": round(alone, 3),
                         "chunking_alone_s": round(chunking_alone, 3), "model_beside_chunking_s":
                         round(result["model"], 3), "chunking_beside_model_s": round(result["chunk"], 3),
                         "model_slowdown": round(result["model"] / alone, 4)})
            print(runs[-1], flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    folder = corpus_dir(args.corpus, Path(tempfile.mkdtemp(prefix="kbflow-gil-")) / "corpus")
    started_machine = machine()
    runs = measure(folder, args.rounds)
    summary = {f"{interval * 1000:g} ms": round(sum(r["model_slowdown"] for r in runs if r["interval_ms"] ==
                                                     interval * 1000) / args.rounds, 4) for interval in INTERVALS_S}
    out = {"corpus": args.corpus.name, "texts": TEXTS, "pages_chunked_beside": PAGES, "runs": runs,
           "mean_model_slowdown": summary, "machine": started_machine,
           "command": "research/gil_switch_interval.py --corpus postgresql-15.20-html.tar.xz"}
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
