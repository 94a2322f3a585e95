"""The read side of both stores: BM25 with Chinese words, filters, upsert/delete/stats, LanceDB's indexes."""

import os
import uuid

import numpy as np
import pyarrow as pa
import pytest

from kbflow.core.errors import ConfigError
from kbflow.core.schemas import store_schema
from kbflow.search.tokens import tokens_text, words
from kbflow.stores import SearchFilter
from kbflow.stores.lancedb_store import LanceStore
from kbflow.stores.qdrant_store import QdrantStore

DIM = 8
TEXTS = {  # doc -> (source path, heading path, texts)
    "a": ("docs/backup/pg.md", ["Backup", "pg_dump"], ["使用 pg_dump 命令备份数据库", "恢复数据库需要 psql 命令"]),
    "b": ("docs/net/ssh.md", ["Network"], ["ssh 命令用于远程登录服务器", "scp copies files between hosts"]),
    "c": ("notes/tar.md", ["Backup", "tar"], ["tar 命令可以打包和压缩文件", "the tar archive format"]),
}


def rows(doc_ids, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for doc_id in doc_ids:
        source, heading, texts = TEXTS[doc_id]
        for i, text in enumerate(texts):
            vector = rng.normal(size=DIM).astype(np.float32)
            records.append({
                "chunk_id": f"{ord(doc_id):016x}{i:016x}", "doc_id": doc_id, "source_path": source, "ordinal": i,
                "heading_path": heading, "text": text, "text_tokens": tokens_text(text), "char_start": 0,
                "char_end": len(text), "n_tokens": 5, "embed_sha256": f"{doc_id}{i}",
                "vector": (vector / np.linalg.norm(vector)).tolist()})
    return pa.Table.from_pylist(records, schema=store_schema(DIM))


@pytest.fixture(params=["lancedb", "qdrant", "qdrant-server"])
def store(request, tmp_path):
    if request.param == "lancedb":
        store = LanceStore(tmp_path / "lancedb", "ns", DIM)
    elif request.param == "qdrant":
        store = QdrantStore(str(tmp_path / "qdrant"), "ns", DIM)
    else:  # a real server (payload indexes, HNSW): only where one is reachable
        if not os.environ.get("QDRANT_URL"):
            pytest.skip("QDRANT_URL is not set: no Qdrant server to test against")
        store = QdrantStore(os.environ["QDRANT_URL"], f"test-{uuid.uuid4().hex[:8]}", DIM)
        request.addfinalizer(store.clear)
    table = rows("abc")
    store.replace_documents(list("abc"), table)
    store.vectors = {r["chunk_id"]: np.array(r["vector"], np.float32) for r in table.to_pylist()}
    return store


def jieba_dictionary() -> set[str]:
    """The words of the dictionary jieba segments with (the one kbflow.search.tokens loads)."""
    import jieba

    with jieba.dt.get_dict_file() as handle:
        return {line.split()[0] for line in handle.read().decode("utf-8").splitlines() if line.strip()}


def is_cjk(word: str) -> bool:
    return all("\u4e00" <= char <= "\u9fff" for char in word)


def test_words_segment_chinese_and_lowercase_latin():
    """The contract of kbflow.search.tokens, not a copy of today's output: words are lower-cased pieces of the text,
    punctuation goes, Chinese runs are cut into dictionary words (search mode: long words and their parts), and
    the longest words put back together give the text again."""
    dictionary = jieba_dictionary()
    text = "使用pg_dump命令备份数据库"
    found = words(text)
    assert all(word in text.lower() for word in found)  # pieces of the text, nothing invented
    assert {"pg", "dump"} <= set(found) and "_" not in "".join(found)  # '_' is no word character
    chinese = [word for word in found if is_cjk(word)]
    assert chinese and all(word in dictionary for word in chinese)  # dictionary words, not the whole run
    assert "命令备份数据库" not in dictionary
    # search mode keeps a long dictionary word whole and adds its parts that are dictionary words too
    assert "数据库" in dictionary and "数据库" in found
    parts = {"数据库"[i:i + 2] for i in range(2)} & dictionary
    assert parts and parts <= set(found)
    # the text without punctuation is tiled by the longest words: nothing was lost, nothing overlaps
    rest, position = "使用pgdump命令备份数据库", 0
    while position < len(rest):
        word = max((w for w in found if rest.startswith(w, position)), key=len, default=None)
        assert word is not None, (rest[position:], found)
        position += len(word)
    # a query is cut the same way, so its words meet the indexed text's words
    assert {"备份", "数据库"} <= set(words("如何备份数据库")) & set(found)
    assert words("The TAR archive, v1.2!") == ["the", "tar", "archive", "v1.2"]  # lower-cased, ',' and '!' gone


def test_bm25_matches_chinese_words_not_whole_sentences(store):
    hits = store.search_text(words("如何备份数据库"), 10)
    assert [h.chunk_id[-1] for h in hits][:1] == ["0"] and hits[0].doc_id == "a"  # 备份 + 数据库 both match
    assert {h.doc_id for h in hits} == {"a"}  # 恢复数据库 (a#1) shares 数据库; nothing else shares a word
    assert hits[0].score > hits[-1].score > 0
    assert store.search_text(words("完全无关的词语"), 10) == []


def test_bm25_idf_prefers_the_rarer_word(store):
    # 命令 occurs in 4 chunks, 压缩 in one: the chunk holding 压缩 must win
    hits = store.search_text(words("命令 压缩"), 10)
    assert hits[0].doc_id == "c" and hits[0].text.startswith("tar 命令")
    assert len(hits) == 4


def test_filters_apply_to_vector_and_text_search(store):
    query = store.vectors[f"{ord('b'):016x}{0:016x}"]
    by_glob = store.search_vector(query, 10, SearchFilter(source_glob="docs/*"))
    assert {h.doc_id for h in by_glob} == {"a", "b"} and by_glob[0].doc_id == "b"
    by_heading = store.search_vector(query, 10, SearchFilter(heading_prefix=("Backup",)))
    assert {h.doc_id for h in by_heading} == {"a", "c"}
    assert {h.doc_id for h in store.search_vector(query, 10, SearchFilter(heading_prefix=("Backup", "tar")))} == {"c"}
    assert store.search_vector(query, 10, SearchFilter(heading_prefix=("tar",))) == []  # a prefix, not any element
    assert {h.doc_id for h in store.search_vector(query, 10, SearchFilter(doc_ids=("c", "b")))} == {"b", "c"}
    assert store.search_vector(query, 10, SearchFilter(source_glob="nothing/*")) == []
    text_hits = store.search_text(words("命令"), 10, SearchFilter(source_glob="docs/*.md", heading_prefix=("Backup",)))
    assert {h.doc_id for h in text_hits} == {"a"}
    assert {h.doc_id for h in store.search_text(words("命令"), 10, SearchFilter(source_glob="*/t?r.md"))} == {"c"}


def test_vector_search_exact_score_is_cosine(store):
    chunk_id, vector = next(iter(store.vectors.items()))
    hit = store.search_vector(vector, 1, exact=True)[0]
    assert hit.chunk_id == chunk_id and hit.score == pytest.approx(1.0, abs=1e-5)


def test_one_documents_rows_are_read_through_a_filter(store):
    found = store.document_rows("c", ["chunk_id", "ordinal", "text", "heading_path"]).sort_by("ordinal").to_pylist()
    assert [row["text"] for row in found] == list(TEXTS["c"][2]) and found[0]["heading_path"] == ["Backup", "tar"]
    assert store.document_rows("nope", ["chunk_id"]).num_rows == 0
    assert store.document_rows("c'; --", ["chunk_id"]).num_rows == 0  # a quote in an id is data, not SQL


def test_upsert_delete_and_stats(store):
    assert store.stats()["rows"] == 6 and store.stats()["documents"] == 3
    changed = rows("b", seed=1).to_pylist()
    changed[0]["text"] = changed[0]["text_tokens"] = "rsync mirrors folders"
    store.upsert(pa.Table.from_pylist(changed, schema=store_schema(DIM)))
    assert store.count() == 6
    assert [h.doc_id for h in store.search_text(["rsync"], 5)] == ["b"]
    assert store.search_text(["ssh"], 5) == []  # the overwritten text is gone from the BM25 index too
    assert store.delete_documents(["b"]) == 2
    assert store.stats()["documents"] == 2 and store.search_text(["rsync"], 5) == []


def test_glob_character_classes_are_refused(tmp_path):
    store = LanceStore(tmp_path / "l", "ns", DIM)
    store.replace_documents(["a"], rows("a"))
    with pytest.raises(ConfigError, match="not supported"):
        store.search_text(["命令"], 5, SearchFilter(source_glob="docs/[ab]*"))


def unit_vectors(n, seed=3):
    vectors = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def numbered_rows(vectors, start, stop):
    """Rows start..stop-1, ten per document, text 'word<i> common'."""
    return pa.Table.from_pylist([{
        "chunk_id": f"{i:032x}", "doc_id": f"d{i // 10}", "source_path": f"s/{i // 10}.md", "ordinal": i % 10,
        "heading_path": [], "text": f"word{i} common", "text_tokens": f"word{i} common", "char_start": 0,
        "char_end": 1, "n_tokens": 2, "embed_sha256": str(i), "vector": vectors[i].tolist()}
        for i in range(start, stop)], schema=store_schema(DIM))


def test_lancedb_builds_indexes_by_size_and_keeps_them_fresh(tmp_path):
    vectors = unit_vectors(600)

    def batch(start, stop):
        return numbered_rows(vectors, start, stop)

    store = LanceStore(tmp_path / "l", "big", DIM, vector_index_min_rows=500, vector_index_type="IVF_FLAT")
    store.upsert(batch(0, 300))
    assert set(store.stats()["indexes"]) == {"text_tokens"}  # full-text from the first write, no vector index yet
    store.upsert(batch(300, 500))
    indexes = store.stats()["indexes"]
    # the new vector index covers all 500; 200 rows wait outside the full-text index (fewer than FTS_STALE_ROWS)
    assert indexes["vector"]["indexed_rows"] == 500 and indexes["text_tokens"]["unindexed_rows"] == 200
    store.upsert(batch(500, 600))  # 100 new rows > 10 % of the table: one optimize updates both indexes
    indexes = store.stats()["indexes"]
    assert indexes["vector"]["unindexed_rows"] == 0 and indexes["text_tokens"]["unindexed_rows"] == 0
    assert [h.text for h in store.search_text(["word555"], 3)] == ["word555 common"]
    ann = store.search_vector(vectors[555], 10)
    exact = store.search_vector(vectors[555], 10, exact=True)
    assert exact[0].chunk_id == f"{555:032x}" and ann[0].chunk_id == exact[0].chunk_id
    assert len({h.chunk_id for h in ann} & {h.chunk_id for h in exact}) >= 8


def test_the_vector_index_has_root_rows_partitions_and_is_trained_again_as_the_table_grows(tmp_path):
    """IVF partitions = sqrt(rows) at training, so a query's cost grows with the root of the table; rows added
    later are folded into the old partitions until the table has grown fourfold, then the index is trained again.
    An index of another type (or one whose training size is unknown) is rebuilt as the configured type."""
    vectors = unit_vectors(2600)

    def vector_index(store):
        return next(c for c in store.table.list_indices() if c.columns == ["vector"])

    store = LanceStore(tmp_path / "l", "grow", DIM, vector_index_min_rows=400)
    store.upsert(numbered_rows(vectors, 0, 400))
    assert (vector_index(store).name, vector_index(store).index_type) == ("vector_ivf20", "IvfFlat")
    store.upsert(numbered_rows(vectors, 400, 1599))  # 1,599 rows < 4 x 20²: updated, not trained again
    assert vector_index(store).name == "vector_ivf20" and store.stats()["indexes"]["vector"]["unindexed_rows"] == 0
    assert store.refresh_indexes() == {}
    store.upsert(numbered_rows(vectors, 1599, 1600))  # 1,600 = 4 x 20²: trained again with sqrt(1600) partitions
    assert vector_index(store).name == "vector_ivf40"
    assert store.stats()["indexes"]["vector"]["indexed_rows"] == 1600
    ann = store.search_vector(vectors[1234], 10)
    assert ann[0].chunk_id == f"{1234:032x}"

    hnsw = LanceStore(tmp_path / "l", "grow", DIM, vector_index_min_rows=400, vector_index_type="IVF_HNSW_SQ")
    # the last row written waits outside the full-text index until an explicit refresh such as this one
    assert hnsw.refresh_indexes() == {"vector": "retrained IVF_HNSW_SQ", "text_tokens": "rebuilt"}
    assert (vector_index(hnsw).name, vector_index(hnsw).index_type) == ("vector_ivf40", "IvfHnswSq")
    hnsw.table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ", replace=True,
                            num_partitions=2)  # as an older kbflow named it: 'vector_idx', training size unknown
    assert vector_index(hnsw).name == "vector_idx"
    assert hnsw.refresh_indexes() == {"vector": "retrained IVF_HNSW_SQ"}
    assert vector_index(hnsw).name == "vector_ivf40" and hnsw.refresh_indexes() == {}
    hnsw.table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ", replace=True,
                            num_partitions=2, name="vector_ivf1")  # a crash between a training and its drop
    assert hnsw.refresh_indexes() == {"vector": "retrained IVF_HNSW_SQ"}
    assert [c.name for c in hnsw.table.list_indices() if c.columns == ["vector"]] == ["vector_ivf40"]


