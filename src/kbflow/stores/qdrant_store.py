"""Qdrant through qdrant-client: a server or cluster (``url``), embedded local mode (``path``), or ``:memory:``.

One collection per namespace, cosine distance. Point ids are the chunk ids read as UUIDs, so a repeat upsert
overwrites instead of duplicating. Qdrant has no multi-operation transaction: a document is replaced by
upserting its new chunks first, then deleting its chunks that are no longer there, so a search in between sees
old and new chunks side by side but never an empty document.

BM25 is Qdrant's own: each chunk carries a sparse vector ``bm25`` whose indices are its words (hashed to 32
bits) and whose values are BM25's term-frequency part, tf·(k1+1) / (tf + k1·(1 − b + b·len/avg_len)); the
collection's ``Modifier.IDF`` multiplies in each word's inverse document frequency at query time, computed by
Qdrant over the live collection. ``avg_len`` is a fixed setting (Qdrant cannot know the mean length at write
time; its own fastembed BM25 does the same), so scores differ slightly from LanceDB's, rankings barely.

Filters: ``doc_id`` and ``source_path`` are keyword payloads; a heading prefix matches a keyword list
``heading_prefixes`` (every prefix of the heading path, joined by U+001F); a source glob is resolved against the
distinct stored source paths and sent as a ``MatchAny``. Local mode searches exactly (no HNSW).
"""

from __future__ import annotations

import atexit
import fnmatch
import errno
import hashlib
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kbflow.config import KbConfig
from kbflow.core.errors import ConfigError
from kbflow.core.extras import require
from kbflow.core.storage import is_remote, location
from kbflow.core.schemas import store_schema
from kbflow.state.files import store_unreadable
from kbflow.stores.base import Hit, SearchFilter
from kbflow.stores.errors import first_denied, refuse_denied
from kbflow.stores.kinds import StoreKind

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

PAYLOAD = ("chunk_id", "doc_id", "source_path", "ordinal", "heading_path", "text", "text_tokens", "char_start", "char_end",
           "n_tokens", "embed_sha256")
UPSERT_BATCH = 256
SCROLL_PAGE = 1024
SPARSE = "bm25"
HEADING_SEP = "\x1f"

_clients: dict[str, QdrantClient] = {}


@atexit.register
def _close_clients() -> None:
    """Close local-mode clients before interpreter shutdown, when their __del__ can no longer import."""
    while _clients:
        _clients.popitem()[1].close()


def _client(location: str, api_key_env: str):
    """One client per location and process: local mode allows a single client per folder."""
    QdrantClient = require("qdrant_client", "store.kind 'qdrant'").QdrantClient

    if location not in _clients:
        if location == ":memory:":
            _clients[location] = QdrantClient(location=":memory:")
        elif location.startswith(("http://", "https://")):
            _clients[location] = QdrantClient(url=location, api_key=os.environ.get(api_key_env) or None)
        else:
            try:
                os.makedirs(location, exist_ok=True)
                _clients[location] = QdrantClient(path=location)
            except Exception as exc:  # local mode opens every collection's SQLite file at once
                refuse_denied(exc)
                refuse_denied(first_denied(location))  # SQLite says only "unable to open database file"
                raise LocalStoreDamaged(f"Qdrant local store {location!r}: {str(exc).strip()[:200]}") from exc
    return _clients[location]


class LocalStoreDamaged(Exception):
    """Qdrant's local mode could not open its folder (a collection's SQLite file cut short or overwritten)."""


