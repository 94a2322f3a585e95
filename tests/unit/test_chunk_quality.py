"""The chunk-quality report: small chunks (a section's last aside), punctuation-only chunks, repeated texts, and a
warning naming the document where something looks wrong; from a run's chunks table into its summary."""

from __future__ import annotations

import pyarrow as pa

from kbflow.ops import report
from kbflow.chunk.chunker import chunk_document
from kbflow.chunk.quality import add_batch, document_quality, punctuation_only, quality_report, warnings_for
from kbflow.chunk.split import split_markdown
from kbflow.chunk.tokens import EstimateTokenCounter


def test_small_chunks_are_counted_before_a_sections_end_and_punctuation_and_repeats_everywhere():
    texts = ["Intro text", ".", "More", "Same", "Same", ". . ."]
    tokens = [50, 2, 60, 9, 9, 3]
    paths = [["A"], ["A"], ["A"], ["B"], ["B"], ["C"]]
    quality = document_quality(texts, tokens, paths, chunk_tokens=100)
    # judged: the chunks followed by one of their section (0, 1 of A; 3 of B); small: '.' (2) and 'Same' (9)
    assert (quality.chunks, quality.judged, quality.small) == (6, 3, 2)
    assert (quality.punctuation_only, quality.duplicates) == (2, 1)
    assert punctuation_only("• — …") and not punctuation_only("数据") and not punctuation_only("v2")


def test_warnings_name_the_document_and_what_looks_wrong():
    shredded = document_quality(["Contents"] + ["."] * 40, [500] + [8] * 40, [["Contents"]] * 41, 512)
    found = warnings_for("pdf/debian-reference.en.pdf", shredded)
    assert len(found) == 3 and all(w.startswith("pdf/debian-reference.en.pdf: ") for w in found)
    assert "40 of 41 chunks hold only punctuation" in found[0] and "39 of 41 chunks hold under a tenth" in found[1]
    assert "39 of 41 chunks repeat a text" in found[2]
    healthy = document_quality([f"Paragraph {i} of real text." for i in range(30)], [300] * 30, [["A"]] * 30, 512)
    assert warnings_for("good.pdf", healthy) == []
    few = document_quality(["a", "b", "c"], [5, 5, 5], [["A"]] * 3, 512)  # three small chunks say little
    assert warnings_for("short.md", few) == []


def test_a_table_of_contents_chunked_today_reports_no_punctuation_only_chunk():
    counter = EstimateTokenCounter(max_tokens=512)
    markdown = "# Contents\n\n" + "\n".join(f"1.{i} Console basics " + ". " * 40 + str(i) for i in range(60)) + "\n"
    chunks = chunk_document("d", markdown, split_markdown(markdown), counter, 128, 16, True)
    result = quality_report([("toc.md", [c.text for c in chunks], [c.n_tokens for c in chunks],
                              [c.heading_path for c in chunks])], 128)
    assert result["punctuation_only"] == 0 and result["small"] == 0 and result["warnings"] == []


def test_a_runs_summary_adds_up_its_batches_and_its_artifact_rows_carry_the_warnings():
    def batch(doc_id, texts):
        chunks = pa.table({"doc_id": [doc_id] * len(texts), "ordinal": list(range(len(texts))), "text": texts,
                           "n_tokens": [3] * len(texts), "heading_path": [["H"]] * len(texts)})
        return chunks, pa.table({"doc_id": [doc_id], "source_path": [f"{doc_id}.pdf"]})

    summary = {"namespace": "ns", "documents": {}, "chunks": {}, "store": {"count": 0}}
    quality = add_batch(None, *batch("b", ["…", "Text"]), chunk_tokens=100)
    quality = add_batch(quality, *batch("a", ["Words here", "More words"]), chunk_tokens=100)
    summary["chunk_quality"] = quality
    assert (quality["documents"], quality["chunks"], quality["punctuation_only"]) == (2, 4, 1)
    assert quality["warnings"] == ["b.pdf: 1 of 2 chunks hold only punctuation (a table of contents or a line of "
                                   "dots the converter kept?)"]
    rows = [row for row in report.summary_rows(summary) if row["group"] == "chunk quality"]
    assert {"group": "chunk quality", "item": "warning", "value": quality["warnings"][0]} in rows
    assert {"group": "chunk quality", "item": "punctuation_only", "value": 1} in rows
