"""`kbflow verify` finds each kind of damage done to a real store, and `--repair` + the next ingest mend it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kbflow.flows.ingest import ingest
from kbflow import api
from kbflow.stores.vector_cache import VectorCache
from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore


def stored(data_dir):
    return LanceStore(data_dir / "lancedb", "default", 384).rows().drop_columns(["vector"]).to_pylist()


def test_verify_finds_damage_and_repair_plus_ingest_restores(docs_dir, tmp_path):
    data_dir = tmp_path / "data"
    ingest(sources=[str(docs_dir)], data_dir=str(data_dir))
    report = api.verify("default", data_dir=data_dir)
    assert report["ok"], report["findings"]
    assert report["counts"]["store_rows"] == report["counts"]["manifest_chunks"] == report["counts"]["cached_of_stored"]
    before = stored(data_dir)

    store = LanceStore(data_dir / "lancedb", "default", 384)
    rows = store.rows()
    docs = sorted(set(rows.column("doc_id").to_pylist()))
    assert len(docs) >= 4
    first_of = {doc: rows.filter(pa.compute.equal(rows.column("doc_id"), doc)).slice(0, 1) for doc in docs}
    # 1. a zero vector in the first document
    zero = first_of[docs[0]].to_pylist()[0]
    store.table.delete(f"chunk_id = '{zero['chunk_id']}'")
    store.table.add([{**zero, "vector": [0.0] * 384}])
    # 2. a chunk of the second document gone from the store
    store.table.delete(f"chunk_id = '{first_of[docs[1]].column('chunk_id')[0].as_py()}'")
    # 3. an orphan: a document the manifest does not list (a run died between store and manifest writes)
    orphan = {**first_of[docs[2]].to_pylist()[0], "chunk_id": "f" * 32, "doc_id": "e" * 32}
    store.table.add([orphan])
    # 4. the cache disagrees with the stored vector of the fourth document
    meta = NamespaceState(data_dir, "default").meta()
    cache = VectorCache(data_dir / "lancedb", meta["model_id"], 384)
    key = first_of[docs[3]].column("embed_sha256")[0].as_py()
    cache.delete([key])
    cache.add([key], np.eye(384, dtype=np.float32)[:1])

    report = api.verify("default", data_dir=data_dir)
    found = {finding["check"]: set(finding["doc_ids"]) for finding in report["findings"]}
    assert found["vectors"] == {docs[0]}
    assert docs[1] in found["manifest"]
    assert found["orphans"] == {"e" * 32}
    assert found["cache"] == {docs[3]}
    assert not report["ok"]

    repaired = api.verify("default", data_dir=data_dir, repair=True)
    assert repaired["repaired"]["documents_forgotten"] == 4  # three damaged documents and the orphan
    rerun = ingest(sources=[str(docs_dir)], data_dir=str(data_dir))
    assert rerun["documents"]["new"] == 3 and rerun["documents"]["failed"] == 0
    assert api.verify("default", data_dir=data_dir)["ok"]
    assert stored(data_dir) == before