def set_aside_damaged(location: str) -> list[str]:
    """Move each collection of a local-mode folder whose SQLite file fails its check aside (renamed, never deleted),
    so the folder opens again; returns the collections moved. A collection moved aside is recreated empty by the
    next write, and its documents come back from the vector cache."""
    import json
    import sqlite3
    import time

    def aside(path: Path) -> None:
        path.rename(path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"))
        moved.append(path.name)

    moved: list[str] = []
    root = Path(location)
    lock = root / ".lock"
    if lock.exists() and not lock.is_file():  # local mode's lock file, as a folder: it cannot open
        aside(lock)
    meta, collections = root / "meta.json", root / "collection"
    try:  # the collections' settings: without them local mode knows no collection, so theirs go aside too
        settings = json.loads(meta.read_text(encoding="utf-8")) if meta.exists() else {"collections": {}}
        readable = isinstance(settings, dict) and isinstance(settings.get("collections"), dict)
    except PermissionError:  # not damage: the error names the path and the fix
        raise
    except (OSError, ValueError):
        readable = False
    if not readable:
        aside(meta)
        if collections.exists():
            aside(collections)
    if collections.exists() and not collections.is_dir():
        aside(collections)
    for folder in sorted(collections.glob("*")) if collections.is_dir() else []:
        if ".damaged-" in folder.name:
            continue
        database = folder / "storage.sqlite"
        if not folder.is_dir() or (database.exists() and not database.is_file()):
            aside(folder)
            continue
        if not database.exists():
            continue
        if not os.access(database, os.R_OK) or not os.access(folder, os.R_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", str(database))
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
                healthy = connection.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        except sqlite3.DatabaseError:
            healthy = False
        if not healthy:
            aside(folder)
    return moved


def word_index(word: str) -> int:
    """A word's sparse-vector index: the first 4 bytes of its blake2b hash (collisions ~1 in 4 billion per pair)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "little")


def bm25_document_vector(words: list[str], k1: float, b: float, avg_len: float) -> tuple[list[int], list[float]]:
    counts = Counter(words)
    norm = k1 * (1 - b + b * len(words) / avg_len)
    merged: dict[int, float] = {}
    for word, tf in counts.items():
        index = word_index(word)
        merged[index] = merged.get(index, 0.0) + tf * (k1 + 1) / (tf + norm)
    return list(merged), list(merged.values())


def heading_prefixes(heading_path: list[str]) -> list[str]:
    return [HEADING_SEP.join(heading_path[:n]) for n in range(1, len(heading_path) + 1)]


def point_id(chunk_id: str) -> str:
    try:
        return str(uuid.UUID(hex=chunk_id))
    except ValueError:
        raise ConfigError(f"chunk id {chunk_id!r} is not 32 hex digits; Qdrant needs UUID point ids") from None


class QdrantStore:
    def __init__(self, location: str, namespace: str, dimension: int, api_key_env: str = "QDRANT_API_KEY",
                 bm25_k1: float = 1.2, bm25_b: float = 0.75, bm25_avg_len: float = 120.0):
        self.models = require("qdrant_client.models", "store.kind 'qdrant'")
        self.bm25 = (bm25_k1, bm25_b, bm25_avg_len)
        self._source_paths: list[str] | None = None  # distinct source paths, for glob filters; reset by writes
        self.location = location
        self.api_key_env = api_key_env  # the variable's name, never the key (see kbflow.engine.portable)
        self.namespace = namespace
        self.dimension = dimension
        self.collection = f"kbflow_{namespace}"
        try:
            self.client = _client(location, api_key_env)
        except LocalStoreDamaged as exc:
            raise store_unreadable(namespace, str(exc)) from exc
        # a server answers overlapping requests; local mode is a plain Python object, read from one thread at a time
        self.concurrent_reads = location.startswith(("http://", "https://"))
        self.defer_vector_index = False  # nothing to defer: a server maintains its indexes itself

    @property
    def settings(self) -> dict:
        """What the config made this store with beyond where it is: a copy in another process is made with the same
        (kbflow.engine.portable); the API key travels as its variable's name only."""
        k1, b, avg_len = self.bm25
        return {"api_key_env": self.api_key_env, "bm25_k1": k1, "bm25_b": b, "bm25_avg_len": avg_len}

    def exists(self) -> bool:
        return self.client.collection_exists(self.collection)

    def searches(self) -> "QdrantStore":
        """Searches for the halves of one hybrid query: a Qdrant collection answers at its current state."""
        return self

    def present(self) -> bool:
        return self.exists()  # a collection's existence does not depend on its vectors' size

    def unreadable(self) -> str | None:
        """Why the collection cannot be read whole, or None (absent is readable)."""
        try:
            sum(1 for _ in self._scroll(False, ["chunk_id", "doc_id"]))
        except Exception as exc:  # the client's own error, whatever the mode
            refuse_denied(exc)
            return f"Qdrant collection {self.collection!r} cannot be read: {str(exc).strip()[:300]}"
        return None

    def index_damage(self) -> str | None:
        """None: a collection's indexes live in its own storage, read (and healed) with it."""
        return None

    def rebuild_indexes(self) -> dict:
        return {}

    def restore_readable(self) -> dict | None:
        """Qdrant keeps no earlier versions of a collection here: nothing to restore (verify then empties it)."""
        return None

    def _ensure(self) -> None:
        if self.exists():
            params = self.client.get_collection(self.collection).config.params
            size = params.vectors.size if hasattr(params.vectors, "size") else params.vectors[""].size
            if size != self.dimension:
                raise ConfigError(f"Qdrant collection {self.collection!r} holds {size}-d vectors, not {self.dimension}")
            if SPARSE not in (params.sparse_vectors or {}):
                raise ConfigError(f"Qdrant collection {self.collection!r} has no '{SPARSE}' sparse vectors (written by "
                                  f"an older kbflow); run `kbflow clear --namespace {self.namespace} --yes` and ingest again")
            return
        models = self.models
        self.client.create_collection(
            self.collection, vectors_config=models.VectorParams(size=self.dimension, distance=models.Distance.COSINE),
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)})
        if self.location.startswith(("http://", "https://")):  # local mode ignores payload indexes
            for field in ("doc_id", "source_path", "heading_prefixes"):
                self.client.create_payload_index(self.collection, field, models.PayloadSchemaType.KEYWORD)

    def _doc_filter(self, doc_ids: list[str]):
        models = self.models
        return models.Filter(must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(doc_ids)))])

    def _point(self, point: str, record: dict):
        models = self.models
        indices, values = bm25_document_vector((record["text_tokens"] or "").split(), *self.bm25)
        payload = {key: record[key] for key in PAYLOAD}
        payload["heading_prefixes"] = heading_prefixes(record["heading_path"] or [])
        return models.PointStruct(id=point, payload=payload, vector={
            "": list(record["vector"]), SPARSE: models.SparseVector(indices=indices, values=values)})

    def upsert(self, rows: pa.Table, skip_unchanged: bool = False) -> tuple[list[str], int]:
        """Insert or overwrite rows by chunk id; returns their point ids and how many points were written.
        ``skip_unchanged``: a point whose stored payload equals its row is left as it is (its vector follows from
        ``embed_sha256``: a collection holds one model), so a changed document writes only its changed chunks."""
        self._ensure()
        self._source_paths = None
        records = rows.select(store_schema(self.dimension).names).cast(store_schema(self.dimension)).to_pylist()
        ids = [point_id(record["chunk_id"]) for record in records]
        written = 0
        for start in range(0, len(records), UPSERT_BATCH):
            batch = range(start, min(start + UPSERT_BATCH, len(records)))
            stored = {}
            if skip_unchanged:
                stored = {str(point.id): point.payload for point in self.client.retrieve(
                    self.collection, [ids[i] for i in batch], with_payload=list(PAYLOAD), with_vectors=False)}
            points = [self._point(ids[i], records[i]) for i in batch
                      if stored.get(ids[i]) != {key: records[i][key] for key in PAYLOAD}]
            if points:
                self.client.upsert(self.collection, points=points, wait=True)
            written += len(points)
        return ids, written

    def refresh_indexes(self, force_vector: bool = False, skip_vector: bool = False,
                        between_batches: bool = False) -> dict:
        """Nothing to do: a Qdrant server maintains its HNSW and sparse indexes itself; local mode has none."""
        return {}

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> int:
        ids, written = self.upsert(rows, skip_unchanged=True)
        stale = self._doc_filter(doc_ids)
        if ids:
            stale.must_not = [self.models.HasIdCondition(has_id=ids)]
        self.client.delete(self.collection, points_selector=self.models.FilterSelector(filter=stale), wait=True)
        return written

    def delete_documents(self, doc_ids: list[str]) -> int:
        if not doc_ids or not self.exists():
            return 0
        self._source_paths = None
        doomed = self.client.count(self.collection, count_filter=self._doc_filter(doc_ids), exact=True).count
        self.client.delete(self.collection, points_selector=self.models.FilterSelector(
            filter=self._doc_filter(doc_ids)), wait=True)
        return doomed

    def _filter(self, where: SearchFilter | None):
        """The Qdrant filter, or False when the filter can match nothing (a glob matching no source path)."""
        if not where:
            return None
        models = self.models
        must = []
        if where.source_glob:
            if self._source_paths is None:
                self._source_paths = sorted({r.payload["source_path"] for r in self._scroll(False, ["source_path"])})
            matched = [path for path in self._source_paths if fnmatch.fnmatchcase(path, where.source_glob)]
            if not matched:
                return False
            must.append(models.FieldCondition(key="source_path", match=models.MatchAny(any=matched)))
        if where.heading_prefix:
            must.append(models.FieldCondition(key="heading_prefixes", match=models.MatchValue(
                value=HEADING_SEP.join(where.heading_prefix))))
        if where.doc_ids:
            must.append(models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(where.doc_ids))))
        if where.chunk_ids:
            must.append(models.HasIdCondition(has_id=[point_id(chunk_id) for chunk_id in where.chunk_ids]))
        return models.Filter(must=must)

    def _query(self, query, using: str | None, limit: int, where: SearchFilter | None, params=None) -> list[Hit]:
        if not self.exists():
            return []
        query_filter = self._filter(where)
        if query_filter is False:
            return []
        response = self.client.query_points(self.collection, query=query, using=using, limit=limit,
                                            query_filter=query_filter, with_payload=list(PAYLOAD[:6]), search_params=params)
        return [Hit(p.payload["chunk_id"], p.payload["doc_id"], p.payload["source_path"],
                    p.payload.get("heading_path") or [], float(p.score), p.payload["text"]) for p in response.points]

    def search_vector(self, vector: np.ndarray, limit: int, where: SearchFilter | None = None,
                      exact: bool = False) -> list[Hit]:
        server = self.location.startswith(("http://", "https://"))  # local mode is always exact
        params = self.models.SearchParams(exact=True) if exact and server else None
        return self._query(np.asarray(vector, dtype=np.float32).tolist(), None, limit, where, params)

    def search_text(self, query_words: list[str], limit: int, where: SearchFilter | None = None) -> list[Hit]:
        indices = sorted({word_index(word) for word in query_words})
        if not indices:
            return []
        query = self.models.SparseVector(indices=indices, values=[1.0] * len(indices))
        return self._query(query, SPARSE, limit, where)

    def count(self) -> int:
        return self.client.count(self.collection, exact=True).count if self.exists() else 0

    def stats(self) -> dict:
        docs = {r.payload["doc_id"] for r in self._scroll(False, ["doc_id"])}
        kind = "exact (local mode)" if not self.location.startswith(("http://", "https://")) else "HNSW (server)"
        return {"rows": self.count(), "documents": len(docs), "bytes": self.size_bytes(),
                "indexes": {"vector": {"type": kind}, SPARSE: {"type": "sparse, IDF modifier"}} if self.exists() else {}}

    def _scroll(self, with_vectors, payload=True, where=None):
        offset = None
        while self.exists():
            records, offset = self.client.scroll(self.collection, limit=SCROLL_PAGE, offset=offset,
                                                 with_payload=payload, with_vectors=with_vectors,
                                                 scroll_filter=where)
            yield from records
            if offset is None:
                break

    def chunk_ids(self) -> pa.Table:
        pairs = [(r.payload["chunk_id"], r.payload["doc_id"]) for r in self._scroll(False)]
        return pa.table({"chunk_id": pa.array([p[0] for p in pairs], pa.string()),
                         "doc_id": pa.array([p[1] for p in pairs], pa.string())})

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        schema = store_schema(self.dimension)
        # asked for the default vector alone, local mode answers with the list itself, not {"": list}
        records = [{**{key: r.payload[key] for key in PAYLOAD},
                    "vector": r.vector[""] if isinstance(r.vector, dict) else r.vector} for r in self._scroll([""])]
        table = pa.Table.from_pylist(records, schema=schema).sort_by("chunk_id")
        return table.select(columns) if columns else table

    def document_rows(self, doc_id: str, columns: list[str]) -> pa.Table:
        schema = store_schema(self.dimension)
        records = [{key: r.payload[key] for key in columns}
                   for r in self._scroll(False, payload=list(columns), where=self._doc_filter([doc_id]))]
        return pa.Table.from_pylist(records, schema=pa.schema([schema.field(key) for key in columns]))

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


