"""A failing run changes nothing but whole documents it finished; two runs on one namespace never overlap;
readers during an ingest see each document's old or new version, never a mix and never nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from kbflow.flows.ingest import ingest
from kbflow import api
from kbflow.runtime import failpoints
from kbflow.state.lock import NamespaceLocked
from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES
from tests.flows.conftest import subprocess_env


def store_rows(data_dir: Path) -> dict[str, list[dict]]:
    """Full stored rows (vectors included) per document."""
    by_doc = defaultdict(list)
    for row in LanceStore(data_dir / "lancedb", "default", 384).rows().to_pylist():
        by_doc[row["doc_id"]].append(row)
    return dict(by_doc)


def manifest_rows(data_dir: Path) -> dict[str, dict]:
    return {row["doc_id"]: row for row in NamespaceState(data_dir, "default").read_manifest().to_pylist()}


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    shutil.copytree(CASES / "docs", root / "docs")
    shutil.copytree(CASES / "formats", root / "formats")
    return root


@pytest.fixture
def small_batches(tmp_path) -> Path:
    path = tmp_path / "batches.yaml"
    # one document per batch, each embedded and written before the next is chunked (no gathering across batches)
    path.write_text("flow:\n  doc_batch: 1\n  max_workers: 1\n  embed_gather_docs: 1\n", encoding="utf-8")
    return path


def test_failed_run_leaves_store_and_manifest_as_before_except_whole_finished_documents(
        corpus, small_batches, tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    ingest(sources=[str(corpus)], data_dir=str(data_dir), config_path=str(small_batches))
    before_store, before_manifest = store_rows(data_dir), manifest_rows(data_dir)

    for name in ("backups.md", "search.md", "chinese.md"):
        path = corpus / "docs" / name
        path.write_text(path.read_text(encoding="utf-8") + "\n\nA paragraph added later, about restores.\n",
                        encoding="utf-8")
    (corpus / "formats" / "crazyones.pdf").unlink()  # removals happen after all batches: never reached here

    monkeypatch.setenv("KBFLOW_FAILPOINTS", "chunk.done=2:raise")  # the second changed document's batch fails
    failpoints.reset()
    with pytest.raises(failpoints.FailpointError):
        ingest(sources=[str(corpus)], data_dir=str(data_dir), config_path=str(small_batches))
    monkeypatch.delenv("KBFLOW_FAILPOINTS")

    after_store, after_manifest = store_rows(data_dir), manifest_rows(data_dir)
    assert set(after_manifest) == set(before_manifest)  # nothing removed, nothing added
    replaced = {doc for doc in after_manifest if after_manifest[doc]["run_id"] != before_manifest[doc]["run_id"]}
    assert len(replaced) == 1  # exactly the first batch's document was finished
    for doc_id, row in after_manifest.items():
        if doc_id in replaced:  # whole: the store holds exactly its new chunks
            assert {r["chunk_id"] for r in after_store[doc_id]} == set(row["chunk_ids"])
            assert any("added later" in r["text"] for r in after_store[doc_id])
        else:  # untouched, to the byte
            assert after_store[doc_id] == before_store[doc_id]
            assert row == before_manifest[doc_id]
    assert not (data_dir / "state" / "default" / "ingest.lock").exists()

    finished = ingest(sources=[str(corpus)], data_dir=str(data_dir), config_path=str(small_batches))
    assert finished["documents"]["changed"] == 2 and finished["documents"]["removed"] == 1


def start_paused(corpus: Path, data_dir: Path, config: Path, point: str, marker: Path,
                 namespace: str = "default") -> subprocess.Popen:
    """``kbflow ingest`` in its own process group (so a test can kill it with anything it starts);
    stderr goes to a file, which a leftover server process cannot hold open the way it holds a pipe."""
    env = subprocess_env(KBFLOW_FAILPOINTS=point, KBFLOW_FAILPOINTS_MARKER=str(marker))
    stderr = open(marker.with_suffix(".log"), "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "kbflow.cli", "ingest", str(corpus), "--data-dir", str(data_dir), "--config",
         str(config), "--namespace", namespace, "--json"],
        stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True)


def log_of(marker: Path) -> str:
    return marker.with_suffix(".log").read_text(errors="replace")[-2000:]


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


HOLD_S = 1800  # a paused writer's longest stand: far beyond any test; the test lets it go (or kills it) itself


def still_paused(process: subprocess.Popen, marker: Path) -> None:
    """The writer has not moved since it reached its failpoint: it is alive and its marker is still there (a pause
    ends only when the test removes the marker, or after HOLD_S)."""
    assert process.poll() is None, f"the paused run ended: {log_of(marker)}"
    assert marker.exists(), "the paused run went on by itself"


def wait_for(marker: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before its failpoint: {log_of(marker)}")
        assert time.time() < deadline, "the run never reached its failpoint"
        time.sleep(0.1)


def test_second_run_on_a_namespace_is_refused_other_namespaces_proceed(docs_dir, small_batches, tmp_path):
    """The engine's namespace lock. A second writer that runs the engine directly (a terminal without a Prefect
    server) is refused once flow.lock_wait_s has passed (1 s here); a second Prefect flow run of the namespace would instead queue on the namespace's
    concurrency slot until the first ends (kbflow.tasks.runs; tests/server covers it), so this test's second and
    third writers run direct."""
    data_dir, marker = tmp_path / "data", tmp_path / "paused"
    direct = tmp_path / "direct.yaml"
    direct.write_text("flow:\n  orchestrator: direct\n  lock_wait_s: 1\n", encoding="utf-8")
    # the writer stands at plan.written (lock held) until the test is done with it: it is killed there, never let go
    first = start_paused(docs_dir, data_dir, small_batches, f"plan.written:pause({HOLD_S})", marker)
    try:
        wait_for(marker, first)
        with pytest.raises(NamespaceLocked, match=rf"pid {first.pid} .* since \d{{4}}-\d\d-\d\d"):
            api.ingest([str(docs_dir)], config=direct, data_dir=data_dir)
        other = ingest(sources=[str(docs_dir)], data_dir=str(data_dir), namespace="other")  # in parallel, a flow run
        assert other["documents"]["new"] == 4 and other["documents"]["failed"] == 0
        still_paused(first, marker)  # all of the above happened while it held the lock at its failpoint
    finally:
        kill_group(first)
    # its owner died: the lock is taken over (by the engine; the dead flow run's concurrency slot would hold a second
    # flow run until its lease ran out)
    taken_over = api.ingest([str(docs_dir)], config=direct, data_dir=data_dir)
    assert taken_over["documents"]["new"] == 4 and taken_over["chunks"]["embedded"] == 0  # vectors came from cache


def sample(data_dir: Path, query: list[float]) -> dict[str, frozenset]:
    """Every document's chunk ids as a reader that opens now sees them (the newest commit); searching works too."""
    store = LanceStore(data_dir / "lancedb", "default", 384)
    snapshot = defaultdict(set)
    for row in store.rows(["chunk_id", "doc_id"]).to_pylist():
        snapshot[row["doc_id"]].add(row["chunk_id"])
    assert store.search_vector(query, 5)
    return {doc: frozenset(ids) for doc, ids in snapshot.items()}


