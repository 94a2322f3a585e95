"""What conversion worker processes cost the embedding model beside them, at three worker niceness values
(``convert.worker_nice``).

An ingest converts one batch ahead of the model, in worker processes (``kbflow.convert.pool``) that share the
cores with the model's threads. Per niceness: the model alone embeds 352 chunks of the PostgreSQL 15.20 manual
(batches of 32), the two workers alone convert 540 of its pages, then both run at once. The ratio of the model's
time beside the workers to its time alone is what conversion cost it; the time until both are done shows whether
the pages were still converted meanwhile (in the model's idle time) or waited. Each round measures both alone
again, then every niceness (in alternating order), in one process, since this machine's speed drifts from minute
to minute. Workers are started fresh for every pass and niced from the parent once they are ready.

Reproduce (a few minutes on 2 cores, nothing else running; Linux):

    .venv/bin/python research/conversion_nice.py --corpus postgresql-15.20-html.tar.xz \\
        --out docs/bench/conversion-nice.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from kbflow.bench.common import corpus_dir, machine

NICES = (0, 10, 19)
TEXTS, MODEL_BATCH, PAGES, WORKERS = 352, 32, 540, 2


def measure(corpus: Path, rounds: int) -> list[dict]:
    from kbflow.chunk.chunker import chunker_fingerprint
    from kbflow.config import load_config
    from kbflow.convert.converters import _convert_one, convert_batch
    from kbflow.convert.pool import KillablePool
    from kbflow.convert.scan import scan
    from kbflow.embed import get_embedder
    from kbflow.engine import stages
    from kbflow.engine.rows import resolve_chunk_tokens

    config = load_config()
    embedder = get_embedder(config.embedder)
    files = [f for f in scan([corpus], "nice", config.convert.include, config.convert.exclude)
             if f.source_path.endswith(".html")][:60 + PAGES]
    docs = convert_batch(files[:60], config.convert.model_copy(update={"workers": 1}))
    tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    counter = embedder.token_counter()
    chunker = chunker_fingerprint(counter, tokens, config.chunking.overlap_tokens, config.chunking.heading_prefix)
    texts = stages.chunk(docs, stages.split(docs), counter, tokens, config.chunking,
                         chunker).column("text").to_pylist()[:TEXTS]
    embedder.embed_documents(texts[:8])  # warm
    jobs = [(source, config.convert) for source in files[60:]]

    def model() -> float:
        started = time.perf_counter()
        for start in range(0, len(texts), MODEL_BATCH):
            embedder.embed_documents(texts[start:start + MODEL_BATCH])
        return time.perf_counter() - started

    def convert(nice: int) -> float:
        with KillablePool(WORKERS, _convert_one) as pool:
            for worker in pool.workers:  # as convert.worker_nice would, here from outside and after start-up
                os.setpriority(os.PRIO_PROCESS, worker.process.pid, nice)
            started = time.perf_counter()
            results = pool.map(jobs, 600, lambda i: None, lambda i, code: None)
            elapsed = time.perf_counter() - started
        if any(row is None or row["status"] != "ok" for row in results):
            raise RuntimeError("a page did not convert")
        return elapsed

    runs = []
    for round_number in range(rounds):
        model_alone, convert_alone = model(), convert(0)
        for nice in NICES if round_number % 2 == 0 else NICES[::-1]:
            result: dict = {}
            thread = threading.Thread(target=lambda: result.update(model=model()))
            started = time.perf_counter()
            thread.start()
            result["convert"] = convert(nice)
            thread.join()
            both = time.perf_counter() - started
            runs.append({"round": round_number, "worker_nice": nice, "model_alone_s": round(model_alone, 3),
                         "conversion_alone_s": round(convert_alone, 3),
                         "model_beside_conversion_s": round(result["model"], 3),
                         "conversion_beside_model_s": round(result["convert"], 3), "both_done_s": round(both, 3),
                         "model_slowdown": round(result["model"] / model_alone, 4),
                         "both_over_model_alone": round(both / model_alone, 4)})
            print(runs[-1], flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    folder = corpus_dir(args.corpus, Path(tempfile.mkdtemp(prefix="kbflow-nice-")) / "corpus")
    started_machine = machine()
    runs = measure(folder, args.rounds)

    def mean(key: str, nice: int) -> float:
        return round(sum(r[key] for r in runs if r["worker_nice"] == nice) / args.rounds, 4)

    out = {"corpus": args.corpus.name, "texts": TEXTS, "pages_converted_beside": PAGES, "workers": WORKERS,
           "runs": runs,
           "mean_model_slowdown": {str(nice): mean("model_slowdown", nice) for nice in NICES},
           "mean_both_over_model_alone": {str(nice): mean("both_over_model_alone", nice) for nice in NICES},
           "machine": started_machine,
           "command": "research/conversion_nice.py --corpus postgresql-15.20-html.tar.xz"}
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
