import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbflow.chunk.chunker import chunk_document
from kbflow.chunk.split import split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter


@pytest.fixture(scope="module")
def counter(real_embedder):
    return real_embedder.token_counter()


def chunks_of(markdown, counter, chunk_tokens=64, overlap=8, prefix=True):
    return chunk_document("doc", markdown, split_markdown(markdown), counter, chunk_tokens, overlap, prefix)


def covered_in_order(markdown, chunks):
    """Every non-space character of the input lies in some chunk, and chunk spans are in order
    (thematic breaks are boundaries, navigation is links without text of its own: neither is content)."""
    covered = [False] * len(markdown)
    for block in split_markdown(markdown):
        if block.kind in ("break", "navigation"):
            covered[block.char_start:block.char_end] = [True] * (block.char_end - block.char_start)
    for chunk in chunks:
        assert markdown[chunk.char_start:chunk.char_end] == chunk.text
        for i in range(chunk.char_start, chunk.char_end):
            covered[i] = True
    missing = [markdown[i] for i in range(len(markdown)) if not covered[i] and not markdown[i].isspace()]
    assert not missing, "".join(missing)[:80]
    starts = [c.char_start for c in chunks]
    assert starts == sorted(starts)


def test_short_paragraph_then_oversize_paragraph_terminates(counter):
    # the seed design looped forever here, and emitted the long paragraph whole
    long = " ".join(f"Sentence number {i} explains one more detail of the system." for i in range(200))
    markdown = f"Short intro.\n\n{long}\n"
    chunks = chunks_of(markdown, counter)
    assert len(chunks) > 10
    assert all(c.n_tokens <= 64 for c in chunks)
    covered_in_order(markdown, chunks)


def test_chinese_paragraph_splits_at_sentence_marks(counter):
    sentence = "数据库在每天晚上自动备份，备份文件保存七天。"
    markdown = sentence * 40
    chunks = chunks_of(markdown, counter, chunk_tokens=48, overlap=0, prefix=False)
    assert len(chunks) > 1
    assert all(c.n_tokens <= 48 for c in chunks)
    assert all(c.text.endswith("。") for c in chunks)
    covered_in_order(markdown, chunks)


def test_text_without_any_punctuation_is_cut_hard_but_never_over_limit(counter):
    markdown = "x" * 5000 + "\n\n" + "中" * 3000
    chunks = chunks_of(markdown, counter, chunk_tokens=32, overlap=4)
    assert all(c.n_tokens <= 32 for c in chunks)
    covered_in_order(markdown, chunks)


def test_code_block_over_limit_is_cut_at_line_ends(counter):
    code = "```python\n" + "\n".join(f"value_{i} = compute(value_{i - 1}, {i})" for i in range(1, 80)) + "\n```\n"
    chunks = chunks_of(code, counter, chunk_tokens=64, overlap=0, prefix=False)
    assert len(chunks) > 1
    for chunk in chunks:
        for line in chunk.text.splitlines():
            assert line.startswith(("```", "value_")), line


def test_table_over_limit_is_cut_between_rows(counter):
    table = "| name | value |\n|---|---|\n" + "\n".join(f"| setting_{i} | {i * 7} units |" for i in range(80))
    chunks = chunks_of(table, counter, chunk_tokens=64, overlap=0, prefix=False)
    assert len(chunks) > 1
    for chunk in chunks:
        assert all(line.startswith("|") and line.endswith("|") for line in chunk.text.splitlines())


def test_heading_prefix_is_embedded_not_stored(counter):
    markdown = "# Backups\n\n## Retention\n\nKeep seven daily copies.\n"
    chunks = chunks_of(markdown, counter, chunk_tokens=128)
    last = chunks[-1]
    assert "Keep seven daily copies." in last.text
    assert last.embed_text.startswith("Backups > Retention\n\n")
    assert not last.text.startswith("Backups > Retention")


