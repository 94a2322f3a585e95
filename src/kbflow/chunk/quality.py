"""Are the chunks worth keeping? A report per document and for a run: chunks, chunks under a tenth of the budget
(a section's last chunk aside: it holds what is left), chunks of punctuation only (there should be none),
texts repeated within a document, tables, the chunks holding table rows and those of them without the table's
header row (there should be none); and a warning naming each document where something looks wrong.

Every ingest puts the report in its summary (``chunk_quality``: the terminal's summary and the Prefect summary
artifact show its warnings); ``kbflow bench chunk`` measures it on a corpus.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from kbflow.chunk.chunker import TABLE_RULE_RE

SMALL = 0.1  # a chunk holding under this share of the budget is small
WARN_SMALL_SHARE = 0.05  # more small chunks than this share of a document's (section ends aside) is a warning
WARN_DUPLICATE_SHARE = 0.1  # as many repeated texts as this share of a document's chunks is a warning
MIN_CHUNKS_FOR_SHARES = 20  # shares of fewer chunks say little: a short document is judged on punctuation only


@dataclass
class DocumentQuality:
    chunks: int = 0
    judged: int = 0  # chunks that are not the last of their section
    small: int = 0  # of those, holding under a tenth of the budget
    punctuation_only: int = 0
    duplicates: int = 0  # chunks whose text an earlier chunk of the document has
    tables: int = 0  # tables, told apart by their header rows
    table_pieces: int = 0  # chunks holding rows of a table
    pieces_without_header: int = 0  # of those, chunks without their table's header row (there should be none)

    def add(self, other: "DocumentQuality") -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def figures(self) -> dict:
        return {**asdict(self), "small_share": round(self.small / self.judged, 4) if self.judged else 0.0}


def punctuation_only(text: str) -> bool:
    """No letter, digit or CJK character: dots, dashes, bullets, brackets."""
    return not any(ch.isalnum() for ch in text)


TABLE_LINE_RE = re.compile(r"^ {0,3}\|", re.M)


def table_figures(text: str, headers: set[str]) -> tuple[bool, bool]:
    """(holds table rows, carries the header row above them) of one chunk; adds its tables' headers to
    ``headers``."""
    lines = text.split("\n")
    rules = [i for i, line in enumerate(lines) if i and TABLE_RULE_RE.fullmatch(line) and TABLE_LINE_RE.match(
        lines[i - 1])]
    headers.update(lines[i - 1] for i in rules)
    header_lines = {i for rule in rules for i in (rule - 1, rule)}
    rows = [i for i, line in enumerate(lines) if TABLE_LINE_RE.match(line) and i not in header_lines]
    return bool(rows), bool(rows) and all(any(rule < row for rule in rules) for row in rows)


def document_quality(texts: Sequence[str], n_tokens: Sequence[int], heading_paths: Sequence[Sequence[str]],
                     chunk_tokens: int) -> DocumentQuality:
    """The figures of one document's chunks, in order. A chunk is its section's last when the next chunk's heading
    path differs (a thematic break inside a section is not seen: its last chunk counts as judged)."""
    quality = DocumentQuality(chunks=len(texts))
    seen: set[str] = set()
    headers: set[str] = set()
    for index, (text, tokens) in enumerate(zip(texts, n_tokens)):
        last = index + 1 == len(texts) or list(heading_paths[index + 1]) != list(heading_paths[index])
        if not last:
            quality.judged += 1
            quality.small += tokens < SMALL * chunk_tokens
        quality.punctuation_only += punctuation_only(text)
        quality.duplicates += text in seen
        seen.add(text)
        holds_rows, with_header = table_figures(text, headers)
        quality.table_pieces += holds_rows
        quality.pieces_without_header += holds_rows and not with_header
    quality.tables = len(headers)
    return quality


def warnings_for(source: str, quality: DocumentQuality) -> list[str]:
    """What looks wrong with one document's chunks, each naming the document and what to look at."""
    found = []
    if quality.punctuation_only:
        found.append(f"{source}: {quality.punctuation_only} of {quality.chunks} chunks hold only punctuation "
                     "(a table of contents or a line of dots the converter kept?)")
    if quality.judged >= MIN_CHUNKS_FOR_SHARES and quality.small > WARN_SMALL_SHARE * quality.judged:
        found.append(f"{source}: {quality.small} of {quality.chunks} chunks hold under a tenth of the chunk budget "
                     "before their section's end (text the chunker had to shred?)")
    if quality.chunks >= MIN_CHUNKS_FOR_SHARES and quality.duplicates >= WARN_DUPLICATE_SHARE * quality.chunks:
        found.append(f"{source}: {quality.duplicates} of {quality.chunks} chunks repeat a text of the same document "
                     "(running headers, repeated boilerplate?)")
    if quality.pieces_without_header:
        found.append(f"{source}: {quality.pieces_without_header} of {quality.table_pieces} chunks holding table rows "
                     "lack the table's header row (a table without one, or a header too wide to repeat?)")
    return found


def quality_report(documents: Iterable[tuple[str, Sequence[str], Sequence[int], Sequence[Sequence[str]]]],
                   chunk_tokens: int) -> dict:
    """Totals, per-document figures and warnings of (source, texts, n_tokens, heading paths) per document."""
    total, per_document, warnings = DocumentQuality(), {}, []
    documents_seen = 0
    for source, texts, n_tokens, heading_paths in documents:
        quality = document_quality(texts, n_tokens, heading_paths, chunk_tokens)
        total.add(quality)
        documents_seen += 1
        per_document[source] = quality.figures()
        warnings += warnings_for(source, quality)
    return {"documents": documents_seen, **total.figures(), "warnings": warnings, "per_document": per_document}


def table_documents(chunks, sources: dict[str, str]):
    """(source, texts, n_tokens, heading paths) per document of a chunks table (rows of a document in order)."""
    columns = {name: chunks.column(name).to_pylist() for name in ("doc_id", "ordinal", "text", "n_tokens",
                                                                   "heading_path")}
    rows: dict[str, list[int]] = {}
    for row, doc_id in enumerate(columns["doc_id"]):
        rows.setdefault(doc_id, []).append(row)
    for doc_id, indices in rows.items():
        indices.sort(key=lambda row: columns["ordinal"][row])
        yield (sources.get(doc_id, doc_id), [columns["text"][i] for i in indices],
               [columns["n_tokens"][i] for i in indices], [columns["heading_path"][i] or [] for i in indices])


def add_batch(report: dict | None, chunks, documents, chunk_tokens: int) -> dict:
    """A run's ``chunk_quality`` (totals and warnings; no per-document figures) with a batch's chunks added:
    ``report`` is what the earlier batches made (None before the first)."""
    sources = dict(zip(documents.column("doc_id").to_pylist(), documents.column("source_path").to_pylist()))
    batch = quality_report(table_documents(chunks, sources), chunk_tokens)
    report = report or {"documents": 0, **DocumentQuality().figures(), "warnings": []}
    total = DocumentQuality(**{name: report[name] + batch[name] for name in asdict(DocumentQuality())})
    return {**report, "documents": report["documents"] + batch["documents"], **total.figures(),
            "warnings": report["warnings"] + batch["warnings"]}