def test_full_text_index_is_updated_by_row_count_not_share(tmp_path, monkeypatch):
    """Every row outside the full-text index is tokenized on every BM25 query (10k of them took a 100k table's
    p50 from 11 to 127 ms), so that index is updated after a fixed number of new rows, not 10 % of the table."""
    from kbflow.stores import lancedb_store

    monkeypatch.setattr(lancedb_store, "FTS_STALE_ROWS", 30)
    vectors = unit_vectors(1000)
    store = LanceStore(tmp_path / "l", "fts", DIM, vector_index_min_rows=10**9)
    store.upsert(numbered_rows(vectors, 0, 900))
    store.upsert(numbered_rows(vectors, 900, 920))  # 20 waiting: under 30 (and 2 % of the table)
    assert store.stats()["indexes"]["text_tokens"]["unindexed_rows"] == 20
    store.upsert(numbered_rows(vectors, 920, 960))  # 60 waiting: over 30, though only 6 % of the table
    assert store.stats()["indexes"]["text_tokens"]["unindexed_rows"] == 0
    assert [h.text for h in store.search_text(["word955"], 3)] == ["word955 common"]
    store.upsert(numbered_rows(vectors, 960, 980))
    assert store.stats()["indexes"]["text_tokens"]["unindexed_rows"] == 20
    # an explicit refresh (the end of every ingest) folds every row in: rows outside the index rank differently
    assert store.refresh_indexes() == {"text_tokens": "rebuilt"}
    assert store.stats()["indexes"]["text_tokens"]["unindexed_rows"] == 0


