"""Qdrant through qdrant-client: a server or cluster (``url``), embedded local mode (``path``), or ``:memory:``.

One collection per namespace, cosine distance. Point ids are the chunk ids read as UUIDs, so a repeat upsert
overwrites instead of duplicating. Qdrant has no multi-operation transaction: a document is replaced by
upserting its new chunks first, then deleting its chunks that are no longer there, so a search in between sees
old and new chunks side by side but never an empty document.
"""

from __future__ import annotations

import atexit
import os
import uuid

import numpy as np
import pyarrow as pa

from kbflow.errors import ConfigError
from kbflow.schemas import store_schema
from kbflow.stores.base import Hit

PAYLOAD = ("chunk_id", "doc_id", "source_path", "ordinal", "heading_path", "text", "char_start", "char_end",
           "n_tokens", "embed_sha256")
UPSERT_BATCH = 256
SCROLL_PAGE = 1024

_clients: dict[str, object] = {}


@atexit.register
def _close_clients() -> None:
    """Close local-mode clients before interpreter shutdown, when their __del__ can no longer import."""
    while _clients:
        _clients.popitem()[1].close()


def _client(location: str, api_key_env: str):
    """One client per location and process: local mode allows a single client per folder."""
    from qdrant_client import QdrantClient

    if location not in _clients:
        if location == ":memory:":
            _clients[location] = QdrantClient(location=":memory:")
        elif location.startswith(("http://", "https://")):
            _clients[location] = QdrantClient(url=location, api_key=os.environ.get(api_key_env) or None)
        else:
            os.makedirs(location, exist_ok=True)
            _clients[location] = QdrantClient(path=location)
    return _clients[location]


def point_id(chunk_id: str) -> str:
    try:
        return str(uuid.UUID(hex=chunk_id))
    except ValueError:
        raise ConfigError(f"chunk id {chunk_id!r} is not 32 hex digits; Qdrant needs UUID point ids") from None


class QdrantStore:
    def __init__(self, location: str, namespace: str, dimension: int, api_key_env: str = "QDRANT_API_KEY"):
        from qdrant_client import models

        self.models = models
        self.location = location
        self.api_key_env = api_key_env  # the variable's name, never the key (see kbflow.portable)
        self.namespace = namespace
        self.dimension = dimension
        self.collection = f"kbflow_{namespace}"
        self.client = _client(location, api_key_env)

    def exists(self) -> bool:
        return self.client.collection_exists(self.collection)

    def _ensure(self) -> None:
        if self.exists():
            size = self.client.get_collection(self.collection).config.params.vectors.size
            if size != self.dimension:
                raise ConfigError(f"Qdrant collection {self.collection!r} holds {size}-d vectors, not {self.dimension}")
            return
        models = self.models
        self.client.create_collection(
            self.collection, vectors_config=models.VectorParams(size=self.dimension, distance=models.Distance.COSINE))
        if self.location.startswith(("http://", "https://")):  # local mode ignores payload indexes
            for field in ("doc_id", "source_path"):
                self.client.create_payload_index(self.collection, field, models.PayloadSchemaType.KEYWORD)

    def _doc_filter(self, doc_ids: list[str]):
        models = self.models
        return models.Filter(must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(doc_ids)))])

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> None:
        self._ensure()
        rows = rows.select(store_schema(self.dimension).names).cast(store_schema(self.dimension))
        records = rows.to_pylist()
        ids = [point_id(record["chunk_id"]) for record in records]
        for start in range(0, len(records), UPSERT_BATCH):
            points = [self.models.PointStruct(id=ids[i], vector=list(records[i]["vector"]),
                                              payload={key: records[i][key] for key in PAYLOAD})
                      for i in range(start, min(start + UPSERT_BATCH, len(records)))]
            self.client.upsert(self.collection, points=points, wait=True)
        stale = self._doc_filter(doc_ids)
        if ids:
            stale.must_not = [self.models.HasIdCondition(has_id=ids)]
        self.client.delete(self.collection, points_selector=self.models.FilterSelector(filter=stale), wait=True)

    def delete_documents(self, doc_ids: list[str]) -> int:
        if not doc_ids or not self.exists():
            return 0
        doomed = self.client.count(self.collection, count_filter=self._doc_filter(doc_ids), exact=True).count
        self.client.delete(self.collection, points_selector=self.models.FilterSelector(
            filter=self._doc_filter(doc_ids)), wait=True)
        return doomed

    def search_vector(self, vector: np.ndarray, limit: int) -> list[Hit]:
        if not self.exists():
            return []
        response = self.client.query_points(self.collection, query=np.asarray(vector, dtype=np.float32).tolist(),
                                            limit=limit, with_payload=True)
        return [Hit(p.payload["chunk_id"], p.payload["doc_id"], p.payload["source_path"],
                    p.payload.get("heading_path") or [], float(p.score), p.payload["text"]) for p in response.points]

    def count(self) -> int:
        return self.client.count(self.collection, exact=True).count if self.exists() else 0

    def _scroll(self, with_vectors: bool):
        offset = None
        while self.exists():
            records, offset = self.client.scroll(self.collection, limit=SCROLL_PAGE, offset=offset,
                                                 with_payload=True, with_vectors=with_vectors)
            yield from records
            if offset is None:
                break

    def chunk_ids(self) -> pa.Table:
        pairs = [(r.payload["chunk_id"], r.payload["doc_id"]) for r in self._scroll(False)]
        return pa.table({"chunk_id": pa.array([p[0] for p in pairs], pa.string()),
                         "doc_id": pa.array([p[1] for p in pairs], pa.string())})

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        schema = store_schema(self.dimension)
        records = [{**r.payload, "vector": r.vector} for r in self._scroll(True)]
        table = pa.Table.from_pylist(records, schema=schema).sort_by("chunk_id")
        return table.select(columns) if columns else table

    def size_bytes(self) -> int:
        if self.location.startswith(("http://", "https://")) or self.location == ":memory:":
            return 0  # not measurable from the client
        total = 0
        for folder, _dirs, files in os.walk(os.path.join(self.location, "collection", self.collection)):
            total += sum(os.path.getsize(os.path.join(folder, name)) for name in files)
        return total

    def clear(self) -> None:
        if self.exists():
            self.client.delete_collection(self.collection)
