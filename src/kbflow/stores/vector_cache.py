"""The vector cache: one LanceDB table per model, rows (embed_sha256, model_id, vector).

A chunk whose embedded text was seen before, in any document, run or namespace, is never embedded again.
Lookups are bulk (``IN`` filters of a few hundred keys), never one query per chunk.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from kbflow.core.schemas import vectors_schema
from kbflow.core import storage
from kbflow.core.errors import StateDamaged
from kbflow.state.layout import set_aside
from kbflow.stores.lancedb_store import (check_folders, delete_in, open_table_or_none, opening_damage,
                                         restore_readable, select_in, set_aside_damage, unreadable_reason)

_create_lock = threading.Lock()


class VectorCache:
    def __init__(self, uri: str | Path, model_id: str, dimension: int):
        self.model_id = model_id
        self.dimension = dimension
        self.schema = vectors_schema(dimension)
        self.table_name = "vectors_" + hashlib.sha256(model_id.encode()).hexdigest()[:16]
        self._db = storage.lance_connect(uri)
        self._table = None

    @property
    def table(self):
        if self._table is None:
            self.ensure_table()
        return self._table

    def ensure_table(self) -> None:
        """Create the table if it does not exist yet. Called once before an ingest's stages run: creating it lazily
        from several embed calls at once raced (one call's create is an Overwrite, which another's Append cannot
        commit against). Another process creating it at the same moment is caught: the table then exists."""
        with _create_lock:
            if self._table is not None:
                return
            with self._opening():
                try:
                    self._table = self._db.create_table(self.table_name, schema=self.schema, exist_ok=True)
                except Exception:  # created by another process in between: open what it made
                    self._table = open_table_or_none(self._db, self.table_name)
                    if self._table is None:
                        raise

    @contextmanager
    def _opening(self):
        """A cache table that cannot be opened (a damaged newest version, a file where one of its folders belongs)
        is StateDamaged naming the repair, not LanceDB's traceback."""
        try:
            check_folders(self.uri, self.table_name)
            yield
        except Exception as exc:
            reason = opening_damage(exc)
            if reason is None:
                raise
            raise StateDamaged(f"the vector cache of {self.model_id} (table {self.table_name}) cannot be opened "
                               f"({reason}); run `kbflow verify --repair` on a namespace of this model: it restores "
                               "the cache's newest readable version and adds back the vectors the store holds "
                               "(nothing stored is lost)") from exc

    @property
    def uri(self) -> str:
        """The LanceDB database the cache lives in (a copy of the cache in another process connects to it)."""
        return self._db.uri

    def exists(self) -> bool:
        """Whether the cache table exists (opened on first ask; nothing is created)."""
        if self._table is None:
            with self._opening():
                self._table = open_table_or_none(self._db, self.table_name)
        return self._table is not None

    def lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Vectors for the keys that are cached; absent keys are simply missing from the result."""
        found: dict[str, np.ndarray] = {}
        unique = sorted(set(keys))
        if not unique or not self.exists():
            return found
        rows = select_in(self.table, "embed_sha256", unique, ["embed_sha256", "vector"])
        if rows.num_rows:
            vectors = rows.column("vector").combine_chunks().values.to_numpy().reshape(-1, self.dimension)
            for key, vector in zip(rows.column("embed_sha256").to_pylist(), vectors):
                found.setdefault(key, vector)
        return found

    def add(self, keys: list[str], vectors: np.ndarray) -> None:
        if not keys:
            return
        flat = pa.array(np.asarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
        table = pa.Table.from_arrays(
            [
                pa.array(keys, pa.string()),
                pa.array([self.model_id] * len(keys), pa.string()),
                pa.FixedSizeListArray.from_arrays(flat, self.dimension),
            ],
            schema=self.schema,
        )
        self.table.add(table)

    def delete(self, keys: list[str]) -> None:
        """Forget these texts' vectors (``kbflow verify --repair`` on a vector that disagrees with the store)."""
        if not keys or not self.exists():
            return
        delete_in(self.table, "embed_sha256", keys)

    def count(self) -> int:
        return self.table.count_rows() if self.exists() else 0

    def unreadable(self) -> str | None:
        """Why the cache cannot be opened or read whole (a data file deleted or cut short), or None."""
        try:
            return unreadable_reason(self.table, self.schema.names) if self.exists() else None
        except StateDamaged as exc:
            return str(exc)

    def restore_readable(self) -> dict | None:
        """Its newest version that reads whole made current ({version, rows}); None when none does. What keeps the
        table from opening is moved aside first (never deleted)."""
        self._table = None
        set_aside_damage(self.uri, self.table_name)
        return restore_readable(self.table, self.schema.names) if self.exists() else None

    def clear(self) -> None:
        """Drop every cached vector (an unreadable cache that no earlier version mends): it fills again as texts are
        embedded."""
        with _create_lock:
            try:
                present = self.exists()
            except StateDamaged:  # no version of it opens: the whole table is moved aside, never deleted
                table = storage.location(self.uri) / f"{self.table_name}.lance"
                set_aside(table)
                present = False
            if present:
                self._db.drop_table(self.table_name)
            self._table = None
        self.ensure_table()
