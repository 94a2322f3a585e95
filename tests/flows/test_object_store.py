"""The knowledge base on object storage (issue 19.2), against moto's S3 server on 127.0.0.1 through the real clients
(LanceDB's own S3 client, s3fs; credentials and endpoint from the standard AWS environment): `store.uri: s3://…`
puts the store and the vector cache in a bucket; `data_dir: s3://bucket/kb` puts everything there."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kbflow import api
from kbflow.config import load_config
from kbflow.core.errors import ConfigError
from kbflow.mcp.server import Tools, inline_limit
from kbflow.core.trust import SourcePolicy
from kbflow.ops.prune import prune
from kbflow.stores.lancedb_store import LanceStore
from tests.flows.conftest import DIM

CONTENT = ["chunk_id", "source_path", "ordinal", "heading_path", "text", "text_tokens", "embed_sha256", "vector"]


def _rows(uri: str) -> list[dict]:
    return LanceStore(uri, "default", DIM).rows(CONTENT).to_pylist()


def _assert_same_rows(a: list[dict], b: list[dict]) -> None:
    """Row for row the same, vectors equal to float noise (the same texts, embedded in other batches)."""
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k != "vector"} == {k: v for k, v in y.items() if k != "vector"}
        assert np.allclose(x["vector"], y["vector"], atol=1e-5)


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

    on_s3 = _rows(uri)
    _assert_same_rows(on_s3, _rows(str(tmp_path / "local" / "lancedb")))
    assert len(on_s3) == first["store"]["count"] == local["store"]["count"]

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


def test_the_whole_knowledge_base_in_a_bucket_and_a_second_fresh_process_finds_it(s3, docs_dir, tmp_path, monkeypatch,
                                                                                   counting):
    """`data_dir: s3://bucket/kb`: tables, manifest, namespace state, run snapshots, chunk plans and the conversion
    cache all in the bucket, nothing on the local disk; then a CI-backfill-shaped second run from a fresh process in
    a fresh working folder embeds nothing and searches; a deletion reaches the bucket; the lock is the bucket's."""
    import json
    import subprocess
    import sys

    from kbflow.state.lock import NamespaceLocked as Locked, namespace_lock
    from kbflow.state.manifest import NamespaceState
    from tests.flows.conftest import subprocess_env

    client, bucket = s3
    data = f"s3://{bucket}/kb"
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    local = api.ingest([str(docs_dir)], data_dir=tmp_path / "local")
    first = api.ingest([str(docs_dir)], data_dir=data)
    assert first["documents"]["new"] == 4 and first["documents"]["failed"] == 0 and first["chunks"]["embedded"] > 0
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/")["Contents"]}
    for prefix in ("kb/state/default/manifest.parquet", "kb/state/default/namespace.json",
                   "kb/state/default/last_run.json", f"kb/runs/default/{first['run_id']}/chunks/part-00000.parquet",
                   f"kb/runs/default/{first['run_id']}/failures.parquet", "kb/state/default/chunk-plans/",
                   "kb/prefect/results/kbflow-convert/", "kb/lancedb/chunks_default.lance/", "kb/lancedb/vectors_"):
        assert any(key.startswith(prefix) for key in keys), prefix
    assert not any(key.endswith("ingest.lock") for key in keys)  # released
    assert list(work.iterdir()) == []  # nothing written where it ran
    _assert_same_rows(_rows(f"{data}/lancedb"), _rows(str(tmp_path / "local" / "lancedb")))
    assert first["store"]["count"] == local["store"]["count"]
    manifest = NamespaceState(data, "default").read_manifest()
    assert manifest.num_rows == 4 and sum(len(ids) for ids in manifest.column("chunk_ids").to_pylist()) == \
        first["store"]["count"]

    fresh = tmp_path / "runner-2"
    fresh.mkdir()
    env = subprocess_env()
    rerun = subprocess.run([sys.executable, "-m", "kbflow", "ingest", str(docs_dir), "--data-dir", data, "--json"],
                           cwd=fresh, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["chunks"]["embedded"] == 0 and summary["documents"]["unchanged"] == 4
    found = subprocess.run([sys.executable, "-m", "kbflow", "search", "how do I restore a backup", "--data-dir", data,
                            "--json"], cwd=fresh, env=env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stdout + found.stderr
    assert json.loads(found.stdout)[0]["source_path"] == "docs/backups.md"
    assert list(fresh.iterdir()) == []

    (docs_dir / "search.md").unlink()
    removed = api.ingest([str(docs_dir)], data_dir=data)
    assert removed["documents"]["removed"] == 1 and removed["chunks"]["deleted"] > 0
    assert all(row["source_path"] != "docs/search.md" for row in _rows(f"{data}/lancedb"))
    assert api.stats(data_dir=data)["documents"] == 3 and [n["namespace"] for n in api.namespaces(data_dir=data)] == \
        ["default"]

    with namespace_lock(NamespaceState(data, "default").root, "default"):
        with pytest.raises(Locked, match="being ingested"):
            api.ingest([str(docs_dir)], data_dir=data)
    report = prune(load_config(data_dir=data), keep_runs=1)
    assert len(report["runs_removed"]["default"]) == 2
    runs = {key.split("/")[3] for key in (o["Key"] for o in client.list_objects_v2(Bucket=bucket,
                                                                                   Prefix="kb/runs/default/")["Contents"])}
    assert runs == {removed["run_id"]}

    cleared = api.clear("default", data_dir=data)  # under the bucket's lock, which the clear must not delete
    assert cleared["chunks_removed"] == removed["store"]["count"]
    left = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/state/default/").get("Contents", [])]
    assert left == [] and api.namespaces(data_dir=data) == []


def test_a_run_whose_lease_lapsed_stops_before_writing(s3, docs_dir, tmp_path, monkeypatch, counting):
    """Before each store write the engine asks the lock whether it still holds the namespace: a lease that could not
    be renewed (this run stalled, another may have taken over) ends the run with nothing written, and the next run
    does the work."""
    from kbflow.state.lock import NamespaceLocked
    from kbflow.state.manifest import NamespaceState
    from kbflow.state.object_lock import ObjectLock

    _, bucket = s3
    data = f"s3://{bucket}/kb"

    def lapsed(self):
        raise NamespaceLocked(f"namespace {self.namespace!r}: this run's lease {self.url} lapsed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ObjectLock, "check", lapsed)
        with pytest.raises(NamespaceLocked, match="lapsed"):
            api.ingest([str(docs_dir)], data_dir=data)
    assert NamespaceState(data, "default").read_manifest().num_rows == 0
    assert LanceStore(f"{data}/lancedb", "default", DIM).count() == 0
    done = api.ingest([str(docs_dir)], data_dir=data)
    assert done["documents"]["new"] == 4 and done["store"]["count"] > 0


S3_KILL_POINTS = ["convert.done=2", "embed.batch_done=3", "upsert.after_store=2", "run.finishing"]


@pytest.mark.parametrize("point", S3_KILL_POINTS)
def test_sigkill_with_the_data_dir_in_a_bucket_then_rerun_equals_a_clean_run(point, s3, crash_corpus, config_file,
                                                                              clean_run, tmp_path):
    """A real SIGKILL of `kbflow ingest` at a failpoint with `--data-dir s3://…`, then a re-run: the bucket ends
    holding what a clean local run holds, row for row, manifest included; the dead run's lease is taken over at
    once (its holder died on this host) and released."""
    from kbflow.flows.ingest import ingest
    from kbflow.state.manifest import NamespaceState
    from kbflow.stores.vector_cache import VectorCache
    from tests.flows.conftest import run_killed

    client, bucket = s3
    data = f"s3://{bucket}/kb"
    clean_dir, clean_summary = clean_run
    run_killed(crash_corpus, data, config_file, point, tmp_path / "killed.log")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/")["Contents"]}
    assert "kb/state/default/ingest.lock" in keys  # the dead run's lease

    model_id = NamespaceState(clean_dir, "default").meta()["model_id"]
    cached_before = VectorCache(f"{data}/lancedb", model_id, 384).count()
    resumed = ingest(sources=[str(crash_corpus)], data_dir=data, config_path=str(config_file))
    assert resumed["documents"]["failed"] == 0
    assert resumed["chunks"]["embedded"] == clean_summary["chunks"]["embedded"] - cached_before
    on_s3 = LanceStore(f"{data}/lancedb", "default", 384).rows()
    local = LanceStore(clean_dir / "lancedb", "default", 384).rows()
    assert on_s3.drop_columns(["vector"]).to_pylist() == local.drop_columns(["vector"]).to_pylist()
    assert np.allclose(np.array(on_s3.column("vector").to_pylist()), np.array(local.column("vector").to_pylist()),
                       atol=1e-5)
    columns = ["doc_id", "source_path", "source_sha256", "chunk_ids"]
    assert NamespaceState(data, "default").read_manifest().select(columns).to_pylist() == \
        NamespaceState(clean_dir, "default").read_manifest().select(columns).to_pylist()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/state/")["Contents"]}
    assert "kb/state/default/ingest.lock" not in keys and "kb/state/default/queue-slot.json" not in keys
    again = ingest(sources=[str(crash_corpus)], data_dir=data, config_path=str(config_file))
    assert again["chunks"]["embedded"] == 0 and again["documents"]["unchanged"] == clean_summary["documents"]["new"]


def test_result_files_in_a_bucket_are_pruned_by_age_from_one_listing(s3):
    from kbflow.state.housekeeping import prune_results

    client, bucket = s3
    for key in ("kb/prefect/results/a", "kb/prefect/results/kbflow-convert/ab/x.json", "kb/state/default/keep.json"):
        client.put_object(Bucket=bucket, Key=key, Body=b"{}")
    assert prune_results(f"s3://{bucket}/kb/prefect/results", max_age_days=1) == 0  # all younger than a day
    time.sleep(1.1)
    assert prune_results(f"s3://{bucket}/kb/prefect/results", max_age_days=1 / 86400) == 2
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/")["Contents"]]
    assert keys == ["kb/state/default/keep.json"]
    assert prune_results(f"s3://{bucket}/kb/nothing-here", max_age_days=0) == 0


def test_an_agent_adds_a_document_to_a_knowledge_base_in_a_bucket_and_qdrant_local_mode_is_refused_there(
        s3, tmp_path, monkeypatch):
    """The MCP `add_document` with inline content writes its inbox file under the data dir: in the bucket when the
    data dir is one, where the next machine finds it (not on this machine's disk). Qdrant's local mode keeps its
    files under the data dir and cannot use a bucket: that is refused with the fix, before anything is written."""
    client, bucket = s3
    data = f"s3://{bucket}/kb"
    config = load_config(data_dir=data)
    tools = Tools(config, namespaces=[], read_only=False, policy=SourcePolicy(), inline_bytes=inline_limit(config))
    monkeypatch.chdir(tmp_path)
    added = tools.add_document(path=None, filename="coffee.md", content="# Coffee\n\nBrew at 93 C for two minutes.\n")
    assert added.documents.new == 1 and added.documents.failed == 0
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/mcp-inbox/")["Contents"]]
    assert keys == ["kb/mcp-inbox/default/coffee.md"]
    assert not any(tmp_path.iterdir())  # nothing on the local disk
    assert api.search("how hot is coffee brewed", data_dir=data, limit=1)[0].source_path == "upload:coffee.md"

    monkeypatch.setenv("KBFLOW__STORE__KIND", "qdrant")
    with pytest.raises(ConfigError, match="store.qdrant_location"):
        api.add_text("Tea brews at 80 C.", "tea", data_dir=data)
    monkeypatch.delenv("KBFLOW__STORE__KIND")
    assert api.stats(data_dir=data)["documents"] == 1  # nothing was written by the refused run
