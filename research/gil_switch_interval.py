"""How long the ingest's embedding thread waits for the GIL while another thread chunks, at Python's default
thread switch interval (5 ms) and at the one an ingest runs with (``kbflow.runtime.environment.INGEST_SWITCH_INTERVAL_S``).

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

import sys
import time
from pathlib import Path

from model_beside import PAGES, TEXTS, WARM_PAGES, ModelWorkload, study_main

INTERVALS_S = (0.005, 0.0005)


def measure(corpus: Path, rounds: int) -> list[dict]:
    from kbflow.convert.converters import convert_batch
    from kbflow.search import tokens as bm25

    workload = ModelWorkload(corpus, "gil")
    docs = convert_batch(workload.files[WARM_PAGES:], workload.in_process())

    def chunk_pages() -> float:
        bm25._block_words.cache_clear()  # every pass does the same work: nothing remembered from the last one
        bm25._stem.cache_clear()
        bm25._block_terms.cache_clear()
        workload.embedder.tokenizer()._word_counts = {}
        started = time.perf_counter()
        for first in range(0, PAGES, 64):
            workload.chunked(docs.slice(first, 64))
        return time.perf_counter() - started

    def beside(interval: float) -> dict:
        before = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        result = workload.beside(chunk_pages)
        sys.setswitchinterval(before)
        return result

    runs = []
    for round_number in range(rounds):
        alone = workload.model()
        chunking_alone = chunk_pages()
        order = INTERVALS_S if round_number % 2 == 0 else INTERVALS_S[::-1]
        for interval in order:
            result = beside(interval)
            runs.append({"round": round_number, "interval_ms": interval * 1000, "model_alone_s": round(alone, 3),
                         "chunking_alone_s": round(chunking_alone, 3), "model_beside_chunking_s":
                         round(result["model"], 3), "chunking_beside_model_s": round(result["other"], 3),
                         "model_slowdown": round(result["model"] / alone, 4)})
            print(runs[-1], flush=True)
    return runs


def study(corpus: Path, rounds: int) -> dict:
    runs = measure(corpus, rounds)
    summary = {f"{interval * 1000:g} ms": round(sum(r["model_slowdown"] for r in runs if r["interval_ms"] ==
                                                     interval * 1000) / rounds, 4) for interval in INTERVALS_S}
    return {"texts": TEXTS, "pages_chunked_beside": PAGES, "runs": runs, "mean_model_slowdown": summary}


if __name__ == "__main__":
    study_main(__doc__, "gil_switch_interval.py", 6, study)
