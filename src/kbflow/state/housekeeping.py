"""Keep the data dir bounded: old run snapshots and Prefect result files are removed (Prefect never deletes them)."""

from __future__ import annotations

import time

from kbflow.core.storage import is_remote, location, remove_tree


def prune_runs(runs_dir, keep: int) -> list[str]:
    """Keep the ``keep`` newest run folders (run ids start with a UTC timestamp, so names sort by age)."""
    runs_dir = location(runs_dir)
    if not runs_dir.exists():
        return []
    runs = sorted((p for p in runs_dir.iterdir() if p.is_dir()), key=lambda p: p.name)
    removed = runs[: max(len(runs) - keep, 0)]
    for run in removed:
        remove_tree(run)
    return [run.name for run in removed]


def prune_results(results_dir, max_age_days: float) -> int:
    """Remove cached task results older than their cache expiry: they can never be hit again."""
    results_dir = location(results_dir)
    if not results_dir.exists():
        return 0
    cutoff = time.time() - max_age_days * 86400
    if is_remote(results_dir):  # one listing with every object's age, one bulk delete: not a request per object
        entries = results_dir.fs.find(results_dir.path, detail=True)
        old = [name for name, info in entries.items() if info.get("type") == "file" and
               (modified := _modified(info)) is not None and modified < cutoff]
        if old:
            results_dir.fs.rm(old)
        return len(old)
    removed = 0
    for path in results_dir.rglob("*"):
        if path.is_file() and path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _modified(info: dict) -> float | None:
    """An object's modification time (epoch seconds) from an fsspec listing entry (S3: ``LastModified``)."""
    value = info.get("LastModified", info.get("mtime", info.get("updated")))
    if value is None:
        return None
    return value.timestamp() if hasattr(value, "timestamp") else float(value)
