"""The graph stage's extraction (kbflow.graph.extract), on text as the converters write it: links resolved like a
browser resolves hrefs, definition-list terms, the heading a section starts with; and the query and anchor keys
that graph search matches against them (kbflow.graph.expand)."""

from __future__ import annotations

import pyarrow as pa

from kbflow.graph.expand import anchor_keys, query_term_keys
from kbflow.graph.extract import chunk_edges, defined_term, extract_edges, resolve_link, term_key

TEXT = """By default, data pages are not protected by [checksums](checksums.html).
The value of [data\\_checksums](../preset/runtime-config-preset.html#GUC-DATA-CHECKSUMS "data_checksums") tells.
See [the site](https://www.postgresql.org/docs/), [mail](mailto:x@example.org), [root](/abs.html),
[above](../../../outside.html), [this page's part](#PART-2) and [*[datum](glossary.html#GLOSSARY-DATUM "Datum")*](glossary.html#GLOSSARY-DATUM).

`data_checksums` (`boolean`)
:   Reports whether data checksums are enabled for this cluster.

Autovacuum (process)
:   A set of background processes.
"""


def test_links_resolve_against_the_chunks_own_path_and_leave_the_collection_out():
    assert resolve_link("x.html#A", "manual/sub/page.html") == ("manual/sub/x.html", "A")
    assert resolve_link("../y%20z.html", "manual/sub/page.html") == ("manual/y z.html", "")
    assert resolve_link("#PART", "manual/page.html") == ("manual/page.html", "PART")
    assert resolve_link("q.html?x=1#B", "manual/page.html") == ("manual/q.html", "B")
    for href in ("https://example.org/a.html", "mailto:a@b", "/abs.html", "../../x.html", "\\\\share\\x"):
        assert resolve_link(href, "manual/page.html") is None, href

    edges = chunk_edges("c1", "d1", "manual/sub/checksums.html", TEXT, None)
    links = sorted((e["target"], e["anchor"], e["label"]) for e in edges if e["kind"] == "link")
    assert links == [
        ("manual/preset/runtime-config-preset.html", "GUC-DATA-CHECKSUMS", "data_checksums | data_checksums"),
        ("manual/sub/checksums.html", "", "checksums"),
        ("manual/sub/checksums.html", "PART-2", "this page's part"),
        ("manual/sub/glossary.html", "GLOSSARY-DATUM", "datum | Datum"),  # the inner link, once
    ]


def test_definition_list_entries_define_their_terms():
    edges = chunk_edges("c1", "d1", "manual/checksums.html", TEXT, None)
    terms = sorted((e["target"], e["label"]) for e in edges if e["kind"] == "defines")
    assert terms == [("autovacuum", "Autovacuum"), ("data checksums", "data_checksums")]
    assert defined_term("`work_mem` (`integer`)") == "work_mem"
    assert defined_term("[*[Datum](glossary.html#X)*](glossary.html#X)") == "Datum"
    assert defined_term("x") is None  # too short to be a term
    assert term_key("Work_Mem-Limit  ") == "work mem limit"


def test_a_section_heading_is_an_edge_of_the_first_chunk_under_it_only():
    chunks = pa.table({"chunk_id": ["a", "b", "c", "d"], "doc_id": ["d1", "d1", "d1", "d2"],
                       "heading_path": [["30.2. Data Checksums"], ["30.2. Data Checksums"],
                                        ["30.2. Data Checksums", "30.2.1. Off-line Enabling of Checksums"],
                                        ["30.2. Data Checksums"]],
                       "text": ["one", "two", "three", "four"], "text_sha256": ["1", "2", "3", "4"]})
    edges = extract_edges(chunks, {"d1": "m/checksums.html", "d2": "m/other.html"}).to_pylist()
    headings = sorted((e["chunk_id"], e["target"]) for e in edges if e["kind"] == "heading")
    assert headings == [("a", "data checksums"), ("c", "off line enabling of checksums"), ("d", "data checksums")]
    assert len({e["edge_id"] for e in edges}) == len(edges)


def test_query_and_anchor_keys_meet_the_term_keys():
    keys = query_term_keys("How do I check data_checksums on a cluster? 数据校验和")
    assert "data checksums" in keys and "check data checksums" in keys and "cluster" in keys
    assert "how" not in keys and "do" not in keys  # stop words and short words are not terms alone
    assert "数据校验" in keys and "校验和" in keys
    assert "data checksums" in anchor_keys("GUC-DATA-CHECKSUMS", "")
    assert "off line enabling of checksums" in anchor_keys("X", "30.2.1. Off-line Enabling of Checksums")


def test_api_reference_names_are_terms_by_their_dotted_names():
    """Sphinx writes a definition as its signature ("fnmatch.fnmatch(*filename*, *pattern*)", "*class*
    io.StringIO(...)") and links to it by its dotted name (#fnmatch.fnmatch): the term, the anchor and a query
    naming it must meet on one key."""
    assert defined_term("fnmatch.fnmatch(*filename*, *pattern*)") == "fnmatch.fnmatch"
    assert defined_term("*class* io.StringIO(*initial\\_value=''*, *newline='\\n'*)") == "io.StringIO"
    assert defined_term("*exception* OSError") == "OSError"
    assert defined_term("class of service") == "class of service"  # words that only look like a keyword stay
    assert defined_term("class variable") == "class variable"  # the Python glossary's entries: not emphasised
    assert defined_term("coroutine function") == "coroutine function"
    assert term_key("os.path.join") == "os path join" and term_key("Path.stat") == "path stat"
    assert term_key("version 2.0 ends.") == "version 2 0 ends."  # a dot ending a sentence stays
    assert "fnmatch fnmatch" in anchor_keys("fnmatch.fnmatch", "fnmatch.fnmatch() | fnmatch.fnmatch")
    assert "fnmatch fnmatch" in query_term_keys("What does fnmatch.fnmatch return?")
