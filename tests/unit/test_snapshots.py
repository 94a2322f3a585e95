import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.schemas import PLAN, SCHEMA_VERSION
from kbflow.state.snapshots import TMP_SUFFIX, clean_temporaries, read_table, write_table


def test_write_is_atomic_and_versioned(tmp_path):
    table = pa.Table.from_pylist([{"doc_id": "a", "source_path": "p", "action": "new", "source_sha256": "s"}], schema=PLAN)
    path = write_table(table, tmp_path / "run" / "plan.parquet", PLAN)
    assert pq.read_metadata(path).metadata[b"kbflow.schema_version"] == SCHEMA_VERSION.encode()
    assert read_table(path, PLAN).to_pylist() == table.to_pylist()
    assert not list(tmp_path.rglob(f"*{TMP_SUFFIX}"))


def test_missing_snapshot_reads_empty_and_leftovers_are_cleaned(tmp_path):
    assert read_table(tmp_path / "nope.parquet", PLAN).num_rows == 0
    leftover = tmp_path / f".plan.parquet.1234{TMP_SUFFIX}"
    leftover.write_bytes(b"half a file")
    assert clean_temporaries(tmp_path) == 1 and not leftover.exists()
