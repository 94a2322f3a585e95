"""`kbflow bench chunk --quality`: the chunks' quality per document of a real corpus, with the configured model."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kbflow.cli.main import app
from tests.conftest import CASES


def test_bench_chunk_quality_reports_each_document_of_the_corpus(tmp_path):
    out = tmp_path / "quality.json"
    result = CliRunner().invoke(app, ["bench", "chunk", "--corpus", str(CASES), "--quality", "--include", "*.pdf",
                                      "--include", "*.md", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    sources = set(report["per_document"])
    assert "cases/pdf/debian-reference-excerpt.pdf" in sources and "cases/docs/backups.md" in sources
    assert not [s for s in sources if not s.endswith((".pdf", ".md"))]  # only what --include names
    assert report["documents"] == len(sources) and report["chunks"] == sum(
        doc["chunks"] for doc in report["per_document"].values())
    excerpt = report["per_document"]["cases/pdf/debian-reference-excerpt.pdf"]
    assert excerpt["punctuation_only"] == 0 and excerpt["chunks"] >= 3 and excerpt["text_tokens"] > 2000
    assert report["tokenizer"] and report["chunk_tokens"] > 0 and isinstance(report["warnings"], list)
