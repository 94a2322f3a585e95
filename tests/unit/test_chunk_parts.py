"""The chunker's parts by hand (issue 18's mutation gaps): packing with overlap, heading prefixes under a budget,
sections, section keys, the over-limit fix-up and the chunk-id formula. Token counts come from the documented
estimate (one per CJK character, four letters, three digits or one mark), so every expected value is countable."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbflow.chunk.chunker import (Span, _pack, sections_of, chunk_document, heading_prefix_text, prefix_line,
                                   section_key, sha256_text, split_long)
from kbflow.chunk.split import Block, split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter

COUNTER = EstimateTokenCounter(max_tokens=512)


def units(*tokens: int) -> list[Span]:
    return [Span(i * 10, i * 10 + 5, n) for i, n in enumerate(tokens)]


def test_pack_fills_each_chunk_up_to_the_budget_and_repeats_trailing_units_within_the_overlap():
    assert _pack(units(3, 3, 3), budget=6, overlap_tokens=0) == [(0, 2), (2, 3)]
    assert _pack(units(3, 3, 3, 3), budget=6, overlap_tokens=3) == [(0, 2), (1, 3), (2, 4)]
    assert _pack(units(3, 3, 3, 3), budget=6, overlap_tokens=2) == [(0, 2), (2, 4)]  # a 3-token unit is over 2
    assert _pack(units(10), budget=6, overlap_tokens=0) == [(0, 1)]  # a unit alone always makes progress
    # carrying 2 tokens would push the next unit (5) over the budget (6): the carried unit is dropped again
    assert _pack(units(2, 2, 5), budget=6, overlap_tokens=4) == [(0, 2), (2, 3)]
    assert _pack(units(1, 1, 1, 1, 1), budget=2, overlap_tokens=1) == [(0, 2), (1, 3), (2, 4), (3, 5)]
    assert _pack([], budget=6, overlap_tokens=2) == []
    # the overlap counts every carried unit: two 1-token units fill an overlap of 2, never a third
    assert _pack(units(1, 1, 1, 1, 1, 1, 1, 1), budget=4, overlap_tokens=2) == [(0, 4), (2, 6), (4, 8)]


def reference_pack(tokens: list[int], budget: int, overlap: int) -> list[tuple[int, int]]:
    """The packing rule stated as sums over candidate ranges, not as _pack's walks: each chunk takes as many new
    units as fit the budget (at least one); it starts at the earliest unit after the previous chunk's first whose
    run up to the new units sums to at most the overlap, and still leaves room for the first new unit."""
    ranges: list[tuple[int, int]] = []
    position = 0
    while position < len(tokens):
        first = position
        if ranges:
            candidates = [f for f in range(ranges[-1][0] + 1, position + 1)
                          if sum(tokens[f:position]) <= overlap and sum(tokens[f:position]) + tokens[position] <= budget]
            first = min(candidates, default=position)  # a unit over the budget on its own carries nothing
        fits = [last for last in range(position + 1, len(tokens) + 1) if sum(tokens[first:last]) <= budget]
        last = max(fits, default=position + 1)
        ranges.append((first, last))
        position = last
    return ranges


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 9), max_size=30), st.integers(1, 20), st.integers(0, 20))
def test_pack_equals_the_packing_rule_stated_by_sums(tokens, budget, overlap):
    assert _pack(units(*tokens), budget, min(overlap, budget)) == reference_pack(tokens, budget, min(overlap, budget))


def test_heading_prefix_drops_leading_ancestors_until_it_fits():
    path = ["Alpha", "Beta", "Gamma"]  # 'Alph' 'a' '>' 'Beta' '>' 'Gamm' 'a' = 7 pieces
    assert heading_prefix_text(path, COUNTER, 7) == "Alpha > Beta > Gamma\n\n"
    assert heading_prefix_text(path, COUNTER, 6) == "Beta > Gamma\n\n"  # 4 pieces
    assert heading_prefix_text(path, COUNTER, 3) == "Gamma\n\n"  # 2 pieces
    assert heading_prefix_text(path, COUNTER, 1) == ""
    assert heading_prefix_text([], COUNTER, 9) == ""


def test_sections_start_at_headings_and_breaks_and_skip_navigation():
    blocks = [Block("heading", 0, 5, ["A"]), Block("paragraph", 6, 9, ["A"]), Block("paragraph", 10, 12, ["A"]),
              Block("break", 13, 16, ["A"]), Block("paragraph", 17, 20, ["A"]), Block("navigation", 21, 25, ["A"]),
              Block("paragraph", 26, 30, ["A"]), Block("paragraph", 31, 35, ["A", "B"])]
    assert [[(b.char_start, b.kind) for b in section] for section in sections_of(blocks)] == [
        [(0, "heading"), (6, "paragraph"), (10, "paragraph")],
        [(17, "paragraph"), (26, "paragraph")],  # after the break; the navigation block is neither text nor a boundary
        [(31, "paragraph")],  # another heading path
    ]


def test_a_section_key_depends_on_its_text_shape_heading_path_and_chunker_not_on_where_it_sits():
    section = "# Tea\n\nGreen tea at 80 degrees.\n"
    here, there = section, "# Intro\n\nSomething else first.\n\n" + section
    key = lambda markdown, chunker="k1": section_key(markdown, sections_of(split_markdown(markdown))[-1], chunker)
    assert key(here) == key(there)  # offsets are taken relative to the section
    assert key(here) != key(here, chunker="k2")
    assert key(here) != key(here.replace("80", "70"))
    assert key(here) != key("## Tea\n\nGreen tea at 80 degrees.\n")  # same words, other heading level: other shape
    shape = sections_of(split_markdown(here))[-1]
    moved = [Block(b.kind, b.char_start, b.char_end, ["Other"]) for b in shape]
    assert section_key(here, shape, "k1") != section_key(here, moved, "k1")
    # every block counts: the first (the key starts there), the last (the text ends there), and their boundaries
    assert key("Intro one.\n\nSame body.\n") != key("Intro two.\n\nSame body.\n")
    assert key("A.\n\nB.\n\nC one.\n") != key("A.\n\nB.\n\nC two.\n")
    text = "First part.\nSecond part.\n"
    one = [Block("paragraph", 0, 25)]
    two = [Block("paragraph", 0, 11), Block("paragraph", 12, 25)]
    assert section_key(text, one, "k1") != section_key(text, two, "k1")


class OneShortCounter(EstimateTokenCounter):
    """The estimate with one token of every text moved into the special tokens, as e5's counter once had it (the
    space after 'passage:' counted in the prefix): totals are exact, but '.' alone counts 0, so a chunker summing
    units thinks a line of dots is empty."""

    def count(self, texts):
        return [n - 1 for n in super().count(texts)]

    def cut(self, text, max_tokens):
        return super().cut(text, max_tokens + 1)


def test_an_over_limit_chunk_is_cut_at_the_tokenizers_limit_and_the_rest_starts_the_next_chunk():
    markdown = "# Contents\n\n" + "1.1 Console basics " + ". " * 300 + "1\n"
    chunks = chunk_document("d", markdown, split_markdown(markdown), OneShortCounter(max_tokens=512, special_tokens=1), 32, 0, True)
    # the prefix 'Contents\n\n' is 2 pieces (it counts 1, the special token the other), so 30 dots fill a chunk
    assert [c.n_tokens for c in chunks[:-1]] == [32] * 10 and [c.text.count(".") for c in chunks[1:-1]] == [30] * 9
    assert chunks[-1].text == ". " * 10 + "1"
    assert not [c for c in chunks if c.text == "."]
    real = OneShortCounter(max_tokens=512, special_tokens=1).count([c.embed_text for c in chunks])
    assert [c.n_tokens for c in chunks] == [n + 1 for n in real]


def test_a_chunk_under_half_its_budget_takes_part_of_the_next_block_instead_of_ending():
    short, long = " ".join(["word"] * 6), " ".join(f"Long{i}." for i in range(12))  # 6 tokens, then 3 x 12 = 36
    markdown = f"{short}\n\n{long}\n"
    chunks = chunk_document("d", markdown, split_markdown(markdown), COUNTER, 40, 0, heading_prefix=False)
    # the long block fits a chunk of its own but not beside the short one; the short one is not left alone at 6 of
    # 40 tokens: the block is split at its sentence ends (into units of at most 20) and they fill the first chunk
    assert [c.n_tokens for c in chunks] == [6 + 33, 3]
    assert chunks[0].text.startswith(short + "\n\nLong0.") and chunks[1].text == "Long11."
    assert " ".join(c.text for c in chunks).split() == markdown.split()
    assert all(c.n_tokens <= 40 for c in chunks)


def test_chunk_ids_hash_doc_id_text_and_occurrence_so_repeated_text_gets_distinct_stable_ids():
    markdown = "Same line.\n\n---\n\nSame line.\n"  # a thematic break: two sections, the same text
    chunks = chunk_document("doc-9", markdown, split_markdown(markdown), COUNTER, 64, 0, heading_prefix=False)
    repeated = [chunk for chunk in chunks if chunk.text.strip() == "Same line."]
    assert len(repeated) == 2
    sha = hashlib.sha256("Same line.".encode()).hexdigest()
    assert [c.text_sha256 for c in repeated] == [sha, sha]
    assert [c.chunk_id for c in repeated] == [hashlib.sha256(f"doc-9\x00{sha}\x00{n}".encode()).hexdigest()[:32]
                                              for n in (0, 1)]
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    again = chunk_document("doc-9", markdown, split_markdown(markdown), COUNTER, 64, 0, heading_prefix=False)
    assert [c.chunk_id for c in again] == [c.chunk_id for c in chunks]


class JoinCostCounter(EstimateTokenCounter):
    """The estimate, plus 5 tokens for every blank line: two blocks together count more than their sum, as a real
    tokenizer's merges across a boundary can make them."""

    def count(self, texts):
        return [n + 5 * text.count("\n\n") for n, text in zip(super().count(texts), texts)]