def readers(writer: subprocess.Popen, data_dir: Path, query: list[float], seen: list) -> None:
    """Read every document's chunk ids, and search, over and over until the writer ends."""
    while writer.poll() is None:
        seen.append(sample(data_dir, query))


def test_readers_during_an_ingest_see_old_or_new_documents_never_a_mix(docs_dir, small_batches, tmp_path):
    data_dir, marker = tmp_path / "data", tmp_path / "paused"
    ingest(sources=[str(docs_dir)], data_dir=str(data_dir), config_path=str(small_batches))
    old = {doc: frozenset(r["chunk_id"] for r in rows) for doc, rows in store_rows(data_dir).items()}
    for name in ("backups.md", "search.md"):
        path = docs_dir / name
        path.write_text("# Rewritten\n\n" + " ".join(f"New sentence {i} about replicas." for i in range(60)),
                        encoding="utf-8")

    # one document per batch: the writer stops after its first batch is written (store and manifest) and waits
    writer = start_paused(docs_dir, data_dir, small_batches, f"upsert.done=1:pause({HOLD_S})", marker)
    seen: list[dict[str, frozenset]] = []
    query = LanceStore(data_dir / "lancedb", "default", 384).rows(["chunk_id", "vector"]).column("vector")[0].as_py()
    try:
        wait_for(marker, writer)
        assert marker.read_text(encoding="utf-8") == "upsert.done"
        between = [sample(data_dir, query) for _ in range(5)]  # while it stands between its two batches
        manifest = manifest_rows(data_dir)
        still_paused(writer, marker)  # so every sample above was taken between the batches
        marker.unlink()  # let it go on
        readers(writer, data_dir, query, seen)
        writer.wait(timeout=300)
    finally:
        kill_group(writer)
    assert writer.returncode == 0, log_of(marker)
    new = {doc: frozenset(r["chunk_id"] for r in rows) for doc, rows in store_rows(data_dir).items()}
    changed = {doc for doc in old if old[doc] != new[doc]}
    assert len(changed) == 2
    # between the batches: the first batch's document is new (in the store and in the manifest), the other old
    [first] = [doc for doc in changed if set(manifest[doc]["chunk_ids"]) == new[doc]]
    [second] = changed - {first}
    assert set(manifest[second]["chunk_ids"]) == old[second]
    for snapshot in between:
        assert snapshot == {doc: (new[doc] if doc == first else old[doc]) for doc in old}
    for snapshot in between + seen:
        assert set(snapshot) == set(old)  # no document ever vanished or appeared
        for doc, ids in snapshot.items():
            assert ids in (old[doc], new[doc]), f"document {doc} showed a mix of versions"
