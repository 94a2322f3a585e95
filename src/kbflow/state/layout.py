"""The data dir's layout, in one place: where each part of a namespace lives, and the checks ``kbflow verify`` makes
of the parts the store and the state files do not cover.

    <data dir>/state/<namespace>/     namespace.json, manifest.parquet, last_run.json, ingest.lock, chunk-plans/
    <data dir>/runs/<namespace>/<run>/ each run's Parquet snapshots (plan, failures, documents/, sections/, chunks/)
    <data dir>/prefect/results/kbflow-convert/  the conversion cache (each file's Markdown by content)
    <data dir>/lancedb/               LanceDB tables: the store's (``chunks_<namespace>``) and the vector cache's
    <data dir>/qdrant/                Qdrant's local mode, when it is the store

What is checked here costs, when damaged, work and never stored data: the caches are removed (the next run that
needs an entry converts or chunks again), a damaged run snapshot is moved aside (it is a record of a past run;
nothing can write it again), and a file standing where one of these folders belongs is moved aside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.core import schemas
from kbflow.core.storage import location

CONVERSION_CACHE = ("prefect", "results", "kbflow-convert")
# each run snapshot's schema, by its name (a part file by its folder's)
SNAPSHOTS = {"plan": schemas.PLAN, "failures": schemas.FAILURES, "documents": schemas.DOCUMENTS,
             "sections": schemas.SECTIONS, "chunks": schemas.CHUNKS}


def runs_dir(data_dir, namespace: str) -> Path:
    return location(data_dir) / "runs" / namespace


def results_dir(data_dir) -> Path:
    """Prefect's result files, and the conversion cache among them (pruned together by age)."""
    return location(data_dir) / "prefect" / "results"


def conversion_cache_dir(data_dir) -> Path:
    return location(data_dir).joinpath(*CONVERSION_CACHE)


def folders(data_dir, namespace: str) -> list[tuple[str, Path]]:
    """(verify check, folder) for every folder a namespace writes, outermost first."""
    data = location(data_dir)
    state = data / "state" / namespace
    return [("namespace.json", data / "state"), ("namespace.json", state), ("chunk-plans", state / "chunk-plans"),
            ("run-snapshots", data / "runs"), ("run-snapshots", runs_dir(data, namespace)),
            ("conversion-cache", data / "prefect"), ("conversion-cache", results_dir(data)),
            ("conversion-cache", conversion_cache_dir(data)), ("store", data / "lancedb"), ("store", data / "qdrant")]


@dataclass
class Damage:
    check: str
    path: Path
    reason: str
    fix: str  # what repair does: "set-aside", "remove", or "" (it cannot: the reason says what to run)


def _unreadable(path: Path, exc: OSError) -> str:
    return (f"cannot be read ({exc.strerror or exc}): give the user running kbflow access to it "
            f"(`chmod u+rw '{path}'`, or `chown` it to that user)")


def misplaced(data_dir, namespace: str) -> list[Damage]:
    """A file standing where one of the namespace's folders belongs (a bad restore, someone's redirect)."""
    found = []
    for check, folder in folders(data_dir, namespace):
        if folder.exists() and not folder.is_dir():
            found.append(Damage(check, folder, "a file stands where this folder belongs", "set-aside"))
    return found


def _folder_files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def damaged_cache_entries(folder: Path, check: str, types: dict[str, type | tuple[type, ...]],
                          required: tuple[str, ...] = ()) -> list[Damage]:
    """Each JSON entry of a cache folder (``<folder>/<xx>/<key>.json``) that is not a JSON object whose fields have
    ``types`` (the ``required`` ones present): emptied, cut, scrambled, of the wrong shape or types, a folder, or
    unreadable."""
    found = []
    for path in _folder_files(folder, "*/*.json"):
        try:
            if path.is_dir():
                raise ValueError("a folder stands where the entry belongs")
            entry = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(entry, dict):
                raise ValueError(f"not a JSON object but {type(entry).__name__}")
            wrong = [key for key, kind in types.items() if key in entry and not isinstance(entry[key], kind)]
            missing = [key for key in required if key not in entry]
            if wrong or missing:
                raise ValueError(f"{', '.join(wrong)} of the wrong type" if wrong else f"lacks {', '.join(missing)}")
        except PermissionError as exc:
            found.append(Damage(check, path, _unreadable(path, exc), ""))
        except (OSError, ValueError) as exc:
            found.append(Damage(check, path, f"damaged ({' '.join(str(exc).split())[:120]})", "remove"))
    return found


def damaged_snapshots(data_dir, namespace: str) -> list[Damage]:
    """Each run snapshot of the namespace that does not read as Parquet of its schema's columns."""
    found = []
    runs = runs_dir(data_dir, namespace)
    for path in _folder_files(runs, "*/*.parquet") + _folder_files(runs, "*/*/*.parquet"):
        schema = SNAPSHOTS.get(path.stem if path.parent.parent == runs else path.parent.name)
        try:
            if path.is_dir():
                raise ValueError("a folder stands where the file belongs")
            columns = pq.read_schema(path).names
            if schema is not None and set(schema.names) - set(columns):
                raise ValueError(f"lacks the columns {', '.join(sorted(set(schema.names) - set(columns)))[:120]}")
        except PermissionError as exc:
            found.append(Damage("run-snapshots", path, _unreadable(path, exc), ""))
        except (OSError, ValueError, pa.ArrowException) as exc:
            found.append(Damage("run-snapshots", path, f"damaged ({' '.join(str(exc).split())[:120]})", "set-aside"))
    return found


def set_aside(path: Path) -> Path:
    """Rename ``path`` (a file or a folder) out of the way, never deleting it; returns its new name."""
    aside = path.with_name(f"{path.name}.set-aside-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%f')}")
    path.rename(aside)
    return aside


def heal(damage: Damage) -> str:
    """Carry out ``damage.fix``; says what was done."""
    if damage.fix == "remove":
        if damage.path.is_dir():
            set_aside(damage.path)
            return f"{damage.path}: a folder where a cache entry belongs, moved aside"
        damage.path.unlink(missing_ok=True)
        return f"{damage.path}: removed (a cache entry: the next run that needs it makes it again)"
    if damage.fix == "set-aside":
        return f"{damage.path}: moved aside to {set_aside(damage.path).name}"
    return f"{damage.path}: not repaired: {damage.reason}"
