"""LanceDB, embedded under the data dir: one table per namespace, cosine distance on normalised vectors."""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from kbflow.schemas import store_schema
from kbflow.stores.base import Hit

IN_LIST_MAX = 500  # ids per IN (...) filter, to keep filter strings bounded


def open_table_or_none(db, name: str):
    """The table, or None when it does not exist (local connections have no table_exists)."""
    try:
        return db.open_table(name)
    except ValueError:
        return None


def sql_list(values: list[str]) -> str:
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


class LanceStore:
    def __init__(self, uri: str | Path, namespace: str, dimension: int):
        self.uri = str(uri)
        self.namespace = namespace
        self.dimension = dimension
        self.table_name = f"chunks_{namespace}"
        Path(self.uri).mkdir(parents=True, exist_ok=True)
        self._db = lancedb.connect(self.uri)
        self._table = None

    @property
    def table(self):
        if self._table is None:
            self._table = self._db.create_table(self.table_name, schema=store_schema(self.dimension), exist_ok=True)
        return self._table

    def exists(self) -> bool:
        if self._table is None:
            self._table = open_table_or_none(self._db, self.table_name)
        return self._table is not None

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> None:
        rows = rows.select(store_schema(self.dimension).names).cast(store_schema(self.dimension))
        if len(doc_ids) > IN_LIST_MAX:
            raise ValueError(f"replace_documents takes at most {IN_LIST_MAX} documents per call, got {len(doc_ids)}")
        (
            self.table.merge_insert("chunk_id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(f"doc_id IN ({sql_list(doc_ids)})")
            .execute(rows)
        )

    def delete_documents(self, doc_ids: list[str]) -> int:
        if not doc_ids or not self.exists():
            return 0
        before = self.table.count_rows()
        for start in range(0, len(doc_ids), IN_LIST_MAX):
            self.table.delete(f"doc_id IN ({sql_list(doc_ids[start:start + IN_LIST_MAX])})")
        return before - self.table.count_rows()

    def search_vector(self, vector: np.ndarray, limit: int) -> list[Hit]:
        if not self.exists():
            return []
        query = self.table.search(np.asarray(vector, dtype=np.float32)).distance_type("cosine").limit(limit)
        rows = query.select(["chunk_id", "doc_id", "source_path", "heading_path", "text", "_distance"]).to_arrow().to_pylist()
        return [
            Hit(row["chunk_id"], row["doc_id"], row["source_path"], row["heading_path"] or [], 1.0 - row["_distance"], row["text"])
            for row in rows
        ]

    def count(self) -> int:
        return self.table.count_rows() if self.exists() else 0

    def chunk_ids(self) -> pa.Table:
        if not self.exists():
            return pa.table({"chunk_id": pa.array([], pa.string()), "doc_id": pa.array([], pa.string())})
        return self.table.search().select(["chunk_id", "doc_id"]).limit(None).to_arrow()

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        """Every row (for verification and tests), sorted by chunk id."""
        if not self.exists():
            return store_schema(self.dimension).empty_table()
        table = self.table.to_arrow()
        table = table.select(columns) if columns else table
        return table.sort_by("chunk_id")

    def size_bytes(self) -> int:
        folder = Path(self.uri) / f"{self.table_name}.lance"
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0

    def clear(self) -> None:
        if self.exists():
            self._db.drop_table(self.table_name)
        self._table = None