def test_hnsw_search_deeper_than_its_beam(tmp_path):
    """Regression: an IVF_HNSW index refused a search for more hits than ``ann_ef`` ('ef must be greater than or
    equal to k'); eval searches 200 deep with ann_ef 64."""
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(400, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    table = pa.Table.from_pylist([{
        "chunk_id": f"{i:032x}", "doc_id": f"d{i}", "source_path": f"s/{i}.md", "ordinal": 0, "heading_path": [],
        "text": f"w{i}", "text_tokens": f"w{i}", "char_start": 0, "char_end": 1, "n_tokens": 1,
        "embed_sha256": str(i), "vector": vectors[i].tolist()} for i in range(400)], schema=store_schema(DIM))
    store = LanceStore(tmp_path / "l", "hnsw", DIM, vector_index_min_rows=300, vector_index_type="IVF_HNSW_SQ",
                       ann_ef=16)
    store.upsert(table)
    assert "vector" in store.stats()["indexes"]
    hits = store.search_vector(vectors[7], 100)
    assert len(hits) == 100 and hits[0].chunk_id == f"{7:032x}"



def random_rows(count: int, seed: int, prefix: str = "r") -> pa.Table:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(count, DIM)).astype(np.float32)
    vectors[1] = vectors[0]  # two rows with equal scores for every query
    return pa.Table.from_pylist([
        {"chunk_id": f"{prefix}{i:05d}", "doc_id": f"{prefix}{i // 3}", "source_path": f"docs/{prefix}{i // 3}.md",
         "ordinal": i % 3, "heading_path": ["H", str(i % 4)], "text": f"text {i}", "text_tokens": f"text {i}",
         "char_start": 0, "char_end": 6, "n_tokens": 2, "embed_sha256": f"{prefix}{i}",
         "vector": (v / np.linalg.norm(v)).tolist()} for i, v in enumerate(vectors)], schema=store_schema(DIM))


