"""A namespace's state under ``<data_dir>/state/<namespace>/``: its model, its manifest, its last run.

The manifest lists what the store holds per document. It is written after the store write succeeded, so a crash
between the two leaves a manifest that is behind the store, never ahead: the next run redoes that document,
idempotently.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from kbflow.core.errors import ModelMismatchError
from kbflow.config.embedders import backend_of_model, recorded_settings
from kbflow.core.schemas import MANIFEST
from kbflow.state.files import damaged, LOCK_NAME, META_KEYS, read_json, read_parquet
from kbflow.state.snapshots import write_table
from kbflow.core.storage import location, remove_tree, write_bytes_atomic


MANIFEST_REQUIRED = ("doc_id", "source_path", "chunk_ids")  # without these a manifest row means nothing


def _write_json(path, payload: dict) -> None:
    write_bytes_atomic(path, json.dumps(payload, indent=2, sort_keys=True).encode("utf-8"))


class NamespaceState:
    def __init__(self, data_dir: str | Path, namespace: str):
        self.namespace = namespace
        self.root = location(data_dir) / "state" / namespace
        self.manifest_path = self.root / "manifest.parquet"
        self.meta_path = self.root / "namespace.json"
        self.last_run_path = self.root / "last_run.json"
        self.plans_dir = self.root / "chunk-plans"  # kbflow.chunk.plans: each document's chunk plans

    # -- model ----------------------------------------------------------------
    def meta(self) -> dict | None:
        """The namespace's model record; None before its first ingest; StateDamaged when unreadable or of the wrong
        shape (every reader relies on a model id that is text and a dimension that is a whole number)."""
        if self.root.exists() and not self.root.is_dir():
            raise damaged(self.root, self.namespace, "a file stands where the namespace's state folder belongs")
        meta = read_json(self.meta_path, self.namespace, META_KEYS)
        if meta is None:
            if self.manifest_path.exists() or self.last_run_path.exists():  # written only after namespace.json
                raise damaged(self.meta_path, self.namespace, "it is missing, while the namespace's manifest or "
                                                              "last run remain")
            return None
        wrong = [f"{key} is {value!r}" for key, value, ok in (
            ("model_id", meta["model_id"], isinstance(meta["model_id"], str) and bool(meta["model_id"])),
            ("dimension", meta["dimension"], isinstance(meta["dimension"], int) and not isinstance(meta["dimension"],
                                                                                               bool)
             and meta["dimension"] > 0),
            ("store_namespace", meta.get("store_namespace"), isinstance(meta.get("store_namespace", ""), str)),
            ("superseded", meta.get("superseded"), isinstance(meta.get("superseded", []), list)))
            if not ok]
        if wrong:
            raise damaged(self.meta_path, self.namespace, "values of the wrong type: " + ", ".join(wrong)[:200] +
                          " (model_id must be text, dimension a positive whole number)")
        return meta

    def check_files(self) -> None:
        """StateDamaged for a folder standing where a state file belongs, or a file where one of the namespace's
        folders does: a write would fail at its end, after its work, when it records its state there; refused
        before it starts instead, naming the repair."""
        from kbflow.state.layout import misplaced

        for damage in misplaced(self.root.parent.parent, self.namespace):
            raise damaged(damage.path, self.namespace, damage.reason)
        for path in (self.meta_path, self.manifest_path, self.last_run_path):
            if path.is_dir():
                raise damaged(path, self.namespace, "it is a folder")

    def check_model(self, model_id: str, dimension: int) -> None:
        """A namespace keeps one model for life; using another is an error, never padding or cutting vectors."""
        meta = self.meta()
        if meta and (meta["model_id"] != model_id or meta["dimension"] != dimension):
            backend, recorded = backend_of_model(meta["model_id"]), recorded_settings(meta["model_id"])
            hint = (f"set embedder.backend: {backend} in the config (or KBFLOW__EMBEDDER__BACKEND={backend}), "
                    if backend else "configure the namespace's model, ")
            if recorded:  # e.g. the same e5 weights at another precision: the backend alone does not fix it
                hint = (f"set embedder.backend: {backend} and "
                        + " and ".join(f"embedder.{key}: {value}" for key, value in recorded.items())
                        + " in the config (or " + ", ".join(f"KBFLOW__EMBEDDER__{key.upper()}={value}"
                                                            for key, value in recorded.items()) + "), ")
            raise ModelMismatchError(
                f"namespace {self.namespace!r} holds vectors of {meta['model_id']} (dim {meta['dimension']}), "
                f"but the configured embedder is {model_id} (dim {dimension}); {hint}move it to the configured "
                f"model with `kbflow reembed --namespace {self.namespace} --model MODEL`, use another namespace, "
                f"or clear this one with `kbflow clear --namespace {self.namespace} --yes`"
            )

    def store_namespace(self) -> str:
        """The store table holding this namespace's live chunks: the namespace itself, or what a reembed switched to."""
        return live_store_namespace(self.namespace, self.meta() or {})

    def write_meta(self, meta: dict) -> None:
        _write_json(self.meta_path, meta)

    def switch_model(self, model_id: str, dimension: int, store_namespace: str) -> None:
        """Make ``store_namespace`` (built by a reembed with ``model_id``) the live table; the old one is listed as
        superseded until pruned. The manifest's rows are moved to the new model id."""
        meta = self.meta() or {}
        old = {"store_namespace": live_store_namespace(self.namespace, meta), "model_id": meta.get("model_id"),
               "dimension": meta.get("dimension"), "replaced": datetime.now(timezone.utc).isoformat()}
        superseded = [e for e in meta.get("superseded", []) if e["store_namespace"] != store_namespace] + [old]
        manifest = self.read_manifest()
        if manifest.num_rows:
            moved = manifest.set_column(manifest.schema.get_field_index("model_id"), "model_id",
                                        pa.array([model_id] * manifest.num_rows, pa.string()))
            write_table(moved.cast(MANIFEST), self.manifest_path, MANIFEST)
        self.write_meta({**meta, "model_id": model_id, "dimension": dimension, "store_namespace": store_namespace,
                         "superseded": superseded})

    def record_model(self, model_id: str, dimension: int, bm25_terms: str) -> None:
        """A new namespace's record: its model, and the BM25 tokenizer version all its rows will be written with."""
        if self.meta() is None:
            created = datetime.now(timezone.utc).isoformat()
            _write_json(self.meta_path, {"model_id": model_id, "dimension": dimension, "created": created,
                                         "bm25_terms": bm25_terms})

    def record_terms(self, version: str) -> None:
        """Every stored row's BM25 terms are now of tokenizer ``version``: searches ask in its terms."""
        meta = self.meta() or {}
        if meta and meta.get("bm25_terms") != version:
            self.write_meta({**meta, "bm25_terms": version})

    # -- manifest -------------------------------------------------------------
    def read_manifest(self) -> pa.Table:
        """What the store holds per document (empty before the first write); StateDamaged when unreadable."""
        return read_parquet(self.manifest_path, self.namespace, MANIFEST, MANIFEST_REQUIRED)

    def write_manifest(self, manifest: pa.Table) -> None:
        write_table(manifest.select(MANIFEST.names).cast(MANIFEST).sort_by("source_path"), self.manifest_path,
                    MANIFEST)

    def update_manifest(self, replaced: pa.Table, removed_doc_ids: list[str]) -> pa.Table:
        """Drop the rows of replaced and removed documents, add ``replaced``; write atomically."""
        current = self.read_manifest()
        drop = pa.array(list(set(replaced.column("doc_id").to_pylist()) | set(removed_doc_ids)), pa.string())
        kept = current.filter(pc.invert(pc.is_in(current.column("doc_id"), value_set=drop)))
        updated = pa.concat_tables([kept, replaced.select(MANIFEST.names).cast(MANIFEST)]).sort_by("source_path")
        write_table(updated, self.manifest_path, MANIFEST)
        return updated

    # -- runs -----------------------------------------------------------------
    def last_run(self) -> dict | None:
        """The last run's summary (``stats``); StateDamaged when unreadable."""
        return read_json(self.last_run_path, self.namespace)

    def record_run(self, summary: dict) -> None:
        _write_json(self.last_run_path, summary)

    def clear(self) -> None:
        """Remove the namespace's state. Its lock file stays: a clear runs under the lock, and the lock's holder
        removes it on release (on object storage a release deletes the lease object it wrote, and only that)."""
        if not self.root.exists():
            return
        for child in self.root.iterdir():
            if child.name == LOCK_NAME:
                continue
            if child.is_dir():
                remove_tree(child)
            else:
                child.unlink()
        if not any(self.root.iterdir()):
            remove_tree(self.root)  # nobody holds the lock: nothing of the namespace is left


def live_store_namespace(namespace: str, meta: dict) -> str:
    """The store table that ``namespace``'s record ``meta`` names live: the namespace itself, or what a reembed
    switched to."""
    return meta.get("store_namespace", namespace)


def store_namespace_for(namespace: str, model_id: str) -> str:
    """The store table a reembed of ``namespace`` to ``model_id`` writes (and makes live)."""
    return f"{namespace}--{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


def namespaces(data_dir: str | Path) -> list[str]:
    """The namespaces that exist under ``data_dir`` (those with a recorded model), sorted."""
    root = location(data_dir) / "state"
    return sorted(p.parent.name for p in root.glob("*/namespace.json")) if root.is_dir() else []
