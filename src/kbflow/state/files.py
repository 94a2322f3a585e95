"""The one reader of a namespace's state files: a file that is there but cannot be read (cut short by a full disk,
emptied, edited by hand) is one ``StateDamaged`` error naming the file and the command that heals it, never a
parser's traceback. An absent file is not damage: it reads as "nothing recorded yet".

What each file is, and so what healing it costs (``kbflow verify --repair``, see docs/reliability.md):

* ``manifest.parquet``: what the store holds per document. Rebuilt from the store; the next ingest then re-checks
  every document (converted and chunked again, vectors from the vector cache: nothing is embedded again).
* ``namespace.json``: the namespace's model and live table. Rewritten from the manifest, the store and the vector
  cache.
* ``last_run.json``: the record of the last run, read by ``stats`` only. Removed; the next ingest writes it again.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.core.errors import StateDamaged
from kbflow.core.storage import location

__all__ = ["StateDamaged", "damaged", "read_json", "read_parquet", "repair_command", "store_unreadable"]

# what a reader needs in namespace.json; without them the namespace's model is unknown
LOCK_NAME = "ingest.lock"  # the namespace's one-writer lock, in its state folder (kbflow.state.lock)

META_KEYS = ("model_id", "dimension")


def repair_command(namespace: str) -> str:
    return f"`kbflow verify --repair --namespace {namespace}`"


FIXES = {
    "manifest.parquet": "run {repair}: it rebuilds the manifest from the store, and the next `kbflow ingest` "
                        "re-checks every document (nothing is embedded again: vectors come from the vector cache)",
    "namespace.json": "run {repair}: it rewrites the namespace's model record from the manifest, the store and the "
                      "vector cache",
    "last_run.json": "run {repair}: it removes this record of the last run (the next ingest writes a new one); "
                     "searches are not affected",
}


def store_unreadable(namespace: str, reason: str) -> StateDamaged:
    """The store (or a table of it) of ``namespace`` cannot be read, and the command that heals it."""
    if "search index" in reason:  # the rows are whole: the index is built again from them
        return StateDamaged(f"the store of namespace {namespace!r} cannot be searched ({reason}); run "
                            f"{repair_command(namespace)}: it builds the index again from the stored rows (nothing "
                            "is lost or embedded again)", namespace=namespace)
    return StateDamaged(f"the store of namespace {namespace!r} cannot be read ({reason}); run "
                        f"{repair_command(namespace)}: it restores the table's newest readable version (or empties "
                        "it), then `kbflow ingest` writes back what it lacks with vectors from the vector cache",
                        namespace=namespace)


def damaged(path, namespace: str, reason: str) -> StateDamaged:
    name = location(path).name
    fix = FIXES.get(name, "run {repair}").format(repair=repair_command(namespace))
    return StateDamaged(f"state file {str(path)!r} of namespace {namespace!r} cannot be read ({reason}); {fix}",
                        str(path), namespace)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def read_json(path, namespace: str, required: tuple[str, ...] = ()) -> dict | None:
    """The JSON object in ``path``, None when the file does not exist; damage (empty, cut short, not an object,
    lacking a ``required`` key) is ``StateDamaged``."""
    path = location(path)
    try:
        if not path.exists():
            return None
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError as exc:
        raise damaged(path, namespace, "it is a folder") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise damaged(path, namespace, f"not UTF-8 text: {_reason(exc)}") from exc
    if not text.strip():
        raise damaged(path, namespace, "the file is empty")
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise damaged(path, namespace, f"not valid JSON: {_reason(exc)}") from exc
    if not isinstance(payload, dict):
        raise damaged(path, namespace, f"expected a JSON object, found {type(payload).__name__}")
    missing = [key for key in required if key not in payload]
    if missing:
        raise damaged(path, namespace, f"lacks {', '.join(missing)}")
    return payload


def read_parquet(path, namespace: str, schema: pa.Schema, required: tuple[str, ...] = ()) -> pa.Table:
    """The table in ``path`` with ``schema`` (a column added since it was written reads as nulls, except the
    ``required`` ones); an absent file is an empty table; damage (empty, cut short, a required column missing) is
    ``StateDamaged``."""
    path = location(path)
    if not path.exists():
        return schema.empty_table()
    try:
        data = path.read_bytes()
        if not data:
            raise damaged(path, namespace, "the file is empty")
        table = pq.read_table(io.BytesIO(data))
    except StateDamaged:
        raise
    except IsADirectoryError as exc:
        raise damaged(path, namespace, "it is a folder") from exc
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowException) and exc.errno is not None:
            raise  # a permission or disk error is not damage to the file: its own error says what to fix
        reason = ("cut short, or not a Parquet file: its footer is missing" if "magic bytes" in str(exc)
                  else f"not a readable Parquet file: {_reason(exc)}")
        raise damaged(path, namespace, reason) from exc
    missing = [name for name in required if name not in table.column_names]
    if missing:
        raise damaged(path, namespace, f"lacks the columns {', '.join(missing)}")
    for field in schema:
        if field.name not in table.column_names and field.nullable:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise damaged(path, namespace, f"lacks the columns {', '.join(missing)}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise damaged(path, namespace, f"columns of the wrong type: {_reason(exc)}") from exc
