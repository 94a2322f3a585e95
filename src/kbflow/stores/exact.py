"""An in-memory copy of a small LanceDB table's vectors and hit columns, searched exactly with one matrix product.

Why: through the LanceDB Python client a vector search of a small table costs several milliseconds whatever its
size (its async bridge, the table's schema fetched on each query: 5-9 ms for the 72-row sample), which is a fifth
of a warm hybrid search; the same exact search over a numpy copy of a few thousand rows costs well under one
(docs/benchmarks.md, Where a warm search spends its time).

When it answers: only where LanceDB would itself compare the query with every row, so the hits are the same:
a search with no filter, of a table with no vector index, holding at most ``search.exact_in_memory_rows`` rows.
Scores are cosine similarity computed in float32, as LanceDB's; equal scores keep the table's row order.

How it stays correct: a copy belongs to one version of the table, named by the version number and the identity
of that version's manifest file (so a table dropped and written again, whose numbers start over, is not taken
for the old one). The store brings its table to the newest version before every search
(``LanceStore._search_table``), and a copy of another version is read again, once, by the search that meets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kbflow.stores.mirror import manifest_names

VersionKey = tuple[int, int, int, int]  # (version, manifest inode, manifest mtime ns, manifest size)


def version_key(table_dir: Path, version: int) -> VersionKey | None:
    """The identity of a local Lance table's version: its number and its manifest file's inode, mtime and size."""
    for name in manifest_names(version):
        try:
            found = (table_dir / "_versions" / name).stat()
        except OSError:
            continue
        return version, found.st_ino, found.st_mtime_ns, found.st_size
    return None


@dataclass(frozen=True)
class ExactCopy:
    key: VersionKey
    vectors: np.ndarray | None  # (rows, dimension) float32, each row of unit length; None: too big, or indexed
    rows: pa.Table | None  # the hit columns, in the same order

    @classmethod
    def of(cls, key: VersionKey, rows: pa.Table, dimension: int) -> ExactCopy:
        """A copy of ``rows`` (the hit columns and ``vector``)."""
        flat = rows.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        vectors = np.asarray(flat, dtype=np.float32).reshape(-1, dimension)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit = (vectors / np.where(norms > 0, norms, 1)).astype(np.float32)  # stored vectors are never zero
        return cls(key, unit, rows.drop_columns(["vector"]))

    @classmethod
    def not_served(cls, key: VersionKey) -> ExactCopy:
        """The answer for a version the copy does not serve (LanceDB searches it), remembered like a copy."""
        return cls(key, None, None)

    def search(self, vector: np.ndarray, limit: int) -> tuple[list[dict], list[float]]:
        """The ``limit`` rows most similar to ``vector``, best first, and their cosine similarities."""
        if self.vectors is None or self.rows is None:
            raise RuntimeError("this version of the table is not served from memory")
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        query = query / (np.linalg.norm(query) or 1.0)
        scores = self.vectors @ query
        count = min(limit, len(scores))
        if count <= 0:
            return [], []
        top = np.argpartition(-scores, count - 1)[:count] if count < len(scores) else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]  # best first; equal scores in row order
        return self.rows.take(pa.array(top)).to_pylist(), scores[top].tolist()
