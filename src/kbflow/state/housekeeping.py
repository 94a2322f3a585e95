"""Keep the data dir bounded: old run snapshots and Prefect result files are removed (Prefect never deletes them)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path


def prune_runs(runs_dir: Path, keep: int) -> list[str]:
    """Keep the ``keep`` newest run folders (run ids start with a UTC timestamp, so names sort by age)."""
    if not Path(runs_dir).exists():
        return []
    runs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())
    removed = runs[: max(len(runs) - keep, 0)]
    for run in removed:
        shutil.rmtree(run, ignore_errors=True)
    return [run.name for run in removed]


def prune_results(results_dir: Path, max_age_days: float) -> int:
    """Remove cached task results older than their cache expiry: they can never be hit again."""
    if not Path(results_dir).exists():
        return 0
    cutoff = time.time() - max_age_days * 86400
    removed = 0
    for path in Path(results_dir).rglob("*"):
        if path.is_file() and path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
