"""Parquet snapshots: explicit schema, schema version in the metadata, written to a temp name and renamed."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.schemas import SCHEMA_VERSION

TMP_SUFFIX = ".tmp-kbflow"


def write_table(table: pa.Table, path: Path, schema: pa.Schema | None = None) -> Path:
    """Write ``table`` atomically: a crash leaves either the old file or the new one, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    metadata = dict(table.schema.metadata or {})
    metadata[b"kbflow.schema_version"] = SCHEMA_VERSION.encode()
    table = table.replace_schema_metadata(metadata)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_table(path: Path, schema: pa.Schema | None = None) -> pa.Table:
    """Read a snapshot; an absent file reads as an empty table of ``schema``."""
    path = Path(path)
    if not path.exists():
        if schema is None:
            raise FileNotFoundError(path)
        return schema.empty_table()
    table = pq.read_table(path)
    return table.select(schema.names).cast(schema) if schema is not None else table


def clean_temporaries(folder: Path) -> int:
    """Remove temp files a killed run left behind; they are never read."""
    removed = 0
    if Path(folder).exists():
        for leftover in Path(folder).rglob(f"*{TMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed
