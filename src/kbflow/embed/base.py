"""The embedder interface and the checks every backend's output goes through.

Two paths, because asymmetric models (e5, DashScope v3/v4) embed a search query differently from a stored
passage: ``embed_documents`` (alias ``embed_passages``) for what goes into the store, ``embed_query`` /
``embed_queries`` for what a user searches with. A backend's query and passage prefixes are part of its
``model_id``, so vectors made with other prefixes never meet in one namespace or cache table.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol

import numpy as np

from kbflow.runtime import cores
from kbflow.core.errors import EmbeddingError
from kbflow.chunk.tokens import TokenCounter

QUERY_PASS_TEXTS = 8  # up to this many queries in one pass run on one thread (an agentic ask's searches)


class Embedder(Protocol):
    model_id: str  # backend + name + revision + dim + normalisation + prefixes: what a vector was made with
    dimension: int
    max_tokens: int  # the model's real input limit, special tokens and passage prefix included
    max_batch: int  # most texts per model call / provider request (DashScope v3/v4: 10)
    recipe: tuple | None  # (function, args) that build it again in another process (BaseEmbedder's pickling)

    def token_counter(self) -> TokenCounter: ...

    def check_access(self) -> None:
        """Raise a ``KbflowError`` naming the fix if the backend cannot be used (a refused key, a wrong model)."""

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dimension) float32 rows, L2-normalised, with the passage prefix applied."""

    def embed_passages(self, texts: list[str]) -> np.ndarray: ...

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dimension) float32 rows, L2-normalised, with the query prefix applied."""

    def embed_query(self, text: str) -> np.ndarray:
        """One query as a (dimension,) float32 vector."""


def format_prefixes(query_prefix: str, passage_prefix: str) -> str:
    """The ``prefix=`` part of a model id; ``none`` when both are empty (keeps older ids unchanged)."""
    if not query_prefix and not passage_prefix:
        return "none"
    return f"query:{query_prefix!r},passage:{passage_prefix!r}"


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


def normalise(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows that ``check_vectors`` already found finite and non-zero."""
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


class BaseEmbedder:
    """Shared behaviour: length checks before the model sees a text, output checks after, both paths.

    A subclass sets ``model_id``, ``dimension``, ``max_tokens``, ``max_batch`` and implements
    ``token_counter()`` and ``_encode(texts, is_query)`` (texts without prefixes; the subclass applies them)."""

    model_id: str
    dimension: int
    max_tokens: int
    max_batch: int = 512
    # how this embedder is built again in another process: (function, args), set by ``kbflow.embed.factory`` to
    # its config section. A model cannot be pickled (native handles, seconds of weights); its settings can, and a
    # worker builds the model once and shares it between tasks.
    recipe: tuple | None = None

    def __reduce_ex__(self, protocol):
        return self.recipe if self.recipe is not None else super().__reduce_ex__(protocol)

    def token_counter(self) -> TokenCounter:  # pragma: no cover - every backend overrides it
        raise NotImplementedError

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def check_access(self) -> None:
        """Prove the backend can be used before a run does other work (a remote service checks the key); a local
        model has nothing to check."""

    def query_extra_tokens(self) -> int:
        """Tokens the query prefix adds beyond the passage prefix (the counter's ``special_tokens`` holds the latter)."""
        return 0

    def _embed(self, texts: list[str], is_query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        self.check_lengths(texts, is_query)
        vectors = check_vectors(self._encode(list(texts), is_query), len(texts), self.dimension, self.model_id)
        return normalise(vectors)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, is_query=False)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, is_query=False)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, is_query=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed([text], is_query=True)[0]

    def check_lengths(self, texts: list[str], is_query: bool = False) -> None:
        """The model would silently truncate (or window) a longer text; refuse instead (the chunker never makes one).

        Counts are for the passage prefix; a query prefix of a different length is allowed for."""
        counter = self.token_counter()
        extra = self.query_extra_tokens() if is_query else 0
        for index, n in enumerate(counter.count(texts)):
            if n + counter.special_tokens + extra > self.max_tokens:
                raise EmbeddingError(
                    f"text #{index} of the batch has {n + counter.special_tokens} tokens, over {self.model_id}'s limit "
                    f"of {self.max_tokens}; it would be truncated. Lower chunking.chunk_tokens (starts {texts[index][:60]!r})"
                )


@contextmanager
def torch_threads(at_most: int) -> Iterator[None]:
    """Run the torch work inside on at most ``at_most`` threads (at least one), for the calling thread only, and
    restore its setting after. torch with OpenMP keeps this setting per calling thread, so another thread's passes
    keep all of theirs; only a thread whose first torch call falls inside this block starts on fewer too
    (tests/unit/test_e5.py).

    Used for query-sized passes (one thread: splitting a ~10-token pass over threads gains little when the cores
    are idle and costs several times its length when they are not, since each pass then waits for its other thread
    to be scheduled; `kbflow bench search --sample --clients` measures a served search), and for an ingest's passes
    beside the run's own work (``passage_threads``)."""
    import torch

    previous = torch.get_num_threads()
    wanted = max(1, min(at_most, previous))
    if wanted == previous:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def passage_threads() -> int:
    """Threads for a forward pass of passages starting now: the calling thread's, less the cores the process's own
    other work holds (``kbflow.runtime.cores``), and at least one."""
    import torch

    return max(1, torch.get_num_threads() - cores.taken())
