"""A namespace's graph edges: one LanceDB table (``graph_<namespace>``) where the LanceDB tables live (the store,
or beside the vector cache when the store is Qdrant), written in the same stage as the chunks, document by document.

Keyed by the namespace, not by the store table: the edges leave from chunk ids, which a re-embed with another
model keeps, so a model switch does not rebuild the graph.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa

from kbflow.core import storage
from kbflow.core.schemas import EDGES
from kbflow.stores.lancedb_store import (IN_LIST_MAX, delete_in, open_table_or_none, select_in, sql_list,
                                         sql_str)

_create_lock = threading.Lock()
CHANGED_EDGE = "target.label != source.label OR target.extractor != source.extractor OR target.doc_id != source.doc_id"


class GraphStore:
    def __init__(self, uri: str | Path, namespace: str):
        self.uri = str(uri)
        self.namespace = namespace
        self.table_name = f"graph_{namespace}"
        self._db = storage.lance_connect(self.uri)
        self._table = None

    def exists(self) -> bool:
        if self._table is None:
            self._table = open_table_or_none(self._db, self.table_name)
        return self._table is not None

    @property
    def table(self):
        if not self.exists():
            with _create_lock:
                self._table = self._db.create_table(self.table_name, schema=EDGES, exist_ok=True)
        return self._table

    def replace_documents(self, doc_ids: list[str], edges: pa.Table) -> int:
        """Make ``doc_ids`` have exactly ``edges``; returns the edges written (an unchanged edge is left in place)."""
        if not doc_ids:
            return 0
        if len(doc_ids) > IN_LIST_MAX:
            raise ValueError(f"replace_documents takes at most {IN_LIST_MAX} documents per call, got {len(doc_ids)}")
        if not edges.num_rows:
            if self.exists():
                self.table.delete(f"doc_id IN ({sql_list(doc_ids)})")
            return 0
        result = (self.table.merge_insert("edge_id")
                  .when_matched_update_all(where=CHANGED_EDGE)
                  .when_not_matched_insert_all()
                  .when_not_matched_by_source_delete(f"doc_id IN ({sql_list(doc_ids)})")
                  .execute(edges.select(EDGES.names).cast(EDGES)))
        return result.num_inserted_rows + result.num_updated_rows

    def delete_documents(self, doc_ids: list[str]) -> None:
        if not doc_ids or not self.exists():
            return
        delete_in(self.table, "doc_id", doc_ids)

    def edges_from(self, chunk_ids: list[str], kind: str = "link") -> pa.Table:
        """The edges of ``kind`` leaving these chunks."""
        if not chunk_ids or not self.exists():
            return EDGES.empty_table()
        return select_in(self.table, "chunk_id", chunk_ids, EDGES.names, f"kind = {sql_str(kind)}")

    def terms(self, keys: list[str], doc_ids: list[str] | None = None,
              kinds: tuple[str, ...] = ("defines", "heading", "entity")) -> pa.Table:
        """The edges of ``kinds`` (a term a chunk defines, a section's title, an entity the LLM found it naming)
        whose key is one of ``keys`` (in these documents only, if given)."""
        if not keys or not self.exists() or (doc_ids is not None and not doc_ids):
            return EDGES.empty_table()
        where = f"kind IN ({sql_list(list(kinds))})"
        if doc_ids is not None:
            if len(doc_ids) > IN_LIST_MAX:
                raise ValueError(f"terms takes at most {IN_LIST_MAX} document ids, got {len(doc_ids)}")
            where += f" AND doc_id IN ({sql_list(doc_ids)})"
        return select_in(self.table, "target", keys, EDGES.names, where)

    def rows(self) -> pa.Table:
        """Every edge, sorted by edge id (tests and inspection)."""
        if not self.exists():
            return EDGES.empty_table()
        return self.table.to_arrow().select(EDGES.names).sort_by("edge_id")

    def columns(self, names: list[str]) -> pa.Table:
        """These columns of every edge (counts, ``kbflow verify``)."""
        if not self.exists():
            return EDGES.empty_table().select(names)
        return self.table.search().select(names).limit(None).to_arrow()

    def counts(self) -> dict[str, int]:
        """Edges by kind."""
        kinds = self.columns(["kind"]).column("kind").to_pylist()
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    def clear(self) -> None:
        if self.exists():
            self._db.drop_table(self.table_name)
            self._table = None