TEN = " ".join(["word"] * 10)  # 10 tokens by the estimate ('word' is one piece of four letters)


def test_blocks_summing_exactly_to_the_budget_share_a_chunk():
    markdown = f"{TEN}\n\n{TEN}\n\n{TEN}\n"
    chunks = chunk_document("d", markdown, split_markdown(markdown), COUNTER, 20, 0, heading_prefix=False)
    assert [c.text for c in chunks] == [f"{TEN}\n\n{TEN}", TEN] and [c.n_tokens for c in chunks] == [20, 10]
    assert [c.embed_text for c in chunks] == [c.text for c in chunks]  # no heading prefix asked for, none added
    titled = f"# Title\n\n{TEN}\n"  # the heading block is part of the chunk's text; the prefix is the path again
    assert [c.embed_text for c in chunk_document("d", titled, split_markdown(titled), COUNTER, 20, 0, False)] \
        == [f"# Title\n\n{TEN}"]
    assert [c.embed_text for c in chunk_document("d", titled, split_markdown(titled), COUNTER, 20, 0, True)] \
        == [f"Title\n\n# Title\n\n{TEN}"]
    deep = f"# Alpha\n\n## Beta\n\n### Gamma\n\n{TEN}\n"  # the full path is 7 tokens, over a quarter of 20 (5)
    last = chunk_document("d", deep, split_markdown(deep), COUNTER, 20, 0, True)[-1]
    assert last.embed_text == f"Beta > Gamma\n\n### Gamma\n\n{TEN}" and last.n_tokens == 4 + 15
    whole = " ".join(["word"] * 20)  # one block of exactly the budget stays whole
    assert [c.text for c in chunk_document("d", whole, split_markdown(whole), COUNTER, 20, 0, False)] == [whole]


