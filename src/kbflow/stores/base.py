"""The store interface. Every write is keyed by deterministic chunk ids, so a repeat creates no duplicates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

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
            **({"path": self.extra["path"]} if "path" in self.extra else {}),  # how graph search reached it
        }


@dataclass(frozen=True)
class SearchFilter:
    """Restrict a search to some chunks. Every set field must hold (AND); an empty filter matches everything.

    ``source_glob`` is an fnmatch pattern over the stored source path ('docs/*.md': ``*`` also crosses '/');
    ``heading_prefix`` matches chunks whose heading path starts with these headings; ``doc_ids`` lists documents,
    ``chunk_ids`` chunks (graph search reads the chunks it reached).
    """

    source_glob: str | None = None
    heading_prefix: tuple[str, ...] = ()
    doc_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.source_glob or self.heading_prefix or self.doc_ids or self.chunk_ids)


class Store(Protocol):
    namespace: str
    dimension: int
    concurrent_reads: bool  # two threads may search at once (hybrid runs BM25 beside the vector search)
    defer_vector_index: bool  # writes leave the vector index to a later refresh_indexes() (an ingest's batches)

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> int:
        """Make ``doc_ids`` hold exactly ``rows``: write the rows that are new or differ from the stored ones (a row
        equal to its stored version is left in place) and delete every other chunk of ``doc_ids``. Returns the
        number of rows written."""

    def delete_documents(self, doc_ids: list[str]) -> int: ...

    def upsert(self, rows: pa.Table) -> None:
        """Insert or overwrite rows by chunk id; other rows stay."""

    def search_vector(self, vector: np.ndarray, limit: int, where: SearchFilter | None = None,
                      exact: bool = False) -> list[Hit]:
        """Nearest chunks by cosine similarity, best first; ``Hit.score`` is the similarity (1 = same direction).

        ``exact`` bypasses any approximate index (ground truth for recall measurements)."""

    def search_text(self, query_words: list[str], limit: int, where: SearchFilter | None = None) -> list[Hit]:
        """BM25 over the chunks' ``text_tokens``, best first; ``Hit.score`` is the BM25 score (0 = no term matched)."""

    def searches(self) -> Any:
        """An object with ``search_vector``, ``search_text`` and ``concurrent_reads`` whose searches all read the
        same state of the store, taken now: the two halves of one hybrid query."""

    def stats(self) -> dict:
        """rows, documents, bytes on disk and index state."""

    def refresh_indexes(self, force_vector: bool = False, skip_vector: bool = False,
                        between_batches: bool = False) -> dict:
        """Build or update the indexes the table's size calls for; returns what was done. ``skip_vector``: not the
        vector index (stores that build one on writes do so after an ingest's last batch, not during it);
        ``between_batches``: a write's own refresh, which may leave some rows for the end of the run."""

    def index_damage(self) -> str | None:
        """Why the store's search indexes cannot be used (a full-text or vector index file deleted or damaged), or
        None; stores whose indexes live inside their own files answer None."""

    def rebuild_indexes(self) -> dict:
        """Build the search indexes again from the rows (after ``index_damage``); returns what was done."""

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        """Every row sorted by chunk id (verification and tests)."""

    def document_rows(self, doc_id: str, columns: list[str]) -> pa.Table:
        """One document's rows (its chunks), in no particular order; read through a filter, not a scan of all."""

    def count(self) -> int: ...

    def chunk_ids(self) -> pa.Table:
        """chunk_id and doc_id of every row."""

    def size_bytes(self) -> int: ...

    def clear(self) -> None: ...

    def present(self) -> bool:
        """Whether the table exists, whatever its vectors' dimension (it may be another model's)."""

    def exists(self) -> bool:
        """Whether the table exists and opens for this store's dimension."""

    def unreadable(self) -> str | None:
        """Why the table cannot be read whole (a data file deleted or cut short), or None; absent is readable."""

    def restore_readable(self) -> dict | None:
        """Go back to the newest earlier version that reads whole: {'version', 'rows', 'current'}; None when the
        store keeps no earlier versions (``kbflow verify --repair`` then empties it)."""
