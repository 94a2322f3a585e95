"""Parquet snapshots: explicit schema, schema version in the metadata, written whole or not at all (a temp name and a
rename on a local disk, one PUT on object storage)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.core.schemas import SCHEMA_VERSION
from kbflow.core.storage import TMP_SUFFIX, is_remote, location, write_bytes_atomic

__all__ = ["TMP_SUFFIX", "write_table", "read_table", "clean_temporaries"]


def write_table(table: pa.Table, path, schema: pa.Schema | None = None):
    """Write ``table`` atomically: a crash leaves either the old file or the new one, never half a file."""
    path = location(path)
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    metadata = dict(table.schema.metadata or {})
    metadata[b"kbflow.schema_version"] = SCHEMA_VERSION.encode()
    table = table.replace_schema_metadata(metadata)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    write_bytes_atomic(path, buffer.getvalue())
    return path


def read_table(path, schema: pa.Schema | None = None) -> pa.Table:
    """Read a snapshot; an absent file reads as an empty table of ``schema``."""
    path = location(path)
    if not path.exists():
        if schema is None:
            raise FileNotFoundError(str(path))
        return schema.empty_table()
    table = pq.read_table(io.BytesIO(path.read_bytes()) if is_remote(path) else path)
    if schema is None:
        return table
    for field in schema:  # a column added since the file was written (a nullable one) reads as nulls
        if field.name not in table.column_names and field.nullable:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)


def clean_temporaries(folder) -> int:
    """Remove temp files a killed run left behind; they are never read (object storage has none: a PUT is whole)."""
    folder = location(folder)
    removed = 0
    if not is_remote(folder) and folder.exists():
        for leftover in folder.rglob(f"*{TMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed
