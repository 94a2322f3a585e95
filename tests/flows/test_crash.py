"""Real SIGKILLs at every stage boundary and inside embedding and upserting, then a second run: the store,
manifest and stats end exactly as a clean single run leaves them, and finished embedding batches are not redone.

The kill comes from a failpoint (kbflow.runtime.failpoints) inside a real ``kbflow ingest`` subprocess: the process dies
at a known place, with no chance to clean up. Set KBFLOW_CRASH_CORPUS to a folder (for example a few hundred
pages of a real manual) to run the same checks on it; the default is five small real files of tests/cases.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kbflow.flows.ingest import ingest
from kbflow.stores.vector_cache import VectorCache
from kbflow.state.manifest import NamespaceState
from kbflow.state.snapshots import TMP_SUFFIX
from kbflow.stores.lancedb_store import LanceStore
from tests.flows.conftest import run_killed

def contents(data_dir: Path) -> list[dict]:
    """Every stored row but its vector, in chunk-id order."""
    table = LanceStore(data_dir / "lancedb", "default", 384).rows()
    return table.drop_columns(["vector"]).to_pylist()


def vectors(data_dir: Path) -> np.ndarray:
    return np.array(LanceStore(data_dir / "lancedb", "default", 384).rows(["chunk_id", "vector"])
                    .column("vector").to_pylist())


def manifest(data_dir: Path) -> list[dict]:
    table = NamespaceState(data_dir, "default").read_manifest()
    return table.select(["doc_id", "source_path", "source_sha256", "chunk_ids"]).to_pylist()


KILL_POINTS = [
    "plan.written",         # before any conversion
    "convert.done=2",       # stage boundaries inside the second document batch
    "split.done=2",
    "chunk.done=2",
    "embed.batch_done=3",   # in the middle of embedding: two batches finished, others in flight or not started
    "upsert.after_store=2",  # in the middle of upserting: the store holds batch 2, the manifest does not
    "upsert.done=3",
    "run.finishing",        # everything stored; failures snapshot, last run and pruning not yet done
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_then_rerun_equals_a_clean_run(point, crash_corpus, config_file, clean_run, tmp_path):
    clean_dir, clean_summary = clean_run
    killed_dir = tmp_path / "killed"
    run_killed(crash_corpus, killed_dir, config_file, point, tmp_path / "killed.log")
    assert (killed_dir / "state" / "default" / "ingest.lock").exists()  # left behind by the dead run
    # and so is its slot of the namespace's Prefect concurrency limit: the rerun below (a flow run on the same
    # server) must release it because its holder died, not wait for it (it used to wait forever)
    assert (killed_dir / "state" / "default" / "queue-slot.json").exists()
    cache = VectorCache(killed_dir / "lancedb", clean_summary_model(clean_dir), 384)
    cached_before = cache.count()

    resumed = ingest(sources=[str(crash_corpus)], data_dir=str(killed_dir), config_path=str(config_file))

    assert resumed["documents"]["failed"] == 0
    # finished embedding batches are not redone: the resumed run embeds exactly what the cache lacked
    assert resumed["chunks"]["embedded"] == clean_summary["chunks"]["embedded"] - cached_before
    assert contents(killed_dir) == contents(clean_dir)
    assert np.allclose(vectors(killed_dir), vectors(clean_dir), atol=1e-5)  # batch composition may differ
    assert manifest(killed_dir) == manifest(clean_dir)
    assert resumed["store"]["count"] == clean_summary["store"]["count"]
    assert not list(killed_dir.rglob(f"*{TMP_SUFFIX}"))  # the dead run's temporaries were cleaned
    assert not (killed_dir / "state" / "default" / "ingest.lock").exists()
    assert not (killed_dir / "state" / "default" / "queue-slot.json").exists()
    again = ingest(sources=[str(crash_corpus)], data_dir=str(killed_dir), config_path=str(config_file))
    assert again["chunks"]["embedded"] == 0 and again["documents"]["unchanged"] == clean_summary["documents"]["new"]


def clean_summary_model(data_dir: Path) -> str:
    return NamespaceState(data_dir, "default").meta()["model_id"]


def test_sigkill_while_deleting_removed_files(crash_corpus, config_file, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(crash_corpus, corpus)
    data_dir = tmp_path / "data"
    ingest(sources=[str(corpus)], data_dir=str(data_dir), config_path=str(config_file))
    removed = sorted(p for p in corpus.rglob("*") if p.is_file())[0]
    removed.unlink()
    run_killed(corpus, data_dir, config_file, "delete.after_store", tmp_path / "killed.log")
    # the store no longer holds the file, the manifest still lists it: the next run finishes the removal
    resumed = ingest(sources=[str(corpus)], data_dir=str(data_dir), config_path=str(config_file))
    assert resumed["documents"]["removed"] == 1 and resumed["chunks"]["embedded"] == 0
    stored_paths = {row["source_path"] for row in contents(data_dir)}
    assert not any(path.endswith(removed.name) for path in stored_paths)
    assert {row["source_path"] for row in manifest(data_dir)} == stored_paths
