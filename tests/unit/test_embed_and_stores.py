import numpy as np
import pyarrow as pa
import pytest

from kbflow.embed.base import check_vectors
from kbflow.stores.vector_cache import VectorCache
from kbflow.core.errors import EmbeddingError
from kbflow.core.schemas import store_schema
from kbflow.stores.lancedb_store import LanceStore
from kbflow.stores.qdrant_store import QdrantStore


@pytest.fixture(params=["lancedb", "qdrant"])
def make_store(request, tmp_path):
    """Both stores behind the one interface: LanceDB embedded, Qdrant in its real local mode."""
    if request.param == "lancedb":
        return lambda namespace: LanceStore(tmp_path / "lancedb", namespace, 4)
    return lambda namespace: QdrantStore(str(tmp_path / "qdrant"), namespace, 4)


def test_check_vectors_refuses_zero_nan_and_wrong_shape():
    good = np.ones((2, 4), np.float32)
    assert check_vectors(good, 2, 4, "m").shape == (2, 4)
    with pytest.raises(EmbeddingError, match="zero vector"):
        check_vectors(np.vstack([good[0], np.zeros(4)]), 2, 4, "m")
    with pytest.raises(EmbeddingError, match="NaN"):
        check_vectors(np.array([[np.nan] * 4, [1] * 4]), 2, 4, "m")
    with pytest.raises(EmbeddingError, match="shape"):
        check_vectors(np.ones((2, 3)), 2, 4, "m")


def test_packaged_model_embeds_offline_normalised(real_embedder):
    vectors = real_embedder.embed_documents(["PostgreSQL uses MVCC.", "数据库备份"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    query = real_embedder.embed_query("multiversion concurrency control")
    assert float(query @ vectors[0]) > float(query @ vectors[1])


def test_overlong_text_is_refused_not_truncated(real_embedder):
    with pytest.raises(EmbeddingError, match="would be truncated"):
        real_embedder.embed_documents(["word " * 400])


def ids(doc_id, n=3):
    """Chunk ids are 32 hex digits, as the chunker makes them."""
    return [f"{ord(doc_id):016x}{i:016x}" for i in range(n)]


def rows_for(doc_id, texts, dim=4):
    vectors = np.random.default_rng(0).random((len(texts), dim)).astype(np.float32) + 0.1
    return pa.Table.from_pylist([{
        "chunk_id": ids(doc_id, len(texts))[i], "doc_id": doc_id, "source_path": f"{doc_id}.md", "ordinal": i,
        "heading_path": ["H"], "text": text, "text_tokens": text.lower(), "char_start": 0, "char_end": len(text), "n_tokens": 3,
        "embed_sha256": f"sha-{text}", "vector": vectors[i].tolist(),
    } for i, text in enumerate(texts)], schema=store_schema(dim))


def test_replace_documents_is_idempotent_and_drops_stale_chunks(make_store):
    store = make_store("ns")
    store.replace_documents(["a"], rows_for("a", ["one", "two", "three"]))
    store.replace_documents(["a"], rows_for("a", ["one", "two", "three"]))
    assert store.count() == 3
    store.replace_documents(["a"], rows_for("a", ["one"]))
    assert store.chunk_ids().column("chunk_id").to_pylist() == [ids("a")[0]]
    store.replace_documents(["b"], rows_for("b", ["x"]))
    assert store.delete_documents(["a"]) == 1 and store.count() == 1
    hits = store.search_vector(np.ones(4, np.float32), 5)
    assert [hit.doc_id for hit in hits] == ["b"] and -1.0 <= hits[0].score <= 1.0


def test_replace_documents_writes_only_rows_that_differ_from_the_stored_ones(make_store):
    """A changed document rewrites the chunks that changed, not all of them (issue 22): a chunk id fixes the text,
    but its position, heading path, BM25 words and the text the model read can change under the same id."""
    store = make_store("ns")
    texts = ["one", "two", "three"]
    assert store.replace_documents(["a"], rows_for("a", texts)) == 3
    assert store.replace_documents(["a"], rows_for("a", texts)) == 0
    for column, value in [("ordinal", 7), ("heading_path", ["H", "Sub"]), ("char_start", 1), ("char_end", 2),
                          ("n_tokens", 4), ("source_path", "moved.md"), ("text", "two!"), ("text_tokens", "two 2"),
                          ("embed_sha256", "sha-other")]:
        changed = rows_for("a", texts).to_pylist()
        changed[1][column] = value
        changed[1]["vector"] = [0.6, 0.0, 0.8, 0.0]  # unit length: Qdrant normalises what it stores for cosine
        assert store.replace_documents(["a"], pa.Table.from_pylist(changed, schema=store_schema(4))) == 1, column
        row = {r["chunk_id"]: r for r in store.rows().to_pylist()}[ids("a")[1]]
        assert row[column] == value and row["vector"] == pytest.approx([0.6, 0.0, 0.8, 0.0], abs=1e-6), column
        assert store.replace_documents(["a"], rows_for("a", texts)) == 1, column  # and back
    assert store.replace_documents(["a"], rows_for("a", ["one", "two"])) == 0 and store.count() == 2
    assert store.rows(["chunk_id", "text", "ordinal"]) == rows_for("a", ["one", "two"]).select(["chunk_id", "text", "ordinal"])


def test_namespaces_are_separate(make_store):
    alpha, beta = make_store("alpha"), make_store("beta")
    alpha.replace_documents(["a"], rows_for("a", ["one"]))
    beta.replace_documents(["b"], rows_for("b", ["two", "three"]))
    beta.clear()
    assert alpha.count() == 1 and beta.count() == 0


def test_vector_cache_bulk_lookup(tmp_path, monkeypatch):
    cache = VectorCache(tmp_path, "model-x", 4)
    assert cache.lookup(["k1"]) == {}
    keys = [f"k{i}" for i in range(1200)]
    vectors = np.arange(1200 * 4, dtype=np.float32).reshape(1200, 4) + 1
    cache.add(keys, vectors)
    queries = []
    search = cache.table.search

    def counted(*args, **kwargs):  # every query the cache makes goes through its table's search()
        queries.append(args)
        return search(*args, **kwargs)

    monkeypatch.setattr(cache.table, "search", counted)
    found = cache.lookup(keys[::3] + ["absent"])
    assert len(found) == 400 and "absent" not in found
    assert np.array_equal(found["k3"], vectors[3])
    # bulk: one IN (...) query per 500 distinct keys, never one per key
    assert len(queries) == 1  # 401 keys
    queries.clear()
    found = cache.lookup(keys[:600] + keys[:600])  # 600 distinct keys, each asked twice
    assert len(found) == 600 and len(queries) == 2
    queries.clear()
    assert len(cache.lookup(keys)) == 1200 and len(queries) == 3
