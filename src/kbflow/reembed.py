"""Changing a namespace's model: the pure parts of ``flows/reembed.py`` and of ``kbflow prune``.

A namespace's chunks live in a store table named by its *store namespace*: the namespace itself at first, then
``<namespace>--<sha256(model id)[:8]>`` after a reembed. ``namespace.json`` records which one is live
(``store_namespace``) and which are superseded (``superseded``); readers resolve the live one through
``NamespaceState.store_namespace()``. A reembed keeps each chunk's text and heading path exactly as stored and
embeds it with the new model (the vector cache serves texts already embedded with that model); the old table
stays, listed as superseded, until ``remove_superseded`` (called by ``kbflow prune``) drops it.
"""

from __future__ import annotations

import hashlib

from kbflow.chunk import sha256_text
from kbflow.config import KbConfig
from kbflow.errors import EmbeddingError
from kbflow.manifest import NamespaceState


def store_namespace_for(namespace: str, model_id: str) -> str:
    return f"{namespace}--{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


def recover_embed_text(text: str, heading_path: list[str], embed_sha256: str) -> str:
    """The exact text the old model read for a stored chunk: its text, after the heading prefix the chunker
    chose ('A > B > C\\n\\n', leading ancestors possibly dropped, or none). Proven by its sha256."""
    path = list(heading_path or [])
    candidates = [" > ".join(path[start:]) + "\n\n" + text for start in range(len(path))] + [text]
    for candidate in candidates:
        if sha256_text(candidate) == embed_sha256:
            return candidate
    raise EmbeddingError(f"cannot recover the embedded text of a chunk starting {text[:60]!r} (no heading prefix "
                         "gives its embed_sha256); the store was written by another chunker. Re-ingest the "
                         "sources with the new model in a new namespace instead")


def superseded_tables(config: KbConfig, namespace: str) -> list[str]:
    """Store namespaces of ``namespace`` that a reembed replaced and that were not removed yet (for ``kbflow prune``)."""
    meta = NamespaceState(config.data_dir, namespace).meta() or {}
    live = meta.get("store_namespace", namespace)
    return [entry["store_namespace"] for entry in meta.get("superseded", []) if entry["store_namespace"] != live]


def remove_superseded(config: KbConfig, namespace: str) -> list[str]:
    """Drop the superseded tables of ``namespace`` (never the live one); returns the store namespaces removed."""
    from kbflow.stores import open_store

    state = NamespaceState(config.data_dir, namespace)
    meta = state.meta() or {}
    live = meta.get("store_namespace", namespace)
    removed = []
    for entry in meta.get("superseded", []):
        if entry["store_namespace"] == live:
            continue
        open_store(config, entry["store_namespace"], entry["dimension"]).clear()
        removed.append(entry["store_namespace"])
    if removed:
        state.write_meta({**meta, "superseded": [e for e in meta.get("superseded", [])
                                                 if e["store_namespace"] not in removed]})
    return removed
