"""The chunker's parts by hand (issue 18's mutation gaps): packing with overlap, heading prefixes under a budget,
sections, section keys, the over-limit fix-up and the chunk-id formula. Token counts come from the documented
estimate (one per CJK character, four letters, three digits or one mark), so every expected value is countable."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbflow.chunk.chunker import Span, _fit, _pack, _sections, chunk_document, heading_prefix_text, section_key
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
    assert [[(b.char_start, b.kind) for b in section] for section in _sections(blocks)] == [
        [(0, "heading"), (6, "paragraph"), (10, "paragraph")],
        [(17, "paragraph"), (26, "paragraph")],  # after the break; the navigation block is neither text nor a boundary
        [(31, "paragraph")],  # another heading path
    ]


def test_a_section_key_depends_on_its_text_shape_heading_path_and_chunker_not_on_where_it_sits():
    section = "# Tea\n\nGreen tea at 80 degrees.\n"
    here, there = section, "# Intro\n\nSomething else first.\n\n" + section
    key = lambda markdown, chunker="k1": section_key(markdown, _sections(split_markdown(markdown))[-1], chunker)
    assert key(here) == key(there)  # offsets are taken relative to the section
    assert key(here) != key(here, chunker="k2")
    assert key(here) != key(here.replace("80", "70"))
    assert key(here) != key("## Tea\n\nGreen tea at 80 degrees.\n")  # same words, other heading level: other shape
    shape = _sections(split_markdown(here))[-1]
    moved = [Block(b.kind, b.char_start, b.char_end, ["Other"]) for b in shape]
    assert section_key(here, shape, "k1") != section_key(here, moved, "k1")
    # every block counts: the first (the key starts there), the last (the text ends there), and their boundaries
    assert key("Intro one.\n\nSame body.\n") != key("Intro two.\n\nSame body.\n")
    assert key("A.\n\nB.\n\nC one.\n") != key("A.\n\nB.\n\nC two.\n")
    text = "First part.\nSecond part.\n"
    one = [Block("paragraph", 0, 25)]
    two = [Block("paragraph", 0, 11), Block("paragraph", 12, 25)]
    assert section_key(text, one, "k1") != section_key(text, two, "k1")


def test_fit_gives_up_last_units_until_every_chunk_is_under_the_limit():
    markdown = "aaaa bbbb cccc dddd"  # four 1-piece words
    spans = [Span(0, 4, 1), Span(5, 9, 1), Span(10, 14, 1), Span(15, 19, 1)]
    assert _fit(spans, [(0, 4)], markdown, "", COUNTER, 4) == [(0, 4)]
    assert _fit(spans, [(0, 4)], markdown, "", COUNTER, 3) == [(0, 3), (3, 4)]
    assert _fit(spans, [(0, 4)], markdown, "", COUNTER, 2) == [(0, 2), (2, 3), (3, 4)]
    assert _fit(spans, [(0, 4)], markdown, "", COUNTER, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # the prefix counts against the limit too ('Title' is 'Titl' 'e': 2 pieces)
    assert _fit(spans, [(0, 4)], markdown, "Title\n\n", COUNTER, 4) == [(0, 2), (2, 3), (3, 4)]
    # only the chunk over the limit gives up units; the others stay as they are
    assert _fit(spans, [(0, 1), (1, 4)], markdown, "", COUNTER, 2) == [(0, 1), (1, 3), (3, 4)]
    with pytest.raises(AssertionError, match="cannot be split further: 'aaaa"):
        _fit(spans, [(0, 1)], markdown, "", COUNTER, 0)  # one unit over the limit: the caller's bug, said


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