def test_overlap_is_bounded_and_repeats_trailing_sentences(counter):
    markdown = " ".join(f"Fact {i} is stated in this sentence." for i in range(60))
    chunks = chunks_of(markdown, counter, chunk_tokens=48, overlap=12, prefix=False)
    for previous, current in zip(chunks, chunks[1:]):
        overlap = max(0, previous.char_end - current.char_start)
        if overlap:
            repeated = markdown[current.char_start:previous.char_end]
            assert counter.count([repeated])[0] <= 12
        assert current.char_end > previous.char_end  # always progresses


def test_chunk_ids_survive_an_edit_earlier_in_the_document(counter):
    sections = [f"## Part {i}\n\nThis part talks about topic number {i} in detail." for i in range(6)]
    before = chunks_of("\n\n".join(sections), counter, chunk_tokens=64)
    sections[0] = "## Part 0\n\nThis part was rewritten completely with new words."
    after = chunks_of("\n\n".join(sections), counter, chunk_tokens=64)
    assert len({c.chunk_id for c in before} & {c.chunk_id for c in after}) == len(before) - 1


def test_thematic_break_keeps_sections_apart(counter):
    # HTML sections without headings arrive as paragraphs split by '* * *': never packed into one chunk
    markdown = "First section talks about backups.\n\n* * *\n\nSecond section talks about replicas.\n"
    chunks = chunks_of(markdown, counter, chunk_tokens=128, overlap=8)
    assert [c.text for c in chunks] == ["First section talks about backups.", "Second section talks about replicas."]


def test_setext_and_fenced_hash_lines_regressions(counter):
    # '# comment' inside a fence is code: the chunk keeps it and no heading prefix appears
    markdown = "```bash\n# install the server\napt install postgresql\n```\n"
    chunks = chunks_of(markdown, counter, chunk_tokens=64)
    assert len(chunks) == 1 and chunks[0].heading_path == [] and chunks[0].embed_text == chunks[0].text


def test_repeated_text_gets_distinct_ids(counter):
    markdown = "## A\n\nSame words.\n\n## A\n\nSame words.\n"
    chunks = chunks_of(markdown, counter, prefix=False)
    assert len({c.chunk_id for c in chunks}) == len(chunks) == 2


def test_estimate_counter_splits_identifiers():
    counter = EstimateTokenCounter(max_tokens=512)
    assert counter.count(["identifier.call(a,b)"])[0] >= 8
    assert counter.count(["中文测试"])[0] == 4


