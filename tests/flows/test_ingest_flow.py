"""Real Prefect runs of flows/ingest.py on real files, the real model and real LanceDB."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from kbflow.flows.ingest import ingest
from kbflow import api
from kbflow.errors import DeletionGuardError, ModelMismatchError, PermanentError
from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES
from tests.flows.conftest import DIM, snapshot, store_of



def run(docs, data_dir, **kwargs):
    return ingest(sources=[str(docs)], data_dir=str(data_dir), **kwargs)


def test_first_run_then_rerun_changes_nothing(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    first = run(docs_dir, data)
    assert first["documents"]["new"] == 4 and first["documents"]["failed"] == 0
    assert first["chunks"]["embedded"] == counting.texts_embedded > 0
    rows, manifest = snapshot(data)
    ids = [row["chunk_id"] for row in rows]
    assert len(ids) == len(set(ids)) == first["store"]["count"]
    assert sum(len(m["chunk_ids"]) for m in manifest) == len(ids)
    assert all(np.linalg.norm(row["vector"]) > 0.99 for row in rows)

    counting.texts_embedded = 0
    second = run(docs_dir, data)
    assert counting.texts_embedded == 0 and second["chunks"]["embedded"] == 0
    assert second["documents"] == {"new": 0, "changed": 0, "unchanged": 4, "removed": 0, "failed": 0}
    assert snapshot(data) == (rows, manifest)


def test_editing_one_paragraph_embeds_only_changed_chunks(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = {row["chunk_id"]: row for row in store_of(data).rows().to_pylist()}
    target = docs_dir / "backups.md"
    target.write_text(target.read_text().replace("Keep seven daily backups", "Keep ten daily backups"))

    counting.texts_embedded = 0
    summary = run(docs_dir, data)
    assert summary["documents"]["changed"] == 1 and summary["documents"]["unchanged"] == 3
    after = {row["chunk_id"]: row for row in store_of(data).rows().to_pylist()}
    new_texts = {row["embed_sha256"] for row in after.values()} - {row["embed_sha256"] for row in before.values()}
    assert counting.texts_embedded == len(new_texts) == 1
    assert not any("seven daily" in row["text"] for row in after.values())
    assert any("ten daily" in row["text"] for row in after.values())
    assert len(after) == len(before)


def test_deleting_a_file_deletes_exactly_its_chunks(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    rows = store_of(data).rows().to_pylist()
    doomed = {row["chunk_id"] for row in rows if row["source_path"] == "docs/search.md"}
    assert doomed
    (docs_dir / "search.md").unlink()
    summary = run(docs_dir, data)
    assert summary["documents"]["removed"] == 1
    assert summary["chunks"]["deleted"] == len(doomed)
    remaining = {row["chunk_id"] for row in store_of(data).rows().to_pylist()}
    assert remaining == {row["chunk_id"] for row in rows} - doomed
    assert "docs/search.md" not in {m["source_path"] for m in NamespaceState(data, "default").read_manifest().to_pylist()}


def test_deletion_guard_stops_mass_delete(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    for name in ("search.md", "backups.md"):
        (docs_dir / name).unlink()
    with pytest.raises(DeletionGuardError, match="allow-mass-delete"):
        run(docs_dir, data)
    assert snapshot(data) == before
    summary = run(docs_dir, data, allow_mass_delete=True)
    assert summary["documents"]["removed"] == 2


def test_renaming_a_file_reuses_its_vectors(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    shutil.move(docs_dir / "backups.md", docs_dir / "backup-guide.md")
    counting.texts_embedded = 0
    summary = run(docs_dir, data)
    assert counting.texts_embedded == 0
    assert summary["documents"]["new"] == 1 and summary["documents"]["removed"] == 1
    paths = {row["source_path"] for row in store_of(data).rows().to_pylist()}
    assert "docs/backup-guide.md" in paths and "docs/backups.md" not in paths


def test_upsert_failure_leaves_store_and_manifest_as_before(docs_dir, tmp_path, counting, monkeypatch):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    (docs_dir / "search.md").write_text("# Search\n\nA completely rewritten page about ranking.\n")

    def broken(self, doc_ids, rows):
        raise RuntimeError("disk full (injected)")

    monkeypatch.setattr(LanceStore, "replace_documents", broken)
    summary = run(docs_dir, data)
    assert summary["documents"]["failed"] == 1
    assert [f["stage"] for f in summary["failures"]] == ["upsert"]
    assert snapshot(data) == before
    failures = pq.read_table(next((data / "runs" / "default").glob(f"{summary['run_id']}/failures.parquet")))
    assert failures.column("stage").to_pylist() == ["upsert"]

    monkeypatch.undo()
    import kbflow.engine.ingest

    monkeypatch.setattr(kbflow.engine.ingest, "get_embedder", lambda config: counting)
    counting.texts_embedded = 0
    again = run(docs_dir, data)
    assert again["documents"]["changed"] == 1 and again["documents"]["failed"] == 0
    assert counting.texts_embedded == 0  # its vectors were cached by the failed run
    assert any("rewritten page" in row["text"] for row in store_of(data).rows().to_pylist())


def test_embedding_failure_keeps_stored_version_and_writes_no_vector(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    (docs_dir / "backups.md").write_text("# Backups\n\nNew policy: back up every hour.\n")
    counting.fail_when = lambda texts: PermanentError("invalid input (injected)")
    summary = run(docs_dir, data)
    assert summary["documents"]["failed"] == 1
    assert {f["stage"] for f in summary["failures"]} == {"embed"}
    assert any(f["chunk_ids"] for f in summary["failures"])
    assert snapshot(data) == before  # old version kept, nothing half-written, no zero vectors

    counting.fail_when = None
    again = run(docs_dir, data)
    assert again["documents"]["changed"] == 1 and again["chunks"]["embedded"] >= 1
    assert any("every hour" in row["text"] for row in store_of(data).rows().to_pylist())


def test_namespace_remembers_its_model(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    meta_path = data / "state" / "default" / "namespace.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "model_id": "some-other-model;dim=768", "dimension": 768}))
    with pytest.raises(ModelMismatchError, match="kbflow clear"):
        run(docs_dir, data)


def test_bad_files_are_recorded_and_the_rest_ingested(tmp_path, counting):
    data = tmp_path / "data"
    docs = tmp_path / "mixed"
    (docs / "bad").mkdir(parents=True)
    for name in ("broken.pdf", "empty.docx", "random.xlsx"):  # the full bad set: tests/flows/test_convert_flow.py
        shutil.copy(CASES / "bad" / name, docs / "bad" / name)
    shutil.copy(CASES / "docs" / "search.md", docs / "search.md")
    summary = ingest(sources=[str(docs)], data_dir=str(data))
    assert summary["documents"]["failed"] == 3
    assert {f["source_path"] for f in summary["failures"]} == {"mixed/bad/broken.pdf", "mixed/bad/empty.docx",
                                                               "mixed/bad/random.xlsx"}
    assert all(f["message"] for f in summary["failures"])
    assert {row["source_path"] for row in store_of(data).rows().to_pylist()} == {"mixed/search.md"}


def test_add_text_and_clear_touch_one_namespace(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data, namespace="alpha")
    api.add_text("Tea is brewed with water at 80 degrees.", doc_id="tea", namespace="beta", data_dir=data)
    hits = api.search("how hot should tea water be", namespace="beta", data_dir=data)
    assert hits and hits[0].source_path == "text:tea"
    alpha_before = snapshot(data, "alpha")

    # the same doc id replaces the text; a later file ingest into beta does not remove it
    api.add_text("Tea is brewed with water at 70 degrees.", doc_id="tea", namespace="beta", data_dir=data)
    texts = [row["text"] for row in store_of(data, "beta").rows().to_pylist()]
    assert texts == ["Tea is brewed with water at 70 degrees."]

    api.clear("beta", data_dir=data)
    assert api.stats("beta", data_dir=data)["chunks"] == 0
    assert snapshot(data, "alpha") == alpha_before
    assert api.stats("alpha", data_dir=data)["documents"] == 4


def test_dry_run_writes_nothing(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    summary = run(docs_dir, data, dry_run=True)
    assert summary["documents"]["new"] == 4
    assert {row["action"] for row in summary["plan"]} == {"new"}
    assert counting.texts_embedded == 0
    assert not (data / "lancedb").exists() and not (data / "state").exists()


def test_eval_on_a_small_labelled_set(tmp_path, counting):
    from kbflow.evaluate import eval_beir

    result = eval_beir(CASES / "beir-mini", data_dir=tmp_path / "data")
    assert result["documents"] == 5 and result["queries"] == 3
    assert result["metrics"]["recall@100"] == 1.0  # every document is retrievable
    assert result["metrics"]["mrr@10"] == 1.0  # and these queries are easy: the right one ranks first


def test_qdrant_store_holds_the_same_chunks_as_lancedb(docs_dir, tmp_path, counting):
    from kbflow.stores.qdrant_store import QdrantStore

    config = tmp_path / "qdrant.yaml"
    config.write_text(f"store:\n  kind: qdrant\n  qdrant_location: {tmp_path / 'qdrant'}\n")
    lance = run(docs_dir, tmp_path / "lance-data")
    qdrant = ingest(sources=[str(docs_dir)], data_dir=str(tmp_path / "qdrant-data"), config_path=str(config))
    assert qdrant["store"]["count"] == lance["store"]["count"]
    store = QdrantStore(str(tmp_path / "qdrant"), "default", DIM)
    assert sorted(store.chunk_ids().column("chunk_id").to_pylist()) == sorted(
        store_of(tmp_path / "lance-data").chunk_ids().column("chunk_id").to_pylist())
    again = ingest(sources=[str(docs_dir)], data_dir=str(tmp_path / "qdrant-data"), config_path=str(config))
    assert again["chunks"]["embedded"] == 0 and again["store"]["count"] == qdrant["store"]["count"]
    hits = api.search("how long are backups kept", data_dir=tmp_path / "qdrant-data", config=config)
    assert hits[0].source_path == "docs/backups.md"


def test_bench_ingest_reports_phases_and_writes_json_and_plot(tmp_path, counting):
    from kbflow.bench.ingest import bench_ingest

    before, after = tmp_path / "v1" / "docs", tmp_path / "v2" / "docs"
    shutil.copytree(CASES / "docs", before)
    shutil.copytree(CASES / "docs", after)
    (after / "search.md").write_text((after / "search.md").read_text() + "\nRanking also uses BM25.\n")
    out = tmp_path / "bench" / "ingest.json"
    result = bench_ingest(before, after, out, tmp_path / "work", None)
    phases = {phase["phase"]: phase for phase in result["phases"]}
    assert phases["rerun"]["texts_embedded"] == 0
    assert 1 <= phases["update"]["texts_embedded"] <= 2
    assert result["ratios"]["update_store_equals_fresh"] is True
    assert json.loads(out.read_text())["ratios"] == result["ratios"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_vector_index_is_built_after_the_last_batch_not_during_them(docs_dir, tmp_path, counting, monkeypatch):
    """Building an ANN index takes memory in proportion to the table; an ingest builds it once, after its batches
    are written and freed, so the two peaks do not add up (kbflow bench memory)."""
    from kbflow import failpoints

    data = tmp_path / "data"
    monkeypatch.setenv("KBFLOW__SEARCH__VECTOR_INDEX_MIN_ROWS", "8")
    monkeypatch.setenv("KBFLOW__SEARCH__VECTOR_INDEX_TYPE", "IVF_FLAT")
    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "1")
    monkeypatch.setenv(failpoints.ENV, "upsert.done=4:raise")  # the run dies after its last batch is written
    failpoints.reset()
    with pytest.raises(failpoints.FailpointError):
        run(docs_dir, data)
    interrupted = store_of(data).stats()
    assert interrupted["rows"] >= 8 and set(interrupted["indexes"]) == {"text_tokens"}  # no vector index yet

    monkeypatch.delenv(failpoints.ENV)
    summary = run(docs_dir, data)
    assert summary["documents"]["unchanged"] == 4 and summary["store"]["indexes"] == {"vector": "created IVF_FLAT"}
    assert store_of(data).stats()["indexes"]["vector"]["unindexed_rows"] == 0
    assert run(docs_dir, data)["store"]["indexes"] == {}  # nothing left to do