def test_a_small_unindexed_table_is_searched_from_memory_with_lancedbs_own_exact_hits(tmp_path):
    """The in-memory copy (stores.exact) answers exactly what LanceDB's exact scan answers: the same rows, in the
    same order, with the same cosine scores; a new version is read again, a filter and a bigger table go to
    LanceDB."""
    searched = LanceStore(tmp_path / "lancedb", "ns", DIM, exact_in_memory_rows=500)
    plain = LanceStore(tmp_path / "lancedb", "ns", DIM)  # the same table, searched by LanceDB alone
    searched.upsert(random_rows(300, seed=1))
    queries = np.random.default_rng(2).normal(size=(20, DIM)).astype(np.float32)
    for query in queries:
        for limit in (1, 10, 400):
            mine, theirs = searched.search_vector(query, limit), plain.search_vector(query, limit, exact=True)
            assert searched._exact is not None and searched._exact.vectors is not None  # served from memory
            assert [h.chunk_id for h in mine] == [h.chunk_id for h in theirs] or (  # equal scores: either order
                sorted(h.chunk_id for h in mine) == sorted(h.chunk_id for h in theirs))
            assert np.allclose([h.score for h in mine], [h.score for h in theirs], atol=1e-5)
            assert [(h.doc_id, h.source_path, h.heading_path, h.text) for h in mine[:1]] == \
                [(h.doc_id, h.source_path, h.heading_path, h.text) for h in theirs[:1]]
    copy = searched._exact
    searched.upsert(random_rows(5, seed=3, prefix="new"))  # a new version: its rows are found
    target = np.array(random_rows(5, seed=3, prefix="new").column("vector")[4].as_py(), np.float32)
    assert searched.search_vector(target, 1)[0].chunk_id == "new00004" and searched._exact is not copy
    where = SearchFilter(source_glob="docs/r1*.md")
    assert {h.source_path for h in searched.search_vector(target, 50, where)} <= {f"docs/r{i}.md" for i in
                                                                                 [1] + list(range(10, 20))}
    searched.upsert(random_rows(300, seed=4, prefix="more"))  # 605 rows: over the limit, LanceDB answers
    assert searched.search_vector(target, 1)[0].chunk_id == "new00004"
    assert searched._exact.vectors is None


