"""Search of a knowledge base in a bucket reads a local copy of its table (kbflow.stores.mirror), against moto's S3
server on 127.0.0.1: a long-lived searcher sees every completed write (an added document, a cleared namespace),
filters and every mode answer as they do from the bucket itself, and a second process reuses the copy."""

from __future__ import annotations

import numpy as np
import pytest

from kbflow import api
from kbflow.config import load_config
from kbflow.search.searcher import Searcher
from kbflow.bench.search import table_rows
from kbflow.stores import SearchFilter
from kbflow.stores.lancedb_store import LanceStore
from tests.flows.conftest import DIM

TEA = "# Tea\n\nGreen tea brews at 80 C for two minutes.\n"
COFFEE = "# Coffee\n\nCoffee brews at 93 C in a French press for four minutes.\n"


@pytest.fixture
def bucket_kb(s3, tmp_path, monkeypatch):
    client, bucket = s3
    monkeypatch.setenv("KBFLOW__STORE__MIRROR_DIR", str(tmp_path / "mirror"))
    return client, f"s3://{bucket}/kb"


def _sources(hits) -> list[str]:
    return [hit.source_path for hit in hits]


def test_a_long_lived_searcher_of_a_bucket_sees_each_completed_write_and_filters_work(bucket_kb, tmp_path):
    client, data = bucket_kb
    api.add_text(TEA, "tea.md", data_dir=data)
    searcher = Searcher(load_config(data_dir=data))
    mirror = searcher.store.mirror
    assert mirror is not None and mirror.local_db.parent == tmp_path / "mirror"
    assert _sources(searcher.search("green tea temperature", mode="vector", limit=1)) == ["text:tea.md"]
    assert mirror.syncs == 1 and any(mirror.local_table.rglob("*.manifest"))  # read from the local copy
    searcher.search("green tea", mode="bm25", limit=1)
    assert mirror.syncs == 1  # nothing new in the bucket: nothing fetched again

    api.add_text(COFFEE, "coffee.md", data_dir=data)  # another writer; the searcher stays open
    for mode in ("vector", "bm25", "hybrid"):
        assert _sources(searcher.search("coffee french press", mode=mode, limit=1)) == ["text:coffee.md"], mode
    assert mirror.syncs == 2
    only_tea = searcher.search("coffee french press", mode="hybrid", limit=5, where=SearchFilter(source_glob="text:tea*"))
    assert _sources(only_tea) == ["text:tea.md"]
    coffee_id = searcher.search("coffee french press", mode="vector", limit=1)[0].doc_id
    assert _sources(searcher.search("brews", mode="bm25", limit=5, where=SearchFilter(doc_ids=(coffee_id,)))) \
        == ["text:coffee.md"]



def test_a_table_dropped_and_written_again_under_the_same_version_names_is_fetched_again(bucket_kb, tmp_path):
    """The copy compares the newest manifest's ETag, not only its name: a dropped table written again reaches the
    same version numbers with other rows."""
    client, data = bucket_kb
    uri = f"{data}/lancedb"
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    writer = LanceStore(uri, "default", DIM)
    writer.upsert(table_rows(["alpha"], vectors[:2], 2, rng))
    reader = LanceStore(uri, "default", DIM, mirror_dir=tmp_path / "mirror")
    assert reader.search_vector(vectors[0], 1)[0].text == "alpha"
    writer.clear()
    writer = LanceStore(uri, "default", DIM)
    writer.upsert(table_rows(["beta"], vectors[2:], 2, rng))
    assert [hit.text for hit in reader.search_vector(vectors[0], 2)] == ["beta", "beta"]
    writer.clear()
    assert reader.search_vector(vectors[0], 1) == []


def test_a_second_process_reuses_the_copy_and_fetches_only_new_files(bucket_kb):
    client, data = bucket_kb
    api.add_text(TEA, "tea.md", data_dir=data)
    first = Searcher(load_config(data_dir=data))
    assert _sources(first.search("green tea", limit=1)) == ["text:tea.md"]
    copied = {p.name for p in (first.store.mirror.local_table / "data").iterdir()}
    api.add_text(COFFEE, "coffee.md", data_dir=data)

    second = Searcher(load_config(data_dir=data))  # as a new process: the same copy on disk, nothing in memory
    fetched = []
    fs = second.store.mirror.fs
    original = fs.get_file
    fs.get_file = lambda remote, local, **kw: (fetched.append(remote), original(remote, local, **kw))[1]
    try:
        assert _sources(second.search("coffee french press", limit=1)) == ["text:coffee.md"]
    finally:
        del fs.get_file
    assert any("/data/" in path for path in fetched)  # the new rows
    assert not {path.rsplit("/", 1)[-1] for path in fetched} & copied  # and nothing the first one copied


