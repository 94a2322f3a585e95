import pyarrow as pa
import pyarrow.parquet as pq

from kbflow.core.schemas import PLAN, SCHEMA_VERSION
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


def test_a_manifest_written_before_the_graph_column_reads_with_it_empty(tmp_path):
    """A manifest of an older kbflow (no `graph` column) is read, not refused: the column reads as nulls, which the
    plan takes as 'graph off', so an upgrade with the graph off re-processes nothing."""
    from kbflow.engine.plan import Fingerprints, make_plan
    from kbflow.core.schemas import MANIFEST

    old_schema = pa.schema([field for field in MANIFEST if field.name != "graph"])
    row = {"doc_id": "d1", "source_path": "docs/a.md", "origin": "file", "source_sha256": "s", "converter": "c",
           "chunker": "k", "model_id": "m", "chunk_ids": ["x"], "run_id": "r"}
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), tmp_path / "manifest.parquet")
    manifest = read_table(tmp_path / "manifest.parquet", MANIFEST)
    assert manifest.schema == MANIFEST and manifest.column("graph").to_pylist() == [None]

    class Source:
        doc_id, source_path, source_sha256 = "d1", "docs/a.md", "s"

    assert make_plan([Source()], manifest, Fingerprints("c", "k", "m")).counts()["unchanged"] == 1
    assert make_plan([Source()], manifest, Fingerprints("c", "k", "m", "structure@1")).counts()["changed"] == 1