def test_a_store_open_for_searches_sees_what_another_process_wrote_cleared_and_wrote_again(tmp_path):
    """LanceDB's handle stays at the version it opened: a long-lived searcher must move to the newest one
    itself, from memory or not."""
    import subprocess
    import sys

    searched = LanceStore(tmp_path / "lancedb", "ns", DIM, exact_in_memory_rows=500)
    searched.upsert(random_rows(10, seed=1))
    query = np.array(random_rows(10, seed=1).column("vector")[7].as_py(), np.float32)
    assert searched.search_vector(query, 1)[0].chunk_id == "r00007"

    def other_process(code: str) -> None:
        subprocess.run([sys.executable, "-c", "import sys\nfrom tests.unit.test_search_stores import *\n"
                        f"store = LanceStore(sys.argv[1], 'ns', DIM)\n{code}", str(tmp_path / "lancedb")],
                       check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

    other_process("store.upsert(random_rows(10, seed=1, prefix='x'))")  # the same vectors under other ids
    assert {h.chunk_id for h in searched.search_vector(query, 2)} == {"r00007", "x00007"}
    assert {h.chunk_id for h in searched.search_text(["text", "7"], 2)} == {"r00007", "x00007"}
    version = searched.table.version  # the version its copy in memory was read at
    other_process("store.clear()")
    assert searched.search_vector(query, 2) == [] and searched.search_text(["text"], 2) == []
    # written again up to the same version number: not taken for the copy of the old table
    other_process(f"store.upsert(random_rows(10, seed=1, prefix='y'))\nseed = 10\nwhile store.table.version < "
                  f"{version}:\n    seed += 1\n    store.upsert(random_rows(3, seed=seed, prefix=f'z{{seed}}'))")
    assert searched.table.version == version
    assert [h.chunk_id for h in searched.search_vector(query, 1)] == ["y00007"]
    assert {h.chunk_id for h in searched.search_text(["text", "7"], 1)} == {"y00007"}
