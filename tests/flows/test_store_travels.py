"""A store sent to another process (runner.kind processes or dask) is the store the config made: its index and
search settings, and an ingest's deferred vector index, travel with it (kbflow.engine.portable); without them a write in
a worker would build a vector index mid-run with LanceDB's defaults. Today an ingest writes from the flow's own
process (the engine runs its writes, it submits only conversions and embeddings), so the ingest below proves the
outcome on the processes runner whichever process writes, and the spawned-process tests prove the recipe."""

from __future__ import annotations

import multiprocessing
import pickle
import shutil
from concurrent.futures import ProcessPoolExecutor

import cloudpickle
import pytest

from kbflow.engine import portable
from kbflow.stores.lancedb_store import LanceStore
from kbflow.stores.qdrant_store import QdrantStore
from tests.conftest import CASES

LANCE = {"vector_index_min_rows": 7, "vector_index_type": "IVF_HNSW_SQ", "ann_nprobes": 5, "ann_ef": 64,
         "ann_refine_factor": 3, "exact_in_memory_rows": 100}
QDRANT = {"api_key_env": "TEAM_QDRANT_KEY", "bm25": (0.9, 0.4, 80.0)}


def _seen(payload: bytes, names: list[str]) -> dict:
    """In another process: the store ``payload`` unpickles to, as its settings."""
    store = pickle.loads(payload)
    return {name: getattr(store, name) for name in names}


def _in_a_spawned_process(store, names: list[str]) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_seen, cloudpickle.dumps(store), names).result(timeout=300)


def test_a_lancedb_store_arrives_in_another_process_with_its_settings_and_deferred_index(tmp_path):
    portable.register()
    store = LanceStore(tmp_path / "lancedb", "ns", 384, **LANCE)
    store.defer_vector_index = True  # an ingest's batches
    seen = _in_a_spawned_process(store, [*LANCE, "defer_vector_index", "uri", "namespace", "dimension"])
    assert seen == {**LANCE, "defer_vector_index": True, "uri": store.uri, "namespace": "ns", "dimension": 384}


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection", "ignore:Failed to obtain server")
def test_a_qdrant_server_store_arrives_with_its_bm25_settings_and_only_its_key_variables_name(tmp_path,
                                                                                             monkeypatch):
    portable.register()
    monkeypatch.setenv("TEAM_QDRANT_KEY", "secret-never-pickled")
    store = QdrantStore("http://127.0.0.1:9", "ns", 384, QDRANT["api_key_env"], *QDRANT["bm25"])
    assert b"secret-never-pickled" not in cloudpickle.dumps(store)
    seen = _in_a_spawned_process(store, [*QDRANT, "location", "namespace", "dimension"])
    assert seen == {**QDRANT, "location": "http://127.0.0.1:9", "namespace": "ns", "dimension": 384}


def test_an_ingest_on_the_processes_runner_builds_the_configured_vector_index_once_after_its_last_write(tmp_path):
    """Every batch is its own write (doc_batch 1); the table is past vector_index_min_rows after the first. The
    vector index must appear only once every row is written, and be the configured type, not LanceDB's default."""
    import lancedb

    from kbflow.config import load_config
    from kbflow.flows.ingest import ingest
    from kbflow.tasks.runners import with_task_runner

    docs = tmp_path / "docs"
    shutil.copytree(CASES / "docs", docs)
    config_path = tmp_path / "processes.yaml"
    config_path.write_text(f"data_dir: {tmp_path / 'data'}\nflow:\n  doc_batch: 1\nrunner:\n  kind: processes\n"
                           "search:\n  vector_index_min_rows: 2\n  vector_index_type: IVF_HNSW_SQ\n")
    flow = with_task_runner(ingest, load_config(config_path))
    assert type(flow.task_runner).__name__ == "ProcessPoolTaskRunner"
    summary = flow(sources=[str(docs)], config_path=str(config_path))
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0, summary

    table = lancedb.connect(tmp_path / "data" / "lancedb").open_table("chunks_default")
    final_rows = table.count_rows()
    history = []  # (version, rows, vector index types)
    for version in sorted(entry["version"] for entry in table.list_versions()):
        table.checkout(version)
        history.append((version, table.count_rows(),
                        [config.index_type for config in table.list_indices() if config.columns == ["vector"]]))
    indexed = [entry for entry in history if entry[2]]
    assert indexed, history
    assert all(rows == final_rows for _, rows, _ in indexed), f"a vector index before the last write: {history}"
    assert len({rows for _, rows, _ in history if rows}) >= 4, history  # a write per document
    assert {kind.replace("_", "").upper() for _, _, kinds in indexed for kind in kinds} == {"IVFHNSWSQ"}, history
