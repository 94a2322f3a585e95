"""Healing a namespace's unreadable state (``kbflow verify --repair``): each piece rebuilt from what is still
readable, never invented. What each costs is in docs/reliability.md.

* the store table: restored to its newest version that reads whole (a LanceDB table keeps its earlier versions);
  with none, emptied. The manifest rows it no longer backs are then dropped by verify's own checks, and the next
  ingest writes those documents again with their vectors from the vector cache;
* the vector cache: restored the same way, or emptied (it is a cache: what it lacks is embedded again);
* ``manifest.parquet``: rebuilt from the store (document, source path, chunk ids) with no source hash or stage
  fingerprints, so the next ingest re-checks every document instead of trusting it unchanged;
* ``namespace.json``: the model from the manifest, the last run, or the vector cache that holds the stored texts,
  with the dimension of the stored vectors (``kbflow.ops.verify.rewrite_meta``: it needs the embedder, a stage this
  layer does not import);
* ``last_run.json``: removed (the next ingest writes it).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from kbflow.config import KbConfig
from kbflow.core.schemas import MANIFEST
from kbflow.state.manifest import NamespaceState

REBUILT_RUN_ID = "rebuilt-by-verify"  # the run id of manifest rows rebuilt from the store


def store_table(store) -> str:
    """Restore the store's table to its newest readable version (or empty it); says what was done."""
    restored = store.restore_readable()
    if restored is None:
        store.clear()
        return "emptied: no earlier version of the table reads whole; the next ingest writes every document again"
    if restored.get("current"):
        return (f"reads whole at its newest version {restored['version']} ({restored['rows']} chunks) once the "
                "damaged files were moved aside")
    return (f"restored to version {restored['version']} ({restored['rows']} chunks); documents written after it "
            "are re-run by the next ingest")


def set_aside_store(config: KbConfig, store_namespace: str) -> str:
    """A local store that cannot be opened: its kind moves the damaged files aside (renamed, not deleted) so it opens
    again (a LanceDB table's damaged newest manifests, Qdrant local mode's damaged collections)."""
    from kbflow.stores.kinds import store_kind

    kind = store_kind(config.store.kind)
    if kind.set_aside is None:
        return f"store.kind {kind.name!r} keeps no files here to set aside"
    return kind.set_aside(config, store_namespace)


def vector_cache(cache, store=None) -> str:
    """Restore the cache's newest readable version (or empty it), then add back the vectors the store holds (the
    same model's vectors of the same texts): what the namespace holds is never embedded again."""
    restored = cache.restore_readable()
    if restored is None:
        cache.clear()
        done = "emptied"
    elif restored.get("current"):
        done = f"reads whole ({restored['rows']} vectors)"
    else:
        done = f"restored to version {restored['version']} ({restored['rows']} vectors)"
    if store is None:
        return done + "; the texts it lacks are embedded again when next needed"
    rows = store.rows(["embed_sha256", "vector"])
    keys = rows.column("embed_sha256").to_pylist()
    have = cache.lookup(keys)
    missing, seen = [], set(have)
    for index, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            missing.append(index)
    if missing:
        vectors = rows.column("vector").combine_chunks().values.to_numpy().reshape(-1, cache.dimension)
        cache.add([keys[i] for i in missing], vectors[missing])
    return f"{done}; {len(missing)} vectors added back from the store"


def set_aside(path) -> str:
    """A folder (or anything but a file) standing where a state file belongs is renamed out of the way, never
    deleted (it may hold someone's files), so the state file can be written again; says what was done ('' when
    nothing stood there)."""
    from datetime import datetime, timezone

    path = Path(path)
    if not path.is_dir():
        return ""
    aside = path.with_name(f"{path.name}.set-aside-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}")
    path.rename(aside)
    return f"the folder in its place moved to {aside.name}; "


def drop_last_run(state: NamespaceState) -> str:
    moved = set_aside(state.last_run_path)
    state.last_run_path.unlink(missing_ok=True)
    return f"{moved}removed; the next ingest records its run"


def rebuild_manifest(state: NamespaceState, store, model_id: str, origin_of) -> pa.Table:
    """A manifest row per stored document, without the source hash and fingerprints it was planned with: every
    document is then 'changed' to the next ingest (converted and chunked again; its vectors come from the cache),
    and a document whose source is gone is still removed. ``origin_of``: a source path's origin
    (``kbflow.sources.origin_of``)."""
    ids = store.chunk_ids()
    chunks_of: dict[str, list[str]] = {}
    for chunk_id, doc_id in zip(ids.column("chunk_id").to_pylist(), ids.column("doc_id").to_pylist()):
        chunks_of.setdefault(doc_id, []).append(chunk_id)
    paths = _source_paths(store, list(chunks_of))
    rows = [{"doc_id": doc_id, "source_path": paths.get(doc_id, ""),
             "origin": origin_of(paths.get(doc_id, "")), "source_sha256": "",
             "converter": "", "chunker": "", "model_id": model_id, "chunk_ids": sorted(chunk_ids),
             "run_id": REBUILT_RUN_ID, "graph": ""} for doc_id, chunk_ids in chunks_of.items()]
    manifest = pa.Table.from_pylist(rows, schema=MANIFEST)
    state.write_manifest(manifest)
    return manifest


def _source_paths(store, doc_ids: list[str]) -> dict[str, str]:
    if not doc_ids:
        return {}
    rows = store.rows(["doc_id", "source_path"])
    return dict(zip(rows.column("doc_id").to_pylist(), rows.column("source_path").to_pylist()))