def test_a_packed_chunk_that_counts_over_the_limit_is_split_again_and_counted_as_embedded():
    markdown = f"{TEN}\n\n{TEN}\n\n{TEN}\n\n{TEN}\n"
    counter = JoinCostCounter(max_tokens=512)
    chunks = chunk_document("d", markdown, split_markdown(markdown), counter, 20, 0, heading_prefix=False)
    # packed by block sums, two blocks make 20; joined they count 25 > 20, so every chunk holds one block
    assert [c.text for c in chunks] == [TEN] * 4 and [c.n_tokens for c in chunks] == [10] * 4
    three = " ".join(["word"] * 7)  # 7 + 7 + 5 = 19 joined: fits, counted with the join's cost
    pair = f"{three}\n\n{three}\n"
    chunks = chunk_document("d", pair, split_markdown(pair), counter, 20, 0, heading_prefix=False)
    assert [c.text for c in chunks] == [f"{three}\n\n{three}"] and chunks[0].n_tokens == 19


def test_an_oversize_list_is_cut_between_items_and_a_sentence_without_full_stops_at_its_commas():
    items = "- aaaa bbbb\n- cccc dddd\n- eeee ffff"  # 3 tokens an item ('-' one mark, two 4-letter pieces)
    assert [items[s.start:s.end] for s in split_long(items, 0, len(items), 6, COUNTER, "list")] == [
        "- aaaa bbbb", "- cccc dddd", "- eeee ffff"]
    clauses = "aaaa bbbb, cccc dddd, eeee ffff"  # 8 tokens, no sentence end: cut after the commas, not at spaces
    assert [(clauses[s.start:s.end], s.tokens) for s in split_long(clauses, 0, len(clauses), 4, COUNTER, "paragraph")] \
        == [("aaaa bbbb,", 3), ("cccc dddd,", 3), ("eeee ffff", 2)]


