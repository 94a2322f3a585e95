"""The embedder interface and the checks every backend's output goes through."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kbflow.errors import EmbeddingError
from kbflow.tokens import TokenCounter


class Embedder(Protocol):
    model_id: str  # name + revision + dim + normalisation + prefixes: what a vector was made with
    dimension: int
    max_tokens: int  # the model's real input limit, special tokens included

    def token_counter(self) -> TokenCounter: ...

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


def check_vectors(vectors: np.ndarray, expected_rows: int, dimension: int, model_id: str) -> np.ndarray:
    """Refuse anything but ``expected_rows`` finite, non-zero float32 vectors of ``dimension``: never pad, cut or zero-fill."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape != (expected_rows, dimension):
        raise EmbeddingError(
            f"model {model_id} returned shape {vectors.shape}, expected ({expected_rows}, {dimension}); "
            "the namespace's model and the configured model differ, or the backend is broken"
        )
    if not np.isfinite(vectors).all():
        bad = int(np.where(~np.isfinite(vectors).all(axis=1))[0][0])
        raise EmbeddingError(f"model {model_id} returned NaN or infinite values for text #{bad} of the batch")
    norms = np.linalg.norm(vectors, axis=1)
    if (norms == 0).any():
        bad = int(np.where(norms == 0)[0][0])
        raise EmbeddingError(f"model {model_id} returned a zero vector for text #{bad} of the batch; it is not stored")
    return vectors
