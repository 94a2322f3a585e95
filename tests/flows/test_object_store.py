"""The LanceDB tables on object storage (issue 19.2, its first part): `store.uri: s3://bucket/…` puts the store and
the vector cache in a bucket, against moto's S3 server on 127.0.0.1 through LanceDB's own S3 client (credentials and
endpoint from the standard AWS environment). The data dir (manifest, state, snapshots) is still local here."""

from __future__ import annotations

import numpy as np

from kbflow import api
from kbflow.config import load_config
from kbflow.prune import prune
from kbflow.stores.lancedb_store import LanceStore
from tests.flows.conftest import DIM

CONTENT = ["chunk_id", "source_path", "ordinal", "heading_path", "text", "text_tokens", "embed_sha256", "vector"]


def _rows(uri: str) -> list[dict]:
    return LanceStore(uri, "default", DIM).rows(CONTENT).to_pylist()


def test_store_and_vector_cache_in_a_bucket_hold_what_a_local_run_holds(s3, docs_dir, tmp_path, monkeypatch, counting):
    client, bucket = s3
    local = api.ingest([str(docs_dir)], data_dir=tmp_path / "local")
    uri = f"s3://{bucket}/kb/lancedb"
    monkeypatch.setenv("KBFLOW__STORE__URI", uri)
    counting.texts_embedded = 0
    first = api.ingest([str(docs_dir)], data_dir=tmp_path / "runner-1")
    assert first["documents"]["new"] == 4 and first["documents"]["failed"] == 0
    assert counting.texts_embedded == first["chunks"]["embedded"] > 0  # the bucket's vector cache started empty
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/lancedb/")["Contents"]]
    assert any(k.startswith("kb/lancedb/chunks_default.lance/") for k in keys)
    assert any(k.startswith("kb/lancedb/vectors_") for k in keys)
    assert not (tmp_path / "runner-1" / "lancedb").exists()  # nothing of the tables on the local disk

    on_s3, on_disk = _rows(uri), _rows(str(tmp_path / "local" / "lancedb"))
    assert len(on_s3) == len(on_disk) == first["store"]["count"] == local["store"]["count"]
    for a, b in zip(on_s3, on_disk):
        assert {k: v for k, v in a.items() if k != "vector"} == {k: v for k, v in b.items() if k != "vector"}
        assert np.allclose(a["vector"], b["vector"], atol=1e-5)

    counting.texts_embedded = 0
    again = api.ingest([str(docs_dir)], data_dir=tmp_path / "runner-1")
    assert counting.texts_embedded == 0 and again["documents"]["unchanged"] == 4

    # a second machine with an empty local data dir and the same bucket: its manifest is empty (the data dir is
    # local: issue 19.2's next part), so every document is new to it, but every vector comes from the bucket
    second = api.ingest([str(docs_dir)], data_dir=tmp_path / "runner-2")
    assert second["documents"]["new"] == 4 and counting.texts_embedded == 0 and second["chunks"]["embedded"] == 0
    assert _rows(uri) == on_s3  # the same rows, replaced document by document

    (docs_dir / "backups.md").write_text((docs_dir / "backups.md").read_text() + "\nKeep three copies offsite.\n")
    changed = api.ingest([str(docs_dir)], data_dir=tmp_path / "runner-1")
    assert changed["documents"]["changed"] == 1 and 1 <= counting.texts_embedded <= 2

    hits = api.search("how do I restore a backup", data_dir=tmp_path / "runner-1", limit=3)
    assert hits and hits[0].source_path == "docs/backups.md"
    assert api.stats(data_dir=tmp_path / "runner-1")["store_bytes"] > 0
    report = prune(load_config(data_dir=tmp_path / "runner-1"), keep_runs=1)
    assert "chunks_default" in report["tables"] and any(t.startswith("vectors_") for t in report["tables"])
    assert len(_rows(uri)) == changed["store"]["count"]  # compacted, old versions removed, every row kept
