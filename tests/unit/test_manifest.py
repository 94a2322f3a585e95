"""kbflow.state.manifest by hand: the namespace's model record, its manifest updates, its run record, the list of
namespaces. Expected values are written out here, not computed by the code under test."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pytest

from kbflow.core.errors import ModelMismatchError
from kbflow.core.schemas import MANIFEST
from kbflow.state.manifest import NamespaceState, namespaces


def rows(*specs) -> pa.Table:
    """Manifest rows from (doc_id, source_path, chunk_ids) triples."""
    return pa.Table.from_pylist([
        {"doc_id": doc, "source_path": path, "origin": "file", "source_sha256": f"sha-{doc}", "converter": "c1",
         "chunker": "k1", "model_id": "m1", "chunk_ids": chunks, "run_id": "r1"} for doc, path, chunks in specs
    ], schema=MANIFEST)


def test_a_new_namespace_has_no_model_an_empty_manifest_and_no_run(tmp_path):
    state = NamespaceState(tmp_path, "fresh")
    assert state.meta() is None and state.last_run() is None and state.store_namespace() == "fresh"
    assert state.read_manifest().num_rows == 0 and state.read_manifest().schema == MANIFEST
    assert state.root == tmp_path / "state" / "fresh" and namespaces(tmp_path) == []
    # the on-disk layout is a contract with every existing data dir: renaming a file loses a namespace's state
    assert (state.manifest_path.name, state.meta_path.name, state.last_run_path.name, state.plans_dir.name) == \
        ("manifest.parquet", "namespace.json", "last_run.json", "chunk-plans")
    assert state.plans_dir.parent == state.root
    state.clear()  # clearing a namespace that was never written is not an error


def test_the_first_model_is_recorded_once_and_another_one_is_refused_with_the_fixes(tmp_path):
    state = NamespaceState(tmp_path, "docs")
    state.record_model("model-a", 384, "terms-1")
    created = state.meta()["created"]
    assert datetime.fromisoformat(created).tzinfo is not None  # an aware UTC timestamp
    state.record_model("model-b", 768, "terms-2")  # a later record never overwrites the first
    assert state.meta() == {"model_id": "model-a", "dimension": 384, "created": created, "bm25_terms": "terms-1"}
    state.record_terms("terms-2")  # every row rewritten in a later tokenizer's terms: only that key moves
    assert state.meta() == {"model_id": "model-a", "dimension": 384, "created": created, "bm25_terms": "terms-2"}
    state.check_model("model-a", 384)
    for model, dim in (("model-b", 384), ("model-a", 768)):
        with pytest.raises(ModelMismatchError) as caught:
            state.check_model(model, dim)
        message = str(caught.value)
        assert "holds vectors of model-a (dim 384)" in message and f"is {model} (dim {dim})" in message
        assert "kbflow reembed --namespace docs" in message and "kbflow clear --namespace docs --yes" in message
    assert namespaces(tmp_path) == ["docs"]


def test_an_e5_namespace_of_another_precision_is_refused_naming_its_precision(tmp_path):
    from kbflow.embed.e5 import E5SmallEmbedder

    state = NamespaceState(tmp_path, "docs")
    int8, fp32 = E5SmallEmbedder("int8"), E5SmallEmbedder("fp32")  # model ids only: nothing is loaded
    state.record_model(int8.model_id, 384, "v")
    with pytest.raises(ModelMismatchError, match="embedder.precision: int8") as caught:
        state.check_model(fp32.model_id, 384)
    assert f"holds vectors of {int8.model_id}" in str(caught.value)
    state.check_model(int8.model_id, 384)


def test_update_replaces_and_removes_whole_documents_and_keeps_the_rest_sorted_by_path(tmp_path):
    state = NamespaceState(tmp_path, "docs")
    state.update_manifest(rows(("d1", "b.md", ["c1", "c2"]), ("d2", "a.md", ["c3"]), ("d3", "c.md", ["c4"])), [])
    assert state.read_manifest().column("source_path").to_pylist() == ["a.md", "b.md", "c.md"]

    updated = state.update_manifest(rows(("d1", "b.md", ["c5"])), ["d3"])
    assert updated.to_pylist() == state.read_manifest().to_pylist()  # what it returns is what it wrote
    assert [(r["doc_id"], r["chunk_ids"]) for r in updated.to_pylist()] == [("d2", ["c3"]), ("d1", ["c5"])]

    assert state.update_manifest(rows(), ["d2", "never-there"]).column("doc_id").to_pylist() == ["d1"]
    assert not list(state.root.glob("*.tmp*"))  # written atomically: no temporary left


def test_switching_the_model_moves_the_manifest_and_lists_the_old_table_as_superseded(tmp_path):
    state = NamespaceState(tmp_path, "docs")
    state.record_model("model-a", 384, "v")
    state.update_manifest(rows(("d1", "a.md", ["c1"]), ("d2", "b.md", ["c2"])), [])
    state.switch_model("model-b", 768, "docs__model-b")
    meta = state.meta()
    assert (meta["model_id"], meta["dimension"], meta["store_namespace"]) == ("model-b", 768, "docs__model-b")
    assert [(e["store_namespace"], e["model_id"], e["dimension"]) for e in meta["superseded"]] == \
        [("docs", "model-a", 384)]
    assert state.store_namespace() == "docs__model-b"
    assert state.read_manifest().column("model_id").to_pylist() == ["model-b", "model-b"]
    assert state.read_manifest().column("chunk_ids").to_pylist() == [["c1"], ["c2"]]  # nothing else changed

    assert datetime.fromisoformat(meta["superseded"][0]["replaced"]).tzinfo is not None
    state.switch_model("model-c", 512, "docs__model-c")  # superseded tables accumulate until pruned
    assert [e["store_namespace"] for e in state.meta()["superseded"]] == ["docs", "docs__model-b"]
    state.switch_model("model-a", 384, "docs")  # and back: the table switched to is not listed as superseded
    assert [e["store_namespace"] for e in state.meta()["superseded"]] == ["docs__model-b", "docs__model-c"]
    state.check_model("model-a", 384)


def test_the_last_run_is_kept_and_clear_forgets_only_this_namespace(tmp_path):
    one, two = NamespaceState(tmp_path, "one"), NamespaceState(tmp_path, "two")
    for state in (one, two):
        state.record_model("m", 8, "v")
    one.record_run({"run_id": "r7", "documents": {"new": 2}})
    assert one.last_run() == {"run_id": "r7", "documents": {"new": 2}}
    assert json.loads(one.last_run_path.read_text())["run_id"] == "r7"
    assert namespaces(tmp_path) == ["one", "two"]
    one.clear()
    assert one.meta() is None and one.last_run() is None and not one.root.exists()
    assert namespaces(tmp_path) == ["two"] and two.meta()["model_id"] == "m"


def test_chunk_plans_round_trip_per_document_and_a_bad_file_only_costs_a_recompute(tmp_path):
    from kbflow.chunk.plans import PlanCache

    cache = PlanCache(tmp_path / "plans")
    assert cache.load("ab12") == {}  # never saved
    plans = {"key-1": {"offsets": [[0, 10]], "tokens": [7], "prefix": "# 标题"}}
    cache.save("ab12", plans)
    cache.save("cd34", {"key-2": {"tokens": [1]}})
    cache.save("ab56", {})  # a second document in the same folder
    assert cache.load("ab12") == plans and cache.load("cd34") == {"key-2": {"tokens": [1]}}
    path = tmp_path / "plans" / "ab" / "ab12.json"
    assert path.is_file() and "标题" in path.read_text(encoding="utf-8")  # UTF-8, not escaped
    assert sorted(p.name for p in (tmp_path / "plans").rglob("*")) == ["ab", "ab12.json", "ab56.json", "cd",
                                                                        "cd34.json"]

    path.write_text("{not json", encoding="utf-8")
    assert cache.load("ab12") == {}
    path.write_text("[1, 2]", encoding="utf-8")  # JSON, but not a mapping of plans
    assert cache.load("ab12") == {}

    cache.forget(["ab12", "never-saved"])
    assert not path.exists() and cache.load("cd34") == {"key-2": {"tokens": [1]}}
