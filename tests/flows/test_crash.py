"""A real SIGKILL in the middle of a run, then a second run: the store ends as a clean single run leaves it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from flows.ingest import ingest
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES


def corpus(tmp_path):
    docs = tmp_path / "corpus"
    shutil.copytree(CASES / "docs", docs / "docs")
    shutil.copytree(CASES / "formats", docs / "formats")
    return docs


def contents(data_dir):
    rows = LanceStore(data_dir / "lancedb", "default", 384).rows(["chunk_id", "doc_id", "text", "embed_sha256"])
    return rows.to_pylist()


def test_sigkill_during_embedding_then_rerun_equals_a_clean_run(tmp_path, counting):
    docs = corpus(tmp_path)
    killed_dir = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "kbflow.cli", "ingest", str(docs), "--data-dir", str(killed_dir), "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PREFECT_LOGGING_LEVEL": "ERROR"})
    deadline = time.time() + 300
    # the chunks snapshot is written right before embedding starts: kill while the model is embedding
    while time.time() < deadline and not list(killed_dir.glob("runs/default/*/chunks/part-00000.parquet")):
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    time.sleep(1.0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert (killed_dir / "state" / "default" / "ingest.lock").exists()  # left behind by the dead run
    assert not (killed_dir / "state" / "default" / "manifest.parquet").exists()  # killed before any upsert finished

    resumed = ingest(sources=[str(docs)], data_dir=str(killed_dir))  # takes over the dead run's lock
    clean = ingest(sources=[str(docs)], data_dir=str(tmp_path / "clean"))
    assert resumed["documents"]["failed"] == clean["documents"]["failed"] == 0
    assert contents(killed_dir) == contents(tmp_path / "clean")
    ids = [row["chunk_id"] for row in contents(killed_dir)]
    assert len(ids) == len(set(ids))
    again = ingest(sources=[str(docs)], data_dir=str(killed_dir))
    assert again["chunks"]["embedded"] == 0 and again["documents"]["unchanged"] == clean["documents"]["new"]