def test_search_with_the_copy_off_reads_the_bucket(bucket_kb, monkeypatch):
    client, data = bucket_kb
    monkeypatch.setenv("KBFLOW__STORE__MIRROR", "false")
    api.add_text(TEA, "tea.md", data_dir=data)
    searcher = Searcher(load_config(data_dir=data))
    assert searcher.store.mirror is None
    assert _sources(searcher.search("green tea", limit=1)) == ["text:tea.md"]


@pytest.mark.parametrize("copy", ["on", "off"])
def test_a_long_lived_searcher_of_a_bucket_follows_a_namespace_made_again_with_another_model(bucket_kb, monkeypatch,
                                                                                             copy):
    """`kbflow mcp` on a bucket keeps its searcher for days. Another process clears the namespace and ingests it
    again with another model of the same dimension (MiniLM, then e5: both 384-d): the query is embedded by the new
    model, never by the old one into the new vectors. With the table copy on, its fetching the new table is the
    sign to read the namespace's record; with it off, the record is read every search."""
    client, data = bucket_kb
    monkeypatch.setenv("KBFLOW__STORE__MIRROR", "true" if copy == "on" else "false")
    for text, name in ((TEA, "tea.md"), (COFFEE, "coffee.md")):
        api.add_text(text, name, data_dir=data)  # the suite's MiniLM
    monkeypatch.delenv("KBFLOW__EMBEDDER__BACKEND")  # the searcher's embedder.backend: auto, the namespace's own
    searcher = Searcher(load_config(data_dir=data))
    assert searcher.embedder.model_id.startswith("st:") and (searcher.store.mirror is not None) == (copy == "on")
    assert _sources(searcher.search("coffee french press", mode="vector", limit=1)) == ["text:coffee.md"]

    monkeypatch.setenv("KBFLOW__EMBEDDER__BACKEND", "e5")  # another writer, another model
    api.clear("default", data_dir=data)
    for text, name in ((TEA, "tea.md"), (COFFEE, "coffee.md")):
        api.add_text(text, name, data_dir=data)
    hits = searcher.search("coffee french press", mode="vector", limit=1)
    assert searcher.embedder.model_id.startswith("e5small-")
    # the query in e5's space: the cosine e5 gives the pair (MiniLM's query vector against e5's scores near 0)
    expected = float(searcher.embedder.embed_passages([hits[0].text])[0] @ searcher.embedder.embed_query(
        "coffee french press"))
    assert _sources(hits) == ["text:coffee.md"] and abs(hits[0].score - expected) < 1e-3, (hits[0].score, expected)


def test_a_hybrid_query_of_a_bucket_asks_for_the_newest_version_once_and_syncs_the_copy_once(bucket_kb):
    """Both halves of a hybrid query read one version of the table: one request for the bucket's newest manifest
    per query, not one per half. Searches at once (the BM25 half runs on its own thread, `kbflow mcp` answers
    requests in threads) bring the copy up to date one at a time: a second one waits and finds it current."""
    import threading
    import time

    client, data = bucket_kb
    api.add_text(TEA, "tea.md", data_dir=data)
    searcher = Searcher(load_config(data_dir=data))
    mirror = searcher.store.mirror
    asked = []
    newest = mirror.newest_manifest
    mirror.newest_manifest = lambda: asked.append(1) or newest()
    assert _sources(searcher.search("green tea temperature", mode="hybrid", limit=1)) == ["text:tea.md"]
    assert len(asked) == 1 and mirror.syncs == 1

    api.add_text(COFFEE, "coffee.md", data_dir=data)
    inside, most = [0], [0]
    sync = mirror._sync

    def slow_sync(marker):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.3)  # long enough for the other thread to arrive meanwhile
        try:
            sync(marker)
        finally:
            inside[0] -= 1

    mirror._sync = slow_sync
    tables = []
    threads = [threading.Thread(target=lambda: tables.append(mirror.table())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1 and mirror.syncs == 2 and tables[0] is tables[1] is not None