WORDS = st.sampled_from(["alpha", "beta", "gamma", "数据", "备份。", "end.", "x" * 30, "call(a,b)", "；", "!"])
PARAGRAPH = st.lists(WORDS, min_size=0, max_size=120).map(" ".join)
BLOCK = st.one_of(
    PARAGRAPH,
    PARAGRAPH.map(lambda p: "# " + p[:40]),
    PARAGRAPH.map(lambda p: "```\n# code " + p + "\n```"),
    PARAGRAPH.map(lambda p: "| " + " | ".join(p.split()[:6]) + " |"),
    PARAGRAPH.map(lambda p: "- " + p),
    st.just(""),
    st.just("## Empty section"),
    st.just("* * *"),
    st.integers(1, 2000).map(lambda n: "wordwithoutanybreak" * n),  # very long, no punctuation, no spaces
    st.lists(PARAGRAPH.map(lambda p: "| " + " | ".join(p.split()[:4]) + " |"), min_size=2, max_size=30).map("\n".join),
    st.text(alphabet="中文字ab .。", min_size=0, max_size=600),
)
MARKDOWN = st.lists(BLOCK, min_size=0, max_size=12).map("\n\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(markdown=MARKDOWN, chunk_tokens=st.sampled_from([24, 48, 128]), overlap=st.sampled_from([0, 4, 8]))
def test_chunking_properties(counter, markdown, chunk_tokens, overlap):
    chunks = chunks_of(markdown, counter, chunk_tokens=chunk_tokens, overlap=overlap)
    assert all(c.n_tokens <= chunk_tokens for c in chunks)
    covered_in_order(markdown, chunks)
    for previous, current in zip(chunks, chunks[1:]):
        if current.heading_path == previous.heading_path and current.char_start < previous.char_end:
            assert counter.count([markdown[current.char_start:previous.char_end]])[0] <= overlap
    assert not any(re.fullmatch(r"\s*", c.text) for c in chunks)


class CountingCounter:
    """The real tokenizer, counting the texts it is asked to count."""

    def __init__(self, inner):
        self.inner, self.texts = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def count(self, texts):
        self.texts += len(texts)
        return self.inner.count(texts)

    def cut(self, text, max_tokens):
        self.texts += 1
        return self.inner.cut(text, max_tokens)


def test_unchanged_sections_reuse_their_plans_and_give_the_same_chunks(counter):
    from dataclasses import asdict

    sections = [f"## Part {i}\n\n" + " ".join(f"Sentence {j} of part {i} about replication." for j in range(30))
                for i in range(12)]
    version_1 = "# Manual\n\nThis is version 15.18.\n\n" + "\n\n".join(sections) + "\n"
    edited = sections[:]
    edited[5] = edited[5].replace("Sentence 3 of part 5", "A rewritten sentence of part 5")
    version_2 = "# Manual\n\nThis is version 15.20 (a stamp of another length).\n\n" + "\n\n".join(edited) + "\n"
    plans: dict = {}
    first = CountingCounter(counter)
    chunk_document("doc", version_1, split_markdown(version_1), first, 64, 8, True, plans, "fp")
    assert len(plans) == 13 and first.texts > 13
    again = CountingCounter(counter)
    reused = chunk_document("doc", version_2, split_markdown(version_2), again, 64, 8, True, plans, "fp")
    fresh = chunk_document("doc", version_2, split_markdown(version_2), counter, 64, 8, True)
    assert [asdict(c) for c in reused] == [asdict(c) for c in fresh]  # the same chunks, to the character
    assert 0 < again.texts < first.texts / 4  # only the stamp's and part 5's sections were counted
    assert len(plans) == 13  # the old stamp's and old part 5's plans are gone, the new ones are in
    other = chunk_document("doc", version_2, split_markdown(version_2), counter, 64, 8, True, dict(plans), "fp2")
    assert [c.text for c in other] == [c.text for c in fresh]  # another chunker fingerprint reuses nothing wrongly


class NotAdditive:
    """The same counter, without the claim that its counts add up across whitespace: every chunk is counted."""

    def __init__(self, inner):
        self.inner, self.name, self.max_tokens = inner, inner.name, inner.max_tokens
        self.special_tokens, self.calls = inner.special_tokens, 0

    def count(self, texts):
        self.calls += 1
        return self.inner.count(texts)

    def cut(self, text, max_tokens):
        return self.inner.cut(text, max_tokens)


def _documents():
    from pathlib import Path

    cases = Path(__file__).parents[1] / "cases" / "docs"
    texts = [path.read_text(encoding="utf-8") for path in sorted(cases.glob("*.md"))]
    word = "ab." * 400  # 800 tokens without a space: cut hard, inside the 'word'
    sentences = " ".join(f"Sentence {i} says one more thing about vacuum." for i in range(40))  # split at sentences
    navigation = "[Prev](a.html) | [Up](b.html) | [Next](c.html)"
    texts.append(f"# Hard cuts\n\nBefore {word} after.\n\n## Links between\n\nFirst paragraph of text.\n\n{navigation}\n\n"
                 f"Second paragraph, after the links.\n\n{sentences}\n\n" + "\n\n".join(f"Para {i} about 数据库 and WAL." for i in range(40)))
    return texts


@pytest.mark.parametrize("chunk_tokens,overlap", [(64, 8), (128, 0), (256, 32)])
def test_chunk_counts_summed_across_whitespace_are_each_chunks_real_count(counter, chunk_tokens, overlap):
    from dataclasses import asdict

    from kbflow.chunk.chunker import ChunkJob, chunk_documents

    assert counter.additive_at_whitespace  # all-MiniLM-L6-v2: BERT's WordPiece
    texts = _documents()
    jobs = lambda: [ChunkJob(f"d{i}", text, split_markdown(text)) for i, text in enumerate(texts)]
    summed = chunk_documents(jobs(), counter, chunk_tokens, overlap, True)
    counted = chunk_documents(jobs(), NotAdditive(counter), chunk_tokens, overlap, True)
    assert [[asdict(c) for c in doc] for doc in summed] == [[asdict(c) for c in doc] for doc in counted]
    chunks = [chunk for doc in summed for chunk in doc]
    assert len(chunks) > 10 and any("ab.ab." in c.text for c in chunks) and any("[Up]" in c.text for c in chunks)
    real = counter.count([chunk.embed_text for chunk in chunks])
    assert [chunk.n_tokens for chunk in chunks] == [n + counter.special_tokens for n in real]
    assert max(chunk.n_tokens for chunk in chunks) <= chunk_tokens


def test_documents_chunked_together_are_chunked_as_each_alone_in_a_few_tokenizer_calls(counter):
    from dataclasses import asdict

    from kbflow.chunk.chunker import ChunkJob, chunk_documents

    def together(texts):
        counting = NotAdditive(counter)
        jobs = [ChunkJob(f"d{i}", text, split_markdown(text)) for i, text in enumerate(texts)]
        return chunk_documents(jobs, counting, 64, 8, True), counting.calls

    texts = _documents()
    batch, calls = together(texts * 3)
    alone = NotAdditive(counter)
    singles = [chunk_document(f"d{i}", t, split_markdown(t), alone, 64, 8, True) for i, t in enumerate(texts * 3)]
    assert [[asdict(c) for c in doc] for doc in batch] == [[asdict(c) for c in doc] for doc in singles]
    # one call per level and pass, whatever the number of documents
    assert together(texts * 9)[1] == calls < alone.calls / 3


def test_an_update_tokenizes_only_the_texts_it_changed_and_gives_a_fresh_chunking(counter):
    from dataclasses import asdict

    from kbflow.chunk.chunker import ChunkJob, chunk_documents
    from kbflow.chunk.plans import chunk_remembering

    body = "\n\n".join(f"Paragraph {i}: " + " ".join(f"word{i}x{j}" for j in range(8)) for i in range(60))
    version_1 = f"# One long section\n\n{body}\n\nStamp: 15.18.\n"
    version_2 = version_1.replace("Paragraph 30:", "Paragraph thirty, rewritten:").replace("15.18", "15.20")
    other = "# Untouched\n\n" + body.replace("Paragraph", "Absatz")
    memories = [{}, {}]

    def run(text, tokenizer_counter):
        jobs = [ChunkJob("doc", text, split_markdown(text)), ChunkJob("other", other, split_markdown(other))]
        return chunk_remembering(jobs, memories, tokenizer_counter, 64, 8, True, "fp")

    first, tokenized_first = run(version_1, counter)
    assert tokenized_first > 120 and memories[0]["tokenizer"] == counter.name and memories[0]["counts"]
    second, tokenized_second = run(version_2, counter)
    fresh = chunk_documents([ChunkJob("doc", version_2, split_markdown(version_2))], counter, 64, 8, True)[0]
    assert [asdict(c) for c in second[0]] == [asdict(c) for c in fresh]
    # the one section changed, but of its 62 blocks only the two edited ones are tokenized (and its chunks are
    # summed): the other document reuses its plan whole
    assert tokenized_second == 2
    again = NotAdditive(counter)  # chunks are counted too, but only the ones whose text changed
    memories[:] = [{}, {}]
    run(version_1, again)
    _, tokenized = run(version_2, NotAdditive(counter))
    assert 2 < tokenized <= 2 + 6

    renamed = NotAdditive(counter)
    renamed.name = "another tokenizer"  # counts kept under one tokenizer are never read for another
    memories[0]["sections"] = {}
    _, tokenized = run(version_2, renamed)
    assert tokenized > 120


def test_a_long_block_keeps_its_split_so_an_edit_beside_it_tokenizes_only_the_edit(counter):
    from dataclasses import asdict

    from kbflow.chunk.chunker import ChunkJob, chunk_documents
    from kbflow.chunk.plans import chunk_remembering

    # every paragraph is ~150 tokens, over a 64-token chunk: each is split into units at its spaces
    body = "\n\n".join(f"Paragraph {i}: " + " ".join(f"word{i}x{j}" for j in range(30)) for i in range(20))
    version_1 = f"# One section\n\n{body}\n\nStamp: 15.18.\n"
    version_2 = version_1.replace("15.18", "15.20")
    memories = [{}]
    _, first = chunk_remembering([ChunkJob("d", version_1, split_markdown(version_1))], memories, counter, 64, 8,
                                 True, "fp")
    assert first > 20 and len(memories[0]["splits"]) == 20
    chunks, second = chunk_remembering([ChunkJob("d", version_2, split_markdown(version_2))], memories, counter, 64,
                                       8, True, "fp")
    assert second == 1  # the stamp: the 20 long paragraphs' splits are reused, not redone
    fresh = chunk_documents([ChunkJob("d", version_2, split_markdown(version_2))], counter, 64, 8, True)
    assert [[asdict(c) for c in doc] for doc in chunks] == [[asdict(c) for c in doc] for doc in fresh]


_WORDS = st.sampled_from(["data", "base", "Ünïcödé", "e\u0301", "数据库", "x_y", "12345", "naïve", "a" * 120, "ab.ab.",
                          "word", "[UNK]", "\u200b", "\x00"])
_SEPARATORS = st.sampled_from([" ", "\n", "\t", "\r\n", ", ", ",", "，", "、", ". ", "。", ": ", ";", "!", "\x0b",
                               "\x1c", "\x85", "\xa0", "\u3000", ""])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(_WORDS, _SEPARATORS), min_size=1, max_size=40), budget=st.integers(2, 12),
       kind=st.sampled_from(["paragraph", "code"]))
