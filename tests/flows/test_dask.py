"""Scale-out: the ingest flow on a real Dask LocalCluster (worker processes on loopback) stores exactly what
the default thread runner stores. Tiny corpus: every worker process loads the model once."""

from __future__ import annotations

import shutil

import distributed  # prefect-dask's hard dependency: if it is missing this module fails, it never skips
import numpy as np

from kbflow.flows.ingest import ingest
from kbflow.config import load_config
from kbflow.stores.lancedb_store import LanceStore
from kbflow.tasks.runners import task_runner_for, with_task_runner
from tests.conftest import CASES


def _config(tmp_path, name: str, runner: str) -> str:
    path = tmp_path / f"{name}.yaml"
    # task_batch 4: the documents' chunks go to the workers as several embed tasks
    path.write_text(f"data_dir: {tmp_path / name}\nembedder:\n  task_batch: 4\n{runner}",
                    encoding="utf-8")
    return str(path)


def _stored(data_dir) -> list[dict]:
    rows = LanceStore(data_dir / "lancedb", "default", 384).rows().to_pylist()
    return sorted(rows, key=lambda row: row["chunk_id"])


def test_dask_cluster_run_stores_what_the_thread_runner_stores(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("backups.md", "search.md"):
        shutil.copy(CASES / "docs" / name, docs / name)

    threads = _config(tmp_path, "threads", "")
    assert task_runner_for(load_config(threads)) is None
    thread_summary = ingest(sources=[str(docs)], config_path=threads)

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        dask = _config(tmp_path, "dask", f"runner:\n  kind: dask\n  dask_address: {cluster.scheduler_address}\n")
        config = load_config(dask)
        flow = with_task_runner(ingest, config)
        assert type(flow.task_runner).__name__ == "DaskTaskRunner"
        dask_summary = flow(sources=[str(docs)], config_path=dask)
        with distributed.Client(cluster.scheduler_address) as client:
            # the model was built inside the worker processes (from the embedder's recipe, its section), not here
            built = client.run(lambda: __import__("kbflow.embed.factory").embed.factory.built_model_ids())

    assert dask_summary["documents"] == thread_summary["documents"] == {
        "new": 2, "changed": 0, "same_text": 0, "unchanged": 0, "removed": 0, "failed": 0}
    assert dask_summary["chunks"] == thread_summary["chunks"]
    assert len(built) == 2 and any(ids for ids in built.values()), built
    by_thread, by_dask = _stored(tmp_path / "threads"), _stored(tmp_path / "dask")
    assert [r["chunk_id"] for r in by_dask] == [r["chunk_id"] for r in by_thread] and by_dask
    for a, b in zip(by_dask, by_thread):
        assert {k: v for k, v in a.items() if k != "vector"} == {k: v for k, v in b.items() if k != "vector"}
        assert np.allclose(a["vector"], b["vector"], atol=1e-5)


def test_dask_workers_that_share_no_disk_ingest_into_a_bucket(s3, tmp_path, monkeypatch):
    """Issue 19.3: the data dir is an S3 URL (moto's server on 127.0.0.1); the cluster's worker processes have only
    their own scratch folders, the flow's process an empty working folder. Everything the run keeps goes to the
    bucket, nothing to a local disk, and the store equals a single-process run's."""
    client, bucket = s3
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("backups.md", "search.md"):
        shutil.copy(CASES / "docs" / name, docs / name)
    thread_summary = ingest(sources=[str(docs)], config_path=_config(tmp_path, "threads", ""))

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    data = f"s3://{bucket}/kb"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, local_directory=str(tmp_path / "scratch")) as cluster:
        path = tmp_path / "dask-s3.yaml"
        path.write_text(f"data_dir: {data}\nembedder:\n  task_batch: 4\nrunner:\n  kind: dask\n"
                        f"  dask_address: {cluster.scheduler_address}\n", encoding="utf-8")
        flow = with_task_runner(ingest, load_config(str(path)))
        summary = flow(sources=[str(docs)], config_path=str(path))
    assert summary["documents"] == thread_summary["documents"] and summary["chunks"] == thread_summary["chunks"]
    assert list(work.iterdir()) == []  # the flow's process and the workers (same working folder) wrote nothing here
    kept = [p for p in (tmp_path / "scratch").rglob("*") if p.suffix in (".parquet", ".lance", ".manifest", ".json")
            and "kbflow" in str(p) or p.name in ("lancedb", "state", "runs")]
    assert kept == []  # nor in their scratch folders
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="kb/")["Contents"]}
    assert any(k.startswith("kb/state/default/manifest.parquet") for k in keys)
    assert any(k.startswith("kb/prefect/results/") for k in keys)  # the workers' cached split/chunk results
    by_dask = sorted(LanceStore(f"{data}/lancedb", "default", 384).rows().to_pylist(), key=lambda r: r["chunk_id"])
    by_thread = _stored(tmp_path / "threads")
    assert [r["chunk_id"] for r in by_dask] == [r["chunk_id"] for r in by_thread] and by_dask
    for a, b in zip(by_dask, by_thread):
        assert {k: v for k, v in a.items() if k != "vector"} == {k: v for k, v in b.items() if k != "vector"}
        assert np.allclose(a["vector"], b["vector"], atol=1e-5)
