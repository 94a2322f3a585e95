"""Before a run trusts what its manifest says the store holds: the cheap checks that keep an ingest from reporting
success over a store it cannot read.

* The store table must read (its chunk and document ids, one column scan): an unreadable one ends the run with
  the command that heals it, before anything is planned as "unchanged".
* Per manifest document, the store must hold exactly the listed chunk ids. A document whose chunks are missing
  (a table restored to an earlier version, rows deleted by hand) is planned again instead of trusted: the run
  writes it back, its vectors from the vector cache.
* The vector cache must read (its keys, one column scan) when the run has texts to look up: a cache is rebuilt,
  never trusted blindly: restored to its newest readable version, or emptied.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc

from kbflow.state import heal
from kbflow.core.errors import KbflowError
from kbflow.state.files import store_unreadable
from kbflow.stores.errors import damage_reason, refuse_denied

log = logging.getLogger("kbflow.engine")


def stored_ids(store, namespace: str) -> pa.Table:
    """The store's chunk and document ids; an unreadable store is StateDamaged with the fix."""
    try:
        return store.chunk_ids()
    except KbflowError:
        raise
    except Exception as exc:  # the store's own error for a missing or torn file: its text is the only detail
        refuse_denied(exc)
        raise store_unreadable(namespace, damage_reason(exc) or str(exc).strip()[:300] or type(exc).__name__) \
            from exc


def trusted_manifest(store, namespace: str, manifest: pa.Table) -> tuple[pa.Table, list[str]]:
    """``manifest`` with the documents whose stored chunks differ from the listed ones marked as not matching any
    file or text (no source or Markdown hash), and those documents' ids (the run plans them again, or removes them)."""
    if not manifest.num_rows:
        return manifest, []
    ids = stored_ids(store, namespace)
    stored: dict[str, set[str]] = defaultdict(set)
    for chunk_id, doc_id in zip(ids.column("chunk_id").to_pylist(), ids.column("doc_id").to_pylist()):
        stored[doc_id].add(chunk_id)
    differ = [doc_id for doc_id, chunk_ids in zip(manifest.column("doc_id").to_pylist(),
                                                 manifest.column("chunk_ids").to_pylist())
              if set(chunk_ids or ()) != stored.get(doc_id, set())]
    if not differ:
        return manifest, []
    log.warning("%s: the store lacks or differs from %d documents of the manifest; they are written again",
                namespace, len(differ))
    # kept, with no source or Markdown hash: a file still there is planned as changed and written again (its text
    # is not taken for the stored one), a file gone is planned as removed (a run killed in the middle of a removal
    # is finished and counted by the next)
    mask = pc.is_in(manifest.column("doc_id"), value_set=pa.array(differ, pa.string()))
    for column in ("source_sha256", "markdown_sha256"):
        hashes = pc.if_else(mask, pa.scalar("", pa.string()), manifest.column(column))
        manifest = manifest.set_column(manifest.schema.get_field_index(column), column, hashes)
    return manifest, differ


def readable_cache(cache) -> str | None:
    """Heal an unreadable vector cache (restored, or emptied); what was done, or None when it read."""
    from kbflow.stores.lancedb_store import unreadable_reason

    if not cache.exists() or unreadable_reason(cache.table, ["embed_sha256"]) is None:
        return None
    done = heal.vector_cache(cache)
    log.warning("the vector cache %s could not be read: %s", cache.table_name, done)
    return f"vector cache {cache.table_name} could not be read: {done}"