def test_a_long_blocks_units_each_hold_the_count_its_text_really_has(counter, parts, budget, kind):
    """Units of a split read their counts from the block's own tokens where that is exact (BERT): each must equal
    its text's real count, whatever separates the words (controls BERT deletes, no-break spaces, CJK marks)."""
    from kbflow.chunk.chunker import split_long

    text = "".join(word + separator for word, separator in parts)
    units = split_long(text, 0, len(text), budget, counter, kind)
    assert [unit.tokens for unit in units] == counter.count([text[u.start:u.end] for u in units])
    assert all(unit.tokens <= budget for unit in units)


def test_bm25_words_of_an_updates_unchanged_chunks_come_from_memory_until_the_word_tokenizer_changes(
        counter, tmp_path, monkeypatch):
    import pyarrow as pa

    from kbflow.chunk.plans import PlanCache
    from kbflow.config import ChunkConfig
    from kbflow.engine import rows
    from kbflow.search.tokens import tokens_text

    cut = []
    monkeypatch.setattr(rows, "tokens_text", lambda text: cut.append(text) or tokens_text(text))
    body = "\n\n".join(f"## Part {i}\n\nPart {i} explains 数据库 replication and WAL shipping." for i in range(12))

    def run(markdown):
        documents = pa.table({"doc_id": ["d1"], "status": ["ok"], "markdown": [markdown]})
        cut.clear()
        return rows.chunk_documents(documents, rows.split_documents(documents), counter, 64, ChunkConfig(), "fp",
                                    PlanCache(tmp_path / "plans"))

    first = run(f"# Manual 15.18\n\n{body}\n")
    assert len(cut) == first.num_rows > 10  # every chunk's words cut once
    second = run(f"# Manual 15.20\n\n{body}\n")
    assert len(cut) == 1  # only the chunk whose text changed
    assert second.column("text_tokens").to_pylist() == [tokens_text(t) for t in second.column("text").to_pylist()]
    monkeypatch.setattr(rows, "TOKENIZER_VERSION", "jieba-99")  # words kept under another version are not used
    third = run(f"# Manual 15.20\n\n{body}\n")
    assert len(cut) == third.num_rows