def test_a_chunk_counts_the_models_special_tokens_and_names_its_embedded_text_by_hash():
    counter = EstimateTokenCounter(max_tokens=512, special_tokens=2)  # e.g. [CLS] and [SEP]
    (chunk,) = chunk_document("d", TEN, split_markdown(TEN), counter, 20, 0, heading_prefix=False)
    assert chunk.n_tokens == 10 + 2 and chunk.embed_sha256 == sha256_text(chunk.embed_text)
    assert chunk.embed_sha256 == hashlib.sha256(TEN.encode("utf-8")).hexdigest()


def test_a_heading_too_long_for_any_prefix_leaves_the_whole_budget_to_the_text():
    # the path 'Supercalifragilisticexpialidocious' is 9 tokens, over a quarter of 20: no prefix, and the heading
    # block (10 tokens: '#' and 9 pieces) plus 10 words fill the budget of 20 exactly, in one chunk
    markdown = f"# Supercalifragilisticexpialidocious\n\n{TEN}\n"
    chunks = chunk_document("d", markdown, split_markdown(markdown), COUNTER, 20, 0, heading_prefix=True)
    assert [(c.embed_text, c.n_tokens) for c in chunks] == [(markdown.strip(), 20)]


def test_section_plans_made_under_one_chunker_are_not_reused_under_another():
    markdown = f"{TEN}\n\n{TEN}\n\n{TEN}\n"
    plans: dict = {}
    wide = chunk_document("d", markdown, split_markdown(markdown), COUNTER, 20, 0, False, plans, chunker="c20")
    narrow = chunk_document("d", markdown, split_markdown(markdown), COUNTER, 10, 0, False, plans, chunker="c10")
    assert [c.n_tokens for c in wide] == [20, 10] and [c.n_tokens for c in narrow] == [10, 10, 10]


def test_section_numbers_are_not_part_of_the_heading_prefix():
    assert prefix_line(["E.1. Release 15.20", "E.1.2. Changes"]) == "Release 15.20 > Changes\n\n"
    assert prefix_line(["12.3. Indexes", "A. Acronyms", "1. Introduction"]) == "Indexes > Acronyms > Introduction\n\n"
    # a version or a year is content, not a section number (no dot after its last part)
    assert prefix_line(["2.0 API changes", "3.11 What's new", "2024 Report", "v1.2. Notes"]) == \
        "2.0 API changes > 3.11 What's new > 2024 Report > v1.2. Notes\n\n"
    assert prefix_line(["1.", "E.1.Changes"]) == "1. > E.1.Changes\n\n" and prefix_line([]) == ""


def test_a_renumbered_section_keeps_the_embedded_text_of_its_chunks_below_the_heading():
    """A patch release inserts a section before this one: 'E.3.' becomes 'E.5.'. Only the chunk holding the
    heading line changes what the model reads; the rest keep their embedded text, so their vectors are reused."""
    body = "\n\n".join([TEN] * 6)
    before, after = (f"# {n}. Release notes\n\nIntro.\n\n## {n}.1. Changes\n\n{body}\n" for n in ("E.3", "E.5"))
    old, new = (chunk_document("d", md, split_markdown(md), COUNTER, 40, 0, heading_prefix=True)
                for md in (before, after))
    assert len(old) == len(new) > 3
    assert all(c.embed_text.startswith("Release notes > Changes\n\nword") for c in new[2:])
    assert [a.embed_sha256 == b.embed_sha256 for a, b in zip(old, new)] == [False, False] + [True] * (len(new) - 2)
    assert [a.text == b.text for a, b in zip(old, new)] == [False, False] + [True] * (len(new) - 2)


def test_reembed_recovers_what_the_model_read_under_this_chunker_and_the_one_before():
    """``kbflow reembed`` re-reads each stored chunk as the old model read it: with the number-free prefix (chunker
    v3), shortened or not, with the numbered one of a store written before v3, or with none."""
    from kbflow.engine.reembed import recover_embed_text
    from kbflow.core.errors import EmbeddingError

    path = ["E.5. Release 15.17", "E.5.1. Changes"]
    for read in ("Release 15.17 > Changes\n\nbody", "Changes\n\nbody", "E.5. Release 15.17 > E.5.1. Changes\n\nbody",
                 "E.5.1. Changes\n\nbody", "body"):
        assert recover_embed_text("body", path, sha256_text(read)) == read
    with pytest.raises(EmbeddingError, match="another chunker"):
        recover_embed_text("body", path, sha256_text("Release 15.18 > Changes\n\nbody"))
