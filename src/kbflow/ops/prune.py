"""`kbflow prune`: bound the data dir. Old run snapshots, expired Prefect result files, and old LanceDB versions (of
the chunk tables, the graph's edges, the vector caches and the LLM fact caches).

Every LanceDB write (merge_insert, delete, cache add) adds a table version and small data files; LanceDB keeps
old versions until told otherwise. ``optimize`` compacts the small files and removes versions older than the
given age; a namespace's table is optimized under its namespace lock, so never under a running ingest.
"""

from __future__ import annotations

import os
from datetime import timedelta

from kbflow.state import housekeeping, layout
from kbflow.config import KbConfig, check_namespace
from kbflow.state.lock import namespace_lock
from kbflow.state.manifest import NamespaceState
from kbflow.engine.reembed import remove_superseded
from kbflow.graph.llm_extract import FACT_TABLE_RE
from kbflow.core import storage
from kbflow.core.errors import StateDamaged
from kbflow.stores.errors import damage_reason, one_line_errors, refuse_denied
from kbflow.stores.factory import store_uri


def _namespaces(config: KbConfig, namespaces: list[str] | None) -> list[str]:
    if namespaces:
        return [check_namespace(name) for name in namespaces]
    known = set()
    data_dir = storage.location(config.data_dir)
    for folder in (data_dir / "runs", data_dir / "state"):
        if folder.is_dir():
            known |= {path.name for path in folder.iterdir() if path.is_dir()}
    return sorted(known)


def _table_names(db) -> set[str]:
    names, token = set(), None
    while True:  # list_tables pages its answer
        page = db.list_tables(page_token=token)
        names |= set(page.tables)
        token = page.page_token
        if not token:
            return names


def _optimize_named(db, name: str, older_than: timedelta, namespace: str | None) -> dict:
    """``_optimize`` of table ``name``; a table whose files are damaged is StateDamaged naming the repair (a
    compaction reads every version it keeps)."""
    try:
        return _optimize(db.open_table(name), older_than)
    except (RuntimeError, ValueError, OSError) as exc:
        refuse_denied(exc, within=os.path.join(db.uri, f"{name}.lance"))
        reason = damage_reason(exc) or " ".join(str(exc).split())[:200]
        where = (f"--namespace {namespace}" if namespace else "--namespace <a namespace of that model>")
        raise StateDamaged(f"table {name!r} cannot be compacted ({reason}); run `kbflow verify --repair {where}`, "
                           "then `kbflow prune` again") from exc


def _optimize(table, older_than: timedelta) -> dict:
    before = len(table.list_versions())
    # optimize removes old versions before it folds unindexed rows into the indexes, which commits one more
    # version; a table whose full-text index has rows waiting (fewer than the store's refresh threshold) would
    # keep that extra version, so fold first, then compact and remove
    table.optimize()
    table.optimize(cleanup_older_than=older_than)
    return {"versions_before": before, "versions_after": len(table.list_versions())}


@one_line_errors
def prune(config: KbConfig, keep_runs: int, namespaces: list[str] | None = None,
          versions_older_than: timedelta = timedelta(hours=1), result_days: float | None = None) -> dict:
    """Prune run folders to the newest ``keep_runs`` per namespace, result files older than ``result_days``
    (default: flow.cache_days), and LanceDB versions older than ``versions_older_than`` after compaction."""
    if keep_runs < 1:
        raise ValueError(f"keep_runs must be at least 1 (got {keep_runs}): the newest run's snapshots stay")
    data_dir = storage.location(config.data_dir)
    report: dict = {"data_dir": str(data_dir), "bytes_before": storage.tree_bytes(data_dir), "runs_removed": {},
                    "tables": {}}
    uri = store_uri(config)
    db = storage.lance_connect(uri) if storage.location(uri).is_dir() else None
    tables = _table_names(db) if db is not None else set()
    for namespace in _namespaces(config, namespaces):
        state = NamespaceState(data_dir, namespace)
        state.check_files()  # a file where its runs folder belongs: named with the repair, before anything is removed
        with namespace_lock(state.root, namespace):
            report["runs_removed"][namespace] = housekeeping.prune_runs(layout.runs_dir(data_dir, namespace), keep_runs)
            superseded = remove_superseded(config, namespace)  # tables a `kbflow reembed` switched away from
            if superseded:
                report.setdefault("superseded_removed", {})[namespace] = superseded
            table_name = f"chunks_{state.store_namespace()}"
            if db is not None and config.store.kind == "lancedb" and table_name in tables:
                report["tables"][table_name] = _optimize_named(db, table_name, versions_older_than, namespace)
            graph_table = f"graph_{namespace}"  # the graph's edges (graph.enabled): replaced per document batch
            if db is not None and graph_table in tables:
                report["tables"][graph_table] = _optimize_named(db, graph_table, versions_older_than, namespace)
        if not storage.is_remote(state.root) and state.root.is_dir() and not any(state.root.iterdir()):  # the lock made the folder; a namespace never ingested keeps no trace
            state.root.rmdir()
    # the vector caches and the LLM fact caches (graph.llm_extract): append-only, shared by namespaces (a namespace
    # named facts_… has its graph table compacted above, under its lock)
    for table_name in sorted(t for t in tables if t.startswith("vectors_") or FACT_TABLE_RE.fullmatch(t)):
        assert db is not None  # tables is empty without a database
        report["tables"][table_name] = _optimize_named(db, table_name, versions_older_than, None)
    days = config.flow.cache_days if result_days is None else result_days
    report["results_removed"] = housekeeping.prune_results(layout.results_dir(data_dir), days)
    report["bytes_after"] = storage.tree_bytes(data_dir)
    return report
