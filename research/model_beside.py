"""The half that the studies of "what other work beside the embedding model costs it" share
(``gil_switch_interval.py``, ``conversion_nice.py``): the model's workload, timing it alone and beside the other
work, and the command line. Not a study of its own.

The workload: the default embedder embeds ``TEXTS`` chunks of the corpus's first ``WARM_PAGES`` HTML pages, in calls
of ``MODEL_BATCH``; the ``PAGES`` pages after them are the other side's work.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from kbflow.bench.common import corpus_dir, machine

TEXTS, MODEL_BATCH, PAGES, WARM_PAGES = 352, 32, 540, 60


class ModelWorkload:
    def __init__(self, corpus: Path, namespace: str):
        from kbflow.chunk.chunker import chunker_fingerprint
        from kbflow.config import load_config
        from kbflow.convert.converters import convert_batch
        from kbflow.convert.scan import scan
        from kbflow.embed import get_embedder
        from kbflow.engine.rows import resolve_chunk_tokens

        self.config = config = load_config()
        self.embedder = get_embedder(config.embedder)
        # the workload's pages, then the other side's
        self.files = [f for f in scan([corpus], namespace, config.convert.include, config.convert.exclude)
                      if f.source_path.endswith(".html")][:WARM_PAGES + PAGES]
        self.tokens = resolve_chunk_tokens(config.chunking, self.embedder.max_tokens, self.embedder.model_id)
        self.counter = self.embedder.token_counter()
        self.chunker = chunker_fingerprint(self.counter, self.tokens, config.chunking.overlap_tokens,
                                           config.chunking.heading_prefix)
        first = convert_batch(self.files[:WARM_PAGES], self.in_process())
        self.texts = self.chunked(first).column("text").to_pylist()[:TEXTS]
        self.embedder.embed_documents(self.texts[:8])  # warm

    def in_process(self):
        """The conversion settings with conversion in this process."""
        return self.config.convert.model_copy(update={"workers": 1})

    def chunked(self, table):
        from kbflow.engine import stages

        return stages.chunk(table, stages.split(table), self.counter, self.tokens, self.config.chunking, self.chunker)

    def model(self) -> float:
        """Seconds to embed the workload's texts."""
        started = time.perf_counter()
        for start in range(0, len(self.texts), MODEL_BATCH):
            self.embedder.embed_documents(self.texts[start:start + MODEL_BATCH])
        return time.perf_counter() - started

    def beside(self, other: Callable[[], float]) -> dict:
        """The model in a thread of its own while this thread runs ``other`` (which returns its own seconds):
        {"model": s, "other": s, "both": s until both were done}."""
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(model=self.model()))
        started = time.perf_counter()
        thread.start()
        result["other"] = other()
        thread.join()
        result["both"] = time.perf_counter() - started
        return result


def study_main(doc: str, script: str, default_rounds: int, study: Callable[[Path, int], dict]) -> None:
    """A study's command line: ``--corpus`` (a folder or a tar archive), ``--out`` (the JSON), ``--rounds``; the
    JSON holds the corpus's name, what ``study(folder, rounds)`` returns, the machine and the command."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=default_rounds)
    args = parser.parse_args()
    folder = corpus_dir(args.corpus, Path(tempfile.mkdtemp(prefix="kbflow-study-")) / "corpus")
    started_machine = machine()
    out = {"corpus": args.corpus.name, **study(folder, args.rounds), "machine": started_machine,
           "command": f"research/{script} --corpus postgresql-15.20-html.tar.xz"}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