def _open(config: KbConfig, namespace: str, dimension: int, for_search: bool) -> QdrantStore:
    where = config.store.qdrant_location
    if not where:
        if is_remote(location(config.data_dir)):
            raise ConfigError(
                f"store.kind qdrant without store.qdrant_location runs Qdrant's local mode in <data_dir>/qdrant, "
                f"and data_dir {config.data_dir} is object storage, which local mode cannot use: set "
                "store.qdrant_location to a Qdrant server (http://host:6333), or use store.kind lancedb")
        where = str(Path(config.data_dir) / "qdrant")
    return QdrantStore(where, namespace, dimension, config.store.qdrant_api_key_env,
                       config.search.bm25_k1, config.search.bm25_b, config.search.bm25_avg_len)


def _set_aside(config: KbConfig, namespace: str) -> str:
    where = config.store.qdrant_location or str(Path(config.data_dir) / "qdrant")
    moved = set_aside_damaged(where)
    return (f"damaged collections moved aside in {where!r}: {', '.join(moved)}" if moved
            else f"no damaged collection found in {where!r}")


def _arrive(location: str, namespace: str, dimension: int, settings: dict) -> QdrantStore:
    return QdrantStore(location, namespace, dimension, **settings)


def _travel(store: QdrantStore) -> tuple:
    """A server's store travels as its location and settings (its API key as the variable's name only); local mode
    is owned by one process and cannot."""
    if not store.location.startswith(("http://", "https://")):
        raise ConfigError(
            f"store.qdrant_location {store.location!r} is Qdrant local mode, which one process owns; "
            "with runner.kind 'processes' or 'dask' use a Qdrant server URL (or LanceDB)"
        )
    return _arrive, (store.location, store.namespace, store.dimension, store.settings)


KIND = StoreKind("qdrant", _open, required_modules=("qdrant_client",), set_aside=_set_aside,
                 travels=(QdrantStore, _travel))
