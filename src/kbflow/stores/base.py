"""The store interface. Every write is keyed by deterministic chunk ids, so a repeat creates no duplicates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa


@dataclass
class Hit:
    chunk_id: str
    doc_id: str
    source_path: str
    heading_path: list[str]
    score: float
    text: str
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "source_path": self.source_path,
            "heading_path": self.heading_path,
            "score": round(float(self.score), 6),
            "text": self.text,
        }


class Store(Protocol):
    namespace: str
    dimension: int

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> None:
        """In one operation: upsert ``rows`` and delete every other chunk of ``doc_ids``."""

    def delete_documents(self, doc_ids: list[str]) -> int: ...

    def search_vector(self, vector: np.ndarray, limit: int) -> list[Hit]:
        """Nearest chunks by cosine similarity, best first; ``Hit.score`` is the similarity (1 = same direction)."""

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        """Every row sorted by chunk id (verification and tests)."""

    def count(self) -> int: ...

    def chunk_ids(self) -> pa.Table:
        """chunk_id and doc_id of every row."""

    def size_bytes(self) -> int: ...

    def clear(self) -> None: ...
